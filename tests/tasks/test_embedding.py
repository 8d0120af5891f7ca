"""Fine-tuning sentence vectors: the losses and dev metrics against sentence-transformers' own on the real MiniLM
and real text, a run that learns on a slice of STS-B, and the folder it writes loaded by sentence-transformers."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from bertforge import SentenceEncoder
from bertforge.tasks.embedding import batches_without_repeats, read_rows, score_rows
from bertforge.training.embedding_losses import (
    EMBEDDING_LOSSES,
    InputExample,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)

SRC = Path(__file__).resolve().parents[2] / "src"


def stsb_rows(data_dir: Path, split: str, count: int) -> list[dict[str, str]]:
    with open(data_dir / "stsb" / f"{split}.tsv", encoding="utf-8") as file:
        return list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]


def mrpc_paraphrases(data_dir: Path, split: str, count: int) -> list[tuple[str, str]]:
    with open(data_dir / "mrpc" / f"{split}.tsv", encoding="utf-8-sig") as file:
        rows = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [(row[3], row[4]) for row in rows if row[0] == "1"][:count]


@pytest.fixture(scope="module")
def sentence_transformers():
    return pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def both_encoders(minilm_dir, sentence_transformers):
    """bertforge's and sentence-transformers' encoders of the real MiniLM, dropout off (so that the two passes
    compute the same thing), gradients on."""
    ours = SentenceEncoder(minilm_dir).eval()
    theirs = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu").eval()
    return ours, theirs


@pytest.mark.parametrize("name, columns, matryoshka", [
    ("multiple_negatives_ranking", 2, False), ("multiple_negatives_ranking", 3, False), ("cosent", 2, False),
    ("cosine_similarity", 2, False), ("multiple_negatives_ranking", 3, True), ("cosent", 2, True)])
def test_each_loss_and_its_gradients_are_sentence_transformers(both_encoders, sentence_transformers, data_dir,
                                                               name, columns, matryoshka):
    ours, theirs = both_encoders
    rows = stsb_rows(data_dir, "dev", 12)
    first, second = [row["sentence1"] for row in rows], [row["sentence2"] for row in rows]
    texts = [first, second, second[::-1]][:columns]  # the third column: another row's text, a hard negative
    scores = torch.tensor([float(row["score"]) for row in rows]) / 5  # cosine_similarity fits scores in [0, 1]
    losses = []
    their_losses = import_module("sentence_transformers.losses")
    their_loss = getattr(their_losses, EMBEDDING_LOSSES[name].__name__)
    pairs = [(ours, EMBEDDING_LOSSES[name](ours)), (theirs, their_loss(theirs))]
    if matryoshka:  # the leading 384, 128 and 32 dimensions, weighed unequally, given out of order
        pairs = [(pairs[0][0], MatryoshkaLoss(ours, pairs[0][1], [128, 384, 32], [0.5, 1, 2])),
                 (pairs[1][0], their_losses.MatryoshkaLoss(theirs, pairs[1][1], [128, 384, 32], [0.5, 1, 2]))]
    for encoder, loss in pairs:
        encoder.zero_grad()
        value = loss([encoder.preprocess(column) for column in texts], scores)
        value.backward()
        gradients = {key: parameter.grad.clone() for key, parameter in encoder.named_parameters()
                     if parameter.grad is not None}  # not the pooler's, which sentence vectors don't use
        losses.append((value.item(), gradients))
    (ours_value, ours_gradients), (their_value, their_gradients) = losses
    assert ours_value == pytest.approx(their_value, rel=1e-5, abs=1e-6)
    # The same parameters by position (the two name them differently): the embeddings' and every layer's.
    assert len(ours_gradients) == len(their_gradients) == 5 + 16 * 6
    for mine, theirs_ in zip(ours_gradients.values(), their_gradients.values(), strict=True):
        # float32 sums in another order (CoSENT's pairs: a table here, sorted running sums there) differ at 1e-6;
        # the attention keys' biases have no gradient in exact arithmetic (softmax ignores a shift of all scores),
        # so both sides hold rounding noise there, under 1e-6
        assert (mine - theirs_).norm() <= 1e-4 * theirs_.norm() + 1e-6


def test_the_dev_metrics_are_sentence_transformers_evaluators(minilm_dir, sentence_transformers, data_dir, tmp_path):
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator, InformationRetrievalEvaluator

    theirs = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    ours = SentenceEncoder(minilm_dir)
    rows = stsb_rows(data_dir, "dev", 200)
    scored = tmp_path / "scored.jsonl"
    scored.write_text("".join(json.dumps({"sentence1": row["sentence1"], "sentence2": row["sentence2"],
                                          "score": float(row["score"])}) + "\n" for row in rows))
    expected = EmbeddingSimilarityEvaluator([row["sentence1"] for row in rows], [row["sentence2"] for row in rows],
                                            [float(row["score"]) for row in rows], name="dev")(theirs)
    got = score_rows(ours, read_rows(scored), 64)
    assert got["spearman"] == pytest.approx(expected["dev_spearman_cosine"], abs=1e-4)
    assert got["pearson"] == pytest.approx(expected["dev_pearson_cosine"], abs=1e-4)

    # Retrieval: paraphrases, a hard negative per row, and an anchor asked twice with two positives.
    pairs = mrpc_paraphrases(data_dir, "dev", 150)
    pairs.append((pairs[0][0], pairs[1][1]))
    negatives = [pairs[(i + 7) % len(pairs)][1] for i in range(len(pairs))]
    unscored = tmp_path / "pairs.jsonl"
    unscored.write_text("".join(json.dumps({"anchor": a, "positive": p, "negative": n}) + "\n"
                                for (a, p), n in zip(pairs, negatives)))
    corpus = list(dict.fromkeys([p for _, p in pairs] + negatives))
    queries = list(dict.fromkeys(a for a, _ in pairs))
    relevant = {f"q{queries.index(a)}": set() for a in queries}
    for a, p in pairs:
        relevant[f"q{queries.index(a)}"].add(f"d{corpus.index(p)}")
    evaluator = InformationRetrievalEvaluator({f"q{i}": q for i, q in enumerate(queries)},
                                              {f"d{i}": d for i, d in enumerate(corpus)}, relevant, name="dev",
                                              score_functions={"cosine": sentence_transformers.util.cos_sim},
                                              accuracy_at_k=[1], mrr_at_k=[10], precision_recall_at_k=[10],
                                              ndcg_at_k=[10], map_at_k=[10])
    expected = evaluator(theirs)
    got = score_rows(ours, read_rows(unscored), 64)
    assert got["accuracy@1"] == pytest.approx(expected["dev_cosine_accuracy@1"], abs=1e-6)
    assert got["mrr@10"] == pytest.approx(expected["dev_cosine_mrr@10"], abs=1e-6)
    assert got["recall@10"] == pytest.approx(expected["dev_cosine_recall@10"], abs=1e-6)
    assert got["accuracy@1"] < 1  # the test set is not too easy to tell a wrong ranking from a right one


@pytest.fixture(scope="module")
def stsb_run(data_dir, tmp_path_factory, minilm_dir):
    """The command on 256 STS-B training pairs, read with [CLS] pooling (which MiniLM was not trained for), scored
    on 400 dev pairs before and after."""
    root = tmp_path_factory.mktemp("stsb-embeddings")
    dev = root / "dev.tsv"
    with open(data_dir / "stsb" / "dev.tsv", encoding="utf-8") as file:
        dev.write_text("".join(file.readlines()[:401]))
    output = root / "model"
    command = [sys.executable, "-m", "bertforge", "finetune-embeddings", "--train",
               str(data_dir / "stsb" / "train.tsv"), "--max-train-examples", "256", "--dev", str(dev),
               "--text-columns", "sentence1,sentence2", "--pooling", "cls", "--batch-size", "16",
               "--output", str(output), "--no-progress", "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, env={"PYTHONPATH": str(SRC), "PATH": ""},
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return output, done.stdout, dev


def test_a_run_learns_on_real_pairs_and_says_what_it_changed(stsb_run):
    output, printed, _ = stsb_run
    metrics = json.loads((output / "metrics.json").read_text())
    before, best = metrics["before"]["spearman"], metrics["best"]["spearman"]
    assert best > before + 0.005, (before, best)
    assert "loss: cosent" in printed
    assert f"starting model: spearman={before:.4f}" in printed
    assert json.loads((output / "1_Pooling" / "config.json").read_text())["pooling_mode_cls_token"] is True
    assert not (output / "checkpoint").exists()  # the optimizer's state goes once the run is over


def test_sentence_transformers_loads_the_folder_as_bertforge_does(stsb_run, sentence_transformers):
    output, _, dev = stsb_run
    texts = [row.split("\t")[7] for row in dev.read_text().splitlines()[1:9]]
    theirs = sentence_transformers.SentenceTransformer(str(output), device="cpu").encode(texts)
    ours = SentenceEncoder(output).encode(texts)
    assert theirs.shape == ours.shape == (8, 384)
    assert torch.allclose(torch.from_numpy(ours), torch.from_numpy(theirs), atol=1e-5)
    # and it is the kept model: the dev metric recorded for it is the one its vectors give
    rows = read_rows(dev, ("sentence1", "sentence2"))
    best = json.loads((output / "metrics.json").read_text())["best"]["spearman"]
    assert score_rows(SentenceEncoder(output), rows, 64)["spearman"] == pytest.approx(best, abs=1e-6)


def test_fit_trains_with_bertforge_losses_as_with_sentence_transformers_own(minilm_dir, data_dir):
    """SentenceEncoder.fit with a native loss (sentence-transformers not needed): the paraphrase pairs it trained
    on come out closer to each other than to the other rows' texts, more than before."""

    pairs = mrpc_paraphrases(data_dir, "train", 64)
    encoder = SentenceEncoder(minilm_dir)
    columns = [encoder.preprocess([pair[0] for pair in pairs]), encoder.preprocess([pair[1] for pair in pairs])]

    def held_loss() -> float:
        with torch.no_grad():
            return MultipleNegativesRankingLoss(encoder.eval())(columns, torch.zeros(len(pairs))).item()

    before = held_loss()
    loader = DataLoader([InputExample(pair) for pair in pairs], batch_size=16, shuffle=True)
    encoder.fit([(loader, MultipleNegativesRankingLoss(encoder))], epochs=2, warmup_steps=0,
                optimizer_params={"lr": 5e-5}, show_progress_bar=False)
    assert held_loss() < before * 0.9, (before, held_loss())


@settings(max_examples=200, deadline=None)
@given(anchors=st.lists(st.integers(0, 6), min_size=1, max_size=60), batch_size=st.integers(1, 9))
def test_in_batch_negatives_repeat_no_text_that_could_wait(anchors, batch_size):
    """Rows whose anchors repeat (a query asked with several positives): every row once, as many batches as a plain
    cut, and a batch holds a text twice only when every row not yet placed would repeat one of its texts."""
    texts = [(f"query {anchor}", f"answer {i}") for i, anchor in enumerate(anchors)]
    batches = batches_without_repeats(list(range(len(texts))), texts, batch_size)
    assert sorted(row for batch in batches for row in batch) == list(range(len(texts)))
    assert len(batches) == -(-len(texts) // batch_size)
    assert all(len(batch) == batch_size for batch in batches[:-1])
    for place, batch in enumerate(batches):
        for position, row in enumerate(batch):
            before = {text for earlier in batch[:position] for text in texts[earlier]}
            if before.isdisjoint(texts[row]):
                continue
            # a repeat: no row of a later batch (nor this one's later rows) could have taken its place
            later = [other for rest in batches[place + 1:] for other in rest] + batch[position + 1:]
            assert all(not before.isdisjoint(texts[other]) for other in later)


def test_evaluate_scores_an_encoder_as_the_run_scored_its_dev_set(stsb_run, run_cli, tmp_path):
    output, _, dev = stsb_run
    best = json.loads((output / "metrics.json").read_text())["best"]
    code, printed, error = run_cli("evaluate", "--model", str(output), "--data", str(dev), "--text-column",
                                   "sentence1", "--text-pair-column", "sentence2", "--output",
                                   str(tmp_path / "scores.json"))
    assert code == 0, error
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores == pytest.approx({"spearman": best["spearman"], "pearson": best["pearson"]}, abs=1e-6)
    assert f"spearman: {best['spearman']:.4f}" in printed + error
    code, _, error = run_cli("evaluate", "--model", str(output), "--data", str(dev), "--text-column", "sentence1")
    assert code == 1 and "--text-column and --text-pair-column together" in error


def test_evaluate_says_what_an_encoder_is_scored_on(minilm_dir, run_cli, tmp_path):
    reviews = tmp_path / "reviews.csv"
    reviews.write_text("review,sentiment\na joy from start to finish,pos\n")
    code, _, error = run_cli("evaluate", "--model", str(minilm_dir), "--data", str(reviews))
    assert code == 1 and len(error.strip().splitlines()) == 1
    assert "no trained task head" in error and "scored on rows of two texts" in error  # a classifier's file
    code, _, error = run_cli("evaluate", "--model", str(minilm_dir), "--data", str(reviews), "--task", "embedding")
    assert code == 1 and "name them with --text-column and --text-pair-column" in error  # evaluate's flags
    assert not (tmp_path / "eval_results.json").exists()


def test_mined_hard_negatives_are_rows_finetune_embeddings_reads(minilm_dir, data_dir, tmp_path):
    """mine_hard_negatives' n-tuple rows (anchor, positive, negative_1..n; with output_scores, a "scores" list
    beside them) are anchors with their positive and negatives, and its labeled pairs are scored pairs."""
    from bertforge.inference import mine_hard_negatives
    from bertforge.tasks.embedding import choose_loss

    pairs = mrpc_paraphrases(data_dir, "dev", 40)
    encoder = SentenceEncoder(minilm_dir)
    dataset = {"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]}
    for layout, scores, columns, loss in (("n-tuple", True, ("anchor", "positive", "negative_1", "negative_2"),
                                           "multiple_negatives_ranking"),
                                          ("labeled-pair", False, ("anchor", "positive"), "cosent")):
        mined = mine_hard_negatives(dataset, encoder, num_negatives=2, output_format=layout, output_scores=scores,
                                    verbose=False)
        path = tmp_path / f"{layout}.jsonl"
        path.write_text("".join(json.dumps(dict(zip(mined, row))) + "\n" for row in zip(*mined.values())))
        rows = read_rows(path)
        assert rows.columns == columns and len(rows) == len(next(iter(mined.values())))
        assert choose_loss(None, rows) == loss
