"""`bertforge pretrain train`, `pretrain eval` and `pretrain plot` end to end on a small real corpus slice; one-line
errors."""

import json
import os
import signal
import sys

import numpy as np
import pytest
import torch

from bertforge.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(inaugural_slice, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_corpus")
    assert main(["pretrain", "prepare", "--corpus", str(inaugural_slice(600)), "-o", str(folder / "data"),
                 "--no-progress"]) == 0
    return folder / "data"


def train_args(corpus, output, *extra):
    return ["pretrain", "train", "--size", "tiny", "--data", str(corpus), "--output", str(output), "--steps", "4",
            "--batch-size", "4", "--max-length", "32", "--log-every", "2", "--save-every", "2", "--holdout", "0.1",
            "--no-progress", *extra]


def test_train_then_eval(corpus, tmp_path, capsys):
    assert main(train_args(corpus, tmp_path / "model", "--objective", "mlm", "--masking", "whole_word")) == 0
    out = capsys.readouterr().out
    assert "trained 4 steps" in out and "perplexity" in out
    assert (tmp_path / "model" / "checkpoint" / "train_state.pt").is_file()
    assert main(["pretrain", "train", *train_args(corpus, tmp_path / "model")[2:], "--objective", "mlm",
                 "--masking", "whole_word", "--resume"]) == 0  # already finished: resumes at the end

    assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(corpus),
                 "--batch-size", "4", "--max-batches", "2", "--max-length", "32"]) == 0
    out = capsys.readouterr().out
    assert "loss" in out and "perplexity" in out and "accuracy" in out
    metrics = json.loads((tmp_path / "model" / "eval_results.json").read_text())
    assert set(metrics) >= {"loss", "perplexity", "accuracy"} and metrics["batches"] == 2
    # "-": the metrics onto standard output, what was done onto standard error
    assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(corpus),
                 "--batch-size", "4", "--max-batches", "2", "--max-length", "32", "--output", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == metrics and "wrote -" in captured.err
    assert main(["pretrain", "plot", str(tmp_path / "model"), "--output", "-"]) == 1
    assert "--output -: the plot is an image; give a file name" in capsys.readouterr().err
    # by default the run's own settings (length, batch size, masking, seed): the last held-out figures its log
    # shows, here over the batches training scored
    logged = [json.loads(line) for line in (tmp_path / "model" / "log.jsonl").read_text().splitlines()]
    last = [record for record in logged if record["event"] == "eval"][-1]
    assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(corpus),
                 "--max-batches", str(last["batches"]), "--output", "-"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert (metrics["loss"], metrics["accuracy"], metrics["masked_tokens"]) == \
        (pytest.approx(last["loss"], rel=1e-6), last["accuracy"], last["masked_tokens"])
    # an --output among the files it reads would destroy the model or the corpus
    for reads in (tmp_path / "model" / "config.json", tmp_path / "model" / "model.safetensors",
                  corpus / "manifest.json", next(corpus.glob("shard-*.npy"))):
        before = reads.read_bytes()
        assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(corpus),
                     "--output", str(reads)]) == 1
        err = capsys.readouterr().err.strip()
        assert "which this command reads" in err and "\n" not in err and reads.read_bytes() == before
    # a count of held-out documents rather than a fraction
    assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(corpus), "--holdout", "2",
                 "--batch-size", "4", "--max-batches", "1", "--max-length", "32", "--output", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["batches"] == 1


def test_holdout_is_a_fraction_or_a_whole_count():
    from bertforge.cli.arguments import held_out_size

    assert [held_out_size(text) for text in ("0", "0.25", "3", "1e1")] == [0, 0.25, 3, 10]
    assert isinstance(held_out_size("3"), int) and isinstance(held_out_size("0.25"), float)


@pytest.mark.parametrize("change, message", [
    (["--data", "MISSING"], "no such folder"),
    (["--size", "huge"], "unknown model size 'huge'"),
    (["--vocab", "VOCAB"], "not the one"),
    (["--init-from", "MISSING"], "--size and --init-from both set the architecture"),
])
def test_errors_are_one_line(corpus, tmp_path, capsys, change, message):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    args = train_args(corpus, tmp_path / "out")
    flag, value = change
    value = {"MISSING": str(tmp_path / "missing"), "VOCAB": str(tmp_path / "vocab.txt")}.get(value, value)
    args = args + [flag, value] if flag not in args else \
        [value if i == args.index(flag) + 1 else arg for i, arg in enumerate(args)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge: error:") and message in err and "\n" not in err


@pytest.mark.parametrize("flag, value, field, bad, rule", [
    # run_mlm's --mlm_probability, taken under that name too; 0 is refused
    ("--mlm-probability", "0.3", "mask_probability", ("--mask-probability", "0"), "must be above 0 and below 1, got 0"),
    # 0: run_mlm's sequences, none made short; above 1 is refused
    ("--short-seq-prob", "0", "short_seq_prob", ("--short-seq-prob", "1.5"), "must be from 0 to 1, got 1.5"),
])
def test_run_mlms_settings_are_flags(corpus, tmp_path, capsys, flag, value, field, bad, rule):
    """--mask-probability and --short-seq-prob reach the run's config."""
    assert main(train_args(corpus, tmp_path / "model", "--objective", "mlm", "--steps", "2", flag, value)) == 0
    assert json.loads((tmp_path / "model" / "pretrain_config.json").read_text())[field] == float(value)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(train_args(corpus, tmp_path / "other", *bad))
    assert f"argument {bad[0]}: {rule}" in capsys.readouterr().err


def test_an_output_that_is_or_holds_the_corpus_is_refused(corpus, tmp_path, capsys):
    """A later --overwrite would replace the folder, and the corpus in it, whole."""
    for output in (corpus, corpus.parent):
        assert main(train_args(corpus, output)) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("bertforge: error:") and "this run reads" in err and "\n" not in err
        assert (corpus / "manifest.json").is_file() and not (corpus / "config.json").exists()


def test_eval_of_an_encoder_without_masked_lm_head_is_one_line(corpus, tmp_path, capsys, minilm_dir):
    assert main(["pretrain", "eval", "--model", str(minilm_dir), "--data", str(corpus), "--max-batches", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge: error:") and "\n" not in err


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's header chunk, after checking the signature and the closing chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and data[-8:-4] == b"IEND"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_draws_a_real_run_log(corpus, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(train_args(corpus, tmp_path / "model", "--eval-every", "2")) == 0
    assert main(["pretrain", "plot", str(tmp_path / "model")]) == 0
    assert f"wrote {tmp_path / 'model' / 'curves.png'}" in capsys.readouterr().out
    assert png_size(tmp_path / "model" / "curves.png") == (1100, 700)  # figsize 11 x 7 inches at 100 dpi
    assert main(["pretrain", "plot", str(tmp_path / "model"), "--output", str(tmp_path / "plots" / "run.png")]) == 0
    assert png_size(tmp_path / "plots" / "run.png") == (1100, 700)
    # The suffix names the format; one matplotlib can't write is refused before anything is drawn.
    assert main(["pretrain", "plot", str(tmp_path / "model"), "--output", str(tmp_path / "run.svg")]) == 0
    assert (tmp_path / "run.svg").read_text().lstrip().startswith("<?xml")
    assert main(["pretrain", "plot", str(tmp_path / "model"), "--output", str(tmp_path / "run.docx")]) == 1
    assert "run.docx: can't draw a .docx image; name a file ending in one of" in capsys.readouterr().err
    assert not (tmp_path / "run.docx").exists()
    # A run killed (or still writing) mid-line: the log is drawn as far as it is written, as resuming reads it;
    # a broken line before the last is named.
    log = tmp_path / "model" / "log.jsonl"
    whole = log.read_text()
    log.write_text(whole + '{"event": "train", "step": 9, "lo')
    assert main(["pretrain", "plot", str(tmp_path / "model"), "--output", str(tmp_path / "torn.png")]) == 0
    assert png_size(tmp_path / "torn.png") == (1100, 700)
    log.write_text('{"event": "train", "st\n' + whole)
    assert main(["pretrain", "plot", str(tmp_path / "model"), "--output", str(tmp_path / "broken.png")]) == 1
    assert "log.jsonl, line 1: not valid JSON" in capsys.readouterr().err


def test_plot_of_a_missing_or_empty_log_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.jsonl").write_text("")
    for folder, message in [("missing", "no such log"), ("empty", "no training steps")]:
        assert main(["pretrain", "plot", str(tmp_path / folder)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("bertforge: error:") and message in err and "\n" not in err
    assert not (tmp_path / "empty" / "curves.png").exists()


def test_plot_without_matplotlib_names_the_extra(corpus, tmp_path, capsys, monkeypatch):
    (tmp_path / "log.jsonl").write_text(json.dumps({"event": "train", "step": 1, "loss": 1.0}) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # what an environment without it raises
    assert main(["pretrain", "plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert 'pip install "bertforge[plot]"' in err and "\n" not in err


def test_fp16_on_cpu_is_one_line(corpus, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("fp16 runs on CUDA; the error is for CPU-only machines")
    assert main(train_args(corpus, tmp_path / "out", "--fp16")) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge: error:") and "fp16 training needs a CUDA device" in err and "\n" not in err
    assert main(train_args(corpus, tmp_path / "out", "--fp16", "--bf16")) == 1
    assert "exclude each other" in capsys.readouterr().err


def test_cased_is_for_a_bare_vocab_only(corpus, tmp_path, capsys, minilm_dir):
    # A tokenizer folder (the corpus's, a model's) records its casing; --cased there would be silently ignored.
    for extra, named in (([], "the corpus's tokenizer"), (["--vocab", str(minilm_dir)], str(minilm_dir))):
        assert main(train_args(corpus, tmp_path / "out", "--cased", *extra)) == 1
        err = capsys.readouterr().err.strip()
        assert err == f"bertforge: error: --cased applies to a vocab.txt given with --vocab; {named} keeps its own " \
                      "casing"
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_again(corpus, tmp_path, capsys, caplog):
    from bertforge.outputs import staging_dir

    staging = staging_dir(tmp_path / "model")  # what a kill leaves before the first checkpoint: the folder, a log
    staging.mkdir()
    (staging / "log.jsonl").write_text("")
    assert main(train_args(corpus, tmp_path / "model", "--objective", "mlm", "--save-every", "100", "--resume")) == 0
    assert "killed before its first checkpoint; it starts again" in caplog.text
    assert "trained 4 steps" in capsys.readouterr().out and not staging.exists()
    # Where it saved its settings, a changed one is refused as for any resume, and nothing is written.
    staging.mkdir()
    (staging / "pretrain_config.json").write_text((tmp_path / "model" / "pretrain_config.json").read_text())
    assert main(train_args(corpus, tmp_path / "model", "--objective", "mlm", "--save-every", "100", "--resume",
                           "--lr", "0.5")) == 1
    assert "the run was started with lr=" in capsys.readouterr().err
    assert sorted(path.name for path in staging.iterdir()) == ["pretrain_config.json"]


def test_train_help_explains_the_global_batch(capsys):
    with pytest.raises(SystemExit):
        main(["pretrain", "train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "the global batch of an optimizer step is batch-size x processes (torchrun's world size) x grad-accum" \
        in help_text
    assert "--fp16" in help_text and "--compile" in help_text


def test_held_out_metrics_are_reported_after_each_evaluation(corpus, tmp_path, caplog):
    """As finetune's dev metrics: through the bertforge.progress logger, which the CLI shows without -v."""
    assert main(train_args(corpus, tmp_path / "model", "--objective", "mlm", "--eval-every", "2",
                           "--eval-batches", "2")) == 0
    lines = [record.getMessage() for record in caplog.records
             if record.name == "bertforge.progress" and record.levelname == "INFO"]
    # first, how much of the corpus is held out: --holdout 0.1 of its documents, counted from the shards' arrays
    manifest = json.loads((corpus / "manifest.json").read_text())
    documents = np.load(corpus / "shard-00000.documents.npy")
    sentences = np.load(corpus / "shard-00000.sentences.npy")
    held = [index for index in range(manifest["documents"])
            if (index + 1) * round(0.1 * manifest["documents"]) // manifest["documents"] >
            index * round(0.1 * manifest["documents"]) // manifest["documents"]]
    tokens = sum(int(sentences[documents[index + 1]] - sentences[documents[index]]) for index in held)
    assert lines.pop(0) == (f"held out {len(held)} of {manifest['documents']} documents for evaluation "
                            f"({100 * tokens / manifest['tokens']:.1f}% of the tokens)")
    assert [line.split(",")[0] for line in lines] == ["step 2", "step 4"]
    assert all("held-out masked LM" in line and "perplexity" in line and "accuracy" in line for line in lines)
    logged = [json.loads(line) for line in (tmp_path / "model" / "log.jsonl").read_text().splitlines()]
    assert [record["batches"] for record in logged if record["event"] == "eval"] == [2, 2]  # --eval-batches


def test_gradient_checkpointing_trains_the_same_steps(corpus, tmp_path):
    """Recomputing the layers in the backward pass changes memory, not the run: the same logged losses."""
    def losses(folder):
        records = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
        return [record["loss"] for record in records if "loss" in record and record.get("event") == "train"]

    assert main(train_args(corpus, tmp_path / "kept", "--objective", "mlm")) == 0
    assert main(train_args(corpus, tmp_path / "recomputed", "--objective", "mlm", "--gradient-checkpointing")) == 0
    kept, recomputed = losses(tmp_path / "kept"), losses(tmp_path / "recomputed")
    assert len(kept) == 2 and recomputed == pytest.approx(kept, rel=1e-5)


def test_sigterm_saves_a_checkpoint_and_resume_gives_the_uninterrupted_run(corpus, tmp_path, capsys, monkeypatch):
    """A scheduler's notice before it kills the job: the step in flight ends, a checkpoint is saved (here the only
    one: every 1,000 steps otherwise), exit status 143. Stopped between two log lines, the resumed run's next line
    still sums both runs' steps: its log and weights are the whole run's."""
    from bertforge.pretraining import run as run_module

    def steps(output):
        return train_args(corpus, output, "--steps", "6", "--log-every", "2", "--save-every", "1000")

    assert main(steps(tmp_path / "whole")) == 0
    to_device, batches = run_module.to_device, []

    def sigterm_in_step_3(*args):
        batches.append(args)
        if len(batches) == 3:  # one batch a step
            os.kill(os.getpid(), signal.SIGTERM)
        return to_device(*args)

    monkeypatch.setattr(run_module, "to_device", sigterm_in_step_3)
    assert main(steps(tmp_path / "split")) == 143
    monkeypatch.undo()
    checkpoint = tmp_path / "split.incomplete" / "checkpoint"
    assert capsys.readouterr().err == ("bertforge: stopped by SIGTERM after step 3; its checkpoint is in "
                                       f"{checkpoint}: continue the run with --resume\n")
    assert torch.load(checkpoint / "train_state.pt", weights_only=True)["step"] == 3
    assert main([*steps(tmp_path / "split"), "--resume"]) == 0

    def without_speed(path):
        return [{k: v for k, v in json.loads(line).items() if k not in ("tokens_per_s", "mfu", "seconds")}
                for line in path.read_text().splitlines()]
    assert without_speed(tmp_path / "split" / "log.jsonl") == without_speed(tmp_path / "whole" / "log.jsonl")
    assert (tmp_path / "split" / "model.safetensors").read_bytes() == \
        (tmp_path / "whole" / "model.safetensors").read_bytes()


def test_eval_refuses_a_corpus_prepared_again_since_training(inaugural_slice, tmp_path, capsys):
    """The held-out split is every n-th document: once more text is prepared into the same folder, it holds out
    other documents, some of which the model trained on. pretrain eval refuses it, naming the counts; the corpus
    as trained on is scored."""
    lines = inaugural_slice(400).read_text(encoding="utf-8").splitlines()
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
    prepare = ["pretrain", "prepare", "--corpus", str(text), "-o", str(tmp_path / "data"), "--no-progress"]
    assert main(prepare) == 0
    assert main(train_args(tmp_path / "data", tmp_path / "model", "--objective", "mlm")) == 0
    assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "data")]) == 0
    documents = json.loads((tmp_path / "data" / "manifest.json").read_text())["documents"]
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(prepare) == 0
    now = json.loads((tmp_path / "data" / "manifest.json").read_text())["documents"]
    assert now > documents
    capsys.readouterr()
    assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "data")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"bertforge: error: {tmp_path / 'data'}: was prepared again after {tmp_path / 'model'} trained on it "
        f"({documents} documents then, {now} now): its held-out documents are no longer those training left out; "
        "evaluate on the corpus as it was, or on another one")


class Killed(Exception):
    pass


def test_report_to_tensorboard_shows_the_log_once_each_step_across_a_resume(corpus, tmp_path, monkeypatch,
                                                                           tensorboard_scalars, logged_scalars):
    """--report-to tensorboard: OUTPUT/runs holds log.jsonl's numbers (each objective's accuracy, the held-out
    metrics) under transformers' tags, at the optimizer step; a run killed in step 6, after step 4's checkpoint and
    evaluation, and resumed shows each step once."""
    from bertforge.pretraining import run as run_module

    args = train_args(corpus, tmp_path / "model", "--steps", "8", "--log-every", "1", "--save-every", "4",
                      "--eval-every", "4", "--eval-batches", "1", "--report-to", "tensorboard")
    to_device, batches = run_module.to_device, []

    def killed_in_step_6(*args):
        batches.append(args)
        if len(batches) == 6:  # one batch a step
            raise Killed
        return to_device(*args)

    monkeypatch.setattr(run_module, "to_device", killed_in_step_6)
    with pytest.raises(Killed):
        main(args)
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0
    assert not (tmp_path / "model.incomplete").exists()
    shown = tensorboard_scalars(tmp_path / "model" / "runs")
    records = [json.loads(line) for line in (tmp_path / "model" / "log.jsonl").read_text().splitlines()]
    assert shown == logged_scalars(records)
    assert [step for step, _ in shown["train/loss"]] == list(range(1, 9))
    assert [step for step, _ in shown["eval/perplexity"]] == [4, 8]
    assert {"train/learning_rate", "train/mlm_accuracy", "train/sentence_pair_accuracy", "eval/loss",
            "eval/accuracy"} <= set(shown)


def test_report_to_tensorboard_without_the_package_is_one_line_before_any_work(corpus, tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what `import tensorboard` meets where it isn't installed
    assert main(train_args(corpus, tmp_path / "out", "--report-to", "tensorboard")) == 1
    assert capsys.readouterr().err == ("bertforge: error: --report-to tensorboard needs the tensorboard package: "
                                       "pip install 'bertforge[tensorboard]'\n")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()
