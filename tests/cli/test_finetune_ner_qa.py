"""`bertforge finetune --task ner|qa`, `evaluate` and `predict` end to end on a tiny model and tiny files, and
their one-line errors."""

import json

import pytest

from bertforge.cli import evaluate as evaluate_cli
from bertforge.cli import finetune as finetune_cli
from bertforge.cli import predict as predict_cli
from bertforge.cli.main import main
from bertforge.errors import BertforgeError

CONLL = "".join("".join(f"{word} X X {tag}\n" for word, tag in sentence) + "\n" for sentence in [
    [("John", "B-PER"), ("Smith", "I-PER"), ("lives", "O"), ("in", "O"), ("Paris", "B-LOC"), (".", "O")],
    [("Mary", "B-PER"), ("visited", "O"), ("Berlin", "B-LOC")],
] * 3)
SQUAD = {"data": [{"title": "t", "paragraphs": [{"context": "Rollo led the Normans in 911. They settled in France.",
                                                 "qas": [
    {"id": "1", "question": "Who led the Normans?", "answers": [{"text": "Rollo", "answer_start": 0}]},
    {"id": "2", "question": "Where did they settle?", "answers": [{"text": "France", "answer_start": 46}]}]}]}]}


def test_ner_finetune_evaluate_predict(tiny_model_dir, tmp_path, run_command):
    conll = tmp_path / "train.conll"
    conll.write_text(CONLL)
    output = tmp_path / "ner"
    code, out = run_command(finetune_cli, "--task", "ner", "--model", tiny_model_dir, "--train", conll,
                            "--dev", conll, "--output", output, "--epochs", "1", "--max-length", "16",
                            "--batch-size", "2", "--no-progress")
    assert code == 0 and "best model" in out and "f1=" in out
    assert json.loads((output / "finetune_config.json").read_text())["task"] == "ner"
    code, out = run_command(evaluate_cli, "--model", output, "--data", conll)
    results = json.loads((output / "eval_results.json").read_text())
    assert code == 0 and set(results) >= {"precision", "f1"} and results["decoding"] == "argmax"
    # The entity precision beside the inference option of the same name, neither in the other's place.
    assert isinstance(results["precision"], float) and results["inference"]["precision"] == "fp32"
    # Each entity type's scores, with its entities in the file (2 PER and 2 LOC a copy, 3 copies) as support.
    assert {label: row["support"] for label, row in results["per_label"].items()} == {"LOC": 6, "PER": 6}
    assert "label         precision  recall      f1  support" in out and "weighted avg" in out
    code, out = run_command(evaluate_cli, "--model", output, "--data", conll, "--decoding", "viterbi")
    assert code == 0 and json.loads((output / "eval_results.json").read_text())["decoding"] == "viterbi"
    code, out = run_command(predict_cli, "--model", output, "--text", "John Smith lives in Paris.",
                            "--decoding", "viterbi")
    assert code == 0 and out.strip()
    code, out = run_command(predict_cli, "--model", output, "--text", "John Smith lives in Paris.")
    assert code == 0 and out.strip()
    texts = tmp_path / "texts.txt"
    texts.write_text("John Smith lives in Paris.\nMary visited Berlin\n")
    predictions = tmp_path / "out.jsonl"
    code, _ = run_command(predict_cli, "--model", output, "--input", texts, "--output", predictions)
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    # Each prediction echoes the user's own text, not a re-joined copy of its words.
    assert code == 0 and [row["text"] for row in rows] == ["John Smith lives in Paris.", "Mary visited Berlin"]
    assert [len(row["tags"]) for row in rows] == [6, 3] and all(isinstance(row["entities"], list) for row in rows)


def test_qa_finetune_evaluate_predict(tiny_model_dir, tmp_path, run_command):
    squad = tmp_path / "train.json"
    squad.write_text(json.dumps(SQUAD))
    output = tmp_path / "qa"
    code, out = run_command(finetune_cli, "--task", "qa", "--model", tiny_model_dir, "--train", squad,
                            "--dev", squad, "--output", output, "--epochs", "1", "--max-length", "32",
                            "--doc-stride", "8", "--max-query-length", "8", "--batch-size", "2", "--no-progress")
    assert code == 0 and "exact_match=" in out
    code, out = run_command(evaluate_cli, "--model", output, "--data", squad)
    assert code == 0 and set(json.loads((output / "eval_results.json").read_text())) >= {"exact_match", "f1"}
    context = SQUAD["data"][0]["paragraphs"][0]["context"]
    code, out = run_command(predict_cli, "--model", output, "--question", "Who led them?", "--context",
                            context)
    assert code == 0 and "score" in out
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": "a", "question": "Who led them?", "context": context}) + "\n")
    predictions = tmp_path / "out.jsonl"
    code, _ = run_command(predict_cli, "--model", output, "--input", questions, "--output", predictions)
    row = json.loads(predictions.read_text())
    assert code == 0 and row["id"] == "a" and context[row["start"]:row["end"]] == row["answer"]
    assert len(row["n_best"]) >= 1


def test_a_v1_model_is_scored_on_v2_data_with_version_2(tiny_model_dir, tmp_path, run_command, run_cli):
    """A SQuAD v1.1 model on v2.0 data (run_qa's --version_2_with_negative at evaluation): refused as trained,
    scored by v2.0's rules with --version-2, where it may abstain; evaluate's scores are those of predict's answers."""
    from bertforge.tasks.metrics import squad_v2_exact_match, squad_v2_f1
    squad = tmp_path / "train.json"
    squad.write_text(json.dumps(SQUAD))
    model = tmp_path / "qa"
    code, _ = run_command(finetune_cli, "--task", "qa", "--model", tiny_model_dir, "--train", squad, "--output",
                          model, "--max-steps", "2", "--max-length", "32", "--doc-stride", "8",
                          "--max-query-length", "8", "--no-progress")
    v2 = json.loads(json.dumps(SQUAD))
    questions = v2["data"][0]["paragraphs"][0]["qas"]
    questions.append({"id": "3", "question": "Who was king?", "answers": [], "is_impossible": True})
    dev = tmp_path / "dev-v2.json"
    dev.write_text(json.dumps(v2))
    code, _, err = run_cli("evaluate", "--model", model, "--data", dev)
    assert code == 1 and "question 3 (article" in err and "is unanswerable" in err and "evaluate --version-2" in err
    code, _, _ = run_cli("evaluate", "--model", model, "--data", dev, "--version-2", "--output", tmp_path / "v2.json")
    record = json.loads((tmp_path / "v2.json").read_text())
    assert code == 0 and record["version_2"] is True and record["examples"] == 3
    code, _, _ = run_cli("predict", "--model", model, "--input", dev, "--version-2", "--output", tmp_path / "p.jsonl")
    answers = [json.loads(line)["answer"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    gold = [[answer["text"] for answer in question["answers"]] for question in questions]
    assert record["exact_match"] == pytest.approx(squad_v2_exact_match(answers, gold))
    assert record["f1"] == pytest.approx(squad_v2_f1(answers, gold))
    assert record["no_answer_exact_match"] == float(answers[2] == "")  # its one unanswerable question
    # --no-version-2 reads as v1.1 whatever the model; a task without the setting says so.
    code, _, err = run_cli("evaluate", "--model", model, "--data", dev, "--no-version-2")
    assert code == 1 and "is unanswerable" in err
    conll = tmp_path / "train.conll"
    conll.write_text(CONLL)
    run_command(finetune_cli, "--task", "ner", "--model", tiny_model_dir, "--train", conll, "--output",
                tmp_path / "ner", "--max-steps", "1", "--max-length", "16", "--no-progress")
    code, _, err = run_cli("evaluate", "--model", tmp_path / "ner", "--data", conll, "--version-2")
    assert code == 1 and "version_2 is no setting of task ner: its settings are" in err


def test_errors_are_one_line(run_command, tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.conll"
    bad.write_text("John BPER\n")
    code = main(["finetune", "--task", "ner", "--model", str(tiny_model_dir), "--train", str(bad),
                 "--output", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert code == 1 and error.count("\n") == 1 and "bad.conll" in error and "is not an entity tag" in error
    squad = tmp_path / "v2.json"
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "x", "qas": [
        {"id": "q", "question": "?", "answers": [], "is_impossible": True}]}]}]}))
    code = main(["finetune", "--task", "qa", "--model", str(tiny_model_dir), "--train", str(squad),
                 "--output", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert code == 1 and error.count("\n") == 1 and "unanswerable" in error
    with pytest.raises(BertforgeError, match="--question and --context go together"):
        run_command(predict_cli, "--model", tiny_model_dir, "--question", "who?")
    with pytest.raises(BertforgeError, match="max_length=32 with max_query_length=64"):
        run_command(finetune_cli, "--task", "qa", "--model", tiny_model_dir, "--train", squad,
                    "--version-2", "--output", tmp_path / "out", "--max-length", "32")
