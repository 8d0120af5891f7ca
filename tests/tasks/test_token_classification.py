"""NER pipeline against hand-derived alignments and spans, and the published CoNLL-2003 statistics."""

from collections import Counter

import pytest
import torch

from bertforge import ConfigError, InputError
from bertforge.batching import collate
from bertforge.heads import IGNORE_INDEX
from bertforge.tasks.metrics import entities
from bertforge.tasks.tables import data_format
from bertforge.tasks.token_classification import (
    NerSettings,
    TaggedSentence,
    collect_labels,
    encode,
    iob2_transitions,
    predict_tags,
    read_conll,
    read_sentences,
    tagged_entities,
    to_iob2,
    token_features,
    viterbi,
)

LABELS = {0: "O", 1: "B-LOC", 2: "B-PER", 3: "I-PER"}
LABEL2ID = {label: i for i, label in LABELS.items()}


def one_hot_logits(feature, label_of_word, num_labels):
    """(seq, labels) logits whose argmax at each word's first sub-token is label_of_word(word)."""
    logits = torch.zeros(len(feature.input_ids), num_labels)
    for word, position in feature.word_positions.items():
        logits[position, label_of_word(word)] = 5.0
    return logits


@pytest.mark.parametrize("tags, expected", [
    (["I-PER", "I-PER", "O", "I-LOC", "B-LOC"], ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]),
    (["O", "I-ORG", "I-LOC", "I-LOC"], ["O", "B-ORG", "B-LOC", "I-LOC"]),  # a type change starts an entity
    (["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),  # IOB2 is left as it is
    ([], []),
])
def test_to_iob2(tags, expected):
    assert to_iob2(tags) == expected
    assert to_iob2(expected) == expected


def test_labels_go_on_the_first_sub_token(tokenizer):
    # By hand: "Johanson" -> johan ##son; the other words are one token each.
    sentence = TaggedSentence(["Johanson", "lives", "in", "Washington"], ["B-PER", "O", "O", "B-LOC"])
    [feature] = token_features([sentence], tokenizer, LABEL2ID)
    assert tokenizer.convert_ids_to_tokens(feature.input_ids) == \
        ["[CLS]", "johan", "##son", "lives", "in", "washington", "[SEP]"]
    assert feature.labels == [IGNORE_INDEX, 2, IGNORE_INDEX, 0, 0, 1, IGNORE_INDEX]
    assert feature.word_positions == {0: 1, 1: 3, 2: 4, 3: 5}


def test_words_split_by_punctuation_stay_one_word(tokenizer):
    # The tokenizer sees "AL-AIN" as three words; the tag still lands only on "al".
    sentence = TaggedSentence(["AL-AIN", ",", "Paris"], ["B-LOC", "O", "B-LOC"])
    [feature] = token_features([sentence], tokenizer, LABEL2ID)
    assert tokenizer.convert_ids_to_tokens(feature.input_ids) == ["[CLS]", "al", "-", "ain", ",", "paris", "[SEP]"]
    assert feature.labels == [IGNORE_INDEX, 1, IGNORE_INDEX, IGNORE_INDEX, 0, 1, IGNORE_INDEX]


def test_overlapping_windows_take_the_most_central_prediction(tokenizer):
    # Six one-token words, 4 per window, 2 shared: windows hold words 0-3 and 2-5. Context on the nearer side:
    # word 2 has 2 tokens in window 0 but 1 in window 1, word 3 the reverse.
    sentence = TaggedSentence("one two three four five six".split(), [])
    features = token_features([sentence], tokenizer, max_length=6, stride=2)
    assert [sorted(f.word_positions) for f in features] == [[0, 1, 2, 3], [2, 3, 4, 5]]
    assert all(label == IGNORE_INDEX for f in features for label in f.labels)
    logits = [one_hot_logits(f, lambda word, window=w: 1 + window, len(LABELS)) for w, f in enumerate(features)]
    [(tags, probabilities)] = predict_tags([sentence], features, logits, LABELS)
    assert tags == ["B-LOC"] * 3 + ["B-PER"] * 3
    assert all(0.5 < p <= 1 for p in probabilities)


def test_a_sentence_longer_than_max_length_gets_every_word(tokenizer, data_dir):
    sentences = read_conll(data_dir / "conll2003" / "eng.testb")[:12]
    long = TaggedSentence([w for s in sentences for w in s.words], [t for s in sentences for t in s.tags])
    labels = collect_labels(sentences)
    label2id = {label: i for i, label in labels.items()}
    features = token_features([long], tokenizer, label2id, max_length=24, stride=4)
    assert len(features) > 5
    assert all(len(f.input_ids) <= 24 for f in features)
    assert set().union(*(f.word_positions for f in features)) == set(range(len(long.words)))
    for f in features:  # every labelled token is a word's first sub-token, with that word's tag
        assert {p: f.labels[p] for p in f.word_positions.values()} == \
            {p: label2id[long.tags[w]] for w, p in f.word_positions.items()}
        assert sum(label != IGNORE_INDEX for label in f.labels) == len(f.word_positions)
    # A model that predicts each gold tag gives back the gold tags, windows merged.
    logits = [one_hot_logits(f, lambda word: label2id[long.tags[word]], len(labels)) for f in features]
    [(tags, _)] = predict_tags([long], features, logits, labels)
    assert tags == long.tags


def test_a_word_longer_than_the_window_keeps_its_labelled_piece(tokenizer):
    sentence = TaggedSentence(["in", "Johansonjohansonjohanson", "x"], ["O", "B-PER", "O"])
    features = token_features([sentence], tokenizer, LABEL2ID, max_length=4, stride=0)
    assert [f.word_positions for f in features] == [{0: 1}, {1: 1}, {2: 1}]
    assert features[1].labels == [IGNORE_INDEX, 2, IGNORE_INDEX, IGNORE_INDEX]
    assert all(len(f.input_ids) <= 4 for f in features)


def test_iob2_transitions_allow_inside_only_after_its_own_type():
    allowed = iob2_transitions(LABELS)  # O, B-LOC, B-PER, I-PER; last row: the sentence start
    inside_per = LABEL2ID["I-PER"]
    assert allowed[:, inside_per].tolist() == [False, False, True, True, False]
    assert allowed[:, LABEL2ID["O"]].all() and allowed[:, LABEL2ID["B-LOC"]].all()


def test_viterbi_repairs_what_argmax_gets_wrong():
    # Word by word, argmax reads O I-PER I-PER: an entity with no beginning. The best valid sequence
    # (by hand: B-PER I-PER I-PER scores log .4 + log .6 + log .9 against O O O's log .6 + log .3 + log .05)
    # turns the first word into B-PER.
    probs = torch.tensor([[0.6, 0.0, 0.4, 0.0],
                          [0.3, 0.0, 0.1, 0.6],
                          [0.05, 0.0, 0.05, 0.9]])
    labels = viterbi(probs.log(), iob2_transitions(LABELS))
    assert [LABELS[label] for label in labels] == ["B-PER", "I-PER", "I-PER"]
    assert probs.argmax(-1).tolist() == [0, 3, 3]
    assert viterbi(torch.zeros(0, 4), iob2_transitions(LABELS)) == []


def test_viterbi_decoding_of_windows_gives_valid_iob2(tokenizer):
    sentence = TaggedSentence("John Smith met Anna in Oslo".split(), [])
    [feature] = token_features([sentence], tokenizer)
    logits = one_hot_logits(feature, lambda word: [2, 3, 0, 3, 0, 1][word], len(LABELS))
    logits[feature.word_positions[3], LABEL2ID["B-PER"]] = 2.0  # second choice for "Anna"
    [(argmax_tags, _)] = predict_tags([sentence], [feature], [logits], LABELS)
    [(tags, probabilities)] = predict_tags([sentence], [feature], [logits], LABELS, decoding="viterbi")
    assert argmax_tags == ["B-PER", "I-PER", "O", "I-PER", "O", "B-LOC"]
    assert tags == ["B-PER", "I-PER", "O", "B-PER", "O", "B-LOC"]  # "Anna" cannot continue an entity after O
    assert probabilities[3] < 0.1 < 0.9 < probabilities[0]
    with pytest.raises(ConfigError, match="unknown decoding 'crf'"):
        predict_tags([sentence], [feature], [logits], LABELS, decoding="crf")


def test_entities_with_character_spans():
    words = ["John", "Smith", "lives", "in", "New", "York", "."]
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"]
    found = tagged_entities(words, tags, [0.9, 0.7, 1, 1, 0.8, 0.6, 1])
    assert [(e["type"], e["text"], e["start"], e["end"]) for e in found] == \
        [("PER", "John Smith", 0, 10), ("LOC", "New York", 20, 28)]
    assert [e["score"] for e in found] == pytest.approx([0.8, 0.7])
    text = " ".join(words)
    assert all(text[e["start"]:e["end"]] == e["text"] for e in found)


def test_entities_of_labels_without_a_chunk_prefix():
    """Some checkpoints name their labels PER, LOC (or LABEL_1): each is an entity of that type, as transformers'
    pipeline reads them, not B/I prefixes of the types 'ER' and 'OC'."""
    words = ["John", "Smith", "visited", "New", "York", "and", "Paris"]
    tags = ["PER", "PER", "O", "LOC", "LOC", "O", "LABEL_1"]
    found = tagged_entities(words, tags)
    assert [(entity["type"], entity["text"]) for entity in found] == [
        ("PER", "John Smith"), ("LOC", "New York"), ("LABEL_1", "Paris")]


def test_collate_pads_labels_with_the_ignore_index(tokenizer):
    """The task's rows through the one collate (token_classification.collate, unused by the library, is gone)."""
    sentences = [TaggedSentence(["Paris"], ["B-LOC"]), TaggedSentence(["John", "Smith"], ["B-PER", "I-PER"])]
    batch = collate(encode(tokenizer, sentences, NerSettings(), LABELS).rows, tokenizer.pad_token_id)
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 1, IGNORE_INDEX, IGNORE_INDEX],
                                        [IGNORE_INDEX, 2, 3, IGNORE_INDEX]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_read_conll_testb_matches_the_published_counts(data_dir):
    # SOURCE.md: 3,453 sentences, 46,435 tokens, PER/LOC/ORG/MISC entities 1,617 / 1,668 / 1,661 / 702.
    sentences = read_conll(data_dir / "conll2003" / "eng.testb")
    assert len(sentences) == 3453
    assert sum(len(s.words) for s in sentences) == 46435
    counts = Counter(type_ for s in sentences for type_, _, _ in entities(s.tags))
    assert counts == {"PER": 1617, "LOC": 1668, "ORG": 1661, "MISC": 702}
    # This copy has no -DOCSTART- lines: the file is one document.
    assert sentences[1] == TaggedSentence(["Nadim", "Ladki"], ["B-PER", "I-PER"], document=0)
    assert {s.document for s in sentences} == {0}
    assert collect_labels(sentences) == dict(enumerate(
        ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]))


def test_conll_files_are_known_by_their_lines_whatever_their_extension(data_dir, tmp_path):
    """CoNLL-2003 ships eng.train, eng.testa, eng.testb: no extension a reader knows, so the lines decide."""
    for name in ("eng.train", "eng.testa", "eng.testb"):
        assert data_format(data_dir / "conll2003" / name) == "conll"
    other = tmp_path / "notes.testb"
    other.write_text("just a sentence of prose\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"notes.testb.*unknown file type '.testb'"):
        data_format(other)


def test_tab_separated_token_files_are_conll_and_other_files_are_refused_with_a_hint(data_dir, tmp_path):
    """Token-per-line NER data often comes as word<TAB>tag in a .tsv (or .txt): read as CoNLL; a .tsv of text
    columns stays a table, and a task that needs CoNLL says which extension would make it one."""
    lines = (data_dir / "conll2003" / "eng.testa").read_text(encoding="utf-8").splitlines()[:400]
    tokens = tmp_path / "ner.tsv"
    tokens.write_text("\n".join("\t".join(line.split()[::3]) for line in lines if not line.startswith("-DOCSTART-"))
                      + "\n", encoding="utf-8")
    assert data_format(tokens) == "conll"
    expected = [sentence.words for sentence in read_conll(data_dir / "conll2003" / "eng.testa")][:5]
    assert [sentence.words for sentence in read_conll(tokens)][:5] == expected
    table = tmp_path / "reviews.tsv"
    table.write_text("sentence\tlabel\nA fine film .\t1\nDull .\t0\n", encoding="utf-8")
    assert data_format(table) == "tsv"
    with pytest.raises(InputError, match=r"reviews.tsv: named-entity recognition reads CoNLL or rows of words and "
                                         r"tags \(JSON lines, Parquet, a datasets folder\), not tsv \(a CoNLL file: "
                                         r"give it the extension .conll\)"):
        read_sentences(table, labelled=True)


def test_read_conll_iob1_with_document_starts(tmp_path):
    path = tmp_path / "eng.iob1"
    path.write_text("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n\n"
                    "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n\n-DOCSTART- -X- O O\n\nBRUSSELS NNP I-NP I-LOC\n",
                    encoding="utf-8")
    assert read_conll(path) == [TaggedSentence(["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"], 0),
                                TaggedSentence(["Peter", "Blackburn"], ["B-PER", "I-PER"], 0),
                                TaggedSentence(["BRUSSELS"], ["B-LOC"], 1)]


def test_document_context_fills_the_window_from_the_same_document_only(tokenizer):
    # One-token words. Document 0: "a b", "Paris c", "d e"; document 1: "f g".
    sentences = [TaggedSentence(["a", "b"], ["O", "O"], 0), TaggedSentence(["Paris", "c"], ["B-LOC", "O"], 0),
                 TaggedSentence(["d", "e"], ["O", "O"], 0), TaggedSentence(["f", "g"], ["O", "O"], 1)]
    wide = token_features(sentences, tokenizer, LABEL2ID, max_length=32, context="document")
    assert [tokenizer.convert_ids_to_tokens(f.input_ids) for f in wide] == [
        ["[CLS]", "a", "b", "paris", "c", "d", "e", "[SEP]"],
        ["[CLS]", "a", "b", "paris", "c", "d", "e", "[SEP]"],
        ["[CLS]", "a", "b", "paris", "c", "d", "e", "[SEP]"],
        ["[CLS]", "f", "g", "[SEP]"]]
    # Only the sentence's own words are labelled and predicted.
    assert [f.word_positions for f in wide] == [{0: 1, 1: 2}, {0: 3, 1: 4}, {0: 5, 1: 6}, {0: 1, 1: 2}]
    assert wide[1].labels == [IGNORE_INDEX] * 3 + [1, 0] + [IGNORE_INDEX] * 3
    # A window of 6 leaves 2 tokens of context: one from each side.
    narrow = token_features(sentences, tokenizer, LABEL2ID, max_length=6, context="document")
    assert tokenizer.convert_ids_to_tokens(narrow[1].input_ids) == ["[CLS]", "b", "paris", "c", "d", "[SEP]"]
    assert tokenizer.convert_ids_to_tokens(narrow[0].input_ids) == ["[CLS]", "a", "b", "paris", "c", "[SEP]"]
    # Decoding with context gives each word its own prediction back.
    logits = [one_hot_logits(f, lambda word, s=f.sentence: LABEL2ID[sentences[s].tags[word]], len(LABELS))
              for f in narrow]
    assert [tags for tags, _ in predict_tags(sentences, narrow, logits, LABELS)] == [s.tags for s in sentences]


def test_document_context_around_a_sentence_split_into_windows(tokenizer, data_dir):
    sentences = read_conll(data_dir / "conll2003" / "eng.testb")[:12]
    label2id = {label: i for i, label in collect_labels(sentences).items()}
    long = TaggedSentence([w for s in sentences[1:10] for w in s.words], [t for s in sentences[1:10] for t in s.tags],
                          document=0)
    document = [TaggedSentence(sentences[0].words, sentences[0].tags, 0), long,
                TaggedSentence(sentences[10].words, sentences[10].tags, 0)]
    features = token_features(document, tokenizer, label2id, max_length=48, stride=4, context="document")
    own = [f for f in features if f.sentence == 1]
    assert len(own) > 3 and all(len(f.input_ids) == 48 for f in features)  # every window is full
    assert set().union(*(f.word_positions for f in own)) == set(range(len(long.words)))
    logits = [one_hot_logits(f, lambda word, s=f.sentence: label2id[document[s].tags[word]], len(label2id))
              for f in features]
    assert [tags for tags, _ in predict_tags(document, features, logits, collect_labels(sentences))] == [
        s.tags for s in document]


@pytest.mark.parametrize("text, message", [
    ("EU B-ORG\nrejects\n", "line 2: expected a word and its tag"),
    ("EU NNP Q-ORG\n", "line 1: tag 'Q-ORG' is not an entity tag"),
])
def test_read_conll_bad_lines(tmp_path, text, message):
    path = tmp_path / "bad.conll"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=message) as error:
        read_conll(path)
    assert error.value.path == path


def test_read_conll_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_conll(tmp_path / "absent.conll")


def test_unknown_tag_is_an_input_error(tokenizer):
    with pytest.raises(InputError, match="tag 'B-ORG' is not among the model's labels"):
        token_features([TaggedSentence(["EU"], ["B-ORG"])], tokenizer, LABEL2ID)


def test_conll_words_alone_to_predict_and_tab_separated_words_with_spaces(data_dir, tmp_path):
    """To predict, a CoNLL file may be its words alone, a word a line (the tags of a labelled file are ignored);
    in a tab-separated file a word may hold a space or a no-break space, and stays whole."""
    real = read_conll(data_dir / "conll2003" / "eng.testb")[:30]
    words_only = tmp_path / "words.conll"
    words_only.write_text("\n\n".join("\n".join(s.words) for s in real) + "\n", encoding="utf-8")
    read = read_sentences(words_only, labelled=False)
    assert [s.words for s in read] == [s.words for s in real] and all(s.tags == [] for s in read)
    assert [s.words for s in read_sentences(data_dir / "conll2003" / "eng.testb", labelled=False)][:30] == [
        s.words for s in real]
    with pytest.raises(InputError, match=r"words.conll, line 1: expected a word and its tag"):
        read_sentences(words_only, labelled=True)
    spaced = tmp_path / "spaced.conll"
    spaced.write_text("New York\tB-LOC\nrejects\tO\nS\u00e3o\u00a0Paulo\tB-LOC\n\nEU B-ORG\n", encoding="utf-8")
    assert read_conll(spaced) == [
        TaggedSentence(["New York", "rejects", "S\u00e3o\u00a0Paulo"], ["B-LOC", "O", "B-LOC"], 0),
        TaggedSentence(["EU"], ["B-ORG"], 0)]


def test_a_latin_1_conll_file_names_its_line(tmp_path):
    """CoNLL-2002's files are Latin-1: the error says where the first byte UTF-8 can't read is."""
    path = tmp_path / "esp.train"
    path.write_bytes("Melbourne B-LOC\n( O\nAustralia B-LOC\n\nEl O\nAbogado O\nGeneral O\nTestigo\u00f1 O\n"
                     .encode("latin-1"))
    with pytest.raises(InputError, match=r"esp.train, line 8: not valid UTF-8 text"):
        read_conll(path)
