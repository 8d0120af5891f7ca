"""WordPiece: split one word into vocabulary pieces, greedy longest-match-first (Schuster & Nakajima 2012; BERT)."""

from __future__ import annotations

from bertforge.tokenizer.vocab import Vocab

CONTINUATION = "##"
# BERT's limit: longer "words" are almost always junk (URLs, base64) and would cost O(n^2) lookups.
MAX_WORD_CHARS = 100

# word -> (ids, spans); spans are (start, end) character offsets of each piece inside the word.
Pieces = tuple[tuple[int, ...], tuple[tuple[int, int], ...]]


class WordPiece:
    """Greedy longest-match-first with "##" continuations; a word that can't be covered becomes [UNK].

    With the vocabulary {un, ##aff, ##able}: "unaffable" -> ["un", "##aff", "##able"]; "affable" ->
    ["[UNK]"] (a word may not start with a "##" piece); a word over 100 characters -> ["[UNK]"].
    """

    def __init__(self, vocab: Vocab, max_word_chars: int = MAX_WORD_CHARS):
        self.vocab = vocab
        self.max_word_chars = max_word_chars
        # Bounds the inner loop: no piece can be longer than the longest vocabulary entry.
        self.longest_piece = max((len(token) for token in vocab.pieces), default=1)

    @property
    def unk_token_id(self) -> int:
        return self.vocab.unk_token_id  # an error naming the token and file if the vocabulary has none

    def split(self, word: str) -> Pieces:
        """'unaffable' -> ((ids of un, ##aff, ##able), ((0, 2), (2, 5), (5, 9)))."""
        token_to_id = self.vocab.pieces
        if len(word) > self.max_word_chars:
            return (self.unk_token_id,), ((0, len(word)),)
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        start = 0
        while start < len(word):
            prefix = CONTINUATION if start > 0 else ""
            end = min(len(word), start + self.longest_piece)
            while end > start:
                piece_id = token_to_id.get(prefix + word[start:end])
                if piece_id is not None:
                    break
                end -= 1
            else:
                # No piece starts here: the whole word is unknown, not just this remainder (as BERT does).
                return (self.unk_token_id,), ((0, len(word)),)
            ids.append(piece_id)
            spans.append((start, end))
            start = end
        return tuple(ids), tuple(spans)

    def tokenize(self, word: str) -> list[str]:
        """'unaffable' -> ['un', '##aff', '##able'] (token strings, for reading)."""
        ids, _ = self.split(word)
        return [self.vocab.id_to_token[i] for i in ids]


class WordPieceCache(dict):
    """word -> WordPiece.split(word), computed on first use; cleared when it reaches `max_words`.

    A dict subclass so that lookups of known words stay in C (`map(cache.__getitem__, words)`);
    only unseen words reach `__missing__`. Clearing instead of LRU keeps hits free of bookkeeping;
    real text has a small working set (Zipf), so a clear costs one short re-warm.
    """

    def __init__(self, wordpiece: WordPiece, max_words: int = 1 << 18):
        super().__init__()
        self.wordpiece = wordpiece
        self.max_words = max_words

    def __reduce__(self) -> tuple:
        # Pickled empty: a tokenizer's pickle (and the fingerprint `datasets` caches a map by) stays the same
        # whatever text it has read.
        return type(self), (self.wordpiece, self.max_words)

    def __missing__(self, word: str) -> Pieces:
        pieces = self.wordpiece.split(word)
        if len(self) >= self.max_words:
            self.clear()
        self[word] = pieces
        return pieces
