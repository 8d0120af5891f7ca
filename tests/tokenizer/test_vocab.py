"""Vocab: reading and writing vocab.txt, special token ids, and the errors for bad vocabularies."""

from __future__ import annotations

import pytest

from bertforge import BertforgeError
from bertforge.tokenizer import Vocab


def test_ids_are_line_numbers(tiny_vocab, tiny_tokens):
    assert tiny_vocab.token_to_id["un"] == 5 and tiny_vocab.id_to_token[6] == "##aff"
    assert (tiny_vocab.pad_token_id, tiny_vocab.unk_token_id, tiny_vocab.cls_token_id, tiny_vocab.sep_token_id,
            tiny_vocab.mask_token_id) == (0, 1, 2, 3, 4)
    assert len(tiny_vocab) == len(tiny_tokens) and "##able" in tiny_vocab and "able" not in tiny_vocab


def test_file_round_trip(tmp_path, tiny_vocab, tiny_tokens):
    tiny_vocab.save(tmp_path / "vocab.txt")
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8") == "\n".join(tiny_tokens) + "\n"
    assert Vocab.from_file(tmp_path / "vocab.txt").id_to_token == tiny_tokens


def test_real_vocabulary(minilm_dir):
    vocab = Vocab.from_file(minilm_dir / "vocab.txt")
    assert len(vocab) == 30522
    assert (vocab.pad_token_id, vocab.unk_token_id, vocab.cls_token_id, vocab.sep_token_id,
            vocab.mask_token_id) == (0, 100, 101, 102, 103)


def test_a_vocabulary_saved_by_a_windows_editor(minilm_dir, tmp_path):
    """A byte-order mark and CRLF line ends (Notepad's) change no token: [PAD] is still token 0 and read whole."""
    text = (minilm_dir / "vocab.txt").read_text(encoding="utf-8")
    (tmp_path / "vocab.txt").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    assert Vocab.from_file(tmp_path / "vocab.txt").id_to_token == Vocab.from_file(minilm_dir / "vocab.txt").id_to_token


def test_custom_special_tokens():
    vocab = Vocab(["<pad>", "<unk>", "<s>", "</s>", "<mask>"], special_tokens={
        "pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"})
    assert vocab.cls_token_id == 2


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(BertforgeError, match="vocab.txt: vocabulary file not found"):
        Vocab.from_file(tmp_path / "vocab.txt")


@pytest.mark.parametrize("missing, name, needed_by", [
    ("[UNK]", "unk", "words the vocabulary can't spell"), ("[CLS]", "cls", "every encoding"),
    ("[PAD]", "pad", "padding"), ("[MASK]", "mask", "masking")])
def test_missing_special_token_is_an_error_only_when_used(tmp_path, tiny_tokens, missing, name, needed_by):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(token for token in tiny_tokens if token != missing) + "\n", encoding="utf-8")
    vocab = Vocab.from_file(path)
    assert not vocab.has_special(f"{name}_token") and vocab.has_special("sep_token")
    with pytest.raises(BertforgeError, match=rf"vocab.txt: the vocabulary has no {name} token "
                                             rf"'\[{name.upper()}\]', which {needed_by} needs"):
        vocab.special_id(f"{name}_token")


def test_empty_and_binary_files(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(BertforgeError, match="empty"):
        Vocab.from_file(tmp_path / "empty.txt")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(BertforgeError, match="not UTF-8"):
        Vocab.from_file(tmp_path / "binary.txt")


def test_trailing_whitespace_is_no_part_of_a_token(tmp_path, tiny_tokens):
    """A line "hello " or "world\\t" is the token "hello" / "world", as tokenizers (and so transformers) read it:
    text is split at whitespace, so a token that kept it could never be matched."""
    tokenizers = pytest.importorskip("tokenizers")
    from bertforge import BertTokenizer

    tokens = tiny_tokens + ["hello", "world", "##s"]
    (tmp_path / "vocab.txt").write_text("".join(token + {"hello": " ", "world": "\t", "##s": " \t"}.get(token, "")
                                                 + "\n" for token in tokens), encoding="utf-8")
    reference = tokenizers.BertWordPieceTokenizer(str(tmp_path / "vocab.txt"))
    ours = BertTokenizer.from_pretrained(tmp_path)
    for text in ("hello worlds", "Hello, world!", "worlds hello"):
        assert ours(text)["input_ids"] == reference.encode(text).ids
    assert ours("hello worlds")["input_ids"][1:-1] == [tokens.index(piece) for piece in ("hello", "world", "##s")]
