"""Pre-training runs on a slice of a real corpus: the loss falls; a run killed and resumed gives the losses of an
uninterrupted one; the result loads as an ordinary checkpoint in bertforge and transformers; fp16 (CUDA) and
torch.compile runs; one-line errors."""

import hashlib
import json
import math
import shutil
from collections import Counter
from itertools import islice

import pytest
import torch

from bertforge import BertConfig, BertModel
from bertforge.checkpoint.train_state import TRAIN_STATE_FILE
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.heads import IGNORE_INDEX
from bertforge.pretraining import run
from bertforge.pretraining.collate import PretrainingCollator, batches
from bertforge.pretraining.corpus import CorpusReader
from bertforge.pretraining.evaluation import evaluate_mlm
from bertforge.pretraining.heads import BertForPreTraining
from bertforge.pretraining.instances import InstanceStream
from bertforge.pretraining.masking import Masker
from bertforge.pretraining.objectives import Objective
from bertforge.pretraining.run import PretrainConfig, pretrain

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(inaugural_corpus):
    return inaugural_corpus(1000) / "data"


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


def run_killed(config: PretrainConfig, micro_batches: int, monkeypatch, death: type[BaseException] = KeyboardInterrupt,
               overwrite: bool = False) -> None:
    """Start `config`'s run and kill it (KeyboardInterrupt, or make it fail with `death`) when it asks for more than
    `micro_batches` losses."""
    real_objective = run.get_objective(config.objective)
    calls = {"n": 0}

    def dying_loss(model, batch, generator=None):
        calls["n"] += 1
        if calls["n"] > micro_batches:
            raise death("killed")
        return real_objective.loss(model, batch, generator)

    dying = Objective(real_objective.description, real_objective.build_model, real_objective.sentence_pairs,
                      dying_loss)
    monkeypatch.setattr(run, "get_objective", lambda name: dying)
    with pytest.raises(death):
        pretrain(config, overwrite=overwrite)
    monkeypatch.undo()


def test_killed_and_resumed_run_repeats_the_uninterrupted_losses(corpus, tmp_path, monkeypatch):
    settings = dict(steps=12, grad_accumulation=2, save_every=5)
    uninterrupted = pretrain(make_config(corpus, tmp_path / "whole", **settings))

    run_killed(make_config(corpus, tmp_path / "split", **settings), 2 * 8 + 1, monkeypatch)  # during step 9
    with pytest.raises(ConfigError, match="--resume"):
        pretrain(make_config(corpus, tmp_path / "split", **settings))
    resumed = pretrain(make_config(corpus, tmp_path / "split", **settings), resume=True)

    assert not (tmp_path / "split.incomplete").exists()
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


def test_a_run_killed_while_saving_its_model_resumes_without_evaluating_again(corpus, tmp_path, monkeypatch):
    """The end of a run checkpoints after its final evaluation: resumed from there, the run writes its model and
    logs that evaluation once."""
    settings = dict(steps=4, save_every=None)
    monkeypatch.setattr(run, "save_final_model", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt("killed")))
    with pytest.raises(KeyboardInterrupt):
        pretrain(make_config(corpus, tmp_path / "out", **settings))
    monkeypatch.undo()
    resumed = pretrain(make_config(corpus, tmp_path / "out", **settings), resume=True)
    logged = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert [(record["event"], record["step"]) for record in logged] == [("train", 1), ("train", 2), ("train", 3),
                                                                         ("train", 4), ("eval", 4)]
    assert resumed.history == [] and (tmp_path / "out" / "model.safetensors").is_file()


def digest(folder):
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_run_killed_or_failed_into_a_model_folder_leaves_the_model_as_it_was(corpus, tmp_path, monkeypatch):
    """The run stages into OUTPUT.incomplete/: until it ends, the model already in OUTPUT (here one of another
    seed) is byte for byte what it was and loads; resuming the killed overwrite then puts the new model in place."""
    settings = dict(steps=6, save_every=2)
    model = tmp_path / "model"
    pretrain(make_config(corpus, model, seed=1, **settings))
    before = digest(model)

    with pytest.raises(ConfigError, match="already holds a training run"):
        pretrain(make_config(corpus, model, **settings))
    run_killed(make_config(corpus, model, **settings), 3, monkeypatch, overwrite=True)
    assert digest(model) == before and (tmp_path / "model.incomplete" / "checkpoint").is_dir()
    run_killed(make_config(corpus, model, **settings), 5, monkeypatch, death=RuntimeError, overwrite=True)
    assert digest(model) == before
    BertForPreTraining.from_pretrained(model)

    with pytest.raises(ConfigError, match="--resume"):
        pretrain(make_config(corpus, model, **settings))
    resumed = pretrain(make_config(corpus, model, **settings), resume=True)
    assert sorted(train_losses(resumed.history)) == [5, 6]  # from the checkpoint of step 4
    assert not (tmp_path / "model.incomplete").exists()
    assert PretrainConfig.load(model / run.RUN_CONFIG_FILE).seed == 0
    assert digest(model)["model.safetensors"] != before["model.safetensors"]


def test_electra_keeps_its_discriminator_as_an_ordinary_encoder(corpus, tmp_path):
    result = pretrain(make_config(corpus, tmp_path / "out", objective="electra", masking="whole_word", steps=3))
    record = [r for r in result.history if r["event"] == "train"][-1]
    assert "replaced_token_accuracy" in record and "sentence_pair_accuracy" not in record
    encoder = BertModel.from_pretrained(tmp_path / "out")
    assert encoder.config.hidden_size == 128


def test_each_objective_masks_its_way_in_training_and_evaluation(corpus, tmp_path, monkeypatch):
    """The run's masker, in training and in its held-out evaluation, replaces chosen tokens as its objective says
    (ELECTRA: no random token), as evaluate_pretrained's does afterwards."""
    from bertforge.pretraining import run as pretraining_run
    from bertforge.pretraining.masking import BERT_REPLACEMENT, ELECTRA_REPLACEMENT

    made = []

    class Recorded(Masker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.replacement)

    monkeypatch.setattr(pretraining_run, "Masker", Recorded)
    pretrain(make_config(corpus, tmp_path / "electra", objective="electra", steps=2))
    pretrain(make_config(corpus, tmp_path / "bert", objective="mlm", steps=2))
    pretraining_run.evaluate_pretrained(tmp_path / "bert", corpus, max_batches=1)
    assert made == [ELECTRA_REPLACEMENT, BERT_REPLACEMENT, BERT_REPLACEMENT]


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


def test_frequency_baseline_is_the_accuracy_of_always_guessing_the_most_frequent_masked_token(corpus, tokenizer):
    reader = CorpusReader(corpus, split="eval", holdout=0.1)
    masker = Masker(tokenizer.vocab)
    # the masked tokens of the evaluation, drawn again with the same seeds, counted independently
    stream = InstanceStream(reader, max_seq_length=64, sentence_pairs=None, seed=0, epochs=1)
    collator = PretrainingCollator(masker, tokenizer.vocab.pad_token_id, seed=0)
    labels = Counter(label for batch in islice(batches(stream, collator, 4), 2)
                     for label in batch["labels"].flatten().tolist() if label != IGNORE_INDEX)
    most_frequent, count = labels.most_common(1)[0]
    torch.manual_seed(0)
    model = BertForPreTraining(run.model_config("tiny", tokenizer, 64))
    with torch.no_grad():
        model.masked_lm.bias[most_frequent] = 1e4  # a model that always guesses that token
    metrics = evaluate_mlm(model, reader, masker, tokenizer.vocab.pad_token_id, batch_size=4, seq_len=64,
                           max_batches=2)
    assert metrics["masked_tokens"] == sum(labels.values())
    assert metrics["frequency_baseline_accuracy"] == pytest.approx(count / sum(labels.values()))
    assert metrics["accuracy"] == pytest.approx(metrics["frequency_baseline_accuracy"])


def test_dropout_replaces_the_presets_in_the_trained_model(corpus, tmp_path):
    pretrain(make_config(corpus, tmp_path / "out", steps=2, dropout=0.0))
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (saved["hidden_dropout_prob"], saved["attention_probs_dropout_prob"]) == (0.0, 0.0)
    with pytest.raises(ConfigError, match="dropout must be in"):
        make_config(corpus, tmp_path / "bad", dropout=-0.1)


def test_a_second_phase_starts_from_the_first_phases_weights(corpus, tmp_path):
    """BERT's two phases: short sequences first, then a run at full length that starts from their result (here an
    MLM-only model continued with MLM + NSP, whose NSP head and pooler start fresh)."""
    pretrain(make_config(corpus, tmp_path / "phase1", objective="mlm", seq_len=32, steps=20))
    # A learning rate too small to move the weights: the second run's model is the first's
    second = make_config(corpus, tmp_path / "phase2", init_from=str(tmp_path / "phase1"), steps=1, lr=1e-12)
    second_losses = train_losses(pretrain(second).history)
    fresh_losses = train_losses(pretrain(make_config(corpus, tmp_path / "fresh", steps=1)).history)
    assert second_losses[1] < fresh_losses[1] - 0.3  # the first phase has learnt something already
    before = BertModel.from_pretrained(tmp_path / "phase1").state_dict()
    after = BertModel.from_pretrained(tmp_path / "phase2").state_dict()
    for name, tensor in before.items():
        if not name.startswith("pooler."):
            torch.testing.assert_close(after[name], tensor, atol=1e-6, rtol=0, msg=name)
    assert PretrainConfig.load(tmp_path / "phase2" / run.RUN_CONFIG_FILE).init_from == str(tmp_path / "phase1")


def test_init_from_errors_name_the_problem(corpus, tmp_path):
    with pytest.raises(ConfigError, match="config.json: no such config file"):
        pretrain(make_config(corpus, tmp_path / "out", init_from=str(tmp_path)))
    other_vocabulary = tmp_path / "small"
    BertModel(BertConfig.tiny(vocab_size=100)).save_pretrained(other_vocabulary)
    with pytest.raises(ConfigError, match="vocab_size 100 differs from the corpus tokenizer's 30522"):
        pretrain(make_config(corpus, tmp_path / "out", init_from=str(other_vocabulary)))
    with pytest.raises(ConfigError, match="ELECTRA trains a generator and a discriminator from scratch"):
        make_config(corpus, tmp_path / "out", init_from=str(other_vocabulary), objective="electra")


def test_config_round_trips_through_json_and_rejects_unknown_keys(tmp_path):
    config = PretrainConfig(data="d", output="o", objective="mlm+sop", masking="ngram", holdout=5, betas=(0.8, 0.9))
    config.save(tmp_path / "run.json")
    assert PretrainConfig.load(tmp_path / "run.json") == config
    (tmp_path / "bad.json").write_text(json.dumps(config.to_dict() | {"learning_rate": 1}))
    with pytest.raises(ConfigError, match="bad.json.*'learning_rate'"):
        PretrainConfig.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="masking"):
        PretrainConfig(data="d", output="o", masking="span")
    # "" was the current folder: "PosixPath('.') has an empty name" for the output, "./manifest.json" for the data
    for paths in ({"data": "", "output": "o"}, {"data": "d", "output": " "}, {"data": "d", "output": "o",
                                                                            "init_from": ""}):
        with pytest.raises(ConfigError, match="is an empty path"):
            PretrainConfig(**paths)


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


def test_fp16_needs_cuda_and_excludes_bf16(corpus, tmp_path):
    """fp16 is for GPUs without bf16; on a CPU it is an error rather than a silent float32 run, since CPUs have no
    fast fp16 kernels and the run config would claim a precision the run never used."""
    with pytest.raises(ConfigError, match="bf16 and fp16 exclude each other"):
        make_config(corpus, tmp_path / "out", bf16=True, fp16=True)
    with pytest.raises(ConfigError, match="fp16 training needs a CUDA device"):
        pretrain(make_config(corpus, tmp_path / "out", fp16=True, device="cpu"))
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast with loss scaling is for CUDA devices")
def test_fp16_run_keeps_its_loss_scale_across_a_resume(corpus, tmp_path, monkeypatch):
    settings = dict(steps=8, save_every=4, fp16=True, device="cuda")
    uninterrupted = pretrain(make_config(corpus, tmp_path / "whole", **settings))
    whole = torch.load(tmp_path / "whole" / "checkpoint" / TRAIN_STATE_FILE, weights_only=True)
    assert whole["scaler"]["scale"] > 0
    assert all(math.isfinite(loss) for loss in train_losses(uninterrupted.history).values())

    run_killed(make_config(corpus, tmp_path / "split", **settings), 6, monkeypatch)  # during step 7
    killed = tmp_path / "split.incomplete" / "checkpoint" / TRAIN_STATE_FILE
    assert torch.load(killed, weights_only=True)["step"] == 4
    resumed = pretrain(make_config(corpus, tmp_path / "split", **settings), resume=True)
    split = torch.load(tmp_path / "split" / "checkpoint" / TRAIN_STATE_FILE, weights_only=True)
    assert split["scaler"] == whole["scaler"]  # the same skipped steps and growth as without the stop
    expected, got = train_losses(uninterrupted.history), train_losses(resumed.history)
    for step in got:  # GPU kernels may add in another order: close, not bit-identical
        assert got[step] == pytest.approx(expected[step], rel=1e-3)


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile's CPU backend needs a C++ compiler")
def test_compiled_run_computes_what_the_eager_one_does(corpus, tmp_path):
    """One step of a narrow model without dropout (compiled kernels draw other random numbers than eager ones):
    the same weights on the same batch give the same first loss; the model is saved without compile's wrapper."""
    model = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    (tmp_path / "model.json").write_text(json.dumps(model))
    settings = dict(model=str(tmp_path / "model.json"), steps=1, batch_size=4, seq_len=32)
    eager = pretrain(make_config(corpus, tmp_path / "eager", **settings))
    compiled = pretrain(make_config(corpus, tmp_path / "compiled", compile=True, **settings))
    assert train_losses(compiled.history)[1] == pytest.approx(train_losses(eager.history)[1], rel=1e-5)
    assert BertModel.from_pretrained(tmp_path / "compiled").config.hidden_size == 32
    assert json.loads((tmp_path / "compiled" / "pretrain_config.json").read_text())["compile"] is True
