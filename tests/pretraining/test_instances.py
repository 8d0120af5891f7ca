"""Instance construction on a corpus whose every token is a distinct word, so each id tells which document and
position it came from: sequence layout, where segment B comes from for NSP and SOP, label rates within 5
binomial standard deviations, BERT's truncation rule against a token-by-token version, determinism, and a
resumed stream continuing exactly."""

import itertools
import math

import numpy as np
import pytest
import torch

from bertforge import BertTokenizer, ConfigError, InputError
from bertforge.pretraining.corpus import CorpusReader, prepare_corpus
from bertforge.pretraining.instances import (
    InstanceStream,
    target_length,
    truncate_pair,
)
from bertforge.pretraining.objectives import OBJECTIVES
from bertforge.tokenizer.vocab import SPECIAL_TOKENS, Vocab

SIGMAS = 5
MAX_SEQ_LENGTH = 32


@pytest.fixture(scope="module")
def unique_corpus(tmp_path_factory):
    """80 documents of 1-10 sentences of 1-8 words (some of 20-45 words, longer than a sequence), every word
    "w<k>" used once; returns the prepared folder and, per token id, its (document, position)."""
    rng = np.random.default_rng(0)
    documents, next_word = [], 0
    for _ in range(80):
        sentences = []
        for _ in range(rng.integers(1, 11)):
            length = rng.integers(20, 46) if rng.random() < 0.1 else rng.integers(1, 9)
            sentences.append(" ".join(f"w{next_word + i}" for i in range(length)))
            next_word += length
        documents.append(sentences)
    documents.append([f"w{next_word}"])  # a one-token document makes no pair and must be skipped
    next_word += 1
    folder = tmp_path_factory.mktemp("unique")
    (folder / "corpus.txt").write_text("\n\n".join("\n".join(document) for document in documents), encoding="utf-8")
    tokenizer = BertTokenizer(Vocab(list(SPECIAL_TOKENS.values()) + [f"w{k}" for k in range(next_word)]))
    prepare_corpus([folder / "corpus.txt"], tokenizer, folder / "prepared", shard_tokens=300, progress=False)
    origin = {}
    for index, document in enumerate(documents):
        words = " ".join(document).split()
        for position, word in enumerate(words):
            origin[tokenizer.vocab.token_to_id[word]] = (index, position)
    return folder / "prepared", origin, tokenizer


def stream(folder, sentence_pairs="next_sentence", seed=0, epochs=None, **options):
    corpus = CorpusReader(folder, **{key: options.pop(key) for key in ("rank", "world_size") if key in options})
    return InstanceStream(corpus, MAX_SEQ_LENGTH, sentence_pairs, seed=seed, epochs=epochs, **options)


def segments(instance, tokenizer):
    """(A, B) token ids, checking the layout [CLS] A [SEP] B [SEP] with segment ids 0...0 1...1."""
    ids, types = instance.input_ids.tolist(), instance.token_type_ids.tolist()
    assert len(ids) <= MAX_SEQ_LENGTH and len(types) == len(ids)
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    separators = [i for i, token in enumerate(ids) if token == tokenizer.sep_token_id]
    assert len(separators) == 2, "a pair has exactly two [SEP]"
    middle = separators[0]
    assert types == [0] * (middle + 1) + [1] * (len(ids) - middle - 1)
    first, second = ids[1:middle], ids[middle + 1:-1]
    assert first and second
    return first, second


def contiguous_span(ids, origin):
    """The (document, first position, last position) of a run of ids that must be consecutive in one document."""
    places = [origin[token] for token in ids]
    assert len({document for document, _ in places}) == 1, "a segment mixes documents"
    positions = [position for _, position in places]
    assert positions == list(range(positions[0], positions[0] + len(positions))), "a segment skips text"
    return places[0][0], positions[0], positions[-1]


def take(instances, count):
    return list(itertools.islice(iter(instances), count))


def test_objective_names_are_the_pairings():
    from bertforge.pretraining.instances import SENTENCE_PAIRS
    assert {o.sentence_pairs for o in OBJECTIVES.values()} - {None} == set(SENTENCE_PAIRS)


def test_next_sentence_pairs(unique_corpus, within):
    """B continues A or comes from another document, half and half where the chunk allowed either. A chunk of
    one line at a document's end, shorter than the target, always takes a random B (as BERT's does), so the rate
    is counted where A holds none of a document's last line (what only such a chunk, or a long line cut in two,
    puts in A)."""
    folder, origin, tokenizer = unique_corpus
    documents = (folder.parent / "corpus.txt").read_text(encoding="utf-8").split("\n\n")
    last_line_start = [len(document.split()) - len(document.split("\n")[-1].split()) for document in documents]
    instances = take(stream(folder, "next_sentence", epochs=20), 10**6)
    max_tokens = MAX_SEQ_LENGTH - 3
    randoms = coin_flips = 0
    for instance in instances:
        first, second = segments(instance, tokenizer)
        document_a, start_a, end_a = contiguous_span(first, origin)
        document_b, start_b, _ = contiguous_span(second, origin)
        if end_a < last_line_start[document_a]:
            coin_flips += 1
            randoms += instance.next_sentence_label == 1
        if instance.next_sentence_label == 1:
            assert document_b != document_a
        else:
            assert instance.next_sentence_label == 0 and document_b == document_a
            # B continues A; only BERT's truncation (from A's end or B's start) may open a gap
            assert start_b > end_a
            assert start_b == end_a + 1 or len(first) + len(second) == max_tokens
    within(randoms, coin_flips, 0.5, "random next sentences")
    assert coin_flips > 2000


def test_a_short_last_line_takes_a_random_next_segment():
    """BERT's create_instances_from_document: a chunk of one sentence has no continuation, so B comes from another
    document; bertforge cuts a one-line chunk in two only where the line alone reaches the target length."""
    from bertforge.pretraining.corpus import Document
    from bertforge.pretraining.instances import IS_RANDOM, next_sentence_pair

    heading = Document(np.arange(5), np.array([0, 5]))  # one line of 5 tokens
    other = Document(np.arange(100, 140), np.array([0, 20, 40]))
    rng = np.random.default_rng(0)
    for _ in range(50):
        first, second, label, next_start = next_sentence_pair(heading, 0, 1, 20, lambda: other, rng)
        assert label == IS_RANDOM and first.tolist() == list(range(5)) and next_start == 1
        assert set(second.tolist()) <= set(range(100, 140)) and len(second) >= 15
    labels = {next_sentence_pair(heading, 0, 1, 5, lambda: other, rng)[2] for _ in range(50)}
    assert labels == {0, 1}  # a line that reaches the target is cut, and B continues it half the time


def test_sentence_order_pairs(unique_corpus, within):
    folder, origin, tokenizer = unique_corpus
    instances = take(stream(folder, "sentence_order", epochs=20), 10**6)
    swapped = 0
    for instance in instances:
        first, second = segments(instance, tokenizer)
        document_a, start_a, end_a = contiguous_span(first, origin)
        document_b, start_b, end_b = contiguous_span(second, origin)
        assert document_a == document_b, "SOP never draws from another document"
        if instance.next_sentence_label == 1:
            swapped += 1
            assert end_b < start_a
        else:
            assert end_a < start_b
    within(swapped, len(instances), 0.5, "swapped pairs")


def test_single_segments_cover_each_epoch_exactly_once(unique_corpus):
    folder, origin, tokenizer = unique_corpus
    instances = take(stream(folder, None, epochs=1), 10**6)
    text = []
    for instance in instances:
        ids = instance.input_ids.tolist()
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert len(ids) <= MAX_SEQ_LENGTH and not instance.token_type_ids.any()
        assert instance.next_sentence_label is None
        contiguous_span(ids[1:-1], origin)
        text += ids[1:-1]
    assert sorted(text) == sorted(origin)


def test_short_targets(within):
    rng = np.random.default_rng(0)
    max_tokens, draws = 29, 20_000
    lengths = np.array([target_length(max_tokens, 0.1, rng) for _ in range(draws)])
    assert lengths.min() >= 2 and lengths.max() == max_tokens
    # a short target is uniform on 2..max, so it equals max one time in max - 1
    within((lengths < max_tokens).sum(), draws, 0.1 * (1 - 1 / (max_tokens - 1)), "short targets")
    assert all(target_length(max_tokens, 0.0, rng) == max_tokens for _ in range(100))


def test_short_sequences_on_real_text(data_dir, tokenizer, tmp_path):
    """Long real documents, no pairs: every piece but a document's last has its target length, so the share
    of shorter ones estimates short_seq_prob (up to the last pieces, which may be short anyway)."""
    with open(data_dir / "pretrain_en" / "state_union.txt", encoding="utf-8") as handle:
        (tmp_path / "slice.txt").write_text("".join(line for _, line in zip(range(1500), handle)), encoding="utf-8")
    prepare_corpus([tmp_path / "slice.txt"], tokenizer, tmp_path / "out", progress=False)
    for probability in (0.0, 0.1, 0.5):
        instances = take(InstanceStream(CorpusReader(tmp_path / "out"), 128, None, probability, epochs=1), 10**6)
        short = sum(len(instance.input_ids) < 128 for instance in instances)
        ends = len(CorpusReader(tmp_path / "out"))  # at most one cut-off piece per document
        rate = probability * (1 - 1 / 125)  # a short target is uniform on 2..126: 1 in 125 is full length
        spread = SIGMAS * math.sqrt(len(instances) * rate * (1 - rate))
        assert rate * len(instances) - spread <= short <= rate * len(instances) + spread + ends


def test_truncation_rule_matches_the_token_by_token_version(within):
    def reference(n_first, n_second, max_tokens):
        # BERT's loop: while too long, shorten the longer one (B when equal)
        while n_first + n_second > max_tokens:
            if n_first > n_second:
                n_first -= 1
            else:
                n_second -= 1
        return n_first, n_second

    rng = np.random.default_rng(0)
    for n_first, n_second, max_tokens in itertools.product(range(1, 14), range(1, 14), range(2, 20)):
        first, second = np.arange(n_first), 100 + np.arange(n_second)
        kept_first, kept_second = truncate_pair(first, second, max_tokens, rng)
        assert (len(kept_first), len(kept_second)) == reference(n_first, n_second, max_tokens)
        for kept, original in ((kept_first, first), (kept_second, second)):  # a slice of what was there
            assert kept.tolist() == list(range(kept[0], kept[0] + len(kept)))
            assert kept[0] >= original[0] and kept[-1] <= original[-1]
    # the removals come from the front half the time
    fronts = [truncate_pair(np.arange(50), np.arange(1), 11, rng)[0][0] for _ in range(200)]
    within(sum(fronts), 200 * 40, 0.5, "tokens removed from the front")


def test_deterministic_given_the_seed(unique_corpus):
    folder, _, _ = unique_corpus

    def first_ids(seed):
        return [instance.input_ids.tolist() for instance in take(stream(folder, seed=seed), 300)]

    assert first_ids(3) == first_ids(3)
    assert first_ids(3) != first_ids(4)


@pytest.mark.parametrize("sentence_pairs", ["next_sentence", None])
def test_resume_continues_exactly(unique_corpus, sentence_pairs):
    folder, _, _ = unique_corpus
    # small shuffle groups, so that the stop falls inside a group and the run crosses groups and epochs
    original = stream(folder, sentence_pairs, seed=7, shuffle_tokens=200)
    iterator = iter(original)
    before = take(iterator, 137)
    state = original.state_dict()
    after = take(iterator, 900)
    assert state["epoch"] == 0 and original.epoch >= 1 and state["group"] > 0 and state["position"] > 0

    resumed = stream(folder, sentence_pairs, seed=7, shuffle_tokens=200)
    resumed.load_state_dict(state)
    assert [i.input_ids.tolist() for i in take(resumed, 900)] == [i.input_ids.tolist() for i in after]
    assert before  # (the first part is not replayed)

    other = stream(folder, sentence_pairs, seed=8, shuffle_tokens=200)
    with pytest.raises(ConfigError, match="seed"):
        other.load_state_dict(state)


def test_ranks_build_from_their_own_documents(unique_corpus):
    folder, origin, _ = unique_corpus
    used = []
    for rank in range(2):
        instances = take(stream(folder, "next_sentence", epochs=1, rank=rank, world_size=2), 10**6)
        used.append({origin[token][0] for instance in instances for token in instance.input_ids.tolist()
                     if token in origin})
    assert used[0] and used[1] and not used[0] & used[1]


def test_errors(unique_corpus, tmp_path, tokenizer):
    folder, _, _ = unique_corpus
    for options in ({"sentence_pairs": "next_sentence_prediction"}, {"seed": -1}):
        with pytest.raises(ConfigError):
            stream(folder, **options)
    with pytest.raises(ConfigError, match="too short"):
        InstanceStream(CorpusReader(folder), max_seq_length=4)
    (tmp_path / "one.txt").write_text("just one document.\nof two lines.\n", encoding="utf-8")
    prepare_corpus([tmp_path / "one.txt"], tokenizer, tmp_path / "out", progress=False)
    with pytest.raises(ConfigError, match="at least 2 documents"):
        InstanceStream(CorpusReader(tmp_path / "out"), sentence_pairs="next_sentence")
    assert take(InstanceStream(CorpusReader(tmp_path / "out"), sentence_pairs="sentence_order", epochs=1), 10)
    # documents of one token each give no pair: an endless stream would look for one forever
    (tmp_path / "words.txt").write_text("hello\n\nworld\n\nagain\n", encoding="utf-8")
    prepare_corpus([tmp_path / "words.txt"], tokenizer, tmp_path / "words", progress=False)
    for sentence_pairs in ("next_sentence", "sentence_order"):
        with pytest.raises(InputError, match=r"no training instance can be made of this corpus part \(3 documents, "
                                             r"3 tokens\): a sentence pair needs a document of at least 2 tokens"):
            take(InstanceStream(CorpusReader(tmp_path / "words"), sentence_pairs=sentence_pairs), 1)
    assert len(take(InstanceStream(CorpusReader(tmp_path / "words"), sentence_pairs=None), 5)) == 5
    # a finite stream ends: a DataLoader worker with no shuffle group of its own gives nothing, and no error
    words = InstanceStream(CorpusReader(tmp_path / "words"), sentence_pairs=None, epochs=1)
    loader = torch.utils.data.DataLoader(words, batch_size=None, num_workers=2, collate_fn=lambda instance: instance)
    assert sorted(instance.input_ids.tolist() for instance in loader) == \
        sorted(instance.input_ids.tolist() for instance in InstanceStream(CorpusReader(tmp_path / "words"),
                                                                           sentence_pairs=None, epochs=1))


def test_a_saved_position_is_refused_on_a_corpus_of_other_text_with_the_same_counts(data_dir, tokenizer, tmp_path):
    """--resume may name the corpus by another path; text edited word for word ('the' -> 'a': as many
    documents, sentences and tokens) is other data, and its saved position would mean other instances."""
    with open(data_dir / "pretrain_en" / "state_union.txt", encoding="utf-8") as handle:
        text = "".join(line for _, line in zip(range(300), handle))
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "b.txt").write_text(text.replace(" the ", " a "), encoding="utf-8")
    for name in ("a", "b"):
        prepare_corpus([tmp_path / f"{name}.txt"], tokenizer, tmp_path / name, progress=False)
    first, second = CorpusReader(tmp_path / "a"), CorpusReader(tmp_path / "b")
    assert len(first) == len(second) and first.manifest["tokens"] == second.manifest["tokens"]
    saved = InstanceStream(first, 64, None, seed=0).state_dict()
    InstanceStream(CorpusReader(tmp_path / "a"), 64, None, seed=0).load_state_dict(saved)  # the same corpus resumes
    with pytest.raises(ConfigError, match="other data settings \\(corpus_sha256="):
        InstanceStream(second, 64, None, seed=0).load_state_dict(saved)
