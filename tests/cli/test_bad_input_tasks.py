"""A model asked for what it wasn't trained to do, and flags that don't go together: the real `bertforge` command
(main(argv)) ends with exit status 1 and one line naming the flag, model or file at fault, and writes nothing."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge import BertConfig
from bertforge.cli import main as cli_main
from bertforge.errors import ConfigError, InputError
from bertforge.heads import BertForSequenceClassification
from bertforge.tasks.checkpoint_contents import inspect_checkpoint
from bertforge.tasks.classification import ClassificationSettings, encode
from bertforge.tasks.data import TextExample

pytestmark = pytest.mark.usefixtures("one_thread")

REVIEWS = [("a joy from start to finish", "pos"), ("dull and lifeless", "neg"), ("warm , witty and wise", "pos"),
           ("an utter mess", "neg")] * 2
SCORES = [("a joy from start to finish", 4.5), ("dull and lifeless", 1.0), ("warm , witty and wise", 4.0),
          ("an utter mess", 0.5)] * 2


def assert_one_line_error(code, out, err, *fragments):
    assert code == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertforge"), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    """A classifier (pos, neg) and a regressor fine-tuned from the tiny encoder, and their data files."""
    root, encoder = tmp_path_factory.mktemp("bad_input_tasks"), tiny_model_dir
    (root / "reviews.csv").write_text("sentence,label\n" + "".join(f'"{t}",{label}\n' for t, label in REVIEWS))
    (root / "scores.csv").write_text("sentence,label\n" + "".join(f'"{t}",{score}\n' for t, score in SCORES))
    (root / "lines.txt").write_text("a cat on a mat\na dog in the fog\n")
    for task, data in (("classification", "reviews.csv"), ("regression", "scores.csv")):
        code = cli_main.main(["--threads", "1", "finetune", "--task", task, "--model", str(encoder), "--train",
                              str(root / data), "--output", str(root / task), "--epochs", "1", "--batch-size", "4",
                              "--max-length", "16", "--no-progress", "--device", "cpu"])
        assert code == 0
    return root


@pytest.mark.parametrize("model, task, data", [("classification", "regression", "reviews.csv"),
                                               ("classification", "multi_label", "reviews.csv"),
                                               ("regression", "classification", "scores.csv")])
def test_evaluate_refuses_a_task_the_model_was_not_trained_for(world, tmp_path, run_cli, model, task, data):
    assert_one_line_error(*run_cli("evaluate", "--model", world / model, "--data", world / data, "--task",
                                   task, "--output", tmp_path / "m.json"),
                          f"the model was fine-tuned for {model}, not {task}", f"--task {task}")
    assert not (tmp_path / "m.json").exists()


def test_evaluate_takes_the_models_own_task_named(world, tmp_path, run_cli):
    code, out, err = run_cli("evaluate", "--model", world / "regression", "--data", world / "scores.csv",
                             "--task", "regression", "--output", tmp_path / "m.json")
    assert code == 0, err
    assert "spearman" in out


def test_an_undefined_metric_is_written_as_standard_json(tmp_path, run_cli, tokenizer):
    """Predictions all equal (a regression head of zero weights) leave the correlations undefined (NaN, as scipy
    says): eval_results.json holds null there, which every JSON reader takes, not Python's bare NaN. Targets all
    equal (the Hub's STS-B test split, -1 everywhere) are refused: a split without labels."""
    model = BertForSequenceClassification(BertConfig.tiny(vocab_size=tokenizer.vocab_size, id2label={0: "LABEL_0"},
                                                          problem_type="regression"))
    with torch.no_grad():
        model.classifier.weight.zero_()
    model.save_pretrained(tmp_path / "flat-model")
    tokenizer.save_pretrained(tmp_path / "flat-model")
    (tmp_path / "scores.csv").write_text("sentence,label\n" + "".join(f'"{t}",{s}\n' for t, s in SCORES))
    code, out, err = run_cli("evaluate", "--model", tmp_path / "flat-model", "--data", tmp_path / "scores.csv",
                             "--output", tmp_path / "m.json")
    assert code == 0, err
    (tmp_path / "flat.csv").write_text("sentence,label\n" + "".join(f'"{t}",-1\n' for t, _ in SCORES))
    code, out, err = run_cli("evaluate", "--model", tmp_path / "flat-model", "--data", tmp_path / "flat.csv")
    assert code == 1 and "flat.csv, field 'label': every score is -1: a split without labels?" in err

    def refuse(constant):
        raise AssertionError(f"{constant} in eval_results.json")

    results = json.loads((tmp_path / "m.json").read_text(), parse_constant=refuse)
    assert results["pearson"] is None and results["spearman"] is None
    assert results["examples"] == len(SCORES)


def test_a_classifier_from_elsewhere_may_be_read_as_multi_label(tmp_path, tokenizer):
    """Without a run config or problem_type a multi-label head looks like a classifier's: --task multi_label may say
    what it is; regression, whose one output it doesn't have, is still refused."""
    torch.manual_seed(0)
    labels = {0: "grain", 1: "trade", 2: "oil"}
    BertForSequenceClassification(BertConfig.tiny(vocab_size=tokenizer.vocab_size, id2label=labels)
                                  ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    checkpoint = inspect_checkpoint(tmp_path)
    assert checkpoint.task_for("multi_label").name == "multi_label"
    with pytest.raises(ConfigError, match="fine-tuned for classification, not regression"):
        checkpoint.task_for("regression")


def test_distill_checks_the_training_labels_against_the_teachers(world, tmp_path, run_cli):
    (tmp_path / "train.csv").write_text("sentence,label\ngood,positive\nbad,negative\n")
    assert_one_line_error(*run_cli("distill", "--teacher", world / "classification", "--train",
                                   tmp_path / "train.csv", "--dev", world / "reviews.csv", "--student-layers", "1",
                                   "--output", tmp_path / "student"),
                          f"{tmp_path / 'train.csv'}, line 2, field 'label': label 'positive' is not one of the "
                          "model's labels (neg, pos)")
    assert not (tmp_path / "student").exists()


def test_examples_in_memory_with_an_unknown_label_are_one_line(tokenizer):
    with pytest.raises(InputError, match=r"label 'maybe' is not one of the model's labels \(neg, pos\)"):
        encode(tokenizer, [TextExample("fine", None, "maybe")], ClassificationSettings(), {0: "neg", 1: "pos"})
    with pytest.raises(InputError, match="a regression target must be a number, got 'pos'"):
        encode(tokenizer, [TextExample("fine", None, "pos")], ClassificationSettings(), {0: "LABEL_0"})


def test_distill_refuses_a_task_other_than_the_teachers(world, tmp_path, run_cli):
    assert_one_line_error(*run_cli("distill", "--teacher", world / "classification", "--train",
                                   world / "scores.csv", "--task", "regression", "--student-layers", "1",
                                   "--output", tmp_path / "student"),
                          "--task regression", "fine-tuned for classification")
    assert not (tmp_path / "student").exists()


def test_predict_refuses_a_question_for_a_classifier(world, run_cli):
    assert_one_line_error(*run_cli("predict", "--model", world / "classification", "--question",
                                   "Who?", "--context", "Nobody."),
                          "wrong task", "does classification", "--question and --context are for")


def test_a_negative_max_drop_asks_for_a_gain(world, tmp_path, run_cli):
    """--max-drop -100: the smaller model would have to gain 100 points, which it can't; said as a gain."""
    code, out, err = run_cli("quantize", "--model", world / "classification", "--dev",
                             world / "reviews.csv", "--max-drop", "-100", "--output", tmp_path / "int8")
    assert code == 1, err
    assert "short of the gain of at least 100.0 asked for (--max-drop -100.0): nothing written" in out
    assert not (tmp_path / "int8").exists()


def test_metric_for_best_model_needs_a_dev_set(tiny_model_dir, world, tmp_path, run_cli):
    assert_one_line_error(*run_cli("finetune", "--model", tiny_model_dir, "--train",
                                   world / "reviews.csv", "--metric-for-best-model", "loss", "--output",
                                   tmp_path / "model", "--no-progress", "--device", "cpu"),
                          "--metric-for-best-model loss", "--dev")
    assert not (tmp_path / "model").exists()


def test_metric_for_best_model_is_checked_against_the_labels_before_training(tiny_model_dir, world, tmp_path,
                                                                              run_cli):
    # Two labels give f1, not macro_f1 (which more labels give): known from the training file, before any step.
    assert_one_line_error(*run_cli("finetune", "--model", tiny_model_dir, "--train", world / "reviews.csv",
                                   "--dev", world / "reviews.csv", "--metric-for-best-model", "macro_f1",
                                   "--output", tmp_path / "model", "--no-progress", "--device", "cpu"),
                          "--metric-for-best-model macro_f1", "2 labels", "accuracy, f1, matthews_correlation")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, fragment", [(["--output", "{T}/e.npy"], "not both"),
                                             (["--level", "word"], "--level word")])
def test_embed_similar_prints_a_ranking_only(tiny_model_dir, world, tmp_path, run_cli, flags, fragment):
    flags = [flag.replace("{T}", str(tmp_path)) for flag in flags]
    assert_one_line_error(*run_cli("embed", "--model", tiny_model_dir, "--input", world / "lines.txt",
                                   "--similar", "a cat", *flags), "--similar", fragment)
    assert not (tmp_path / "e.npy").exists()


def test_a_quantize_or_distill_output_that_is_a_file_is_named_a_file(tmp_path):
    from bertforge.compress.gate import check_output
    from bertforge.errors import InputError

    (tmp_path / "a_file").write_text("notes")
    with pytest.raises(InputError, match="exists and is a file; the output is a model folder"):
        check_output(tmp_path / "a_file")


def test_a_classifier_fine_tuned_again_for_other_labels_gets_a_new_head(world, tmp_path, run_cli, caplog):
    # The pos/neg classifier's encoder, a new three-label head (transformers: ignore_mismatched_sizes).
    rows = [(text, ("pos", "neg", "mixed")[i % 3]) for i, (text, _) in enumerate(REVIEWS)]
    (tmp_path / "three.csv").write_text("sentence,label\n" + "".join(f'"{t}",{label}\n' for t, label in rows))
    code, out, err = run_cli("finetune", "--model", world / "classification", "--train", tmp_path / "three.csv",
                             "--output", tmp_path / "three", "--epochs", "1", "--batch-size", "4",
                             "--max-length", "16", "--no-progress", "--device", "cpu")
    assert code == 0, err
    assert "newly initialised" in caplog.text and "classifier.weight" in caplog.text
    assert json.loads((tmp_path / "three" / "config.json").read_text())["id2label"] == {
        "0": "mixed", "1": "neg", "2": "pos"}


@pytest.mark.parametrize("flags, fragment", [(["--text-column", ""], "field '': no column ''"),
                                             (["--label-column", ""], "no column ''"),
                                             (["--label-separator", " "], "label_separator must be a visible")])
def test_evaluate_reads_a_blank_column_or_separator_as_given_as_fine_tuning_does(world, tmp_path, run_cli, flags,
                                                                                  fragment):
    """An empty column name is a name the file lacks, not 'the training run's column'; a blank label separator is
    refused. finetune says the same of both."""
    evaluate = ["evaluate", "--model", world / "classification", "--data", world / "reviews.csv"]
    assert_one_line_error(*run_cli(*evaluate, *flags, "--output", tmp_path / "m.json"), fragment)
    assert not (tmp_path / "m.json").exists()
    finetune = ["finetune", "--model", world / "classification", "--train", world / "reviews.csv"]
    assert_one_line_error(*run_cli(*finetune, *flags, "--output", tmp_path / "run", "--max-steps", "1"), fragment)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task, data, message", [
    ("classification", "sentence,label\na joy,pos\ndull,pos\n", "needs at least two labels in the training data"),
    ("ner", "EU B-ORG\nrejects O\n\nPeter B-PER\nsmiles O\n", None),  # learns: the control
    ("ner", "EU O\nrejects O\n\nPeter O\nsmiles O\n", "needs tags other than O in the training data"),
])
def test_training_data_without_labels_to_learn_is_refused_naming_the_file(world, tmp_path, run_cli, task, data,
                                                                         message):
    train = tmp_path / ("train.csv" if task == "classification" else "train.conll")
    train.write_text(data)
    result = run_cli("finetune", "--task", task, "--model", world / "classification", "--random-init", "--train",
                     train, "--output", tmp_path / "model", "--epochs", "1", "--max-length", "16", "--no-progress")
    if message is None:
        assert result[0] == 0, result[2]
        return
    assert_one_line_error(*result, f"{train}: ", message)
    assert not (tmp_path / "model").exists()
