"""BertForMultipleChoice and BertForNextSentencePrediction on the real MiniLM checkpoint: logits, losses, hidden
states and attentions equal transformers' classes of the same names on MRPC sentences, checkpoints move both ways,
a BertForPreTraining checkpoint gives its next-sentence head, training lowers the loss, and what the task registry
and the commands say of such a checkpoint."""

import csv
import json
import logging
import random

import numpy as np
import pytest
import torch

from bertforge import (
    BertConfig,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertTokenizer,
)
from bertforge.cli.main import main
from bertforge.errors import BertforgeError, CheckpointError, ConfigError
from bertforge.tasks.checkpoint_contents import inspect_checkpoint
from bertforge.tasks.registry import head_of

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-5
NUM_CHOICES = 4
# our class -> (transformers' class, the head's parameters in a checkpoint)
CLASSES = {
    BertForMultipleChoice: (transformers.BertForMultipleChoice, "classifier"),
    BertForNextSentencePrediction: (transformers.BertForNextSentencePrediction, "cls.seq_relationship"),
}


@pytest.fixture(scope="module")
def mrpc_pairs(data_dir) -> list[tuple[str, str]]:
    """Real sentence pairs: MRPC's first dev rows, each sentence and its paraphrase (or near-paraphrase)."""
    with open(data_dir / "mrpc" / "dev.tsv", encoding="utf-8-sig") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["#1 String"], row["#2 String"]) for row, _ in zip(rows, range(12))]


@pytest.fixture(scope="module")
def hf_tokenizer(minilm_dir):
    return transformers.AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def choice_batch(mrpc_pairs, hf_tokenizer):
    """SWAG's shape from MRPC: each first sentence is the context, its own second sentence one of NUM_CHOICES
    endings (at a seeded place, the label), the others other rows' second sentences; encoded and padded as
    transformers' multiple-choice recipe does (pairs per choice, DataCollatorForMultipleChoice)."""
    draw = random.Random(0)
    endings = [second for _, second in mrpc_pairs]
    features = []
    for i, (context, right) in enumerate(mrpc_pairs[:3]):
        choices = draw.sample(endings[:i] + endings[i + 1:], NUM_CHOICES - 1)
        label = draw.randrange(NUM_CHOICES)
        choices.insert(label, right)
        encoded = hf_tokenizer([context] * NUM_CHOICES, choices, truncation=True, max_length=64)
        features.append({**encoded, "label": label})
    batch = transformers.DataCollatorForMultipleChoice(hf_tokenizer)(features)
    assert batch["input_ids"].shape[:2] == (3, NUM_CHOICES) and not batch["attention_mask"].all()
    return batch


@pytest.fixture(scope="module")
def pair_batch(mrpc_pairs, hf_tokenizer):
    """Next-sentence pairs from MRPC: a sentence with its own second sentence (label 0) or another row's (1)."""
    firsts = [first for first, _ in mrpc_pairs[:6]]
    seconds = [second if i % 2 == 0 else mrpc_pairs[i + 5][1] for i, (_, second) in enumerate(mrpc_pairs[:6])]
    batch = hf_tokenizer(firsts, seconds, padding=True, truncation=True, max_length=96, return_tensors="pt")
    return {**batch, "labels": torch.tensor([i % 2 for i in range(6)])}


def batch_for(model_class, choice_batch, pair_batch) -> dict:
    return dict(choice_batch if model_class is BertForMultipleChoice else pair_batch)


def model_id(model_class) -> str:
    return model_class.__name__


def head_parameters(model) -> tuple[torch.Tensor, torch.Tensor]:
    head = model.classifier if hasattr(model, "classifier") else (
        model.cls.seq_relationship if hasattr(model, "cls") else model.next_sentence)
    return head.weight, head.bias


def seed_head(model):
    """BERT's initialisation gives scores of order 0.01; scores of order 1 make the comparison bite."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in head_parameters(model):
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def assert_same_outputs(ours, theirs, batch):
    """Logits, loss, every layer's hidden states (at real tokens) and attention weights (of real queries)."""
    with torch.inference_mode():
        mine = ours(**batch, output_hidden_states=True, output_attentions=True)
        reference = theirs(**batch, output_hidden_states=True, output_attentions=True)
    assert list(mine.keys()) == list(reference.keys()) == ["loss", "logits", "hidden_states", "attentions"]
    assert mine.logits.shape == reference.logits.shape
    assert reference.logits.abs().max() > 0.1, "scores large enough for the tolerance to mean something"
    torch.testing.assert_close(mine.logits, reference.logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(mine.loss, reference.loss, atol=TOLERANCE, rtol=0)
    real = batch["attention_mask"].reshape(-1, batch["attention_mask"].shape[-1]).bool()  # a row per sequence
    assert len(mine.hidden_states) == len(reference.hidden_states) == 7
    for layer, (a, b) in enumerate(zip(mine.hidden_states, reference.hidden_states, strict=True)):
        assert a.shape == b.shape and (a - b)[real].abs().max() < TOLERANCE, f"hidden state {layer}"
    assert len(mine.attentions) == len(reference.attentions) == 6
    for layer, (a, b) in enumerate(zip(mine.attentions, reference.attentions, strict=True)):
        queries = real[:, None, :].expand(a.shape[:3])  # bertforge computes no padding query
        assert a.shape == b.shape and (a - b)[queries].abs().max() < TOLERANCE, f"attention weights of layer {layer}"


@pytest.mark.parametrize("ours_class", CLASSES, ids=model_id)
def test_a_bertforge_checkpoint_gives_transformers_numbers(ours_class, minilm_dir, choice_batch, pair_batch,
                                                           tmp_path):
    torch.manual_seed(0)
    ours = seed_head(ours_class.from_pretrained(minilm_dir))
    ours.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [ours_class.__name__]
    theirs = CLASSES[ours_class][0].from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert torch.equal(head_parameters(theirs)[0], head_parameters(ours)[0])
    assert_same_outputs(ours, theirs, batch_for(ours_class, choice_batch, pair_batch))


@pytest.mark.parametrize("ours_class", CLASSES, ids=model_id)
def test_a_transformers_checkpoint_loads_with_the_same_numbers(ours_class, minilm_dir, choice_batch, pair_batch,
                                                               tmp_path, caplog):
    theirs_class, head = CLASSES[ours_class]
    torch.manual_seed(0)
    theirs = seed_head(theirs_class.from_pretrained(minilm_dir, attn_implementation="eager")).eval()
    theirs.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        ours = ours_class.from_pretrained(tmp_path, require_heads=True)
    assert "newly initialised" not in caplog.text
    batch = batch_for(ours_class, choice_batch, pair_batch)
    assert_same_outputs(ours, theirs, batch)

    # The other ways in: a tuple, token vectors in the place of ids, explicit positions.
    vectors = ours.get_input_embeddings()(batch["input_ids"])
    positions = torch.arange(batch["input_ids"].shape[-1]).expand(batch["input_ids"].shape)
    inputs = {key: value for key, value in batch.items() if key != "input_ids"}
    with torch.inference_mode():
        as_tuple = ours(**batch, return_dict=False)
        reference = theirs(**batch, return_dict=False)
        embedded = ours(**inputs, inputs_embeds=vectors, position_ids=positions)
        reference_embedded = theirs(**inputs, inputs_embeds=vectors, position_ids=positions)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(reference) == 2
    for mine, expected in zip(as_tuple, reference, strict=True):
        torch.testing.assert_close(mine, expected, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(embedded.logits, reference_embedded.logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(embedded.loss, reference_embedded.loss, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("saved_by", ["transformers", "bertforge"])
def test_a_pretraining_checkpoint_gives_its_next_sentence_head(saved_by, minilm_dir, pair_batch, tmp_path, caplog):
    """bert-base's NSP head comes in a BertForPreTraining checkpoint: the masked-LM head is skipped, as in
    transformers, and the NSP scores are transformers' own."""
    torch.manual_seed(0)
    if saved_by == "transformers":
        pretrained = transformers.BertForPreTraining.from_pretrained(minilm_dir)
        head = pretrained.cls.seq_relationship
    else:
        pretrained = BertForPreTraining.from_pretrained(minilm_dir)
        head = pretrained.next_sentence
    with torch.no_grad():
        head.weight.normal_(0, 0.1)
        head.bias.normal_(0, 0.1)
    pretrained.save_pretrained(tmp_path)
    caplog.clear()  # what loading it says, not what loading MiniLM into BertForPreTraining said
    with caplog.at_level(logging.INFO, logger="bertforge"):
        ours = BertForNextSentencePrediction.from_pretrained(tmp_path, require_heads=True)
    assert "cls.predictions.bias" in caplog.text and "newly initialised" not in caplog.text
    theirs = transformers.BertForNextSentencePrediction.from_pretrained(tmp_path).eval()
    with torch.inference_mode():
        mine, reference = ours(**pair_batch), theirs(**pair_batch)
    assert reference.logits.abs().max() > 0.1
    torch.testing.assert_close(mine.logits, reference.logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(mine.loss, reference.loss, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("ours_class", CLASSES, ids=model_id)
def test_a_training_step_lowers_the_loss(ours_class, minilm_dir, choice_batch, pair_batch):
    torch.manual_seed(0)
    model = ours_class.from_pretrained(minilm_dir)
    batch = batch_for(ours_class, choice_batch, pair_batch)
    with torch.no_grad():
        before = model.eval()(**batch).loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    for _ in range(3):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        gradients = head_parameters(model)[0].grad, model.bert.embeddings.tokens.weight.grad
        assert all(gradient is not None and gradient.abs().sum() > 0 for gradient in gradients)
        optimizer.step()
    with torch.no_grad():
        after = model.eval()(**batch).loss
    assert after < before - 0.05, (before, after)


@pytest.fixture(scope="module")
def tiny_models():
    torch.manual_seed(0)
    config = BertConfig.tiny(vocab_size=50)
    return BertForMultipleChoice(config).eval(), BertForNextSentencePrediction(config).eval()


def one_line_error(call) -> str:
    with pytest.raises(BertforgeError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_wrong_shapes_are_one_line_errors(tiny_models):
    choices, next_sentence = tiny_models
    ids = torch.randint(1, 50, (2, 3, 7))
    mask = torch.ones_like(ids)
    assert "input_ids must be (batch, choices, seq), got shape (6, 7)" in one_line_error(
        lambda: choices(ids.flatten(0, 1)))
    assert "attention_mask has shape (2, 3, 6), input_ids has (2, 3, 7)" in one_line_error(
        lambda: choices(ids, mask[..., 1:]))
    assert "inputs_embeds must be (batch, choices, seq, 128), got shape (6, 7, 128)" in one_line_error(
        lambda: choices(inputs_embeds=torch.randn(6, 7, 128)))
    assert "one of the two" in one_line_error(lambda: choices())
    assert "labels must be (2,) choice ids" in one_line_error(lambda: choices(ids, labels=torch.tensor([0, 1, 2])))
    assert "labels must be (2,) choice ids" in one_line_error(lambda: choices(ids, labels=torch.tensor([0.0, 1.0])))
    assert "label 3 is no choice id: they run from 0 to 2" in one_line_error(
        lambda: choices(ids, labels=torch.tensor([3, 0])))
    assert choices(ids, labels=torch.tensor([-100, 2])).loss.isfinite()  # -100: an ignored question

    pairs = ids[:, 0]
    assert "label 2 is no next-sentence id: they run from 0 to 1" in one_line_error(
        lambda: next_sentence(pairs, labels=torch.tensor([0, 2])))
    assert "labels must be (2,) next-sentence ids" in one_line_error(
        lambda: next_sentence(pairs, labels=torch.tensor([1])))
    assert "input_ids must be (batch, seq)" in one_line_error(lambda: next_sentence(ids))


def test_the_task_registry_and_the_commands_on_these_checkpoints(tiny_models, tokenizer, tmp_path, capsys):
    """No task runs these heads: to the tasks a checkpoint of one is its encoder, and the commands that need a task
    head say which class loads it; `export hf` keeps the head."""
    torch.manual_seed(0)
    config = BertConfig.tiny(vocab_size=tokenizer.vocab_size)
    for model_class in CLASSES:
        model = model_class(config)
        directory = tmp_path / model_class.__name__
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        checkpoint = inspect_checkpoint(directory)
        assert (checkpoint.head, checkpoint.task, checkpoint.architectures) == ("encoder", None,
                                                                                 (model_class.__name__,))
        with pytest.raises(CheckpointError, match=f"no trained task head \\(a {model_class.__name__}, whose head "
                                                  f"Python loads as bertforge.{model_class.__name__}"):
            checkpoint.task_for()
        with pytest.raises(ConfigError, match=f"a {model_class.__name__} is none of the models bertforge's tasks"):
            head_of(model)

        assert main(["predict", "--model", str(directory), "--text", "It rained."]) == 1
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and model_class.__name__ in error, error

        exported = tmp_path / f"{model_class.__name__}-exported"
        assert main(["export", "hf", "--model", str(directory), "--output", str(exported)]) == 0
        capsys.readouterr()
        assert json.loads((exported / "config.json").read_text())["architectures"] == [model_class.__name__]
        reloaded = model_class.from_pretrained(exported, require_heads=True)
        assert torch.equal(head_parameters(reloaded)[0], head_parameters(model)[0])


def test_multiple_choice_exports_to_onnx_as_transformers_scores_it(minilm_dir, choice_batch, tmp_path, capsys):
    """`bertforge export onnx` of a multiple-choice checkpoint (its head kept without --task): a (batch, choices,
    seq) graph whose logits on SWAG-shaped MRPC questions, of a shape it wasn't traced with, are transformers'
    BertForMultipleChoice's of the same weights. --task multiple-choice on a checkpoint without that head is refused
    in one line; --task feature-extraction exports its encoder."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bertforge.inference.onnx import INPUT_NAMES, onnx_session

    torch.manual_seed(0)
    directory = tmp_path / "choices"
    BertForMultipleChoice.from_pretrained(minilm_dir).save_pretrained(directory)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(directory)
    graph = tmp_path / "choices.onnx"
    assert main(["export", "onnx", "--model", str(directory), "--output", str(graph)]) == 0
    assert "wrote multiple-choice graph" in capsys.readouterr().out
    logits = onnx_session(graph).run(["logits"], {name: choice_batch[name].numpy() for name in INPUT_NAMES})[0]
    reference = transformers.BertForMultipleChoice.from_pretrained(directory).eval()
    with torch.no_grad():
        expected = reference(**{name: choice_batch[name] for name in INPUT_NAMES}).logits
    capsys.readouterr()  # transformers' loading bar
    assert logits.shape == tuple(expected.shape) == (3, NUM_CHOICES)
    assert np.abs(logits - expected.numpy()).max() < 1e-4

    assert main(["export", "onnx", "--model", str(minilm_dir), "--output", str(tmp_path / "no.onnx"),
                 "--task", "multiple-choice"]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "needs a trained BertForMultipleChoice head" in error, error
    assert main(["export", "onnx", "--model", str(directory), "--output", str(tmp_path / "encoder.onnx"),
                 "--task", "feature-extraction"]) == 0
    assert "wrote feature-extraction graph" in capsys.readouterr().out
