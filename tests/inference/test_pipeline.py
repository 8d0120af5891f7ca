"""bertforge.pipeline against transformers' own pipelines on the same saved folders and real text: the same shapes,
keys, labels, words, spans and scores. transformers 5 has no question-answering pipeline; there the reference is
transformers 4's rule computed here from transformers' own tokenizer windows and model logits."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from bertforge import (
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    FinetunedModel,
    pipeline,
)
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, InputError
from bertforge.pretraining import BertForMaskedLM
from bertforge.tasks.token_classification import read_conll

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOLERANCE = 1e-4
SENTIMENTS = {0: "negative", 1: "neutral", 2: "positive"}
TOPICS = {0: "film", 1: "music", 2: "sport"}
TAGS = dict(enumerate(["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]))
# Hyphens, initialisms, numbers with points, accents, a word piece split and a character the vocabulary lacks.
TRICKY = "Jean-Luc Picard met Johanson in Washington, D.C. on 12/03 at café Montréal ☃ for 25.76 dollars."


def assert_same(ours, theirs, where="answer"):
    """Equal structure, keys and values; numbers within TOLERANCE (transformers' NER scores are numpy floats)."""
    if isinstance(theirs, dict) and {"labels", "scores"} <= set(theirs):
        # zero-shot labels by score: labels of equal scores may come in either order (transformers' sort puts the
        # later first), so each label's score, and ours in order
        assert isinstance(ours, dict) and list(ours) == list(theirs), f"{where}: {ours} vs {theirs}"
        assert ours["scores"] == sorted(ours["scores"], reverse=True), where
        assert_same(dict(sorted(zip(ours["labels"], ours["scores"]))), dict(sorted(zip(theirs["labels"],
                                                                                    theirs["scores"]))), where)
        assert_same({key: ours[key] for key in ours if key not in ("labels", "scores")},
                    {key: theirs[key] for key in theirs if key not in ("labels", "scores")}, where)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), f"{where}: {ours} vs {theirs}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), f"{where}: {ours} vs {theirs}"
        for index, (mine, reference) in enumerate(zip(ours, theirs)):
            assert_same(mine, reference, f"{where}[{index}]")
    elif isinstance(theirs, torch.Tensor):
        assert ours.shape == theirs.shape and (ours - theirs).abs().max() < TOLERANCE, where
    elif isinstance(theirs, (float, np.floating)) and not isinstance(theirs, bool):
        assert isinstance(ours, float) and abs(ours - float(theirs)) < TOLERANCE, f"{where}: {ours} vs {theirs}"
    else:
        assert ours == theirs, f"{where}: {ours!r} vs {theirs!r}"


def tiny_config(tokenizer, **overrides) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=512, **overrides)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    """Tiny models over MiniLM's vocabulary with seeded random heads, widened so that labels, tags and spans differ
    clearly from input to input, each saved (with the tokenizer) as transformers reads a model folder."""
    torch.manual_seed(0)
    models = {
        "classifier": BertForSequenceClassification(tiny_config(tokenizer, id2label=SENTIMENTS)),
        "regression": BertForSequenceClassification(tiny_config(tokenizer, id2label={0: "LABEL_0"})),
        "multi_label": BertForSequenceClassification(tiny_config(tokenizer, id2label=TOPICS,
                                                                 problem_type="multi_label_classification")),
        "ner": BertForTokenClassification(tiny_config(tokenizer, id2label=TAGS)),
        "qa": BertForQuestionAnswering(tiny_config(tokenizer)),
        "masked_lm": BertForMaskedLM(tiny_config(tokenizer)),
    }
    folders = {}
    for name, model in models.items():
        with torch.no_grad():
            head = model.masked_lm.bias if name == "masked_lm" else getattr(model, "classifier", None)
            if name == "masked_lm":
                head.normal_(0, 3)  # a peaked vocabulary distribution: a clear ranking
            else:
                torch.nn.init.normal_((head or model.qa_outputs).weight, std=1.0)
        folders[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    return folders


def reference(task, folder, **options):
    return transformers.pipeline(task, model=str(folder), device="cpu", **options)


@pytest.fixture(scope="module")
def reviews(sst2_dev):
    return [text for text, _ in sst2_dev[:5]]


@pytest.fixture(scope="module")
def ner_texts(data_dir):
    """CoNLL-2003 test sentences as plain text (names, places, organisations), and one with every hard case."""
    sentences = read_conll(data_dir / "conll2003" / "eng.testb")[1:7]
    return [" ".join(sentence.words) for sentence in sentences] + [TRICKY]


@pytest.fixture(scope="module")
def squad_questions(data_dir):
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = squad["data"][0]["paragraphs"]
    return [(paragraph["qas"][0]["question"], paragraph["context"]) for paragraph in paragraphs[:3]]


# --- feature-extraction ---------------------------------------------------------------------------------------

def test_feature_extraction_of_the_default_model_matches_transformers(minilm_dir, real_sentences):
    ours, theirs = pipeline("feature-extraction", device="cpu"), reference("feature-extraction", minilm_dir)
    texts = real_sentences[:3]
    mine, expected = ours(texts), theirs(texts)
    assert [(len(rows), len(rows[0]), len(rows[0][0])) for rows in mine] == [
        (1, len(rows[0]), 384) for rows in expected]
    for rows, reference_rows in zip(mine, expected):
        assert_same(torch.tensor(rows), torch.tensor(reference_rows))
    one = ours(texts[0], return_tensors=True)
    assert_same(one, theirs(texts[0], return_tensors=True))
    assert one.shape[:2] == (1, len(ours.tokenizer(texts[0])["input_ids"]))  # [CLS] and [SEP] included


def test_feature_extraction_reads_the_encoder_of_any_folder_and_cuts_when_asked(folders):
    ours, theirs = pipeline("feature-extraction", model=folders["classifier"]), reference(
        "feature-extraction", folders["classifier"])
    assert_same(ours("A gripping film."), theirs("A gripping film."))
    long_text = "words of a long review " * 120
    with pytest.raises(InputError, match="tokens long; the model reads at most 512 .truncation=True cuts it"):
        ours(long_text)
    assert_same(ours(long_text, truncation=True, return_tensors=True),
                theirs(long_text, truncation=True, return_tensors=True))
    assert ours(long_text, max_length=20, return_tensors=True).shape == (1, 20, 32)


# --- fill-mask ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, options", [
    ("Paris is the [MASK] of France.", {}),
    ("Paris is the [MASK] of France.", {"top_k": 2}),
    ("[MASK] is the capital of [MASK].", {"top_k": 3}),  # a list per mask, each sequence keeping the other mask
    ("Paris is the [MASK] of France.", {"targets": ["capital", "city", "Capital", "zqx"]}),
    (["The [MASK] sat on the mat.", "A [MASK] day."], {"top_k": 2}),
    (["The [MASK] sat on the mat."], {}),  # a list of one text answers as the text alone
])
def test_fill_mask_matches_transformers(folders, text, options):
    assert_same(pipeline("fill-mask", model=folders["masked_lm"])(text, **options),
                reference("fill-mask", folders["masked_lm"])(text, **options))


# --- text-classification --------------------------------------------------------------------------------------

@pytest.mark.parametrize("form, options", [
    ("text", {}),  # [{label, score}]: one text answers in a list of one
    ("texts", {}),  # one {label, score} per text
    ("pair", {}),  # {"text", "text_pair"}: a dict alone
    ("pairs", {}),
    ("text", {"top_k": 2}),
    ("texts", {"top_k": None}),  # every label, best first
    ("text", {"function_to_apply": "sigmoid"}),
    ("texts", {"function_to_apply": "none", "top_k": 1}),
    ("text", {"top_k": 0}),  # no label: []
    ("texts", {"top_k": 0}),
    ("texts", {"padding": "max_length", "max_length": 24, "truncation": True}),  # fills batches, changes no score
    ("pairs", {"padding": True, "num_workers": 2, "batch_size": 2}),
])
def test_text_classification_matches_transformers(folders, reviews, form, options):
    inputs = {"text": reviews[0], "texts": reviews, "pair": {"text": reviews[0], "text_pair": reviews[1]},
              "pairs": [{"text": a, "text_pair": b} for a, b in zip(reviews, reviews[1:])]}[form]
    assert_same(pipeline("text-classification", model=folders["classifier"])(inputs, **options),
                reference("text-classification", folders["classifier"])(inputs, **options))


def test_top_k_given_to_the_pipeline_shapes_answers_as_transformers_does(folders, reviews):
    """transformers 5 wraps one text's top-k list in another list when top_k came with the pipeline."""
    for inputs in (reviews[0], reviews[:2]):
        assert_same(pipeline("sentiment-analysis", model=folders["classifier"], top_k=2)(inputs),
                    reference("sentiment-analysis", folders["classifier"], top_k=2)(inputs))


def test_return_all_scores_answers_as_transformers_4_did(folders, reviews):
    """transformers 4's return_all_scores=True (its tutorials'; transformers 5 leaves it unread) is top_k=None, one
    text's labels in a list of one: the labels transformers' top_k=None gives, nested as 4 nested them."""
    ours = pipeline("text-classification", model=folders["classifier"])
    every_label = reference("text-classification", folders["classifier"])
    assert_same(ours(reviews[0], return_all_scores=True), [every_label(reviews[0], top_k=None)])
    assert_same(ours(reviews[:3], return_all_scores=True), every_label(reviews[:3], top_k=None))
    assert_same(ours(reviews[0], return_all_scores=True, top_k=1), [every_label(reviews[0], top_k=1)])


def test_single_texts_and_pairs_in_one_list(folders, reviews):
    mixed = [reviews[0], {"text": reviews[1], "text_pair": reviews[2]}, reviews[3]]
    assert_same(pipeline("text-classification", model=folders["classifier"])(mixed, top_k=None),
                reference("text-classification", folders["classifier"])(mixed, top_k=None))


def test_multi_label_scores_are_sigmoids_as_in_transformers(folders, reviews):
    assert_same(pipeline("text-classification", model=folders["multi_label"])(reviews, top_k=None),
                reference("text-classification", folders["multi_label"])(reviews, top_k=None))


def test_regression_scores_are_bertforge_s_and_transformers_raw_ones(folders, reviews):
    """A one-output model without problem_type is regression to bertforge (its predict's score, the raw output);
    transformers then applies a sigmoid, and gives the raw output with function_to_apply="none"."""
    ours = pipeline("text-classification", model=folders["regression"])
    assert_same(ours(reviews), reference("text-classification", folders["regression"])(
        reviews, function_to_apply="none"))
    predicted = FinetunedModel.load(folders["regression"]).predict(reviews)
    assert [answer["score"] for answer in ours(reviews)] == pytest.approx([p["score"] for p in predicted], abs=1e-6)
    assert_same(ours(reviews[0], function_to_apply="sigmoid"),
                reference("text-classification", folders["regression"])(reviews[0]))


def test_a_regression_model_saved_as_fine_tuned_scores_raw_in_both(tmp_path, tokenizer, reviews):
    """bertforge's fine-tuning writes problem_type "regression", as transformers' Trainer does: no sigmoid in either."""
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config(tokenizer, id2label={0: "LABEL_0"}, problem_type="regression"))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert_same(pipeline("text-classification", model=tmp_path)(reviews),
                reference("text-classification", tmp_path)(reviews))


def test_labels_and_probabilities_are_bertforge_predict_s(folders, reviews):
    """One decoding for every entry point: the pipeline's ranked labels are FinetunedModel.predict's."""
    ranked = pipeline("text-classification", model=folders["classifier"])(reviews, top_k=None)
    for answers, predicted in zip(ranked, FinetunedModel.load(folders["classifier"]).predict(reviews)):
        assert answers[0]["label"] == predicted["label"]
        assert {a["label"]: a["score"] for a in answers} == pytest.approx(predicted["probabilities"], abs=1e-6)


# --- token-classification -------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_token_classification_matches_transformers(folders, ner_texts, strategy):
    ours = pipeline("ner", model=folders["ner"], aggregation_strategy=strategy)
    theirs = reference("ner", folders["ner"], aggregation_strategy=strategy)
    answers = ours(ner_texts)
    assert_same(answers, theirs(ner_texts))
    assert all(answer for answer in answers)  # every text has entities to compare
    assert_same(ours(TRICKY), theirs(TRICKY))


def test_outside_pieces_are_answered_when_not_ignored(folders, ner_texts):
    ours, text = pipeline("token-classification", model=folders["ner"]), max(ner_texts, key=len)
    answers = ours(text, ignore_labels=[])
    assert_same(answers, reference("token-classification", folders["ner"])(text, ignore_labels=[]))
    assert any(answer["entity"] == "O" for answer in answers)
    assert_same(ours(text, ignore_labels=["O", "B-PER"]),
                reference("token-classification", folders["ner"])(text, ignore_labels=["O", "B-PER"]))


@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
def test_outside_runs_are_groups_when_not_ignored(folders, tokenizer, ner_texts, tmp_path, strategy):
    """With an aggregation and O not ignored, each run of O words is a group of its own, as transformers gives."""
    model = BertForTokenClassification.from_pretrained(folders["ner"])
    with torch.no_grad():
        model.classifier.bias[0] += 12.0  # most words O: runs of several
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ours, theirs = pipeline("ner", model=tmp_path), reference("ner", tmp_path)
    for ignored in ([], ["PER"], ["B-PER", "LOC"]):
        answers = ours(ner_texts, aggregation_strategy=strategy, ignore_labels=ignored)
        assert_same(answers, theirs(ner_texts, aggregation_strategy=strategy, ignore_labels=ignored), str(ignored))
        runs = [entity for answer in answers for entity in answer if entity["entity_group"] == "O"]
        assert len(runs) > 10 and any(" " in entity["word"] for entity in runs)


def test_a_text_longer_than_the_model_reads_is_cut_as_transformers_cuts_it(folders, tokenizer):
    text = " ".join(["Johanson met Picard in Montréal."] * 100)  # 800 tokens
    assert_same(pipeline("ner", model=folders["ner"], tokenizer=folders["ner"])(text, aggregation_strategy="first"),
                reference("ner", folders["ner"])(text, aggregation_strategy="first"))


@pytest.fixture(scope="module")
def conll_document(data_dir):
    """The first 59 sentences of CoNLL-2003's test file as one text of ~1,300 word pieces, and as its words."""
    words = [word for sentence in read_conll(data_dir / "conll2003" / "eng.testb")[1:60] for word in sentence.words]
    return " ".join(words), words


@pytest.mark.parametrize("strategy", ["simple", "first", "average", "max"])
def test_stride_tags_every_window_of_a_long_text_as_transformers(folders, conll_document, strategy):
    """transformers' `stride`: windows of model_max_length tokens sharing `stride` pieces, each window's entities,
    and where two overlap the longer (the surer of equal ones)."""
    ours, theirs = pipeline("ner", model=folders["ner"]), reference("ner", folders["ner"])
    text, _ = conll_document
    assert len(ours.tokenizer(text, truncation=False)["input_ids"]) > 2 * 512
    cut = ours(text, aggregation_strategy=strategy)
    for stride in (0, 16, 200):
        answers = ours(text, aggregation_strategy=strategy, stride=stride)
        assert_same(answers, theirs(text, aggregation_strategy=strategy, stride=stride), f"stride {stride}")
        assert answers[-1]["end"] > cut[-1]["end"] + 2000  # the text's end is tagged, not cut away
    assert_same(ours([text, TRICKY], aggregation_strategy=strategy, stride=8),
                theirs([text, TRICKY], aggregation_strategy=strategy, stride=8))


def test_stride_needs_entities_and_room(folders):
    ours = pipeline("ner", model=folders["ner"])
    with pytest.raises(ConfigError, match="stride tags every window.*aggregation_strategy"):
        ours(TRICKY, stride=8)
    with pytest.raises(ConfigError, match="stride=510 must be less than the 510 word pieces"):
        ours(TRICKY, aggregation_strategy="first", stride=510)
    with pytest.raises(ConfigError, match="stride"):
        ours(TRICKY, aggregation_strategy="first", stride=-1)


@pytest.mark.parametrize("delimiter", [None, " ", "\t", "", " | "])
@pytest.mark.parametrize("strategy", ["none", "simple", "first"])
def test_words_already_split_are_tagged_as_transformers(folders, ner_texts, conll_document, strategy, delimiter):
    """is_split_into_words: spans in the words joined by `delimiter`; one list of words answered in a list of
    one, a list of them answered each, as transformers answers."""
    ours, theirs = pipeline("ner", model=folders["ner"]), reference("ner", folders["ner"])
    options = {"aggregation_strategy": strategy, "is_split_into_words": True}
    if delimiter is not None:
        options["delimiter"] = delimiter
    word_lists = [text.split() for text in ner_texts]
    answers = ours(word_lists[0], **options)
    assert len(answers) == 1 and answers[0]
    assert_same(answers, theirs(word_lists[0], **options))
    assert_same(ours(word_lists, **options), theirs(word_lists, **options))
    if strategy != "none":
        _, words = conll_document
        assert_same(ours(words, stride=32, **options), theirs(words, stride=32, **options))


def test_words_already_split_must_be_words(folders):
    ours = pipeline("ner", model=folders["ner"])
    with pytest.raises(InputError, match="is_split_into_words takes a list of words"):
        ours("Johanson met Picard", is_split_into_words=True)
    with pytest.raises(InputError, match="is_split_into_words takes a list of words"):
        ours([["Johanson", 3]], is_split_into_words=True)
    with pytest.raises(ConfigError, match="delimiter must be a text"):
        ours(["Johanson"], is_split_into_words=True, delimiter=[" "])


def test_first_strategy_entities_are_bertforge_predict_s(folders, ner_texts):
    """One decoding: where CoNLL's words are the tokenizer's (no inner punctuation), "first" is the ner task's
    own decoding, and its entities are FinetunedModel.predict's."""
    texts = [text for text in ner_texts if all(word.isalnum() or len(word) == 1 for word in text.split())]
    assert len(texts) >= 3
    predicted = FinetunedModel.load(folders["ner"]).predict(texts)
    for found, answer in zip(pipeline("ner", model=folders["ner"], aggregation_strategy="first")(texts), predicted):
        assert [(e["entity_group"], e["start"], e["end"]) for e in found] == [
            (e["type"], e["start"], e["end"]) for e in answer["entities"]]
        assert [e["score"] for e in found] == pytest.approx([e["score"] for e in answer["entities"]], abs=1e-6)


# --- question-answering ---------------------------------------------------------------------------------------

def reference_answers(folder, question, context, top_k=1, max_answer_len=15, max_seq_len=384, doc_stride=128,
                      handle_impossible_answer=False):
    """transformers 4's question-answering rule, searched exhaustively on transformers' own tokenizer windows and
    BertForQuestionAnswering logits: per window, softmax of the start and end logits over [CLS] and the context,
    a span's score p(start) * p(end); the top_k * 2 + 10 best spans of at most max_answer_len tokens, widened to
    whole words; answers of one text (in any case) add their scores; "" at 0, 0 scored by the least [CLS] pair when
    it beats the best span. Where windows overlap a span counts once (bertforge's decode), not once per window."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.BertForQuestionAnswering.from_pretrained(folder).eval()
    windows = tokenizer(question, context, truncation="only_second", max_length=max_seq_len, stride=doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
    spans, null = {}, 1.0
    for window in range(len(windows["input_ids"])):
        inputs = {name: torch.tensor([windows[name][window]])
                  for name in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            output = model(**inputs)
        context_tokens = [i for i, sequence in enumerate(windows.sequence_ids(window)) if sequence == 1]
        readable = torch.tensor([0, *context_tokens])
        starts = output.start_logits[0, readable].softmax(-1)
        ends = output.end_logits[0, readable].softmax(-1)
        null = min(null, (starts[0] * ends[0]).item())
        offsets = windows["offset_mapping"][window]
        for i, start in enumerate(context_tokens, 1):
            for j, end in enumerate(context_tokens[i - 1:i - 1 + max_answer_len], i):
                span = (offsets[start][0], offsets[end][1])
                spans[span] = max(spans.get(span, 0.0), (starts[i] * ends[j]).item())
    ranked = sorted(spans.items(), key=lambda item: -item[1])
    encoded = tokenizer(context, return_offsets_mapping=True)
    words = {}
    for word, (start, end) in zip(encoded.word_ids(), encoded["offset_mapping"]):
        if word is not None:
            words[word] = (words.get(word, (start, end))[0], end)
    answers = {}
    for (start, end), score in ranked[:top_k * 2 + 10]:
        start = next(s for s, e in words.values() if s <= start < e)
        end = next(e for s, e in words.values() if s < end <= e)
        found = answers.setdefault(context[start:end].lower(), {"score": 0.0, "start": start, "end": end,
                                                                "answer": context[start:end]})
        found["score"] += score
    if handle_impossible_answer and null > ranked[0][1]:
        answers[""] = {"score": null, "start": 0, "end": 0, "answer": ""}
    best = sorted(answers.values(), key=lambda found: -found["score"])[:top_k]
    return best[0] if len(best) == 1 else best


@pytest.mark.parametrize("options", [{}, {"top_k": 3}, {"max_answer_len": 4, "top_k": 2},
                                     {"handle_impossible_answer": True}])
def test_question_answering_follows_transformers_4(folders, squad_questions, options):
    ours = pipeline("question-answering", model=folders["qa"])
    for question, context in squad_questions:
        assert_same(ours(question=question, context=context, **options),
                    reference_answers(folders["qa"], question, context, **options))


def test_no_answer_wins_when_the_model_abstains(tmp_path, tokenizer, squad_questions):
    """A model whose [CLS] outscores every span (a large first position, read by its span head) answers "" at 0, 0
    with handle_impossible_answer, and its best span without."""
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_config(tokenizer))
    with torch.no_grad():
        torch.nn.init.normal_(model.qa_outputs.weight, std=1.0)
        model.bert.embeddings.positions.weight[0, 0] = 8.0  # [CLS] is always at position 0
        model.qa_outputs.weight[:, 0] = 3.0
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ours, (question, context) = pipeline("question-answering", model=tmp_path), squad_questions[0]
    for options in ({"handle_impossible_answer": True, "top_k": 2}, {}):
        assert_same(ours(question=question, context=context, **options),
                    reference_answers(tmp_path, question, context, **options))
    assert ours(question=question, context=context, handle_impossible_answer=True)["answer"] == ""
    assert ours(question=question, context=context)["answer"] != ""


def test_a_long_context_is_read_in_windows(folders, squad_questions):
    question, context = squad_questions[0]
    context = " ".join(context for _, context in squad_questions)
    options = {"max_seq_len": 96, "doc_stride": 24, "top_k": 2}
    assert_same(pipeline("question-answering", model=folders["qa"])(question=question, context=context, **options),
                reference_answers(folders["qa"], question, context, **options))


def test_questions_in_transformers_forms(folders, squad_questions):
    ours = pipeline("question-answering", model=folders["qa"])
    (q1, c1), (q2, c2) = squad_questions[:2]
    one = ours(question=q1, context=c1)
    assert set(one) == {"score", "start", "end", "answer"} and c1[one["start"]:one["end"]] == one["answer"]
    assert ours({"question": q1, "context": c1}) == one
    assert ours([{"question": q1, "context": c1}]) == one  # a list of one answers alone, as transformers 4
    assert ours(question=[q1, q2], context=[c1, c2]) == [one, ours(question=q2, context=c2)]
    assert ours(question=[q1, q2], context=c1) == [one, ours(question=q2, context=c1)]
    assert ours(q1, c1) == ours(q1, context=c1) == one  # transformers 4's question and context by position
    assert ours([q1, q2], c1) == [one, ours(question=q2, context=c1)]
    assert list(ours(item for item in [{"question": q1, "context": c1}])) == [one]  # a stream of one
    assert 0 < one["score"] <= 1


def test_answers_are_bertforge_predict_s_best_spans(folders, squad_questions):
    """One decoding: without widening to words, the best answer is the qa task's own best span."""
    pairs = squad_questions
    answers = pipeline("question-answering", model=folders["qa"])(
        question=[q for q, _ in pairs], context=[c for _, c in pairs], align_to_words=False, max_answer_len=30)
    predicted = FinetunedModel.load(folders["qa"]).predict(pairs)
    assert [(a["start"], a["end"], a["answer"]) for a in answers] == [(p["start"], p["end"], p["answer"])
                                                                     for p in predicted]


# --- models, tasks, devices and errors ------------------------------------------------------------------------

def test_the_task_is_the_model_s_when_not_given(folders, tokenizer):
    assert pipeline().task == "feature-extraction"
    assert pipeline(model=folders["masked_lm"]).task == "fill-mask"
    assert {name: pipeline(model=folders[name]).task for name in ("classifier", "ner", "qa")} == {
        "classifier": "text-classification", "ner": "token-classification", "qa": "question-answering"}
    assert pipeline(model=BertForTokenClassification.from_pretrained(folders["ner"]), tokenizer=tokenizer).task == (
        "token-classification")


def test_loaded_models_answer_as_their_folders(folders, tokenizer, reviews):
    from_folder = pipeline("text-classification", model=folders["classifier"])(reviews, top_k=None)
    model = BertForSequenceClassification.from_pretrained(folders["classifier"])
    assert pipeline("text-classification", model=model, tokenizer=tokenizer)(reviews, top_k=None) == from_folder
    finetuned = FinetunedModel.load(folders["classifier"])
    assert pipeline(model=finetuned)(reviews, top_k=None) == from_folder
    encoder = pipeline("feature-extraction", model=model, tokenizer=folders["classifier"])
    assert encoder("A film.") == pipeline("feature-extraction", model=folders["classifier"])("A film.")


def test_devices_as_transformers_names_them(folders):
    assert pipeline("ner", model=folders["ner"], device=-1).device == torch.device("cpu")
    assert pipeline("ner", model=folders["ner"], device="cpu").device == torch.device("cpu")
    assert pipeline("fill-mask", model=folders["masked_lm"]).device == torch.device("cpu")
    if not torch.cuda.is_available():
        assert pipeline("ner", model=folders["ner"], device=0).device == torch.device("cpu")  # transformers' fallback
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            pipeline("ner", model=folders["ner"], device="cuda")


@pytest.mark.parametrize("make, error, message", [
    (lambda f: pipeline("summarization"), ConfigError, "unknown pipeline task 'summarization'; choose from"),
    (lambda f: pipeline("fill-mask", model=f["masked_lm"], topk=3), ConfigError, "unknown fill-mask option 'topk'"),
    (lambda f: pipeline("ner", model=f["ner"], aggregation_strategy="longest"), ConfigError,
     "unknown aggregation_strategy 'longest'"),
    (lambda f: pipeline("text-classification"), ConfigError,
     "text-classification needs a model fine-tuned with a sequence_classification head; it holds an encoder"),
    (lambda f: pipeline("question-answering", model=f["classifier"]), ConfigError,
     "question-answering needs a model fine-tuned with a question_answering head; it holds a sequence_classific"),
    (lambda f: pipeline("fill-mask"), CheckpointError, "no trained weights for BertForMaskedLM's head"),
    (lambda f: pipeline("ner", model=f["ner"] / "missing"), CheckpointError, "no such model directory"),
    (lambda f: pipeline(model=42), ConfigError, "model must be a folder, \"default\" or a bertforge model, got a int"),
    (lambda f: pipeline("text-classification", model=BertForSequenceClassification.from_pretrained(
        f["classifier"])), ConfigError, "needs its tokenizer"),
    (lambda f: pipeline("text-classification", model=BertModel.from_pretrained(f["classifier"]),
                        tokenizer=f["classifier"]), ConfigError, "a BertModel holds an encoder without a trained"),
    (lambda f: pipeline("ner", model=f["ner"], device="gpu"), ConfigError, "is not a device"),
    (lambda f: pipeline("fill-mask", model=f["masked_lm"])("No mask here."), InputError, "no .MASK. token"),
    (lambda f: pipeline("text-classification", model=f["classifier"])([["a", "b"]]), InputError,
     "expected a text or a {\"text\", \"text_pair\"} dict"),
    (lambda f: pipeline("text-classification", model=f["classifier"])("a", function_to_apply="tanh"), ConfigError,
     "unknown function_to_apply 'tanh'"),
    (lambda f: pipeline("ner", model=f["ner"])(42), InputError, "token-classification takes a text or a list"),
    (lambda f: pipeline("question-answering", model=f["qa"])(), InputError, "needs question= and context="),
    (lambda f: pipeline("question-answering", model=f["qa"])(question="Who?", context=" "), InputError,
     "each context must be a non-empty text"),
    (lambda f: pipeline("question-answering", model=f["qa"])(question=5, context="Me."), InputError,
     "question= and context= take a text or a list of texts each"),
    (lambda f: pipeline("question-answering", model=f["qa"])(question="Who?", context="Me.", max_seq_len=600),
     ConfigError, "max_seq_len 600 is more than the model's max_position_embeddings"),
])
def test_mistakes_are_one_line_errors(folders, make, error, message):
    with pytest.raises(error, match=message) as raised:
        make(folders)
    assert isinstance(raised.value, BertforgeError) and "\n" not in str(raised.value)


def test_streams_enums_defaults_and_loading_options_as_transformers_takes_them(folders, reviews, ner_texts):
    """transformers' pipeline test suite's forms: a generator or a dataset of inputs (an iterator of answers), its
    enums for a choice, None for an option's default, and the model-loading options dtype and framework."""
    from transformers.pipelines import AggregationStrategy

    ours, theirs = pipeline("text-classification", model=folders["classifier"]), \
        reference("text-classification", folders["classifier"])
    streamed = ours(text for text in reviews)
    assert iter(streamed) is streamed
    assert_same(list(streamed), list(theirs(text for text in reviews)))
    dataset = torch.utils.data.Subset(reviews, range(3))  # indexed, not iterable by itself: a torch Dataset
    assert_same(list(ours(dataset)), list(theirs(dataset)))
    assert_same(ours(reviews, batch_size=None), theirs(reviews, batch_size=None))
    tagger, reference_tagger = pipeline("ner", model=folders["ner"]), reference("ner", folders["ner"])
    for options in ({"ignore_labels": None}, {"aggregation_strategy": AggregationStrategy.SIMPLE},
                    {"aggregation_strategy": None}):
        assert_same(tagger(ner_texts[:3], **options), reference_tagger(ner_texts[:3], **options), str(options))
    assert_same(pipeline("fill-mask", model=folders["masked_lm"])("A [MASK] film.", top_k=None),
                reference("fill-mask", folders["masked_lm"])("A [MASK] film.", top_k=None))
    cut = {"tokenize_kwargs": {"truncation": True, "max_length": 6}}  # feature-extraction's way to say how to cut
    assert_same(pipeline("feature-extraction", model=folders["classifier"])(reviews[:2], **cut),
                reference("feature-extraction", folders["classifier"])(reviews[:2], **cut))
    bare = {"tokenize_kwargs": {"add_special_tokens": False}}  # the word pieces' vectors alone
    assert_same(pipeline("feature-extraction", model=folders["classifier"])(reviews[:2], **bare),
                reference("feature-extraction", folders["classifier"])(reviews[:2], **bare))
    with pytest.raises(ConfigError, match="add_special_tokens must be True or False, got 'no'"):
        pipeline("feature-extraction", model=folders["classifier"])("a", tokenize_kwargs={"add_special_tokens": "no"})
    with pytest.raises(InputError, match="text 0 has no token to read without"):
        pipeline("feature-extraction", model=folders["classifier"])("", **bare)
    for count in (1, 2):  # a stream of one answers one input too, where a list of one answers it alone
        masked = ["A [MASK] film."] * count
        assert_same(list(pipeline("fill-mask", model=folders["masked_lm"])(text for text in masked)),
                    list(reference("fill-mask", folders["masked_lm"])(text for text in masked)))
    long_text = "A [MASK] film. " + "It runs on and on. " * 150  # past the 512 tokens the model reads
    fill, reference_fill = pipeline("fill-mask", model=folders["masked_lm"]), reference("fill-mask",
                                                                                      folders["masked_lm"])
    with pytest.raises(InputError, match="tokenizer_kwargs"):
        fill(long_text)
    cut = {"tokenizer_kwargs": {"truncation": True}}
    assert_same(fill(long_text, **cut), reference_fill(long_text, **cut))
    halved = pipeline("text-classification", model=folders["classifier"], dtype=torch.bfloat16, framework="pt")
    assert halved.model.dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="framework 'tf': bertforge runs PyTorch"):
        pipeline("text-classification", model=folders["classifier"], framework="tf")
    with pytest.raises(ConfigError, match="give tokenizer="):
        pipeline("text-classification", model=BertForSequenceClassification.from_pretrained(folders["classifier"]),
                 tokenizer=transformers.AutoTokenizer.from_pretrained(folders["classifier"]))


def test_bertforge_runs_pipelines_without_transformers(folders):
    """transformers is the tests' reference only: a pipeline imports none of the Hugging Face libraries."""
    code = (f"import sys; from bertforge import pipeline; "
            f"pipeline('ner', model={str(folders['ner'])!r})('Paris.'); "
            f"pipeline('fill-mask', model={str(folders['masked_lm'])!r})('A [MASK].'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('transformers', 'tokenizers', 'sentence_transformers', 'huggingface_hub')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- zero-shot-classification ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nli_folder(tmp_path_factory, tokenizer):
    """A tiny natural-language-inference classifier (MNLI's label names, entailment last) with a seeded head."""
    torch.manual_seed(1)
    model = BertForSequenceClassification(tiny_config(tokenizer, id2label={0: "CONTRADICTION", 1: "NEUTRAL",
                                                                             2: "ENTAILMENT"}))
    with torch.no_grad():
        torch.nn.init.normal_(model.classifier.weight, std=1.0)
    folder = tmp_path_factory.mktemp("nli")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("call", [
    lambda pipe, texts: pipe(texts[0], ["positive", "negative", "neutral"]),
    lambda pipe, texts: pipe(texts, candidate_labels="film, music, sport", multi_label=True),
    lambda pipe, texts: pipe(texts, candidate_labels=["politics"], hypothesis_template="This text is about {}."),
    lambda pipe, texts: pipe(texts, ["good", "bad"], hypothesis_template="The review is {}."),
], ids=["one text, labels by position", "multi-label, labels in one text", "one label, a template",
        "a batch, a template"])
def test_zero_shot_classification_matches_transformers(call, nli_folder, reviews):
    ours = pipeline("zero-shot-classification", nli_folder)
    theirs = reference("zero-shot-classification", nli_folder)
    assert_same(call(ours, reviews), call(theirs, reviews))


@pytest.mark.parametrize("id2label", [{0: "entailment", 1: "neutral", 2: "contradiction"},
                                      {0: "LABEL_0", 1: "LABEL_1"}, {0: "LABEL_0"}],
                         ids=["entailment first", "no entailment label", "one output"])
def test_zero_shot_reads_other_label_layouts_as_transformers(id2label, tmp_path, tokenizer, reviews):
    """Which logits are entailment and contradiction when the labels are not MNLI's: contradiction is the last
    label when entailment is the first; without an "entail" label, entailment is the last; a one-output model
    (a reranker, a regression) gets 0.5 for every label, as transformers gives it."""
    torch.manual_seed(2)
    model = BertForSequenceClassification(tiny_config(tokenizer, id2label=id2label))
    with torch.no_grad():
        torch.nn.init.normal_(model.classifier.weight, std=1.0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for options in ({}, {"multi_label": True}):
        labels = ["film", "music", "sport"]
        assert_same(pipeline("zero-shot-classification", tmp_path)(reviews[:2], labels, **options),
                    reference("zero-shot-classification", tmp_path)(reviews[:2], labels, **options))


def test_zero_shot_labels_of_equal_scores_come_in_transformers_order(nli_folder, reviews):
    # "film" and "film " make the same hypothesis tokens, so the same score exactly
    labels = ["sport", "film", "music", "film "]
    for multi_label in (False, True):
        ours = pipeline("zero-shot-classification", nli_folder)(reviews[0], labels, multi_label=multi_label)
        theirs = reference("zero-shot-classification", nli_folder)(reviews[0], labels, multi_label=multi_label)
        assert ours["scores"][ours["labels"].index("film")] == ours["scores"][ours["labels"].index("film ")]
        assert ours["labels"] == theirs["labels"]


def test_zero_shot_classification_refuses_what_it_cannot_do(nli_folder, reviews):
    pipe = pipeline("zero-shot-classification", nli_folder)
    for kwargs, message in [({}, "candidate_labels must be one or more labels"),
                            ({"candidate_labels": []}, "candidate_labels must be one or more labels"),
                            ({"candidate_labels": ["a"], "hypothesis_template": "No slot."},
                             "hypothesis_template must hold one {} where the label goes"),
                            # str.format can't fill these with one label (transformers: IndexError, KeyError)
                            ({"candidate_labels": ["a"], "hypothesis_template": "{} and {}"}, "must hold one {}"),
                            ({"candidate_labels": ["a"], "hypothesis_template": "About {topic}."}, "must hold one {}"),
                            ({"candidate_labels": ["a"], "hypothesis_template": "About {"}, "must hold one {}")]:
        with pytest.raises(ConfigError, match=message):
            pipe(reviews[0], **kwargs)
    with pytest.raises(ConfigError, match="takes 1 option\\(s\\) after the inputs by position"):
        pipe(reviews[0], ["a"], "extra")
    with pytest.raises(ConfigError, match="candidate_labels given twice"):
        pipe(reviews[0], ["a"], candidate_labels=["b"])
