"""CrossEncoder against sentence-transformers' CrossEncoder on the same folders: MiniLM's real encoder with a seeded
classifier head (one output: a reranker; three labels: an NLI-style pair classifier), saved as a user has it, scored
on real MRPC, STS-B and SQuAD pairs. Every expected value comes from sentence-transformers."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from bertforge import BertForSequenceClassification, BertModel, BertTokenizer, ConfigError, CrossEncoder, InputError

sentence_transformers = pytest.importorskip("sentence_transformers")

ATOL = 1e-5  # the same weights: only the order of float32 sums differs


def reference(folder: Path, **options) -> sentence_transformers.CrossEncoder:
    return sentence_transformers.CrossEncoder(str(folder), device="cpu", **options)


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory, seeded_classifier) -> Path:
    return seeded_classifier(tmp_path_factory.mktemp("reranker"), {0: "LABEL_0"}, seed=1)


@pytest.fixture(scope="module")
def nli_dir(tmp_path_factory, seeded_classifier) -> Path:
    labels = {0: "contradiction", 1: "entailment", 2: "neutral"}
    return seeded_classifier(tmp_path_factory.mktemp("nli"), labels, seed=3)


def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig") as handle:  # MRPC's file starts with a byte-order mark
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.fixture(scope="module")
def sentence_pairs(data_dir) -> list[tuple[str, str]]:
    """MRPC paraphrase candidates and STS-B pairs of the dev sets."""
    mrpc = [(row["#1 String"], row["#2 String"]) for row in read_tsv(data_dir / "mrpc" / "dev.tsv")[:20]]
    stsb = [(row["sentence1"], row["sentence2"]) for row in read_tsv(data_dir / "stsb" / "dev.tsv")[::150][:10]]
    return mrpc + stsb


@pytest.fixture(scope="module")
def squad_paragraphs(data_dir) -> list[dict]:
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = [paragraph for article in squad["data"] for paragraph in article["paragraphs"]]
    # Paragraphs 752 and 756 have more than 512 tokens: the default max_length cuts them.
    return paragraphs[:10] + [paragraphs[752], paragraphs[756]]


@pytest.fixture(scope="module")
def question_pairs(squad_paragraphs) -> list[tuple[str, str]]:
    """Each SQuAD question with its own context, and the next paragraph's context with it: the long text second
    and first."""
    questions = [paragraph["qas"][0]["question"] for paragraph in squad_paragraphs]
    contexts = [paragraph["context"] for paragraph in squad_paragraphs]
    return [(question, context) for question, context in zip(questions, contexts)] + [
        (context, question) for question, context in zip(questions, contexts[1:] + contexts[:1])]


@pytest.fixture(scope="module")
def reranker(reranker_dir) -> CrossEncoder:
    return CrossEncoder(reranker_dir)


@pytest.fixture(scope="module")
def reranker_reference(reranker_dir):
    return reference(reranker_dir)


def test_reranker_scores_as_sentence_transformers(reranker, reranker_reference, sentence_pairs):
    expected = reranker_reference.predict(sentence_pairs)
    scores = reranker.predict(sentence_pairs, batch_size=7)
    assert scores.shape == expected.shape == (len(sentence_pairs),) and scores.dtype == expected.dtype == np.float32
    np.testing.assert_allclose(scores, expected, atol=ATOL, rtol=0)
    assert expected.std() > 0.1  # the seeded head tells pairs apart

    logits = reranker_reference.predict(sentence_pairs, activation_fn=nn.Identity())
    np.testing.assert_allclose(reranker.predict(sentence_pairs, activation_fn=nn.Identity()), logits, atol=ATOL,
                               rtol=0)
    np.testing.assert_allclose(reranker.predict(sentence_pairs, apply_softmax=True),
                               reranker_reference.predict(sentence_pairs, apply_softmax=True), atol=ATOL, rtol=0)

    tensor = reranker.predict(sentence_pairs, convert_to_tensor=True)
    expected_tensor = reranker_reference.predict(sentence_pairs, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == expected_tensor.shape and tensor.dtype == torch.float32
    torch.testing.assert_close(tensor, expected_tensor, atol=ATOL, rtol=0)

    listed = reranker.predict(sentence_pairs[:3], convert_to_numpy=False)
    expected_list = reranker_reference.predict(sentence_pairs[:3], convert_to_numpy=False)
    assert isinstance(listed, list) and [t.shape for t in listed] == [t.shape for t in expected_list]
    torch.testing.assert_close(torch.stack(listed), torch.stack(expected_list), atol=ATOL, rtol=0)

    for one_pair in (sentence_pairs[0], list(sentence_pairs[0])):
        single, expected_single = reranker.predict(one_pair), reranker_reference.predict(one_pair)
        assert type(single) is type(expected_single) is np.float32
        assert single == pytest.approx(expected_single, abs=ATOL)


def test_pair_classifier_scores_as_sentence_transformers(nli_dir, sentence_pairs):
    classifier, expected = CrossEncoder(nli_dir), reference(nli_dir)
    assert classifier.num_labels == expected.num_labels == 3
    assert type(classifier.activation_fn) is type(expected.activation_fn) is nn.Identity
    for options in ({}, {"apply_softmax": True}, {"activation_fn": nn.Sigmoid()},
                    {"activation_fn": nn.Sigmoid(), "apply_softmax": True}):
        scores, wanted = classifier.predict(sentence_pairs, **options), expected.predict(sentence_pairs, **options)
        assert scores.shape == wanted.shape == (len(sentence_pairs), 3)
        np.testing.assert_allclose(scores, wanted, atol=ATOL, rtol=0)
    np.testing.assert_allclose(classifier.predict(sentence_pairs, apply_softmax=True).sum(1), 1.0, atol=1e-6)

    single, wanted_single = classifier.predict(sentence_pairs[4]), expected.predict(sentence_pairs[4])
    assert single.shape == wanted_single.shape == (3,)
    np.testing.assert_allclose(single, wanted_single, atol=ATOL, rtol=0)
    tensor = classifier.predict(sentence_pairs, convert_to_tensor=True, apply_softmax=True)
    torch.testing.assert_close(tensor, expected.predict(sentence_pairs, convert_to_tensor=True, apply_softmax=True),
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("max_length", [None, 48])
def test_long_pairs_are_cut_as_sentence_transformers_cuts_them(reranker_dir, question_pairs, max_length):
    """The longer text loses tokens first, down to max_length (the tokenizer's 512 by default)."""
    expected = reference(reranker_dir, max_length=max_length)
    scorer = CrossEncoder(reranker_dir, max_length=max_length)
    assert scorer.max_length == expected.max_seq_length
    np.testing.assert_allclose(scorer.predict(question_pairs, batch_size=4), expected.predict(question_pairs),
                               atol=ATOL, rtol=0)


def test_max_length_set_after_loading(reranker_dir, question_pairs):
    scorer = CrossEncoder(reranker_dir)
    scorer.max_length = 40
    expected = reference(reranker_dir, max_length=40)
    np.testing.assert_allclose(scorer.predict(question_pairs), expected.predict(question_pairs), atol=ATOL, rtol=0)


def test_rank_as_sentence_transformers(reranker, reranker_reference, squad_paragraphs):
    query = squad_paragraphs[3]["qas"][0]["question"]
    documents = [paragraph["context"] for paragraph in squad_paragraphs[:10]]
    expected = reranker_reference.rank(query, documents)
    scores = [result["score"] for result in expected]
    assert min(np.diff(scores[::-1])) > 1e-4  # no near ties: the order is the scores', not rounding's
    for options in ({}, {"top_k": 3, "return_documents": True}, {"activation_fn": nn.Identity(), "top_k": 5},
                    {"batch_size": 2, "return_documents": True}):
        ranked, wanted = reranker.rank(query, documents, **options), reranker_reference.rank(query, documents,
                                                                                           **options)
        assert [(r["corpus_id"], r.get("text")) for r in ranked] == [(r["corpus_id"], r.get("text")) for r in wanted]
        assert [sorted(r) for r in ranked] == [sorted(r) for r in wanted]
        assert all(type(r["score"]) is float for r in ranked)
        assert [r["score"] for r in ranked] == pytest.approx([r["score"] for r in wanted], abs=ATOL)
    assert reranker.rank(query, []) == reranker_reference.rank(query, []) == []


def test_rank_refuses_several_outputs(nli_dir, sentence_pairs):
    query, documents = sentence_pairs[0][0], [pair[1] for pair in sentence_pairs]
    with pytest.raises(ValueError, match="num_labels=1"):
        reference(nli_dir).rank(query, documents)
    with pytest.raises(ConfigError, match="num_labels=1") as refused:
        CrossEncoder(nli_dir).rank(query, documents)
    assert "\n" not in str(refused.value)


def test_no_pairs_as_sentence_transformers(reranker, reranker_reference):
    assert reranker.predict([]).shape == reranker_reference.predict([]).shape == (0,)
    assert reranker.predict([], convert_to_tensor=True).shape == reranker_reference.predict(
        [], convert_to_tensor=True).shape
    assert reranker.predict([], convert_to_numpy=False) == reranker_reference.predict([], convert_to_numpy=False)


@pytest.mark.parametrize("folder, activation", [("reranker_dir", nn.Tanh()), ("reranker_dir", nn.Identity()),
                                                ("nli_dir", None), ("nli_dir", nn.Softmax(dim=-1))])
def test_saved_folder_loads_in_sentence_transformers(request, tmp_path, sentence_pairs, folder, activation):
    scorer = CrossEncoder(request.getfixturevalue(folder), max_length=96, activation_fn=activation)
    scorer.save(tmp_path / "saved")
    loaded = reference(tmp_path / "saved")
    assert loaded.max_seq_length == 96
    assert type(loaded.activation_fn) is type(scorer.activation_fn)
    expected = loaded.predict(sentence_pairs)
    np.testing.assert_allclose(scorer.predict(sentence_pairs), expected, atol=ATOL, rtol=0)
    reloaded = CrossEncoder(tmp_path / "saved")
    assert reloaded.max_length == 96 and type(reloaded.activation_fn) is type(loaded.activation_fn)
    np.testing.assert_allclose(reloaded.predict(sentence_pairs), expected, atol=ATOL, rtol=0)


def test_loads_a_folder_sentence_transformers_saved(tmp_path, nli_dir, sentence_pairs):
    """sentence-transformers 6 keeps the activation in config_sentence_transformers.json; saving over the folder
    again must change it there."""
    reference(nli_dir, max_length=80, activation_fn=nn.Sigmoid()).save(str(tmp_path / "st"))
    expected = reference(tmp_path / "st")
    scorer = CrossEncoder(tmp_path / "st")
    assert scorer.max_length == expected.max_seq_length == 80
    assert type(scorer.activation_fn) is type(expected.activation_fn) is nn.Sigmoid
    np.testing.assert_allclose(scorer.predict(sentence_pairs), expected.predict(sentence_pairs), atol=ATOL, rtol=0)

    CrossEncoder(tmp_path / "st", activation_fn=nn.Identity()).save(tmp_path / "st")
    assert type(reference(tmp_path / "st").activation_fn) is nn.Identity


@pytest.mark.parametrize("key, value", [
    ("sentence_transformers", {"activation_fn": "torch.nn.modules.linear.Identity", "version": "4.0.1"}),
    ("sentence_transformers", {"activation_fn": "torch.nn.Tanh"}),
    ("sbert_ce_default_activation_function", "torch.nn.modules.activation.Tanh"),  # before sentence-transformers 4
])
def test_activation_saved_in_config_json(tmp_path, reranker_dir, sentence_pairs, key, value):
    """The Hub's rerankers (cross-encoder/ms-marco-MiniLM-L6-v2 and kin) name their activation in config.json."""
    folder = shutil.copytree(reranker_dir, tmp_path / "hub")
    config = json.loads((folder / "config.json").read_text()) | {key: value}
    (folder / "config.json").write_text(json.dumps(config))
    expected, scorer = reference(folder), CrossEncoder(folder)
    assert type(scorer.activation_fn) is type(expected.activation_fn) is not nn.Sigmoid
    np.testing.assert_allclose(scorer.predict(sentence_pairs), expected.predict(sentence_pairs), atol=ATOL, rtol=0)


def test_loaded_model_and_tokenizer(reranker_dir, reranker_reference, sentence_pairs):
    model = BertForSequenceClassification.from_pretrained(reranker_dir)
    tokenizer = BertTokenizer.from_pretrained(reranker_dir)
    scorer = CrossEncoder(model, tokenizer)
    assert scorer.model is model and scorer.tokenizer is tokenizer and scorer.config is model.config
    assert scorer.num_labels == reranker_reference.num_labels and scorer.max_length == \
        reranker_reference.max_seq_length
    assert scorer.to("cpu") is scorer and scorer.device == reranker_reference.device == torch.device("cpu")
    np.testing.assert_allclose(scorer.predict(sentence_pairs), reranker_reference.predict(sentence_pairs), atol=ATOL,
                               rtol=0)


@pytest.mark.parametrize("num_labels", [None, 3])
def test_encoder_without_classifier_gets_a_new_head_as_in_sentence_transformers(minilm_dir, num_labels):
    scorer, expected = CrossEncoder(minilm_dir, num_labels=num_labels), reference(minilm_dir, num_labels=num_labels)
    assert scorer.num_labels == expected.num_labels == (num_labels or 1)
    assert scorer.max_length == expected.max_seq_length
    assert type(scorer.activation_fn) is type(expected.activation_fn)


def test_one_line_errors(tmp_path, reranker, reranker_reference, reranker_dir, minilm_dir, sentence_pairs):
    with pytest.raises(ValueError):
        reranker_reference.predict(sentence_pairs, batch_size=0)
    unknown_activation = shutil.copytree(reranker_dir, tmp_path / "unknown")
    config = json.loads((unknown_activation / "config.json").read_text())
    (unknown_activation / "config.json").write_text(json.dumps(
        config | {"sentence_transformers": {"activation_fn": "my_package.Scorer"}}))
    lambda_scorer = CrossEncoder(reranker_dir, activation_fn=lambda logits: logits * 2)
    failures = {
        "takes no option 'prompt_template'": (ConfigError, lambda: CrossEncoder(reranker_dir, prompt_template="q: ")),
        "backend 'openvino': CrossEncoder runs 'torch' or 'onnx'": (
            ConfigError, lambda: CrossEncoder(reranker_dir, backend="openvino")),
        "a (text, pair) tuple": (InputError, lambda: reranker.predict("one text only")),
        "two strings": (InputError, lambda: reranker.predict([("a question", "a document"), ("lonely",)])),
        "batch_size": (InputError, lambda: reranker.predict(sentence_pairs, batch_size=0)),
        "max_length must be": (InputError, lambda: CrossEncoder(reranker_dir, max_length=1000)),
        "'my_package.Scorer' is not supported": (ConfigError, lambda: CrossEncoder(unknown_activation)),
        "can't be saved": (ConfigError, lambda: lambda_scorer.save(tmp_path / "lambda")),
        "BertForSequenceClassification": (ConfigError, lambda: CrossEncoder(BertModel.from_pretrained(minilm_dir),
                                                                            reranker.tokenizer)),
        "needs its tokenizer": (ConfigError, lambda: CrossEncoder(reranker.model)),
        "query text and a list": (InputError, lambda: reranker.rank("a query", "not a list")),
    }
    for message, (error, call) in failures.items():
        with pytest.raises(error, match=re.escape(message)) as raised:
            call()
        assert "\n" not in str(raised.value)
    np.testing.assert_allclose(lambda_scorer.predict(sentence_pairs[:4]), reranker_reference.predict(
        sentence_pairs[:4], activation_fn=lambda logits: logits * 2), atol=ATOL, rtol=0)


@pytest.mark.parametrize("top_k", [0, -1, 1.5, "2"])
def test_rank_refuses_a_top_k_that_is_not_a_count(reranker, top_k):
    """-1 dropped the last document (a slice's end), 1.5 and "2" failed in the slicing."""
    with pytest.raises(InputError, match=re.escape(f"top_k must be a positive whole number, got {top_k!r}")):
        reranker.rank("a query", ["a document", "another", "a third"], top_k=top_k)


def test_prompt_options_of_the_wrong_type_are_named(reranker, reranker_dir):
    with pytest.raises(InputError, match="prompt must be a text, got 5"):
        reranker.predict([("a query", "a document")], prompt=5)
    for options, message in (({"prompts": "x"}, "CrossEncoder: prompts must be a dict, got 'x'"),
                             ({"model_kwargs": 5}, "CrossEncoder: model_kwargs must be a dict, got 5"),
                             ({"device": "gpu"}, "device 'gpu' is not a device; use cpu, cuda, cuda:N or mps")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            CrossEncoder(reranker_dir, **options)


def test_prompts_go_before_each_first_text_as_sentence_transformers_puts_them(reranker_dir, sentence_pairs):
    options = {"prompts": {"retrieval": "Judge the relevance: ", "nli": "Entailment? "},
               "default_prompt_name": "retrieval"}
    ours, theirs = CrossEncoder(reranker_dir, **options), reference(reranker_dir, **options)
    assert (ours.prompts, ours.default_prompt_name) == ({**options["prompts"]}, theirs.default_prompt_name)
    for call in ({}, {"prompt_name": "nli"}, {"prompt": "Q: "}, {"prompt_name": "nli", "prompt": "Q: "}):
        np.testing.assert_allclose(ours.predict(sentence_pairs[:8], **call),
                                   theirs.predict(sentence_pairs[:8], **call), atol=ATOL, rtol=0)
    query, documents = sentence_pairs[0][0], [second for _, second in sentence_pairs[:8]]
    ranked, expected = ours.rank(query, documents, prompt_name="nli"), theirs.rank(query, documents, prompt_name="nli")
    assert [r["corpus_id"] for r in ranked] == [r["corpus_id"] for r in expected]
    with pytest.raises(InputError, match="prompt_name 'nope': the model has prompts 'nli', 'retrieval'"):
        ours.predict(sentence_pairs[:1], prompt_name="nope")
    with pytest.raises(ConfigError, match="default_prompt_name 'nope' is none of the prompts"):
        CrossEncoder(reranker_dir, default_prompt_name="nope")


def test_saved_prompts_load_in_both(reranker_dir, sentence_pairs, tmp_path):
    """A save keeps the prompts in sentence-transformers 6's layout, which both libraries read back."""
    options = {"prompts": {"retrieval": "Judge the relevance: "}, "default_prompt_name": "retrieval"}
    CrossEncoder(reranker_dir, max_length=64, **options).save(tmp_path / "prompted")
    ours, theirs = CrossEncoder(tmp_path / "prompted"), reference(tmp_path / "prompted")
    for loaded in (ours, theirs):
        assert (loaded.prompts, loaded.default_prompt_name, loaded.max_seq_length) == (
            options["prompts"], "retrieval", 64)
    expected = reference(reranker_dir, max_length=64, **options).predict(sentence_pairs[:8])
    for loaded in (ours, theirs):
        np.testing.assert_allclose(loaded.predict(sentence_pairs[:8]), expected, atol=ATOL, rtol=0)


def test_older_keywords_as_sentence_transformers_still_takes_them(reranker_dir, sentence_pairs):
    """sentence-transformers 4's names (automodel_args, default_activation_function, classifier_dropout; predict's
    activation_fct and num_workers) still work there, with a warning."""
    old_style = {"automodel_args": {}, "tokenizer_args": {}, "config_args": {}, "classifier_dropout": 0.25,
                 "default_activation_function": nn.Identity()}
    with pytest.warns(FutureWarning, match="'automodel_args' is now 'model_kwargs'"):
        ours = CrossEncoder(reranker_dir, **old_style)
    theirs = reference(reranker_dir, **old_style)
    assert ours.config.classifier_dropout == theirs.config.classifier_dropout == 0.25
    assert type(ours.activation_fn) is type(theirs.activation_fn) is nn.Identity
    with pytest.warns(FutureWarning, match="'activation_fct' is now 'activation_fn'"):
        mine = ours.predict(sentence_pairs[:8], activation_fct=nn.Tanh(), num_workers=0)
    np.testing.assert_allclose(mine, theirs.predict(sentence_pairs[:8], activation_fct=nn.Tanh(), num_workers=0),
                               atol=ATOL, rtol=0)


def test_sentence_transformers_evaluators_score_it_as_their_cross_encoder(reranker, reranker_reference, data_dir,
                                                                         squad_paragraphs, tmp_path):
    """The cross-encoder evaluators (correlation on STS-B, classification on MRPC, reranking SQuAD questions'
    paragraphs) give bertforge's CrossEncoder sentence-transformers' scores and record them on model_card_data."""
    evaluation = pytest.importorskip("sentence_transformers.cross_encoder.evaluation")
    stsb, mrpc = read_tsv(data_dir / "stsb" / "dev.tsv")[:80], read_tsv(data_dir / "mrpc" / "dev.tsv")[:80]
    contexts = [paragraph["context"] for paragraph in squad_paragraphs[:10]]
    evaluators = [
        evaluation.CrossEncoderCorrelationEvaluator([(r["sentence1"], r["sentence2"]) for r in stsb],
                                                    [float(r["score"]) for r in stsb], name="stsb"),
        evaluation.CrossEncoderClassificationEvaluator([(r["#1 String"], r["#2 String"]) for r in mrpc],
                                                       [int(r["Quality"]) for r in mrpc], name="mrpc"),
        evaluation.CrossEncoderRerankingEvaluator(
            [{"query": paragraph["qas"][0]["question"], "positive": [contexts[i]],
              "negative": contexts[:i] + contexts[i + 1:]} for i, paragraph in enumerate(squad_paragraphs[:10])],
            name="squad"),
    ]
    for evaluator in evaluators:
        # model.evaluate(evaluator, output_path) as sentence-transformers has it: the evaluator's CSV in that folder
        ours = reranker.evaluate(evaluator, tmp_path / "ours" / evaluator.name)
        theirs = reranker_reference.evaluate(evaluator, str(tmp_path / "theirs" / evaluator.name))
        assert ours.keys() == theirs.keys() and len(ours) >= 2
        assert sorted(p.name for p in (tmp_path / "ours" / evaluator.name).iterdir()) == sorted(
            p.name for p in (tmp_path / "theirs" / evaluator.name).iterdir()) != []
        for metric, value in theirs.items():
            assert ours[metric] == pytest.approx(value, abs=1e-5 if "threshold" in metric else 1e-6), metric
        assert reranker.model_card_data.eval_results_dict[evaluator] == ours


def test_fit_trains_as_sentence_transformers_fit(minilm_dir, data_dir, tmp_path):
    """fit as sentence-transformers' tutorials call it (InputExample pairs with STS-B scores, the default binary
    cross-entropy) moves the weights as sentence-transformers' own loop (old_fit) does from the same start (dropout
    off in both), ours recomputing its activations (gradient_checkpointing_enable, as transformers' models have it)
    and theirs not; with an evaluator and output_path the best model is saved where sentence-transformers loads it."""
    from torch.utils.data import DataLoader

    evaluation = pytest.importorskip("sentence_transformers.cross_encoder.evaluation")
    rows = read_tsv(data_dir / "stsb" / "train.tsv")[:64]
    examples = [sentence_transformers.InputExample(texts=[row["sentence1"], row["sentence2"]],
                                                   label=float(row["score"]) / 5) for row in rows]
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    torch.manual_seed(0)
    ours = CrossEncoder(minilm_dir, num_labels=1, config_kwargs=no_dropout)
    theirs = sentence_transformers.CrossEncoder(str(minilm_dir), num_labels=1, device="cpu",
                                                config_kwargs=no_dropout)
    with torch.no_grad():  # the same new head
        theirs.model.classifier.weight.copy_(ours.model.classifier.weight)
        theirs.model.classifier.bias.copy_(ours.model.classifier.bias)
    pairs = [(row["sentence1"], row["sentence2"]) for row in rows[:8]]
    before = ours.predict(pairs)
    ours.gradient_checkpointing_enable()
    assert ours.is_gradient_checkpointing and ours.model.is_gradient_checkpointing
    settings = dict(epochs=1, warmup_steps=2, weight_decay=0.0, optimizer_params={"lr": 5e-5},
                    show_progress_bar=False)
    ours.fit(DataLoader(examples, batch_size=16), **settings)
    theirs.old_fit(DataLoader(examples, batch_size=16), **settings)
    after = ours.predict(pairs)
    assert np.abs(after - before).max() > 0.01  # it trained
    np.testing.assert_allclose(after, theirs.predict(pairs), atol=1e-5)

    evaluator = evaluation.CrossEncoderCorrelationEvaluator(pairs, [float(row["score"]) for row in rows[:8]],
                                                            name="sts")
    ours.fit(DataLoader(examples, batch_size=16), evaluator=evaluator, output_path=tmp_path / "best", **settings)
    assert "sts_spearman" in ours.model_card_data.eval_results_dict[evaluator]
    np.testing.assert_allclose(reference(tmp_path / "best").predict(pairs), CrossEncoder(tmp_path / "best").predict(
        pairs), atol=1e-5)
    with pytest.raises(ConfigError, match="fit: callback is not supported here"):
        ours.fit(DataLoader(examples), callback=print)


def test_preprocess_gives_the_features_sentence_transformers_gives(reranker, reranker_reference, sentence_pairs,
                                                                     question_pairs):
    """preprocess (sentence-transformers 6) and tokenize (its name before) make the batch the model reads: each pair
    cut to max_length longer text first, a prompt before each first text, padded; the model scores it as predict
    does."""
    pairs = sentence_pairs[:6] + question_pairs[:4]
    for options in ({}, {"prompt": "Judge the relevance: "}):
        ours, theirs = reranker.preprocess(pairs, **options), reranker_reference.preprocess(pairs, **options)
        # sentence-transformers 6 also notes the batch's modality ("text") and a prompt's length for its own
        # modules; the model's inputs are the tensors
        assert set(ours) == set(theirs) - {"modality", "prompt_length"} == {"input_ids", "token_type_ids",
                                                                            "attention_mask"}
        for name in ours:
            assert torch.equal(ours[name], theirs[name]), (name, options)
    tokenized, preprocessed = reranker.tokenize(pairs), reranker.preprocess(pairs)
    assert all(torch.equal(tokenized[name], preprocessed[name]) for name in preprocessed)
    assert reranker.preprocess([]) == reranker_reference.preprocess([]) == {}
    with torch.inference_mode():
        logits = reranker.model(**reranker.preprocess(pairs)).logits
    np.testing.assert_allclose(torch.sigmoid(logits[:, 0]).numpy(), reranker.predict(pairs), atol=ATOL, rtol=0)
    assert reranker.get_max_seq_length() == reranker_reference.get_max_seq_length() == reranker.max_length
    assert type(reranker.default_activation_function) is type(reranker_reference.default_activation_function)
    with pytest.raises(InputError, match=r"^preprocess takes a list of \(text, pair\) tuples; wrap one pair"):
        reranker.preprocess(("a question", "a document"))
    with pytest.raises(InputError, match=r"^preprocess takes \(text, pair\) tuples of two strings"):
        reranker.preprocess([("a question", "a document"), ("lonely",)])


def test_onnx_backend_scores_as_sentence_transformers(reranker_dir, reranker_reference, sentence_pairs, tmp_path):
    """backend="onnx": the classifier exported and run by ONNX Runtime scores and ranks as sentence-transformers'
    CrossEncoder (torch); save() writes onnx/model.onnx, which a reload runs without exporting again."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bertforge import export_dynamic_quantized_onnx_model

    scorer = CrossEncoder(reranker_dir, backend="onnx")
    assert scorer.get_backend() == "onnx" and scorer.num_labels == 1
    expected = reranker_reference.predict(sentence_pairs)
    np.testing.assert_allclose(scorer.predict(sentence_pairs, batch_size=7), expected, atol=ATOL, rtol=0)
    query, documents = sentence_pairs[0][0], [second for _, second in sentence_pairs[:8]]
    assert [item["corpus_id"] for item in scorer.rank(query, documents)] == \
        [item["corpus_id"] for item in reranker_reference.rank(query, documents)]
    scorer.save(tmp_path / "saved")
    assert (tmp_path / "saved" / "onnx" / "model.onnx").is_file()
    again = CrossEncoder(tmp_path / "saved", backend="onnx", model_kwargs={"export": False})
    np.testing.assert_allclose(again.predict(sentence_pairs), expected, atol=ATOL, rtol=0)
    np.testing.assert_allclose(reference(tmp_path / "saved").predict(sentence_pairs), expected, atol=ATOL, rtol=0)
    written = export_dynamic_quantized_onnx_model(again, "avx512", tmp_path / "saved")
    int8 = CrossEncoder(tmp_path / "saved", backend="onnx", model_kwargs={"file_name": f"onnx/{written.name}"})
    scores = int8.predict(sentence_pairs)
    # int8 noise, which the seeded head's wide weights amplify: the file named is run, close to fp32
    assert written.name == "model_qint8_avx512.onnx" and 1e-4 < np.abs(scores - expected).mean() < 0.03
    assert np.corrcoef(scores, expected)[0, 1] > 0.95
