"""Reranking (`finetune --task rerank`): the ranking metrics against sentence-transformers' reranking evaluator, the
rows it reads, and a run on real questions and passages (SQuAD's sentences) that learns to rank the sentence holding
the answer, scored by sentence-transformers on the folder it writes as bertforge scores it."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.errors import InputError
from bertforge.tasks.data import Columns, TextExample
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.tasks.metrics import compute_metrics
from bertforge.tasks.registry import get_task, sequence_task
from bertforge.tasks.reranking import read_examples, score
from bertforge.training.trainer import TrainConfig

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def squad_sentence_rows(data_dir: Path, first: int, count: int) -> list[dict]:
    """Answer-sentence selection from SQuAD v1.1 dev (as QNLI is made from SQuAD): the first question of each
    paragraph with every sentence of its passage, label 1 for the sentence where the answer starts. Paragraphs
    `first` to `first + count`."""
    paragraphs = [paragraph for article in json.loads((data_dir / "squad" / "dev-v1.1.json").read_text())["data"]
                  for paragraph in article["paragraphs"]][first:first + count]
    rows = []
    for paragraph in paragraphs:
        context, question = paragraph["context"], paragraph["qas"][0]
        answer_start, start = question["answers"][0]["answer_start"], 0
        for sentence in SENTENCE_END.split(context):
            start = context.index(sentence, start)
            rows.append({"query": question["question"], "document": sentence,
                         "label": int(start <= answer_start < start + len(sentence))})
            start += len(sentence)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def evaluator_samples(rows: list[dict]) -> list[dict]:
    """sentence-transformers' reranking samples: each query with its relevant and other documents."""
    samples: dict[str, dict] = {}
    for row in rows:
        sample = samples.setdefault(row["query"], {"query": row["query"], "positive": [], "negative": []})
        sample["positive" if row["label"] >= 0.5 else "negative"].append(row["document"])
    return list(samples.values())


# --- metrics --------------------------------------------------------------------------------------------------

query_rankings = st.lists(st.integers(1, 14).flatmap(lambda documents: st.tuples(
    st.lists(st.floats(-5, 5), min_size=documents, max_size=documents, unique=True),
    st.lists(st.integers(0, 1), min_size=documents, max_size=documents))), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(query_rankings)
def test_ranking_metrics_equal_sentence_transformers_reranking_evaluator(queries):
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    reference = CrossEncoderRerankingEvaluator([{"query": "q", "positive": ["p"], "negative": ["n"]}], at_k=10)
    expected = np.mean([reference.compute_metrics(relevance, np.array(scores)) for scores, relevance in queries], 0)
    metrics = compute_metrics("reranking", [scores for scores, _ in queries], [relevance for _, relevance in queries])
    assert [metrics["mrr@10"], metrics["ndcg@10"], metrics["map"]] == pytest.approx(expected.tolist(), abs=1e-12)


def test_ranking_metrics_by_hand():
    # relevant at ranks 2 and 3 of 3: MRR 1/2; DCG 1/log2(3) + 1/2 over the ideal 1 + 1/log2(3); AP (1/2 + 2/3) / 2
    metrics = compute_metrics("reranking", [[0.9, 0.5, 0.1]], [[0, 1, 1]])
    ideal = 1 + 1 / np.log2(3)
    assert metrics == pytest.approx({"mrr@10": 0.5, "ndcg@10": (1 / np.log2(3) + 0.5) / ideal, "map": 7 / 12})
    # past the tenth rank nothing counts for MRR and NDCG; MAP still sees it
    past = compute_metrics("reranking", [list(range(11, 0, -1))], [[0] * 10 + [1]])
    assert past == pytest.approx({"mrr@10": 0.0, "ndcg@10": 0.0, "map": 1 / 11})


def test_score_leaves_out_queries_without_a_relevant_document():
    examples = [TextExample("a", "x", 1.0), TextExample("a", "y", 0.0), TextExample("b", "z", 0.0),
                TextExample("c", "w", 0.0), TextExample("c", "v", 0.7)]
    metrics = score([{"score": s} for s in (0.2, 0.9, 0.5, 0.1, 0.3)], examples, {0: "LABEL_0"})
    # query a: its relevant x second; b: none relevant, left out; c: the soft label 0.7 counts, ranked first
    assert metrics == pytest.approx({"mrr@10": 0.75, "map": 0.75, "ndcg@10": (1 / np.log2(3) + 1) / 2})
    with pytest.raises(InputError, match=r"no query of the 2 has a relevant document \(a label of 0.5 or more\)"):
        score([{"score": 0.5}] * 2, [TextExample("a", "x", 0.2), TextExample("b", "y", 0.0)], {0: "LABEL_0"})


# --- reading --------------------------------------------------------------------------------------------------

def test_reads_labeled_pairs_and_labeled_lists(tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"anchor": "q1", "answer": "d1", "label": 1},
                                                   {"anchor": "q1", "answer": "d2", "label": 0.25}])
    assert read_examples(pairs) == [TextExample("q1", "d1", 1.0, 1), TextExample("q1", "d2", 0.25, 2)]
    lists = write_jsonl(tmp_path / "lists.jsonl", [{"query": "q1", "docs": ["d1", "d2"], "labels": [0, 1]},
                                                   {"query": "q2", "docs": ["d3"], "labels": [1]}])
    assert read_examples(lists) == [TextExample("q1", "d1", 0.0, 1), TextExample("q1", "d2", 1.0, 1),
                                    TextExample("q2", "d3", 1.0, 2)]
    assert [example.label for example in read_examples(lists, labelled=False)] == [None, None, None]
    named = tmp_path / "named.tsv"
    named.write_text("question_text\tsentence_text\trelevant\nq\td\t1\n", encoding="utf-8")
    assert read_examples(named, Columns("question_text", "sentence_text", "relevant")) == \
        [TextExample("q", "d", 1.0, 2)]


PAIR = {"query": "q", "document": "d", "label": 1}
LIST = {"query": "q", "docs": ["a", "b"], "labels": [1, 0]}


@pytest.mark.parametrize("first, row, message", [
    (PAIR, {**PAIR, "label": 3}, r"line 2, field 'label': relevance label 3 is outside \[0, 1\]: a reranker learns 0 "
                                 r"\(not relevant\) to 1 \(relevant\)"),
    (PAIR, {**PAIR, "label": "yes"}, r"line 2, field 'label': relevance label \"yes\" is not a number"),
    (PAIR, {"query": "q", "document": "d"}, r"line 2, field 'label': missing value"),
    (LIST, {**LIST, "labels": [1]}, r"line 2, field 'labels': 1 labels for 2 documents"),
    (LIST, {**LIST, "docs": ["a", 7]}, r"line 2, field 'docs': expected a text or a list of texts"),
    (LIST, {**LIST, "labels": [1, 1.5]}, r"line 2, field 'labels': relevance label 1.5 is outside \[0, 1\]"),
])
def test_bad_rows_are_refused_by_line_and_field(tmp_path, first, row, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [first, row])
    with pytest.raises(InputError, match=message):
        read_examples(path)


def test_a_file_without_a_document_column_lists_its_columns(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"query": "q", "title": "d", "label": 1}])
    with pytest.raises(InputError, match=r"no column 'document' or .*'passage'.* \(the documents\); the file has "
                                         r"'query', 'title', 'label'"):
        read_examples(path)


def test_rows_of_a_query_its_positive_and_negatives_read_as_the_labeled_pairs_they_make(tmp_path):
    """mine_hard_negatives' n-tuples (and finetune-embeddings' triplets): the positive relevant, each negative not,
    as its output_format="labeled-pair" writes the same mining."""
    path = write_jsonl(tmp_path / "rows.jsonl", [
        {"anchor": "q1", "positive": "p1", "negative_1": "n1", "negative_2": "n2"},
        {"anchor": "q2", "positive": "p2", "negative_1": "n3", "negative_2": "n4"}])
    assert read_examples(path) == [TextExample("q1", "p1", 1.0, 1), TextExample("q1", "n1", 0.0, 1),
                                   TextExample("q1", "n2", 0.0, 1), TextExample("q2", "p2", 1.0, 2),
                                   TextExample("q2", "n3", 0.0, 2), TextExample("q2", "n4", 0.0, 2)]
    assert [(e.text_pair, e.label) for e in read_examples(path, labelled=False)] == [
        ("p1", None), ("n1", None), ("n2", None), ("p2", None), ("n3", None), ("n4", None)]
    triplets = tmp_path / "triplets.csv"
    triplets.write_text("query,positive,negative\nq,p,n\n", encoding="utf-8")
    assert read_examples(triplets) == [TextExample("q", "p", 1.0, 2), TextExample("q", "n", 0.0, 2)]
    lists = write_jsonl(tmp_path / "lists.jsonl", [{"query": "q", "positive": "p", "negatives": ["n1", "n2"]}])
    assert [e.label for e in read_examples(lists)] == [1.0, 0.0, 0.0]
    missing = write_jsonl(tmp_path / "missing.jsonl", [{"anchor": "q", "positive": "p", "negative_1": "n"},
                                                       {"anchor": "q", "positive": "p"}])
    with pytest.raises(InputError, match=r"line 2, field 'negative_1': missing value"):
        read_examples(missing)
    scored = write_jsonl(tmp_path / "scored.jsonl", [{"anchor": "q", "positive": "p", "negative_1": "n",
                                                      "scores": [0.9, 0.4]}])  # the miner's similarities
    assert read_examples(scored) == [TextExample("q", "p", 1.0, 1), TextExample("q", "n", 0.0, 1)]
    labelled = write_jsonl(tmp_path / "labelled.jsonl", [{"query": "q", "positive": "p", "negative": "n", "label": 1}])
    assert read_examples(labelled, Columns("query", "positive", "label")) == [TextExample("q", "p", 1.0, 1)]


def test_mined_hard_negatives_train_and_score_a_reranker_in_every_layout(minilm_dir, tiny_model_dir, data_dir,
                                                                          run_cli, tmp_path):
    """What mine_hard_negatives writes, whichever output_format (the n-tuples with the miner's scores beside them
    too), is rows a reranker trains and is evaluated on: each of a question's documents once, its positive relevant."""
    from bertforge import SentenceEncoder
    from bertforge.inference import mine_hard_negatives

    answers = [row for row in squad_sentence_rows(data_dir, 0, 30) if row["label"] == 1]
    dataset = {"anchor": [row["query"] for row in answers], "positive": [row["document"] for row in answers]}
    encoder, files = SentenceEncoder(minilm_dir), {}
    for layout, scores in (("n-tuple", True), ("triplet", False), ("labeled-pair", False), ("labeled-list", False)):
        mined = mine_hard_negatives(dataset, encoder, num_negatives=2, output_format=layout, output_scores=scores,
                                    verbose=False)
        rows = [dict(zip(mined, row)) for row in zip(*mined.values())]
        files[layout] = write_jsonl(tmp_path / f"{layout}.jsonl", rows)
    pairs = {layout: sorted({(e.text, e.text_pair, e.label) for e in read_examples(path)})
             for layout, path in files.items()}
    assert pairs["n-tuple"] == pairs["triplet"] == pairs["labeled-pair"] == pairs["labeled-list"]
    assert {label for _, _, label in pairs["n-tuple"]} == {0.0, 1.0}
    code, out, err = run_cli("finetune", "--task", "rerank", "--model", tiny_model_dir, "--train", files["n-tuple"],
                             "--dev", files["triplet"], "--max-steps", "2", "--max-length", "64",
                             "--output", tmp_path / "model", "--no-progress")
    assert code == 0, err
    best = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert set(best.get("best", best)) >= {"map", "mrr@10", "ndcg@10"}


def test_training_data_of_one_kind_of_document_is_refused_before_anything_is_written(run_cli, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"query": "q", "document": "a", "label": 1},
                                                   {"query": "q", "document": "b", "label": 0.9}])
    code, _, err = run_cli("finetune", "--task", "rerank", "--train", train, "--output", tmp_path / "model")
    assert code == 1 and err.count("\n") == 1, err
    assert f"{train}: every document of the training data is relevant (labels at least 0.5)" in err
    assert not (tmp_path / "model").exists()


def test_one_sigmoid_output_is_a_reranker():
    assert sequence_task(1, "multi_label_classification") == "rerank"
    assert sequence_task(1, "regression") == sequence_task(1, None) == "regression"  # MS MARCO's say nothing
    assert sequence_task(3, "multi_label_classification") == "multi_label"
    assert get_task("rerank").problem_type == "multi_label_classification"


# --- a run on real text ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def squad_reranker(data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("squad-reranker")
    train = write_jsonl(folder / "train.jsonl", squad_sentence_rows(data_dir, 0, 160))
    dev_rows = squad_sentence_rows(data_dir, 600, 100)
    dev = write_jsonl(folder / "dev.jsonl", dev_rows)
    finetune(FinetuneConfig(task="rerank", train=str(train), dev=str(dev), output=str(folder / "model"),
                            training=TrainConfig(epochs=2, lr=1e-4, warmup_ratio=0.1, progress=False, seed=0)))
    return folder / "model", dev, dev_rows


def expected_random_mrr(rows: list[dict]) -> float:
    """MRR@10 of ranking each query's sentences at random, one relevant among n: the mean of 1/k over k <= n."""
    sentences = defaultdict(int)
    for row in rows:
        sentences[row["query"]] += 1
    return float(np.mean([sum(1 / k for k in range(1, min(n, 10) + 1)) / n for n in sentences.values()]))


def test_rerank_learns_to_find_the_answer_sentence(squad_reranker):
    folder, _, dev_rows = squad_reranker
    metrics = json.loads((folder / "metrics.json").read_text())
    best = metrics["best"] if "best" in metrics else metrics
    assert best["mrr@10"] > expected_random_mrr(dev_rows) + 0.15, best


def test_sentence_transformers_scores_the_folder_as_bertforge_does(squad_reranker, run_cli):
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    folder, dev, dev_rows = squad_reranker
    theirs = CrossEncoderRerankingEvaluator(evaluator_samples(dev_rows), at_k=10)(CrossEncoder(str(folder),
                                                                                                  device="cpu"))
    code, out, _ = run_cli("evaluate", "--model", str(folder), "--data", str(dev))
    assert code == 0, out
    ours = json.loads((folder / "eval_results.json").read_text())
    assert {name: ours[name] for name in ("map", "mrr@10", "ndcg@10")} == pytest.approx(theirs, abs=1e-6)


def test_every_entry_point_gives_the_reranker_s_sigmoid(squad_reranker, run_cli, tmp_path):
    from fastapi.testclient import TestClient
    from sentence_transformers import CrossEncoder

    from bertforge.inference.serve.app import load_app

    folder, dev, dev_rows = squad_reranker
    rows = dev_rows[:6]
    theirs = CrossEncoder(str(folder), device="cpu").predict([(row["query"], row["document"]) for row in rows])
    code, out, _ = run_cli("predict", "--model", str(folder), "--input", str(write_jsonl(tmp_path / "in.jsonl", rows)),
                           "--output", str(tmp_path / "out.jsonl"))
    assert code == 0, out
    predicted = [json.loads(line)["score"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert predicted == pytest.approx(theirs.tolist(), abs=1e-5)
    query = rows[0]["query"]
    texts = [row["document"] for row in rows if row["query"] == query]
    with TestClient(load_app(str(folder))) as client:
        ranked = client.post("/rerank", json={"query": query, "texts": texts}).json()
        raw = client.post("/rerank", json={"query": query, "texts": texts, "raw_scores": True}).json()
    scores = dict(zip(texts, theirs.tolist()))
    assert sorted(item["score"] for item in ranked) == pytest.approx(sorted(scores.values()), abs=1e-5)
    assert {item["index"]: item["score"] for item in raw} == pytest.approx(
        {item["index"]: float(np.log(item["score"] / (1 - item["score"]))) for item in ranked}, abs=1e-4)
    code, _, err = run_cli("predict", "--model", str(folder), "--text", query)
    assert code == 1 and "is a reranker, which scores a query and a document: give --text-pair too" in err


def test_a_reranker_from_elsewhere_is_evaluated_as_one(squad_reranker, run_cli, tmp_path):
    """An MS MARCO cross-encoder's config.json says no problem_type: it reads as a regressor unless --task rerank."""
    import shutil

    folder, dev, _ = squad_reranker
    plain = shutil.copytree(folder, tmp_path / "plain", ignore=shutil.ignore_patterns("finetune_config.json"))
    config = json.loads((plain / "config.json").read_text())
    config.pop("problem_type"), config.pop("finetuning_task"), config.pop("bertforge_finetune", None)
    (plain / "config.json").write_text(json.dumps(config))
    code, out, _ = run_cli("evaluate", "--model", plain, "--data", dev, "--task", "rerank", "--output", "-")
    assert code == 0, out
    metrics = json.loads(out[out.index("{"):])
    expected = json.loads((folder / "metrics.json").read_text())["best"]
    assert {name: metrics[name] for name in ("map", "mrr@10", "ndcg@10")} == pytest.approx(
        {name: expected[name] for name in ("map", "mrr@10", "ndcg@10")}, abs=1e-6)


def test_a_reranker_distills_into_a_reranker_gated_by_ndcg(squad_reranker, data_dir, run_cli, tmp_path):
    folder, dev, _ = squad_reranker
    train = write_jsonl(tmp_path / "train.jsonl", squad_sentence_rows(data_dir, 0, 20))
    code, out, err = run_cli("distill", "--teacher", folder, "--train", train, "--dev", dev, "--output",
                             tmp_path / "student", "--student-layers", "2", "--max-steps", "4", "--max-drop", "100",
                             "--no-progress")
    assert code == 0, err
    assert "ndcg@10" in out
    config = json.loads((tmp_path / "student" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["problem_type"], config["finetuning_task"]) == \
        (2, "multi_label_classification", "rerank")
