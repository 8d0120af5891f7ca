"""SQuAD pipeline against hand-built windows and logits, real dev answers, and transformers' overflowing windows."""

import json

import pytest

from bertforge import ConfigError, InputError
from bertforge.batching import collate
from bertforge.tasks.metrics import normalize_answer
from bertforge.tasks.question_answering import (
    Answer,
    QAExample,
    QASettings,
    SpanFeatures,
    best_answers,
    encode,
    gold_answers,
    predict_answers,
    read_squad,
    span_features,
    window_starts,
)

CONTEXT = "one two three four five six seven eight nine ten eleven"  # one token a word


def splits_there(text, i):
    """Whether BERT's basic tokenizer puts a token boundary before text[i]: not between two letters or digits."""
    return i in (0, len(text)) or not (text[i - 1].isalnum() and text[i].isalnum())


@pytest.fixture(scope="module")
def squad_dev(data_dir):
    return read_squad(data_dir / "squad" / "dev-v1.1.json")


def test_window_starts():
    assert window_starts(40, 9, 3) == [0, 6, 12, 18, 24, 30, 36]
    assert window_starts(9, 9, 3) == [0]
    assert window_starts(10, 9, 3) == [0, 6]
    assert window_starts(0, 9, 3) == [0]


def test_three_windows_and_an_answer_across_a_boundary(tokenizer):
    # [CLS] q ? [SEP] + 5 context tokens + [SEP] = 10; windows advance 5 - 2 = 3 tokens: words 0-4, 3-7, 6-10.
    # "five six" (tokens 4-5) crosses the end of window 0 and is wholly inside window 1 only.
    example = QAExample("x", "q?", CONTEXT, [("five six", CONTEXT.index("five"))])
    features = span_features([example], tokenizer, max_length=10, stride=2, max_query_length=2)
    assert [tokenizer.decode(f.input_ids, skip_special_tokens=True) for f in features] == [
        "q? one two three four five", "q? four five six seven eight", "q? seven eight nine ten eleven"]
    assert [f.token_type_ids for f in features] == [[0] * 4 + [1] * 6] * 3
    assert [(f.start_position, f.end_position) for f in features] == [(0, 0), (5, 6), (0, 0)]
    window = features[1]
    assert window.offsets[:4] == [None] * 4 and window.offsets[-1] is None
    assert CONTEXT[window.offsets[5][0]:window.offsets[6][1]] == "five six"

    # Window 0 sees only "five" (no end after it); window 1 scores the whole answer higher.
    starts, ends = [[0.0] * 10 for _ in features], [[0.0] * 10 for _ in features]
    starts[0][8], ends[0][8] = 5.0, 1.0  # "five" in window 0
    starts[1][5], ends[1][6] = 5.0, 5.0  # "five six" in window 1
    ranked = predict_answers([example], features, starts, ends)
    assert ranked[0][0] == Answer("five six", 19, 27, 10.0)
    assert best_answers(ranked) == ["five six"]


def test_long_questions_are_cut_to_max_query_length(tokenizer):
    example = QAExample("x", "one two three four five six", CONTEXT, [])
    [feature] = span_features([example], tokenizer, max_length=20, stride=1, max_query_length=3)
    assert tokenizer.decode(feature.input_ids, skip_special_tokens=True) == "one two three " + CONTEXT


def test_n_best_from_hand_made_logits():
    context = "abc def ghi"
    offsets = [None, None, None, (0, 3), (4, 7), (8, 11), None]  # [CLS] q [SEP] abc def ghi [SEP]
    feature = SpanFeatures([0] * 7, [0] * 7, 0, offsets)
    example = QAExample("x", "q", context, [])
    starts = [9.0, 10.0, 0.0, 3.0, 1.5, 0.0, 0.0]
    ends = [9.0, 0.0, 0.0, 0.0, 2.0, 4.0, 10.0]
    # By hand, over context tokens with start <= end: abc-ghi 7, def-ghi 5.5, abc-def 5, ghi 4, def 3.5, abc 3;
    # the question token's 10 and [SEP]'s 10 never count.
    [ranked] = predict_answers([example], [feature], [starts], [ends])
    assert [(a.text, a.score) for a in ranked] == [
        ("abc def ghi", 7.0), ("def ghi", 5.5), ("abc def", 5.0), ("ghi", 4.0), ("def", 3.5), ("abc", 3.0)]
    [ranked] = predict_answers([example], [feature], [starts], [ends], n_best=2, max_answer_length=2)
    assert [a.text for a in ranked] == ["def ghi", "abc def"]
    # SQuAD v2: the null score is [CLS] start + end = 18.
    [ranked] = predict_answers([example], [feature], [starts], [ends], null_threshold=0.0)
    assert ranked[0] == Answer("", 0, 0, 18.0)
    [ranked] = predict_answers([example], [feature], [starts], [ends], null_threshold=11.5)
    assert ranked[0].text == "abc def ghi" and all(a.text for a in ranked)


def test_gold_positions_map_back_to_every_dev_answer(tokenizer, squad_dev):
    # One example per gold answer, so that every answer (not only the first) is labelled and checked.
    examples = [QAExample(e.id, e.question, e.context, [answer]) for e in squad_dev[:300] for answer in e.answers]
    features = span_features(examples, tokenizer)
    found = [None] * len(examples)
    for f in features:
        if f.start_position:
            context = examples[f.example].context
            found[f.example] = context[f.offsets[f.start_position][0]:f.offsets[f.end_position][1]]
    assert None not in found
    # An answer that starts or ends inside a token ("8" of "18": 13 of the 898 here) comes back as the
    # covering tokens; every other one comes back exactly.
    inside_tokens = 0
    for example, text in zip(examples, found):
        gold, start = example.answers[0]
        inside = not (splits_there(example.context, start) and splits_there(example.context, start + len(gold)))
        inside_tokens += inside
        assert gold in text if inside else normalize_answer(text) == normalize_answer(gold)
    assert inside_tokens < 0.05 * len(examples)


def test_windows_match_transformers_overflowing_tokens(tokenizer, squad_dev, minilm_dir):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    first_questions = {}  # one question a paragraph
    for example in squad_dev:
        first_questions.setdefault(example.context, example)
    long = [e for e in first_questions.values() if len(tokenizer.tokenize(e.context)) > 330][::4][:12]
    assert len(long) == 12
    features = span_features(long, tokenizer, max_length=384, stride=128)
    expected = reference([e.question for e in long], [e.context for e in long], truncation="only_second",
                         max_length=384, stride=128, return_overflowing_tokens=True, return_offsets_mapping=True)
    assert [f.example for f in features] == expected["overflow_to_sample_mapping"]
    assert max(f.example for f in features) == 11 and len(features) > 12
    assert [f.input_ids for f in features] == expected["input_ids"]
    assert [f.token_type_ids for f in features] == expected["token_type_ids"]
    for f, offsets, segments in zip(features, expected["offset_mapping"], expected["token_type_ids"]):
        context_offsets = [tuple(o) for o, s in zip(offsets, segments) if s == 1][:-1]  # drop the last [SEP]
        assert [o for o in f.offsets if o is not None] == context_offsets


def test_collate(tokenizer):
    example = QAExample("x", "q?", CONTEXT, [("five six", CONTEXT.index("five"))])
    # The task's rows through the one collate (question_answering.collate, unused by the library, is gone).
    batch = collate(encode(tokenizer, [example], QASettings(max_length=10, doc_stride=2, max_query_length=2)).rows, 0)
    assert batch["start_positions"].tolist() == [0, 5, 0] and batch["end_positions"].tolist() == [0, 6, 0]
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (3, 10)


def test_settings_that_leave_no_window(tokenizer):
    with pytest.raises(ConfigError, match="stride=128"):
        span_features([], tokenizer, max_length=192, stride=128, max_query_length=64)


def squad_file(tmp_path, *questions, version="1.1"):
    path = tmp_path / "squad.json"
    paragraph = {"context": "Denver Broncos won.", "qas": list(questions)}
    path.write_text(json.dumps({"version": version, "data": [{"title": "SB", "paragraphs": [paragraph]}]}))
    return path


def test_read_squad_v2(tmp_path):
    path = squad_file(tmp_path, {"id": "q1", "question": "Who lost?", "answers": [], "is_impossible": True})
    [example] = read_squad(path, version_2=True)
    assert example.is_impossible and example.answers == []
    assert gold_answers([example]) == [[""]]
    with pytest.raises(InputError, match=r"unanswerable: SQuAD v2.0 data, which a model fine-tuned with "
                                         r"--version-2 \(version_2=True\) reads"):
        read_squad(path)


def test_read_squad_to_predict_needs_no_answers(tmp_path):
    """A SQuAD file of questions alone (answers left out, or a v2.0 file read by a v1.1 model) is what predict
    reads: its questions and contexts."""
    path = squad_file(tmp_path, {"id": "q1", "question": "Who lost?"},
                      {"id": "q2", "question": "Who won?", "answers": [], "is_impossible": True})
    read = read_squad(path, labelled=False)
    assert [(e.id, e.question, e.answers, e.is_impossible) for e in read] == [
        ("q1", "Who lost?", [], False), ("q2", "Who won?", [], False)]
    assert read[0].context == read[1].context and read[0].context
    with pytest.raises(InputError, match=r"question q1 .* has no 'answers'"):
        read_squad(path)
    no_question = squad_file(tmp_path, {"id": "q3"})
    with pytest.raises(InputError, match=r"question q3 .* has no 'question'"):
        read_squad(no_question, labelled=False)


def test_questions_sharing_an_id_are_each_read_with_a_warning(tmp_path, caplog):
    path = squad_file(tmp_path, {"id": "1", "question": "Who lost?"}, {"id": "2", "question": "Who won?"},
                      {"id": "1", "question": "Where?"})
    with caplog.at_level("WARNING", logger="bertforge"):
        read = read_squad(path, labelled=False)
    assert [example.question for example in read] == ["Who lost?", "Who won?", "Where?"]
    assert [record.getMessage() for record in caplog.records] == [
        f"{path}: 1 question(s) share an id with an earlier one (first: '1'); each is answered, but the official "
        f"SQuAD script keys answers by id"]


def test_read_squad_real_dev(squad_dev):
    assert len(squad_dev) == 10570  # the official SQuAD v1.1 dev set
    first = squad_dev[0]
    assert first.answers[0] == ("Denver Broncos", first.context.index("Denver Broncos"))


@pytest.mark.parametrize("question, message, field", [
    ({"id": "q1", "question": "Who won?", "answers": [{"text": "Broncos", "answer_start": 0}]},
     "question q1 \\(article 'SB', paragraph 0\\), answer 0: answer_start 0 points at 'Denver ', not 'Broncos'",
     "answer_start"),
    ({"id": "q1", "question": "Who won?"}, "question q1 \\(article 'SB', paragraph 0\\) has no 'answers'",
     "answers"),
    ({"id": "q1", "question": "Who won?", "answers": [{"text": "Denver"}]}, "answer 0 has no 'answer_start'",
     "answer_start"),
    ({"question": "Who won?", "answers": []}, "article 'SB', paragraph 0 has no 'id'", "id"),
    ({"id": "q1", "question": "Who won?", "answers": []}, "has no answers", "answers"),
])
def test_read_squad_errors(tmp_path, question, message, field):
    path = squad_file(tmp_path, question)
    with pytest.raises(InputError, match=message) as error:
        read_squad(path)
    assert (error.value.path, error.value.field) == (path, field)
    assert "\n" not in str(error.value)


def test_read_squad_bad_json(tmp_path):
    path = tmp_path / "squad.json"
    path.write_text('{"data": [\n  {"title": }]}')
    with pytest.raises(InputError, match="line 2: not valid JSON"):
        read_squad(path)
    with pytest.raises(InputError, match="no such file"):
        read_squad(tmp_path / "absent.json")


def test_run_qa_json_of_rows_under_data(tmp_path, squad_dev):
    """transformers' run_qa reads a custom .json file as load_dataset("json", field="data"): rows of id, question,
    context and answers under "data". Read as such, the same questions as the SQuAD file."""
    from bertforge.tasks.question_answering import read_examples

    chosen = squad_dev[:5]
    rows = [{"id": e.id, "title": "t", "question": e.question, "context": e.context,
             "answers": {"text": [text for text, _ in e.answers], "answer_start": [start for _, start in e.answers]}}
            for e in chosen]
    (tmp_path / "run_qa.json").write_text(json.dumps({"version": "0.1.0", "data": rows}), encoding="utf-8")
    assert read_examples(tmp_path / "run_qa.json") == chosen
