"""Vocabulary learner: a hand-derived worked example, the pieces it builds, and a vocabulary learnt on real text
that BertTokenizer loads and that leaves < 1% [UNK] on held-out lines."""

import pytest

from bertforge import BertTokenizer, ConfigError, InputError
from bertforge.pretraining.raw_text import corpus_texts
from bertforge.tokenizer.learn_vocab import count_words, join, learn_vocab, learn_wordpiece

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_worked_example():
    # h ##u ##g (10), p ##u ##g (5), h ##u ##g ##s (5):
    # (##u, ##g) occurs 20 times -> ##ug; then (h, ##ug) 15 -> hug; then (hug, ##s) 5 and (p, ##ug) 5 tie and
    # the alphabetically first pair wins -> hugs; then pug. Nothing is left to merge after that.
    tokens = learn_wordpiece({"hug": 10, "pug": 5, "hugs": 5}, vocab_size=100)
    alphabet = ["g", "h", "p", "s", "u", "##g", "##h", "##p", "##s", "##u"]
    assert tokens == SPECIALS + alphabet + ["##ug", "hug", "hugs", "pug"]
    assert learn_wordpiece({"hug": 10, "pug": 5, "hugs": 5}, vocab_size=16) == SPECIALS + alphabet + ["##ug"]


def test_pairs_seen_once_are_not_merged():
    assert learn_wordpiece({"ab": 1, "cd": 1}, vocab_size=50) == SPECIALS + ["a", "b", "c", "d"] + \
        ["##a", "##b", "##c", "##d"]
    assert learn_wordpiece({"ab": 1}, vocab_size=50, min_pair_count=1)[-1] == "ab"


def test_repeated_pieces_merge_left_to_right():
    # "aaa" x 3: (a, ##a) 3 times and (##a, ##a) 3 times; the tie goes to (##a, ##a) ('#' < 'a'), which joins
    # the last two pieces -> a ##aa; then (a, ##aa) -> aaa.
    tokens = learn_wordpiece({"aaa": 3}, vocab_size=50)
    assert tokens[len(SPECIALS) + 2:] == ["##aa", "aaa"]
    assert join("un", "##aff") == "unaff" and join("##a", "##b") == "##ab"


def test_same_piece_from_two_pairs_enters_once():
    # "abc" can become "abc" by a + ##bc or by ab + ##c; the vocabulary holds it once.
    tokens = learn_wordpiece({"abc": 5, "bc": 4, "ab": 3, "xbc": 2}, vocab_size=100)
    assert len(tokens) == len(set(tokens))


def test_words_are_split_as_bert_tokenizer_splits_them():
    counts = count_words(["Héllo, [MASK] WORLD!", "hello [CLS]"])
    assert counts == {"hello": 2, ",": 1, "world": 1, "!": 1}
    assert count_words(["Héllo"], lowercase=False) == {"Héllo": 1}


def test_learnt_vocabulary_on_real_text(data_dir, tmp_path):
    path = data_dir / "pretrain_en" / "abc_science.txt"
    with open(path, encoding="utf-8") as handle:
        lines = [line for _, line in zip(range(4500), handle)]
    train, held_out = lines[:4000], lines[4000:]
    corpus = tmp_path / "train.txt"
    corpus.write_text("".join(train), encoding="utf-8")

    vocab = learn_vocab([corpus], vocab_size=3000)
    assert len(vocab) == 3000 and vocab.id_to_token[:5] == SPECIALS
    vocab.save(tmp_path / "vocab.txt")
    tokenizer = BertTokenizer(tmp_path / "vocab.txt")
    tokens = [token for line in held_out for token in tokenizer.tokenize(line)]
    assert tokens.count("[UNK]") / len(tokens) < 0.01
    words = sum(len(tokenizer.basic.split(line)) for line in held_out)
    assert len(tokens) / words < 1.6, "frequent words are whole tokens"
    assert {"the", "scientists", "##s", "##ing"} <= set(vocab.id_to_token)
    assert tokenizer.tokenize("The scientists") == ["the", "scientists"]


def test_cased_vocabulary_keeps_case(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Paris Paris Paris Café café\n" * 3, encoding="utf-8")
    vocab = learn_vocab([corpus], vocab_size=60, lowercase=False)
    assert "Paris" in vocab and "Café" in vocab
    tokenizer = BertTokenizer(vocab, do_lower_case=False)
    assert tokenizer.tokenize("Paris Café") == ["Paris", "Café"]


def test_errors_are_one_line(tmp_path):
    with pytest.raises(InputError, match=r"missing\.txt: no such corpus file"):
        learn_vocab([tmp_path / "missing.txt"], vocab_size=100)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abc abd\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"vocab_size 10 is too small: this corpus needs at least 13 tokens"):
        learn_vocab([corpus], vocab_size=10)
    assert learn_vocab(str(corpus), vocab_size=20).id_to_token == learn_vocab([corpus], vocab_size=20).id_to_token
    numpy = pytest.importorskip("numpy")  # a numpy integer is a count, as transformers takes it
    assert learn_vocab([corpus], vocab_size=numpy.int64(20)).id_to_token == learn_vocab([corpus], 20).id_to_token
    for options in ({"vocab_size": "100"}, {"vocab_size": None}, {"vocab_size": True}, {"vocab_size": 1.5},
                    {"vocab_size": 100, "min_pair_count": 0}, {"vocab_size": 100, "min_pair_count": -1}):
        name, value = next((name, value) for name, value in reversed(options.items()))
        with pytest.raises(ConfigError, match=rf"^{name} must be a positive whole number, got {value!r}$"):
            learn_vocab([corpus], **options)
    with pytest.raises(ConfigError, match=r"^vocab_size must be a positive whole number, got 'x'$"):
        BertTokenizer.from_pretrained("default").train_new_from_iterator(["abc"], "x")
    corpus.write_bytes(b"ok\n\xff\xfe broken\n")
    with pytest.raises(InputError, match=r"corpus\.txt, line 2: not valid UTF-8"):
        list(corpus_texts([corpus]))


def test_close_to_the_tokenizers_library_trainer(data_dir, tmp_path):
    """Hugging Face tokenizers' WordPieceTrainer makes the same kind of merges (BPE on "##" pieces); the two
    vocabularies differ only in the alphabet (it keeps the character forms it saw) and in tie-breaking."""
    tokenizers = pytest.importorskip("tokenizers")
    with open(data_dir / "pretrain_en" / "abc_science.txt", encoding="utf-8") as handle:
        corpus = tmp_path / "slice.txt"
        corpus.write_text("".join(line for _, line in zip(range(3000), handle)), encoding="utf-8")
    reference = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    reference.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    reference.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    reference.train([str(corpus)], tokenizers.trainers.WordPieceTrainer(vocab_size=2000, special_tokens=SPECIALS,
                                                                          min_frequency=2, show_progress=False))
    ours = set(learn_vocab([corpus], vocab_size=2000).id_to_token)
    assert len(ours & set(reference.get_vocab())) / len(ours) > 0.9


def test_train_new_from_iterator_as_transformers(data_dir, tmp_path):
    """transformers' recipe for a tokenizer of one's own domain: the old tokenizer's settings, a vocabulary learnt
    from batches of WikiText-2 lines. Close to what transformers' BertTokenizerFast learns from the same batches
    (the same kind of merges; see test_close_to_the_tokenizers_library_trainer), as good on held-out lines, and
    saved as a folder transformers reads to the same tokens."""
    transformers = pytest.importorskip("transformers")
    from bertforge.checkpoint.default_model import default_model_dir

    with open(data_dir / "wikitext2" / "wiki.valid.tokens", encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    train, held_out = lines[:1500], lines[1500:1700]
    batches = [train[i:i + 100] for i in range(0, len(train), 100)]
    old = BertTokenizer.from_pretrained(default_model_dir(), model_max_length=256)
    ours = old.train_new_from_iterator(iter(batches), vocab_size=3000)
    theirs = transformers.AutoTokenizer.from_pretrained(default_model_dir(), model_max_length=256
                                                        ).train_new_from_iterator(iter(batches), vocab_size=3000)
    assert len(ours) == len(theirs) == 3000 and ours.model_max_length == 256 and ours.do_lower_case
    assert len(set(ours.get_vocab()) & set(theirs.get_vocab())) / 3000 > 0.9

    def unknown_and_count(tokenizer):
        tokens = [token for line in held_out for token in tokenizer.tokenize(line)]
        return sum(token == "[UNK]" for token in tokens) / len(tokens), len(tokens)

    (our_unknown, our_count), (their_unknown, their_count) = unknown_and_count(ours), unknown_and_count(theirs)
    assert our_unknown < 1.5 * their_unknown + 1e-3 and abs(our_count - their_count) < 0.02 * their_count
    ours.save_pretrained(tmp_path)
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert [reloaded.tokenize(line) for line in held_out[:50]] == [ours.tokenize(line) for line in held_out[:50]]

    one_by_one = old.train_new_from_iterator(train[:200], vocab_size=1500)  # texts, not batches, do as well
    assert len(one_by_one) <= 1500 and one_by_one.tokenize("the same old story")[0] == "the"
    with pytest.raises(InputError, match="reads texts or lists of texts"):
        old.train_new_from_iterator([["a text", 3]], vocab_size=100)
    # the trainer's options, as transformers passes them to the tokenizers library's trainer
    reference = transformers.AutoTokenizer.from_pretrained(default_model_dir())
    options = dict(limit_alphabet=40, initial_alphabet=["ß", "€uro"], new_special_tokens=["<ent>", "</ent>"],
                   show_progress=False)
    ours, theirs = (tokenizer.train_new_from_iterator(iter(batches), vocab_size=2000, **options)
                    for tokenizer in (old, reference))
    ours_vocab, their_vocab = ours.get_vocab(), theirs.get_vocab()
    assert {t for t in ours_vocab if len(t) == 1} == {t for t in their_vocab if len(t) == 1} >= {"ß", "€"}
    assert len({t for t in ours_vocab if len(t) == 1}) == 40
    assert [ours_vocab[t] for t in ours.all_special_tokens] == [their_vocab[t] for t in theirs.all_special_tokens]
    assert ours.all_special_tokens == theirs.all_special_tokens and ours_vocab["</ent>"] == 6
    assert ours.tokenize("the <ent> costs </ent>") == theirs.tokenize("the <ent> costs </ent>")
    assert len(set(ours_vocab) & set(their_vocab)) / 2000 > 0.9
    # merges of pairs seen at least 100 times, until none is left
    ours, theirs = (tokenizer.train_new_from_iterator(iter(batches), vocab_size=30000, min_frequency=100)
                    for tokenizer in (old, reference))
    assert abs(len(ours) - len(theirs)) < 0.1 * len(theirs) < 100
    with pytest.raises(ConfigError, match="special_tokens_map can't rename them"):
        old.train_new_from_iterator(train, vocab_size=100, special_tokens_map={"[CLS]": "<s>"})
