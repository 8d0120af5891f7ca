"""A fine-tuned model says what it was trained with where other tools read it: transformers' pipeline gives the
same labels and probabilities as `bertforge predict` on texts longer than the training max_length."""

import json

import pytest

from bertforge.tasks.classification import ClassificationSettings
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.tasks.finetuned_model import predict
from bertforge.training.trainer import TrainConfig

transformers = pytest.importorskip("transformers")

MAX_LENGTH = 32


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, sst2_dev):
    """MiniLM fine-tuned for a few steps on real SST-2 sentences at 32 tokens: a real exported classifier."""
    output = tmp_path_factory.mktemp("classifier") / "model"
    examples = [{"sentence": text, "label": label} for text, label in sst2_dev[:48]]
    train = output.parent / "train.jsonl"
    train.write_text("".join(json.dumps(example) + "\n" for example in examples), encoding="utf-8")
    config = FinetuneConfig(train=str(train), output=str(output),
                            settings=ClassificationSettings(max_length=MAX_LENGTH), batch_size=16,
                            training=TrainConfig(epochs=1, lr=1e-4, progress=False, device="cpu"))
    finetune(config)
    return output


def test_training_settings_are_where_transformers_reads_them(classifier):
    assert json.loads((classifier / "tokenizer_config.json").read_text())["model_max_length"] == MAX_LENGTH
    config = json.loads((classifier / "config.json").read_text())
    assert config["finetuning_task"] == "classification"
    assert config["bertforge_finetune"]["max_length"] == MAX_LENGTH
    assert config["bertforge_finetune"]["long_text"] == "truncate"


def test_pipeline_agrees_with_bertforge_predict_on_long_texts(classifier, squad_contexts, sst2_dev):
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(classifier)
    texts = [text for text, _ in sst2_dev[200:260]
             if len(reference_tokenizer(text)["input_ids"]) > MAX_LENGTH][:6] + squad_contexts[:3]
    assert len(texts) == 9
    ours = predict(str(classifier), texts=texts)
    pipe = transformers.pipeline("text-classification", model=str(classifier), device="cpu")
    # The pipeline truncates only when asked; then it cuts at tokenizer_config.json's model_max_length.
    theirs = pipe(texts, truncation=True, top_k=None)
    for answer, scores in zip(ours, theirs):
        by_label = {score["label"]: score["score"] for score in scores}
        assert answer["label"] == max(by_label, key=by_label.get)
        assert answer["probabilities"] == pytest.approx(by_label, abs=1e-4)
