"""transformers' Auto classes: the same code loads the same models and gives the same numbers on bertforge."""

import json

import pytest
import torch

import bertforge
from bertforge import BertConfig, ConfigError
from bertforge.auto import AUTO_CLASSES

transformers = pytest.importorskip("transformers")

TASK_MODELS = {  # Auto class -> what a seeded head of it is built with
    "AutoModelForSequenceClassification": {"id2label": {0: "negative", 1: "positive"}},
    "AutoModelForTokenClassification": {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}},
    "AutoModelForQuestionAnswering": {},
    "AutoModelForMaskedLM": {},
    "AutoModelForPreTraining": {},
    "AutoModelForMultipleChoice": {},
    "AutoModelForNextSentencePrediction": {},
}


def test_every_auto_class_is_exported_and_names_transformers_bert_class():
    for auto, loads in AUTO_CLASSES.items():
        assert getattr(bertforge, auto).loads is loads
        assert hasattr(transformers, auto)
    assert AUTO_CLASSES["AutoModel"].__name__ == "BertModel"


def test_auto_model_and_tokenizer_give_transformers_vectors_on_minilm(minilm_dir, real_sentences):
    ours_tokenizer = bertforge.AutoTokenizer.from_pretrained(minilm_dir, use_fast=True)
    theirs_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    ours = bertforge.AutoModel.from_pretrained(minilm_dir)
    theirs = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    batch = ours_tokenizer(real_sentences, padding=True, return_tensors="pt")
    reference = theirs_tokenizer(real_sentences, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], reference["input_ids"])
    with torch.inference_mode():
        got, expected = ours(**batch), theirs(**reference)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got.last_hidden_state[mask], expected.last_hidden_state[mask], atol=2e-5, rtol=0)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=2e-5, rtol=0)


@pytest.mark.parametrize("auto", TASK_MODELS)
def test_a_task_folder_loads_into_the_same_model_in_both(auto, tmp_path, tokenizer, random_batch):
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, **TASK_MODELS[auto])
    torch.manual_seed(0)
    getattr(bertforge, auto).from_config(config).save_pretrained(tmp_path)
    ours = getattr(bertforge, auto).from_pretrained(tmp_path)
    theirs = getattr(transformers, auto).from_pretrained(tmp_path).eval()
    assert type(ours).__name__ == type(theirs).__name__
    input_ids, attention_mask, token_type_ids = random_batch(config)
    if auto == "AutoModelForMultipleChoice":  # (batch, choices, seq): the rows as one question's three choices
        input_ids, attention_mask, token_type_ids = input_ids[None], attention_mask[None], token_type_ids[None]
    with torch.inference_mode():
        got = ours(input_ids, attention_mask, token_type_ids)
        expected = theirs(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    names = [name for name in ("logits", "start_logits", "end_logits", "prediction_logits", "seq_relationship_logits")
             if name in expected]
    assert names
    real = attention_mask.bool()  # bertforge's token outputs at padding are zeros, transformers' are not read
    for name in names:
        token_level = expected[name].dim() > 1 and expected[name].shape[1] == input_ids.shape[-1]
        torch.testing.assert_close(got[name][real] if token_level else got[name],
                                   expected[name][real] if token_level else expected[name], atol=1e-5, rtol=0)


def test_loading_options_pass_through_as_transformers_takes_them(minilm_dir):
    classifier = bertforge.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=3,
                                                                             dtype=torch.bfloat16)
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    assert classifier.config.id2label == reference.config.id2label
    assert classifier.classifier.weight.shape == reference.classifier.weight.shape
    assert classifier.dtype == torch.bfloat16


def test_auto_config_reads_and_makes_bert_configs(minilm_dir):
    ours, theirs = bertforge.AutoConfig.from_pretrained(minilm_dir), transformers.AutoConfig.from_pretrained(minilm_dir)
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        assert getattr(ours, field) == getattr(theirs, field)
    assert bertforge.AutoConfig.from_pretrained(minilm_dir, num_labels=4).num_labels == 4
    made = bertforge.AutoConfig.for_model("bert", hidden_size=64, num_attention_heads=4, num_labels=2)
    reference = transformers.AutoConfig.for_model("bert", hidden_size=64, num_attention_heads=4, num_labels=2)
    assert (made.hidden_size, made.num_labels, made.id2label) == (
        reference.hidden_size, reference.num_labels, reference.id2label)


def test_from_config_takes_transformers_config_and_builds_untrained(tmp_path):
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37)
    model = bertforge.AutoModelForMaskedLM.from_config(config, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    assert (type(model).__name__, model.dtype, model.config.hidden_size) == ("BertForMaskedLM", torch.bfloat16, 32)
    model.float().save_pretrained(tmp_path)  # and transformers reads what it saves
    assert type(transformers.AutoModelForMaskedLM.from_pretrained(tmp_path)).__name__ == "BertForMaskedLM"


def test_what_bertforge_cannot_load_is_a_one_line_error(tmp_path, minilm_dir):
    with pytest.raises(ConfigError, match="AutoModel is not constructed: use AutoModel.from_pretrained"):
        bertforge.AutoModel()
    with pytest.raises(ConfigError, match="unknown model_type 'roberta'; choose from bert"):
        bertforge.AutoConfig.for_model("roberta")
    with pytest.raises(ConfigError, match="attn_implementation"):
        bertforge.AutoModel.from_config(BertConfig.tiny(), attn_implementation="fastest")
    with pytest.raises(ConfigError, match="AutoTokenizer is made from a model folder"):
        bertforge.AutoTokenizer.from_config(BertConfig.tiny())
    config = json.loads((minilm_dir / "config.json").read_text()) | {"model_type": "roberta"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="model_type='roberta' is not supported"):
        bertforge.AutoModel.from_pretrained(tmp_path)
