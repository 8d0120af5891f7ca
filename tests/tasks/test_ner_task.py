"""The "ner" task row: CoNLL files -> features -> entities with character spans; a short fine-tune of the default
model on real CoNLL-2003 sentences must find entities, and the saved model must give transformers' logits."""

import pytest
import torch

from bertforge import BertConfig, BertForTokenClassification
from bertforge.errors import InputError
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.tasks.finetuned_model import FinetunedModel, evaluate, predict
from bertforge.tasks.registry import TASKS
from bertforge.tasks.token_classification import (
    NerSettings,
    read_conll,
    sentence_from_text,
    tagged_entities,
    token_features,
)
from bertforge.training import TrainConfig

NER = TASKS["ner"]


def write_conll(sentences, path):
    path.write_text("-DOCSTART- -X- -X- O\n\n" + "".join(
        "".join(f"{word} X X {tag}\n" for word, tag in zip(s.words, s.tags)) + "\n" for s in sentences))
    return path


@pytest.fixture(scope="module")
def conll_slices(data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("conll")
    train = read_conll(data_dir / "conll2003" / "eng.train")[:300]
    dev = read_conll(data_dir / "conll2003" / "eng.testa")[:100]
    return write_conll(train, folder / "train.conll"), write_conll(dev, folder / "dev.conll")


@pytest.fixture(scope="module")
def finetuned_ner(conll_slices, tmp_path_factory):
    train, dev = conll_slices
    config = FinetuneConfig(task="ner", train=str(train), dev=str(dev), output=str(tmp_path_factory.mktemp("ner")),
                            batch_size=8, training=TrainConfig(epochs=4, lr=5e-4, warmup_ratio=0.1, seed=0,
                                                               progress=False))
    return finetune(config)


def test_reading_checks_tags_against_the_model_and_reads_text_for_prediction(tmp_path):
    path = tmp_path / "a.conll"
    path.write_text("John X X B-PER\nlives X X O\n\nParis X X B-LOC\n")
    assert [s.tags for s in NER.read_examples(path, None)] == [["B-PER", "O"], ["B-LOC"]]
    with pytest.raises(InputError, match="'B-LOC' is not one of the model's labels"):
        NER.read_examples(path, None, {0: "O", 1: "B-PER"})
    assert NER.read_examples(path, None, labelled=False)[0].tags == []
    text = tmp_path / "a.txt"
    text.write_text("U.S. troops left Paris, fine.\n\nSecond line\n")
    assert [s.words for s in NER.read_examples(text, None, labelled=False)] == [
        ["U.S.", "troops", "left", "Paris", ",", "fine", "."], [], ["Second", "line"]]  # a prediction per line
    with pytest.raises(InputError, match="one text, not a pair"):
        sentence_from_text("a", "b")
    # decomposed letters (macOS writes names so): a combining mark belongs to its letter, not a word break
    decomposed = sentence_from_text("Peter visited Zu\u0308rich, Mu\u0308nchen and Sa\u0303o Paulo.")
    assert decomposed.words == ["Peter", "visited", "Zu\u0308rich", ",", "Mu\u0308nchen", "and", "Sa\u0303o",
                                "Paulo", "."]
    assert [decomposed.source[start:end] for start, end in decomposed.spans] == decomposed.words


def test_encode_labels_first_pieces_and_predictions_give_entities_with_spans(tokenizer):
    sentences = [sentence_from_text("Johanson lives in Washington"), sentence_from_text("word " * 30)]
    sentences[0].tags = ["B-PER", "O", "O", "B-LOC"]
    sentences[1].tags = ["O"] * 30
    id2label = {0: "O", 1: "B-LOC", 2: "B-PER"}
    features = NER.encode(tokenizer, sentences, NerSettings(max_length=12, doc_stride=2), id2label)
    assert features.rows[0]["labels"] == [-100, 2, -100, 0, 0, 1, -100]  # [CLS] johan ##son lives in washington
    assert features.example_index.count(1) > 2 and features.truncated == 1 and len(features.extras) == len(features)
    model = BertForTokenClassification(BertConfig.tiny(vocab_size=tokenizer.vocab_size, id2label=id2label))
    answers = NER.predict(model, features, sentences, 4)
    assert [len(a["tags"]) for a in answers] == [4, 30]
    for sentence, answer in zip(sentences, answers):
        for entity in answer["entities"]:
            assert sentence.text[entity["start"]:entity["end"]] == entity["text"] and 0 < entity["score"] <= 1
    perfect = NER.score([{"tags": s.tags} for s in sentences], sentences, id2label)
    assert perfect == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "accuracy": 1.0}


def test_short_finetune_finds_entities(finetuned_ner):
    """300 training sentences, 4 epochs: entity F1 on 100 eng.testa sentences well above 0 (measured 0.378;
    per epoch 0.23, 0.29, 0.29, 0.38)."""
    assert finetuned_ner.best["f1"] >= 0.3, finetuned_ner.history


def test_saved_ner_model_matches_transformers_and_predicts_entities(finetuned_ner, tokenizer):
    transformers = pytest.importorskip("transformers")
    directory = finetuned_ner.output_dir
    ours = FinetunedModel.load(directory)
    assert ours.task.name == "ner" and ours.settings.max_length == 128
    theirs = transformers.BertForTokenClassification.from_pretrained(directory).eval()
    assert theirs.config.id2label == ours.id2label
    batch = tokenizer(["EU rejects German call to boycott British lamb .", "Peter Blackburn"], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        expected = theirs(**batch).logits
        actual = ours.model(**batch).logits
    real = batch["attention_mask"].bool()  # padding positions' outputs are arbitrary in both
    torch.testing.assert_close(actual[real], expected[real], rtol=1e-4, atol=1e-4)
    answer = ours.predict([sentence_from_text("EU rejects German call to boycott British lamb .")])[0]
    assert len(answer["tags"]) == 9


def test_a_model_trained_with_document_context_reads_files_with_it(tokenizer, tmp_path, data_dir):
    """The run config's context travels with the model: evaluate and predict on a CoNLL file fill windows with
    the neighbouring sentences as fine-tuning did, a single text (no document) has none."""
    id2label = {0: "O", 1: "B-LOC"}
    model = BertForTokenClassification(BertConfig.tiny(vocab_size=tokenizer.vocab_size, id2label=id2label))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    FinetuneConfig(task="ner", settings=NerSettings(context="document")).save(tmp_path / "finetune_config.json")
    finetuned = FinetunedModel.load(tmp_path)
    sentences = read_conll(data_dir / "conll2003" / "eng.testb")[:20]
    path = write_conll(sentences, tmp_path / "test.conll")
    examples = finetuned.read(path, finetuned.columns(path=path), labelled=False)
    features = NER.encode(tokenizer, examples, finetuned.settings, id2label)
    assert all(len(row["input_ids"]) == 128 for row in features.rows)  # 20 sentences hold far more than 128 tokens
    alone = NER.encode(tokenizer, [sentence_from_text("Peter lives in Paris")], finetuned.settings, id2label)
    assert len(alone.rows[0]["input_ids"]) == 6
    assert [len(a["tags"]) for a in finetuned.predict(examples)] == [len(s.words) for s in sentences]


# Natural sentences as users type them: punctuation glued to words, hyphens, initialisms, numbers with points and
# commas, several spaces, a tab.
NATURAL = [
    "John Smith, of Acme Corp., visited Paris.",
    "Jean-Luc Picard  met the U.S. delegation in São Paulo on Tuesday.",
    "Shares of Hewlett-Packard rose 25.76% to $3.14 in New York.",
    "Angela Merkel and Emmanuel Macron spoke in Berlin;  the EU welcomed it.",
    "The well-known author lived at 221B Baker St., London, until 1890.",
    "Manchester United beat Real Madrid 3-1 at Old Trafford\tlast night!",
    "Dr. Maria Garcia-Lopez (Stanford University) joined Google in 2019.",
    "Tokyo's governor, Yuriko Koike, met Toyota executives on 12/03/2021.",
]


def test_words_remember_where_they_are_in_the_text():
    for text in NATURAL:
        sentence = sentence_from_text(text)
        assert sentence.text == text and [text[start:end] for start, end in sentence.spans] == sentence.words
    assert sentence_from_text("rose 25.76 %  at U.S. Jean-Luc's").words == \
        ["rose", "25.76", "%", "at", "U.S.", "Jean-Luc's"]


def test_entity_spans_are_the_words_places_in_the_text():
    text = NATURAL[0]
    sentence = sentence_from_text(text)
    assert sentence.words == ["John", "Smith", ",", "of", "Acme", "Corp", ".", ",", "visited", "Paris", "."]
    tags = ["B-PER", "I-PER", "O", "O", "B-ORG", "I-ORG", "O", "O", "O", "B-LOC", "O"]
    found = tagged_entities(sentence, tags)
    expected = [("PER", "John Smith"), ("ORG", "Acme Corp"), ("LOC", "Paris")]
    assert [(e["type"], e["text"], e["start"], e["end"]) for e in found] == \
        [(kind, name, text.index(name), text.index(name) + len(name)) for kind, name in expected]


def test_tokens_are_assigned_to_words_by_their_offsets_in_the_text(tokenizer):
    for text in NATURAL:
        sentence = sentence_from_text(text)
        [feature] = token_features([sentence], tokenizer, max_length=128)
        # Each word's first piece is where tokenizing the word alone says it is.
        for word, position in feature.word_positions.items():
            alone = tokenizer(sentence.words[word])["input_ids"][1:-1]
            assert feature.input_ids[position:position + len(alone)] == alone


def test_entity_spans_index_the_text_as_given(finetuned_ner):
    answers = predict(finetuned_ner.output_dir, texts=NATURAL)
    found = 0
    for text, answer in zip(NATURAL, answers):
        sentence = sentence_from_text(text)
        assert answer["text"] == text and len(answer["tags"]) == len(sentence.words)
        starts, ends = {start for start, _ in sentence.spans}, {end for _, end in sentence.spans}
        for entity in answer["entities"]:
            assert text[entity["start"]:entity["end"]] == entity["text"]
            assert entity["start"] in starts and entity["end"] in ends  # whole words
            found += 1
    assert found >= 2  # the model does tag entities in them


def test_a_conll_txt_file_is_read_as_conll_unless_told(finetuned_ner, tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n")
    [as_conll] = predict(finetuned_ner.output_dir, path)
    assert as_conll["text"] == "EU rejects German" and len(as_conll["tags"]) == 3
    assert "f1" in evaluate(finetuned_ner.output_dir, path)  # evaluate reads the same file the same way
    as_lines = predict(finetuned_ner.output_dir, path, format="txt")
    assert [answer["text"] for answer in as_lines] == ["-DOCSTART- -X- -X- O", "", "EU NNP B-NP B-ORG",
                                                       "rejects VBZ B-VP O", "German JJ B-NP B-MISC", ""]
    assert as_lines[1]["entities"] == [] and as_lines[1]["tags"] == []  # a blank line: a sentence of no words


def rewritten(tags, scheme):
    """IOB2 tags in IOBES or BILOU, written here from the entities' extents (single: S-/U-, last: E-/L-)."""
    single, last = {"iobes": ("S", "E"), "bilou": ("U", "L")}[scheme]
    out = list(tags)
    for i, tag in enumerate(tags):
        continues = i + 1 < len(tags) and tags[i + 1] == "I-" + tag[2:]
        if tag.startswith("B-") and not continues:
            out[i] = f"{single}-{tag[2:]}"
        elif tag.startswith("I-") and not continues:
            out[i] = f"{last}-{tag[2:]}"
    return out


@pytest.mark.parametrize("scheme", ["iobes", "bilou"])
def test_iobes_and_bilou_files_read_as_their_iob2_originals(finetuned_ner, conll_slices, tmp_path, scheme):
    """CoNLL-2003 sentences with their tags in IOBES or BILOU (in a .txt file, found to be CoNLL by its tags) read
    as the IOB2 original, and a model trained on IOB2 scores them the same."""
    original = read_conll(conll_slices[1])
    converted = [type(s)(s.words, rewritten(s.tags, scheme), s.document) for s in original]
    assert sum(tag[0] in "SEUL" for s in converted for tag in s.tags) > 50
    path = write_conll(converted, tmp_path / f"dev_{scheme}.txt")
    again = read_conll(path)
    assert [(s.words, s.tags) for s in again] == [(s.words, s.tags) for s in original]
    assert evaluate(finetuned_ner.output_dir, path) == evaluate(finetuned_ner.output_dir, conll_slices[1])


def test_a_tag_of_no_scheme_names_what_is_read(tmp_path):
    path = tmp_path / "bad.conll"
    path.write_text("Paris X-LOC\n")
    with pytest.raises(InputError) as caught:
        read_conll(path)
    assert str(caught.value) == (f"{path}, line 1: tag 'X-LOC' is not an entity tag (expected O, or B-TYPE and "
                                 "I-TYPE: IOB; E-, S- (IOBES) and L-, U- (BILOU) are read too)")


def as_rows(sentences, tags_as="names", names=None):
    """CoNLL sentences as transformers' run_ner rows: {"tokens": [...], "ner_tags": [...]} (names, or numbers)."""
    return [{"tokens": s.words, "ner_tags": s.tags if tags_as == "names" else [names.index(t) for t in s.tags]}
            for s in sentences]


def write_jsonl(rows, path):
    import json

    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_rows_of_words_and_tags_read_as_conll(finetuned_ner, conll_slices, tmp_path):
    """The same CoNLL-2003 sentences as JSON lines of names, a datasets folder and a Parquet file of numbers that
    their ClassLabel names, and a datasets.Dataset in memory (Hugging Face's conll2003 layout) read as the CoNLL
    file, train, and score alike."""
    datasets = pytest.importorskip("datasets")
    original = read_conll(conll_slices[1])
    names = sorted({tag for s in original for tag in s.tags})
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    dataset = datasets.Dataset.from_list(as_rows(original, "numbers", names), features=features)
    dataset.save_to_disk(str(tmp_path / "dev_dataset"))
    dataset.to_parquet(str(tmp_path / "dev.parquet"))
    sources = {"jsonl": write_jsonl(as_rows(original), tmp_path / "dev.jsonl"), "dataset": tmp_path / "dev_dataset",
               "parquet": tmp_path / "dev.parquet", "memory": dataset}
    expected = [(s.words, s.tags) for s in original]
    for name, source in sources.items():
        assert [(s.words, s.tags) for s in NER.read_examples(source, None)] == expected, name
    reference = evaluate(finetuned_ner.output_dir, conll_slices[1])
    for name in ("jsonl", "dataset", "parquet"):
        assert evaluate(finetuned_ner.output_dir, sources[name]) == reference, name
    # numbers that no file names are refused, not read through the model's labels (whose order need not be the data's)
    numbered = write_jsonl(as_rows(original, "numbers", [finetuned_ner_label(finetuned_ner, i)
                                                         for i in range(len(names))]), tmp_path / "numbered.jsonl")
    with pytest.raises(InputError, match="numbered.jsonl, line 1, field 'ner_tags': tag 0 is a number that nothing in"):
        evaluate(finetuned_ner.output_dir, numbered)
    # to predict, the words alone
    answers = predict(finetuned_ner.output_dir, write_jsonl([{"tokens": s.words} for s in original[:3]],
                                                            tmp_path / "words.jsonl"))
    assert [answer["text"] for answer in answers] == [" ".join(s.words) for s in original[:3]]


def finetuned_ner_label(finetuned_ner, index):
    return FinetunedModel.load(finetuned_ner.output_dir).id2label[index]


def test_a_model_trains_on_rows_of_words_and_tags(conll_slices, tmp_path):
    train = write_jsonl([{"words": s.words, "tags": rewritten(s.tags, "iobes")} for s in read_conll(conll_slices[0])],
                        tmp_path / "train.jsonl")
    config = FinetuneConfig(task="ner", train=str(train), dev=str(conll_slices[1]), output=str(tmp_path / "model"),
                            batch_size=8, max_train_examples=64,
                            training=TrainConfig(epochs=1, lr=5e-4, seed=0, progress=False))
    result = finetune(config)
    labels = set(FinetunedModel.load(result.output_dir).id2label.values())
    assert labels <= {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"} and "O" in labels
    assert "f1" in result.best


@pytest.mark.parametrize("rows, message", [
    ([{"tokens": ["John", "ran"], "ner_tags": ["B-PER"]}], "line 1, field 'ner_tags': expected a list of 2 tags"),
    ([{"tokens": "John ran", "ner_tags": ["B-PER", "O"]}], "line 1, field 'tokens': expected a list of words"),
    ([{"tokens": ["John", "\u00a0", "ran"], "ner_tags": ["B-PER", "O", "O"]}],
     'line 1, field \'tokens\': word 2 of the sentence is blank ("\\u00a0"): a word has characters other than'),
    ([{"tokens": ["John"], "ner_tags": [3]}], "line 1, field 'ner_tags': tag 3 is a number that nothing in the data"),
    ([{"tokens": ["John"], "ner_tags": ["PER"]}], "line 1, field 'ner_tags': tag 'PER' is not an entity tag"),
    ([{"text": ["John"], "label": ["B-PER"]}], "no column 'sentence' or 'tokens' or 'words' (the words of each"),
])
def test_rows_that_are_not_sentences_are_one_line_errors(tmp_path, rows, message):
    path = write_jsonl(rows, tmp_path / "bad.jsonl")
    columns = FinetuneConfig(task="ner").columns
    with pytest.raises(InputError) as caught:
        NER.read_examples(path, columns)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_ner_refuses_csv_naming_what_it_reads(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("sentence,label\nJohn,B-PER\n")
    with pytest.raises(InputError, match=r"reads CoNLL or rows of words and tags \(JSON lines, Parquet, a datasets "
                                         r"folder\), not csv"):
        NER.read_examples(path, None)


def test_json_lines_named_json_are_read_as_run_ner_names_them(conll_slices, tmp_path, write_reviews):
    """transformers' example scripts call JSON lines `train.json`: rows for ner and classification alike, where a
    SQuAD file (one object with "data") stays SQuAD."""
    original = read_conll(conll_slices[1])[:20]
    path = write_jsonl(as_rows(original), tmp_path / "train.json")
    assert [(s.words, s.tags) for s in NER.read_examples(path, None)] == [(s.words, s.tags) for s in original]
    reviews = write_jsonl([{"sentence": "a fine film", "label": "pos"}, {"sentence": "dull", "label": "neg"}],
                          tmp_path / "reviews.json")
    assert [e.label for e in TASKS["classification"].read_examples(reviews, FinetuneConfig().columns)] == ["pos", "neg"]
    import json

    array = tmp_path / "array.json"  # a JSON array of rows, which datasets' JSON loader also reads
    array.write_text(json.dumps(as_rows(original), indent=1))
    assert [(s.words, s.tags) for s in NER.read_examples(array, None)] == [(s.words, s.tags) for s in original]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(as_rows(original)[:2] + ["not a row"]))
    with pytest.raises(InputError, match="broken.json, row 3: expected a JSON object per row, got str"):
        NER.read_examples(broken, None)
    squad = tmp_path / "squad.json"
    squad.write_text('{"version": "1.1", "data": []}\n')
    with pytest.raises(InputError, match="reads CoNLL or rows of words and tags .*, not squad"):
        NER.read_examples(squad, None)


def test_a_dataframe_of_word_arrays_reads_as_lists():
    """pandas holds list cells (from Parquet, say) as numpy arrays: read as the lists they are."""
    pd = pytest.importorskip("pandas")
    import numpy as np

    frame = pd.DataFrame({"tokens": [np.array(["John", "ran"]), np.array(["Paris"])],
                          "ner_tags": [np.array(["B-PER", "O"]), np.array(["S-LOC"])]})
    assert [(s.words, s.tags) for s in NER.read_examples(frame, None)] == [(["John", "ran"], ["B-PER", "O"]),
                                                                           (["Paris"], ["B-LOC"])]
