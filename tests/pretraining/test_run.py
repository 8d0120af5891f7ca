"""Pre-training runs on a slice of a real corpus: the loss falls; a run killed and resumed gives the losses of an
uninterrupted one; the result loads as an ordinary checkpoint in bertforge and transformers; one-line errors."""

import json
import math

import pytest
import torch

from bertforge import BertModel
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.pretraining import run
from bertforge.pretraining.corpus import CorpusReader, prepare_corpus
from bertforge.pretraining.heads import BertForPreTraining
from bertforge.pretraining.masking import Masker
from bertforge.pretraining.objectives import Objective
from bertforge.pretraining.run import PretrainConfig, evaluate_mlm, pretrain


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a shared 2-core machine, spinning OpenMP threads make tiny steps 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(data_dir, tmp_path_factory, minilm_dir):
    from bertforge import BertTokenizer
    lines = (data_dir / "pretrain_en" / "inaugural.txt").read_text(encoding="utf-8").splitlines()[:1000]
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "slice.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepare_corpus([folder / "slice.txt"], BertTokenizer.from_pretrained(minilm_dir), folder / "data", progress=False)
    return folder / "data"


def make_config(corpus, output, **overrides) -> PretrainConfig:
    settings = dict(data=str(corpus), output=str(output), model="tiny", steps=30, batch_size=8, seq_len=64, lr=1e-3,
                    warmup_steps=3, log_every=1, holdout=0.1, save_every=None, eval_batches=2, progress=False)
    return PretrainConfig(**(settings | overrides))


def train_losses(history):
    return {record["step"]: record["loss"] for record in history if record["event"] == "train"}


def test_loss_falls_and_result_loads_in_bertforge_and_transformers(corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    result = pretrain(make_config(corpus, tmp_path / "out"))
    losses = list(train_losses(result.history).values())
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    records = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    train, evaluation = records[-2], records[-1]
    assert set(train) >= {"step", "loss", "mlm_accuracy", "sentence_pair_accuracy", "lr", "tokens_per_s", "mfu"}
    assert evaluation["event"] == "eval" and evaluation["perplexity"] == pytest.approx(math.exp(evaluation["loss"]))

    ours = BertForPreTraining.from_pretrained(tmp_path / "out")
    reference = transformers.BertForPreTraining.from_pretrained(tmp_path / "out").eval()
    input_ids = torch.tensor([[101, 2023, 2003, 103, 3231, 1012, 102]])
    with torch.inference_mode():
        expected = reference(input_ids)
        got = ours(input_ids)
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.seq_relationship_logits, expected.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    encoder = BertModel.from_pretrained(tmp_path / "out")
    assert encoder.config.vocab_size == 30522 and (tmp_path / "out" / "vocab.txt").is_file()


def test_killed_and_resumed_run_repeats_the_uninterrupted_losses(corpus, tmp_path, monkeypatch):
    settings = dict(steps=12, grad_accumulation=2, save_every=5)
    uninterrupted = pretrain(make_config(corpus, tmp_path / "whole", **settings))

    real_objective = run.get_objective("mlm+nsp")
    calls = {"n": 0}

    def dying_loss(model, batch, generator=None):
        calls["n"] += 1
        if calls["n"] > 2 * 8 + 1:  # killed during step 9, after the checkpoint of step 5
            raise KeyboardInterrupt
        return real_objective.loss(model, batch, generator)

    dying = Objective(real_objective.description, real_objective.build_model, real_objective.sentence_pairs,
                      dying_loss)
    monkeypatch.setattr(run, "get_objective", lambda name: dying)
    with pytest.raises(KeyboardInterrupt):
        pretrain(make_config(corpus, tmp_path / "split", **settings))
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="--resume"):
        pretrain(make_config(corpus, tmp_path / "split", **settings))
    resumed = pretrain(make_config(corpus, tmp_path / "split", **settings), resume=True)

    expected, got = train_losses(uninterrupted.history), train_losses(resumed.history)
    assert sorted(got) == list(range(6, 13))
    for step in got:
        assert got[step] == pytest.approx(expected[step], abs=1e-6)
    logged = [json.loads(line) for line in (tmp_path / "split" / "log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in logged if record["event"] == "train"] == list(range(1, 13))
    first = BertModel.from_pretrained(tmp_path / "whole").state_dict()
    second = BertModel.from_pretrained(tmp_path / "split").state_dict()
    for name in first:
        torch.testing.assert_close(second[name], first[name], atol=1e-6, rtol=0)


def test_electra_keeps_its_discriminator_as_an_ordinary_encoder(corpus, tmp_path):
    result = pretrain(make_config(corpus, tmp_path / "out", objective="electra", masking="whole_word", steps=3))
    record = [r for r in result.history if r["event"] == "train"][-1]
    assert "replaced_token_accuracy" in record and "sentence_pair_accuracy" not in record
    encoder = BertModel.from_pretrained(tmp_path / "out")
    assert encoder.config.hidden_size == 128


def test_evaluation_is_repeatable_and_consistent(corpus, tokenizer):
    reader = CorpusReader(corpus, split="eval", holdout=0.1)
    torch.manual_seed(0)
    model = BertForPreTraining(run.model_config("tiny", tokenizer, 64))
    masker = Masker(tokenizer.vocab)
    first = evaluate_mlm(model, reader, masker, tokenizer.vocab.pad_token_id, batch_size=4, seq_len=64, max_batches=2)
    second = evaluate_mlm(model, reader, masker, tokenizer.vocab.pad_token_id, batch_size=4, seq_len=64, max_batches=2)
    assert first == second and first["batches"] == 2
    assert first["perplexity"] == pytest.approx(math.exp(first["loss"]))
    # An untrained model is close to uniform over the vocabulary.
    assert abs(first["loss"] - math.log(tokenizer.vocab_size)) < 1.0


def test_config_round_trips_through_json_and_rejects_unknown_keys(tmp_path):
    config = PretrainConfig(data="d", output="o", objective="mlm+sop", masking="ngram", holdout=5, betas=(0.8, 0.9))
    config.save(tmp_path / "run.json")
    assert PretrainConfig.load(tmp_path / "run.json") == config
    (tmp_path / "bad.json").write_text(json.dumps(config.to_dict() | {"learning_rate": 1}))
    with pytest.raises(ConfigError, match="bad.json.*'learning_rate'"):
        PretrainConfig.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="masking"):
        PretrainConfig(data="d", output="o", masking="span")


def test_errors_name_the_problem(corpus, tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        pretrain(make_config(tmp_path / "missing", tmp_path / "out"))
    with pytest.raises(ConfigError, match="unknown model size 'huge'"):
        pretrain(make_config(corpus, tmp_path / "out", model="huge"))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a"]) + "\n")
    with pytest.raises(ConfigError, match="not the one .* was prepared with"):
        pretrain(make_config(corpus, tmp_path / "out", tokenizer=str(vocab)))
    with pytest.raises(CheckpointError, match="no training checkpoint"):
        pretrain(make_config(corpus, tmp_path / "out"), resume=True)
