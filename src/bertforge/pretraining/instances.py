"""Training sequences built on the fly from a prepared corpus: [CLS] A [SEP] B [SEP] pairs for NSP/SOP, or one
stretch of text for masked-LM-only objectives (BERT's create_pretraining_data, done lazily every epoch).

A document is cut into chunks of whole sentences, each at least a target length (max_seq_length - 3, or with
probability short_seq_prob a length drawn uniformly from 2 up to that, so the model also sees short inputs).
A chunk's first k sentences (k uniform in 1..n-1) are segment A and the rest B; a one-sentence chunk is cut at a
random token instead (for NSP only one that reaches the target: a shorter one is A, with a random B, as in BERT's).
How B is then chosen and labelled is the named strategy of SENTENCE_PAIRS.

All randomness comes from counters: the documents' order in an epoch from (seed, rank, epoch), everything in a
shuffle group from (seed, rank, epoch, group). The stream's position (epoch, group, instances already given) is
therefore its whole state, and a resumed run rebuilds the same group and continues where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset

from bertforge.errors import ConfigError, InputError
from bertforge.pretraining.corpus import CorpusReader, Document

SHORT_SEQ_PROB = 0.1
# The instances of this many tokens' worth of documents are built together and shuffled, so that a batch mixes
# documents instead of holding consecutive chunks of one (BERT shuffles all instances of its output file).
SHUFFLE_TOKENS = 1 << 20
# Labels, as BertForPreTraining's next_sentence_label expects them.
IS_NEXT, IS_RANDOM = 0, 1
IN_ORDER, SWAPPED = 0, 1

Rng = np.random.Generator


@dataclass
class Instance:
    input_ids: np.ndarray  # (seq,) int64: [CLS] A [SEP] B [SEP], or [CLS] text [SEP]
    token_type_ids: np.ndarray  # (seq,) int64: 0 for [CLS] A [SEP], 1 for B [SEP]
    next_sentence_label: int | None  # 0 = real continuation / in order, 1 = random B / swapped; None: no pair


def target_length(max_tokens: int, short_seq_prob: float, rng: Rng) -> int:
    """max_tokens, or with probability short_seq_prob a length uniform in 2..max_tokens."""
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, max_tokens + 1))
    return max_tokens


def truncate_pair(first: np.ndarray, second: np.ndarray, max_tokens: int, rng: Rng) -> tuple[np.ndarray, np.ndarray]:
    """BERT's truncate_seq_pair: drop one token at a time from the longer segment (B on a tie), from its front or
    its back with equal probability. (10, 3, max 8) -> (5, 3); (6, 6, max 9) -> (5, 4).

    Done in closed form: the final lengths follow from the rule, and the number of the removals taken from the
    front of a segment is Binomial(removals, 1/2), as the token-by-token coin flips would give.
    """
    n_first, n_second = len(first), len(second)
    excess = n_first + n_second - max_tokens
    if excess <= 0:
        return first, second
    if n_first - excess >= n_second:
        keep_first, keep_second = n_first - excess, n_second
    elif n_second - excess >= n_first:
        keep_first, keep_second = n_first, n_second - excess
    else:  # both end within one token of each other; ties took B first, so A keeps the odd token
        keep_first, keep_second = (max_tokens + 1) // 2, max_tokens // 2
    return _trim(first, n_first - keep_first, rng), _trim(second, n_second - keep_second, rng)


def _trim(tokens: np.ndarray, removals: int, rng: Rng) -> np.ndarray:
    if removals == 0:
        return tokens
    front = int(rng.binomial(removals, 0.5))
    return tokens[front:len(tokens) - (removals - front)]


def split_chunk(document: Document, start: int, end: int, rng: Rng) -> tuple[np.ndarray, np.ndarray, int]:
    """Segment A, segment B, and the first sentence of B (`end` when A and B share one sentence).

    Sentences start..end-1 are cut after a random k in 1..n-1 of them; a one-sentence chunk (a long line, or
    the last line of a document) is cut at a random token, so that it still makes a pair.
    """
    tokens, offsets = document.tokens, document.offsets
    if end - start == 1:
        cut = int(rng.integers(offsets[start] + 1, offsets[end]))
        return tokens[offsets[start]:cut], tokens[cut:offsets[end]], end
    middle = int(rng.integers(start + 1, end))
    return tokens[offsets[start]:offsets[middle]], tokens[offsets[middle]:offsets[end]], middle


def random_span(document: Document, min_tokens: int, rng: Rng) -> np.ndarray:
    """Whole sentences from a random sentence of `document` on, until at least min_tokens (or the end)."""
    offsets = document.offsets
    start = int(rng.integers(len(document)))
    end = int(np.searchsorted(offsets, offsets[start] + max(1, min_tokens), side="left"))
    return document.tokens[offsets[start]:offsets[min(max(end, start + 1), len(document))]]


# A pair strategy: (document, chunk start, chunk end, target length, a function drawing a random other document,
# rng) -> (segment A, segment B, label, first sentence of the next chunk).
PairStrategy = Callable[[Document, int, int, int, Callable[[], Document], Rng],
                        tuple[np.ndarray, np.ndarray, int, int]]


def next_sentence_pair(document: Document, start: int, end: int, target: int,
                       other_document: Callable[[], Document], rng: Rng) -> tuple[np.ndarray, np.ndarray, int, int]:
    """BERT's NSP: half the time B is A's continuation (label 0), half the time a span of another document
    (label 1); then the chunk's sentences after A are put back: the next chunk starts with them. A one-line chunk
    short of the target (a heading, a document's last line) always takes B from another document, as BERT's does:
    it has no continuation, and cutting it in two would make one."""
    offsets = document.offsets
    if end - start == 1 and offsets[end] - offsets[start] < target:
        first = document.tokens[offsets[start]:offsets[end]]
        return first, random_span(other_document(), target - len(first), rng), IS_RANDOM, end
    first, second, second_start = split_chunk(document, start, end, rng)
    if rng.random() < 0.5:
        return first, random_span(other_document(), target - len(first), rng), IS_RANDOM, second_start
    return first, second, IS_NEXT, end


def sentence_order_pair(document: Document, start: int, end: int, target: int,
                        other_document: Callable[[], Document], rng: Rng) -> tuple[np.ndarray, np.ndarray, int, int]:
    """ALBERT's SOP: B is always A's continuation; half the time the two are swapped (label 1)."""
    first, second, _ = split_chunk(document, start, end, rng)
    if rng.random() < 0.5:
        return second, first, SWAPPED, end
    return first, second, IN_ORDER, end


# The objectives' `sentence_pairs` names -> how segment B is made and labelled.
SENTENCE_PAIRS: dict[str, PairStrategy] = {
    "next_sentence": next_sentence_pair,
    "sentence_order": sentence_order_pair,
}


class InstanceBuilder:
    """Document -> its training instances, for one sequence length and pairing strategy."""

    def __init__(self, cls_token_id: int, sep_token_id: int, max_seq_length: int = 128,
                 sentence_pairs: str | None = "next_sentence", short_seq_prob: float = SHORT_SEQ_PROB):
        if sentence_pairs is not None and sentence_pairs not in SENTENCE_PAIRS:
            raise ConfigError(f"unknown sentence pairing {sentence_pairs!r}; choose from "
                              f"{', '.join(SENTENCE_PAIRS)} or None")
        special = 2 if sentence_pairs is None else 3
        if max_seq_length < special + 2:
            raise ConfigError(f"max_seq_length={max_seq_length} is too short: {special} special tokens "
                              f"and at least 2 tokens of text")
        if not 0.0 <= short_seq_prob <= 1.0:
            raise ConfigError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
        self.cls, self.sep = np.array([cls_token_id]), np.array([sep_token_id])
        self.max_tokens = max_seq_length - special
        self.pair = SENTENCE_PAIRS[sentence_pairs] if sentence_pairs is not None else None
        self.short_seq_prob = short_seq_prob

    def __call__(self, document: Document, other_document: Callable[[], Document], rng: Rng) -> list[Instance]:
        if self.pair is None:
            return self.single_segments(document, rng)
        return self.pairs(document, other_document, rng)

    def single_segments(self, document: Document, rng: Rng) -> list[Instance]:
        """The document's text cut into consecutive pieces of the target length: nothing is left over, and a
        piece may start inside a sentence (there is no pair to keep sentence-aligned)."""
        instances, start = [], 0
        while start < len(document.tokens):
            end = start + target_length(self.max_tokens, self.short_seq_prob, rng)
            instances.append(self.instance(document.tokens[start:end], None, None))
            start = end
        return instances

    def pairs(self, document: Document, other_document: Callable[[], Document], rng: Rng) -> list[Instance]:
        instances, offsets, start = [], document.offsets, 0
        while start < len(document):
            target = target_length(self.max_tokens, self.short_seq_prob, rng)
            # The chunk: whole sentences from `start` until they reach the target (or the document ends).
            end = int(np.searchsorted(offsets, offsets[start] + target, side="left"))
            end = min(max(end, start + 1), len(document))
            if offsets[end] - offsets[start] < 2:  # a lone one-token line ends the document: no pair
                start = end
                continue
            first, second, label, start = self.pair(document, start, end, target, other_document, rng)
            first, second = truncate_pair(first, second, self.max_tokens, rng)
            instances.append(self.instance(first, second, label))
        return instances

    def instance(self, first: np.ndarray, second: np.ndarray | None, label: int | None) -> Instance:
        parts = [self.cls, first, self.sep] + ([second, self.sep] if second is not None else [])
        input_ids = np.concatenate(parts).astype(np.int64)
        token_type_ids = np.zeros(len(input_ids), dtype=np.int64)
        token_type_ids[len(first) + 2:] = 1
        return Instance(input_ids, token_type_ids, label)


class InstanceStream(IterableDataset):
    """Instances of a prepared corpus, epoch after epoch (forever when epochs is None), reproducible from seed.

    >>> stream = InstanceStream(CorpusReader(folder, split="train", holdout=0.01, rank=rank, world_size=world),
    ...                         max_seq_length=128, sentence_pairs="next_sentence", seed=0)
    >>> loader = DataLoader(stream, batch_size=32, collate_fn=PretrainingCollator(masker, pad_token_id, seed=0))

    Each epoch visits the reader's documents (its rank's part) in a new order. `state_dict()` is the position of
    the last instance handed out; `load_state_dict` makes a new stream continue right after it. With DataLoader
    workers each worker builds every num_workers-th shuffle group, but the position then lives in the workers:
    iterate in the main process (num_workers=0) for exact resumption.
    """

    def __init__(self, corpus: CorpusReader, max_seq_length: int = 128, sentence_pairs: str | None = "next_sentence",
                 short_seq_prob: float = SHORT_SEQ_PROB, seed: int = 0, epochs: int | None = None,
                 shuffle_tokens: int = SHUFFLE_TOKENS):
        super().__init__()
        if sentence_pairs == "next_sentence" and len(corpus) < 2:
            part = f"this process's part of the corpus has {len(corpus)}" if corpus.world_size > 1 else \
                f"this corpus has {len(corpus)}"
            raise ConfigError("next-sentence prediction needs at least 2 documents to draw random segments from; "
                              f"{part}: prepare the text with blank lines between documents"
                              + (", or start fewer processes" if corpus.world_size > 1 else ""))
        if seed < 0:
            raise ConfigError(f"the data seed must be a non-negative integer, got {seed}")
        special = corpus.special_token_ids
        self.builder = InstanceBuilder(special["cls_token"], special["sep_token"], max_seq_length, sentence_pairs,
                                       short_seq_prob)
        self.corpus, self.seed, self.epochs, self.shuffle_tokens = corpus, seed, epochs, shuffle_tokens
        # Everything that must match for a saved position to mean the same instances.
        self.settings = {"seed": seed, "rank": corpus.rank, "world_size": corpus.world_size,
                         "documents": len(corpus), "corpus_sha256": corpus.manifest.get("content_sha256"),
                         "max_seq_length": max_seq_length,
                         "sentence_pairs": sentence_pairs, "short_seq_prob": short_seq_prob,
                         "shuffle_tokens": shuffle_tokens}
        self._document_tokens = corpus.document_tokens()
        self.epoch, self.group, self.position = 0, 0, 0
        self._groups: tuple[int, list[np.ndarray]] | None = None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "group": self.group, "position": self.position, "settings": dict(self.settings)}

    def load_state_dict(self, state: dict) -> None:
        different = sorted(key for key in self.settings if state["settings"].get(key) != self.settings[key])
        if different:
            saved = ", ".join(f"{key}={state['settings'].get(key)!r}" for key in different)
            now = ", ".join(f"{key}={self.settings[key]!r}" for key in different)
            raise ConfigError(f"the saved data position is for other data settings ({saved}; now {now}): "
                              "it can't be resumed exactly")
        self.epoch, self.group, self.position = state["epoch"], state["group"], state["position"]

    def __iter__(self) -> Iterator[Instance]:
        worker = torch.utils.data.get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        while self.epochs is None or self.epoch < self.epochs:
            groups = self.shuffle_groups(self.epoch)
            whole_epoch, handed_out = self.group == 0 and self.position == 0, 0
            while self.group < len(groups):
                if self.group % workers == worker_id:
                    instances = self.group_instances(self.epoch, self.group, groups[self.group])
                    handed_out += len(instances) - self.position
                    while self.position < len(instances):
                        # Counted before it is handed out, so that state_dict() taken by the consumer includes it.
                        self.position += 1
                        yield instances[self.position - 1]
                self.group, self.position = self.group + 1, 0
            if self.epochs is None and whole_epoch and not handed_out:  # every epoch after would give none too
                raise InputError(self._nothing_to_give(workers), self.corpus.directory)
            self.epoch, self.group = self.epoch + 1, 0

    def _nothing_to_give(self, workers: int) -> str:
        """Why a whole pass gave this process no instance, where an endless stream would look for one forever."""
        if workers > 1:
            return (f"a data worker of {workers} got no training instance in a whole pass over the corpus part "
                    f"({len(self.corpus)} documents): give fewer DataLoader workers, or more text")
        need = "a sentence pair needs a document of at least 2 tokens" if self.builder.pair is not None else \
            "it has no token"
        return (f"no training instance can be made of this corpus part ({len(self.corpus)} documents, "
                f"{int(self._document_tokens.sum())} tokens): {need}")

    def shuffle_groups(self, epoch: int) -> list[np.ndarray]:
        """This epoch's document order, cut into groups of about shuffle_tokens tokens."""
        if self._groups is None or self._groups[0] != epoch:
            rng = np.random.default_rng([self.seed, self.corpus.rank, epoch, 0, 0])
            order = rng.permutation(len(self.corpus))
            lengths = self._document_tokens[order]
            group_of = (np.cumsum(lengths) - lengths) // self.shuffle_tokens  # by the tokens before each document
            boundaries = np.flatnonzero(np.diff(group_of)) + 1
            self._groups = (epoch, np.split(order, boundaries))
        return self._groups[1]

    def group_instances(self, epoch: int, group: int, documents: np.ndarray) -> list[Instance]:
        """The shuffled instances of one group's documents; the same for the same (seed, rank, epoch, group)."""
        rng = np.random.default_rng([self.seed, self.corpus.rank, epoch, 1, group])
        instances: list[Instance] = []
        for index in documents:
            index = int(index)

            def other_document(current: int = index) -> Document:
                # Uniform over the other documents: draw among n - 1 and skip over the current one.
                other = int(rng.integers(len(self.corpus) - 1))
                return self.corpus[other + (other >= current)]

            instances += self.builder(self.corpus[index], other_document, rng)
        return [instances[i] for i in rng.permutation(len(instances))]
