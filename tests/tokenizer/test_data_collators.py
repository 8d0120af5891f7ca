"""transformers' data collators (what its Trainer recipes batch with) take bertforge's tokenizer and make the batches
they make with transformers' own: padding, masked-LM masking (the same draws from the same seed), token labels."""

import csv

import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizers(minilm_dir, tokenizer):
    return tokenizer, transformers.AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def texts(sst2_dev):
    return [text for text, _ in sst2_dev[:16]]


def features(tokenizer, texts, **options):
    """Rows as datasets.map(tokenizer, batched=True) stores them: one dict of lists per text."""
    encoded = tokenizer(texts, truncation=True, max_length=48, **options)
    return [{name: list(encoded[name][i]) for name in encoded.keys()} for i in range(len(texts))]


def collate(collator_class, tokenizer, rows, seed=0, **options):
    torch.manual_seed(seed)
    return collator_class(tokenizer=tokenizer, **options)([dict(row) for row in rows])


def assert_same_batch(ours, theirs):
    assert set(ours) == set(theirs)
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name


def test_padding_collator(tokenizers, texts):
    ours, theirs = tokenizers
    for options in ({}, {"pad_to_multiple_of": 8}, {"padding": "max_length", "max_length": 64}):
        assert_same_batch(collate(transformers.DataCollatorWithPadding, ours, features(ours, texts), **options),
                          collate(transformers.DataCollatorWithPadding, theirs, features(theirs, texts), **options))


def test_labels_pass_through_padding_as_transformers_keeps_them(tokenizers, data_dir):
    """A regression target stays a float (STS-B's scores), and a label list that happens to be as long as the
    text's tokens (multi-hot labels) is not padded as if it were one per token."""
    ours, theirs = tokenizers
    with open(data_dir / "stsb" / "dev.tsv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:16]
    texts, scores = [row["sentence1"] for row in rows], [float(row["score"]) for row in rows]
    mine, reference = (collate(transformers.DataCollatorWithPadding, tokenizer,
                               [dict(row, labels=score) for row, score in zip(features(tokenizer, texts), scores)])
                       for tokenizer in (ours, theirs))
    assert_same_batch(mine, reference)
    assert mine["labels"].dtype == torch.float32 and mine["labels"].tolist() == pytest.approx(scores)
    row = {"input_ids": ours("a b c")["input_ids"], "labels": [0.0, 1.0, 1.0, 0.0, 1.0]}  # five labels, five tokens
    for kind in ("pt", "np"):
        mine = ours.pad([row], padding="max_length", max_length=8, return_tensors=kind)
        reference = theirs.pad([dict(row)], padding="max_length", max_length=8, return_tensors=kind)
        assert mine["labels"].tolist() == reference["labels"].tolist() == [row["labels"]]
        assert mine["labels"].dtype == reference["labels"].dtype
        assert mine["input_ids"].tolist() == reference["input_ids"].tolist()


@pytest.mark.parametrize("options", [{}, {"mlm_probability": 0.3, "pad_to_multiple_of": 8}])
def test_masked_lm_collator_draws_the_same_masks(tokenizers, texts, options):
    ours, theirs = tokenizers
    mine = collate(transformers.DataCollatorForLanguageModeling, ours, features(ours, texts), **options)
    reference = collate(transformers.DataCollatorForLanguageModeling, theirs, features(theirs, texts), **options)
    assert_same_batch(mine, reference)
    assert (mine["labels"] != -100).any() and (mine["input_ids"] == ours.mask_token_id).any()


def test_whole_word_masking_reads_bertforge_offsets(tokenizers, texts):
    """transformers' whole-word masking reads each row's offsets; its own tokenizer can't pad them in its collator,
    bertforge's pads them, and every piece of a masked word is masked with it."""
    ours, _ = tokenizers
    rows = features(ours, texts, return_offsets_mapping=True)
    batch = collate(transformers.DataCollatorForLanguageModeling, ours, rows, whole_word_mask=True,
                    mlm_probability=0.3)
    assert "offset_mapping" not in batch and batch["labels"].shape == batch["input_ids"].shape
    for row, labels in zip(rows, batch["labels"]):
        encoding_words = ours(ours.decode(row["input_ids"][1:-1]), truncation=True, max_length=48).word_ids()
        assert len(encoding_words) == len(row["input_ids"])
        masked_words = {encoding_words[i] for i in range(len(row["input_ids"])) if labels[i] != -100}
        for i, word in enumerate(encoding_words):
            if word in masked_words:
                assert labels[i] != -100  # the whole word, not a piece of it


def test_token_classification_collator_pads_labels(tokenizers, texts):
    ours, theirs = tokenizers

    def labelled(tokenizer):
        rows = features(tokenizer, texts)
        for row in rows:  # a label per word, -100 on [CLS] and [SEP], as transformers' NER recipe aligns them
            encoding = tokenizer(tokenizer.decode(row["input_ids"][1:-1]), truncation=True, max_length=48)
            row["labels"] = [-100 if word is None else word % 3 for word in encoding.word_ids()]
        return rows

    assert_same_batch(collate(transformers.DataCollatorForTokenClassification, ours, labelled(ours)),
                      collate(transformers.DataCollatorForTokenClassification, theirs, labelled(theirs)))
