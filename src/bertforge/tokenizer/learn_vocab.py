"""Learn a WordPiece vocabulary from raw text: BERT's basic tokenization, then merges of frequent adjacent pieces.

The merge rule is BPE's (Sennrich et al., 2016) on "##"-marked pieces, which is what Hugging Face tokenizers'
WordPiece trainer does: repeatedly join the adjacent pair of pieces that occurs most often in the corpus (ties:
the alphabetically first pair). The likelihood score of the WordPiece papers, count(ab) / (count(a) count(b)),
favours pairs of rare pieces; frequency merges are simpler to follow and to compute incrementally, and give
the same kind of vocabulary for a BERT. The result is read by BertTokenizer's greedy longest-match-first.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from bertforge.errors import ConfigError, InputError
from bertforge.tokenizer.basic import BasicTokenizer
from bertforge.tokenizer.vocab import SPECIAL_TOKENS, Vocab
from bertforge.tokenizer.wordpiece import CONTINUATION, MAX_WORD_CHARS
from bertforge.validation import check_counts

logger = logging.getLogger("bertforge")

# Pairs seen once are not worth a vocabulary entry: they would only memorise single words of the corpus.
MIN_PAIR_COUNT = 2

Pair = tuple[str, str]


def count_words(lines: Iterable[str], lowercase: bool = True, strip_accents: bool | None = None,
                split_cjk: bool = True) -> Counter[str]:
    """How often each word occurs, split exactly as BertTokenizer splits text (special tokens left out); the
    options are BertTokenizer's basic tokenization settings.

    ["Hello, hello!"] -> {"hello": 2, ",": 1, "!": 1}.
    """
    specials = SPECIAL_TOKENS.values()
    basic = BasicTokenizer(lowercase=lowercase, strip_accents=strip_accents, split_cjk=split_cjk, never_split=specials)
    counts: Counter[str] = Counter()
    for line in lines:
        counts.update(basic.split(line))
    for token in specials:
        counts.pop(token, None)
    return counts


def join(first: str, second: str) -> str:
    """The piece two adjacent pieces become: ("un", "##aff") -> "unaff"; ("##a", "##b") -> "##ab"."""
    return first + second.removeprefix(CONTINUATION)


def alphabet(word_counts: Mapping[str, int], limit: int | None = None, initial: Iterable[str] = ()) -> list[str]:
    """Every character as a word-initial piece and as a "##" continuation, so any word made of seen characters
    has a WordPiece split: {"ab"} -> ["a", "b", "##a", "##b"]. The `initial` characters are kept, seen or not;
    with `limit`, `limit` characters in all, those and then the most frequent (ties: the first in code order), as
    the tokenizers library's trainer keeps its initial_alphabet and limit_alphabet."""
    frequency: Counter[str] = Counter()
    for word, count in word_counts.items():
        for char in word:
            frequency[char] += count
    initial = list(dict.fromkeys(initial))
    ranked = initial + sorted(set(frequency) - set(initial), key=lambda char: (-frequency[char], char))
    chars = sorted(ranked[:limit] if limit is not None else ranked)
    return chars + [CONTINUATION + char for char in chars]


def learn_wordpiece(word_counts: Mapping[str, int], vocab_size: int, min_pair_count: int = MIN_PAIR_COUNT,
                    progress: Callable[[int], None] | None = None, alphabet_limit: int | None = None,
                    initial_alphabet: Iterable[str] = (), extra_special: Sequence[str] = ()) -> list[str]:
    """The vocabulary's tokens: the special tokens (BERT's, then `extra_special`), the alphabet (see `alphabet`),
    then merged pieces in the order learnt. A character left out of the alphabet leaves the pieces of its word to
    either side to merge, as the tokenizers library's trainer leaves them.

    Worked example, {"hug": 10, "pug": 5, "hugs": 5}: pieces h ##u ##g / p ##u ##g / h ##u ##g ##s; the pair
    (##u, ##g) occurs 20 times -> "##ug"; then (h, ##ug) 15 times -> "hug"; then (hug, ##s) 5 and (p, ##ug) 5
    tie and "hug" + "##s" comes first alphabetically -> "hugs"; then "pug".
    `progress` is called with the vocabulary size after each new token.
    """
    check_counts(ConfigError, vocab_size=vocab_size, min_pair_count=min_pair_count)
    specials = list(SPECIAL_TOKENS.values()) + [token for token in dict.fromkeys(extra_special)
                                                if token not in SPECIAL_TOKENS.values()]
    letters = alphabet(word_counts, alphabet_limit, initial_alphabet)
    tokens = specials + letters
    kept = {letter for letter in letters if not letter.startswith(CONTINUATION)}  # the word-initial forms
    if vocab_size < len(tokens):
        raise ConfigError(f"vocab_size {vocab_size} is too small: this corpus needs at least {len(tokens)} tokens "
                          f"({len(specials)} special + {len(tokens) - len(specials)} single characters)")
    known = set(tokens)
    words, counts = [], []
    for word, count in word_counts.items():
        if len(word) > MAX_WORD_CHARS:  # always [UNK] in WordPiece: its pieces would be wasted entries
            continue
        pieces = [char if i == 0 else CONTINUATION + char for i, char in enumerate(word) if char in kept]
        if pieces:
            words.append(pieces)
            counts.append(count)
    pair_counts: dict[Pair, int] = defaultdict(int)
    pair_words: dict[Pair, set[int]] = defaultdict(set)  # may hold words that lost the pair (checked on use)
    for index, (pieces, count) in enumerate(zip(words, counts)):
        for pair in zip(pieces, pieces[1:]):
            pair_counts[pair] += count
            pair_words[pair].add(index)
    # Max-heap of (-count, pair), updated lazily: an entry whose count is out of date is re-queued when popped.
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    while len(tokens) < vocab_size and heap:
        negative_count, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count != -negative_count:
            if count > 0:
                heapq.heappush(heap, (-count, pair))
            continue
        if count < min_pair_count:
            break
        merged = join(*pair)
        grown = set()
        for index in pair_words.pop(pair):
            pieces = words[index]
            if not _contains(pieces, pair):
                continue
            for old in zip(pieces, pieces[1:]):
                pair_counts[old] -= counts[index]
            pieces = words[index] = _merge(pieces, pair, merged)
            for new in zip(pieces, pieces[1:]):
                pair_counts[new] += counts[index]
                pair_words[new].add(index)
                if merged in new:
                    grown.add(new)  # only pairs with the new piece can have grown; the rest are re-queued lazily
        del pair_counts[pair]
        for new in grown:
            heapq.heappush(heap, (-pair_counts[new], new))
        # Two different pairs can spell the same piece ("a"+"##bc", "ab"+"##c"); it enters the vocabulary once.
        if merged not in known:
            known.add(merged)
            tokens.append(merged)
            if progress is not None:
                progress(len(tokens))
    return tokens


def _contains(pieces: list[str], pair: Pair) -> bool:
    return any(a == pair[0] and b == pair[1] for a, b in zip(pieces, pieces[1:]))


def _merge(pieces: list[str], pair: Pair, merged: str) -> list[str]:
    """Join every occurrence of `pair`, left to right: [##a ##a ##a] with (##a, ##a) -> [##aa ##a]."""
    out, i = [], 0
    while i < len(pieces):
        if i + 1 < len(pieces) and pieces[i] == pair[0] and pieces[i + 1] == pair[1]:
            out.append(merged)
            i += 2
        else:
            out.append(pieces[i])
            i += 1
    return out


def learn_vocab(paths: Iterable[str | Path], vocab_size: int, lowercase: bool = True,
                min_pair_count: int = MIN_PAIR_COUNT,
                progress: Callable[[int], None] | None = None, text_field: str = "text") -> Vocab:
    """Learn a vocabulary from a corpus, read as `pretrain prepare` reads it (text files, JSON lines, Parquet,
    datasets folders: bertforge.pretraining.raw_text). Load it with BertTokenizer(vocab, do_lower_case=lowercase).

    Lower-cases and strips accents unless `lowercase=False` (a cased vocabulary), as BertTokenizer does.
    """
    # Imported here: bertforge.pretraining imports the tokenizer, which imports this module.
    from bertforge.pretraining.raw_text import corpus_texts

    check_counts(ConfigError, vocab_size=vocab_size, min_pair_count=min_pair_count)  # before the corpus is read
    paths = [paths] if isinstance(paths, str | Path) else list(paths)  # one file, or several
    if not paths:
        raise InputError("no corpus files given")
    word_counts = count_words(corpus_texts(paths, text_field), lowercase=lowercase)
    if not word_counts:
        raise InputError(f"the corpus has no words ({', '.join(map(str, paths))})")
    logger.info("counted %d distinct words (%d in all)", len(word_counts), sum(word_counts.values()))
    return Vocab(learn_wordpiece(word_counts, vocab_size, min_pair_count, progress))
