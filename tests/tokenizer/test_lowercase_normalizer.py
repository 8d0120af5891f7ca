"""tokenizer.json's normalizer Sequence [Lowercase, BertNormalizer], which sentence-transformers 6 saves for a model it
lower-cases (do_lower_case), against the tokenizers library reading the same file."""

from __future__ import annotations

import json
import shutil

import pytest

from bertforge import BertforgeError
from bertforge.tokenizer import BertTokenizer

# Accents, case mappings that change length ('İ'), ligatures, final sigma, CJK, controls, odd whitespace, [MASK].
TEXTS = [
    "Café Zürich", "İstanbul", "ﬁ", "CAFÉ ZÜRICH İSTANBUL ﬁne ÀÉÎÕÜ", "Ωmega ΣΑΣ Σίσυφος Straße ẞ", "Ǆemal ǅ ǆ ı",
    "e\u0301x re\u0301sume\u0301 x\u0338 a≠b", "Unaffable café owners!", "中文字符和English混合", "한국어 텍스트",
    "a\u200bb\ufeffc ctrl\x00\x1f\x7f\ufffd", "tab\tnew\nline nbsp\u00a0ideo\u3000space", "[MASK] a [SEP] [mask]",
    "Ångström ÉCOLE naïve", "", " ",
]


def save_with_normalizer(minilm_dir, directory, normalizer, config: dict | None = None):
    """MiniLM's tokenizer.json with another normalizer (and a tokenizer_config.json when given); the tokenizers
    library's Tokenizer for it, without the file's padding and truncation."""
    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    backend.normalizer = normalizer
    directory.mkdir(exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    backend.no_padding()
    backend.no_truncation()
    return backend


def assert_same_as_backend(ours: BertTokenizer, backend) -> None:
    """Ids, offsets, the normalised text and its words, which show the accents kept even where MiniLM's
    vocabulary spells the word [UNK]."""
    for text in TEXTS:
        expected = backend.encode(text)
        encoded = ours(text, return_offsets_mapping=True, truncation=False)
        assert encoded["input_ids"] == expected.ids, text
        assert encoded["offset_mapping"] == expected.offsets, text
        normalized = backend.normalizer.normalize_str(text)
        assert ours.basic.normalize(text)[0] == normalized, text
        assert ours.basic.split(text) == [word for word, _ in backend.pre_tokenizer.pre_tokenize_str(normalized)]


@pytest.mark.parametrize("own_lowercase", [False, True], ids=["cased_inside", "uncased_inside"])
@pytest.mark.parametrize("strip_accents", [None, False, True])
def test_lowercase_before_bert_normalizer(minilm_dir, tmp_path, own_lowercase, strip_accents):
    """A BertNormalizer's strip_accents=None follows its own lowercase flag: Lowercase + BertNormalizer(lowercase=
    False) lower-cases and keeps accents ('café')."""
    normalizers = pytest.importorskip("tokenizers.normalizers")
    backend = save_with_normalizer(minilm_dir, tmp_path, normalizers.Sequence([
        normalizers.Lowercase(), normalizers.BertNormalizer(lowercase=own_lowercase, strip_accents=strip_accents)]))
    ours = BertTokenizer.from_pretrained(tmp_path)
    keeps_accents = strip_accents is False or (strip_accents is None and not own_lowercase)
    assert ours.do_lower_case is True and ours.strip_accents is not keeps_accents
    assert ours.basic.normalize("Café Zürich")[0] == ("café zürich" if keeps_accents else "cafe zurich")
    assert_same_as_backend(ours, backend)


def test_sentence_transformers_layout(minilm_dir, tmp_path):
    """As sentence-transformers 6 saves a cased model it lower-cases: tokenizer_config.json still says
    do_lower_case false, which describes the BertNormalizer, not the Lowercase before it."""
    normalizers = pytest.importorskip("tokenizers.normalizers")
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text()) | {"do_lower_case": False,
                                                                                "strip_accents": None}
    backend = save_with_normalizer(minilm_dir, tmp_path, normalizers.Sequence([
        normalizers.Lowercase(), normalizers.BertNormalizer(lowercase=False, strip_accents=None)]), config)
    ours = BertTokenizer.from_pretrained(tmp_path)
    assert (ours.do_lower_case, ours.strip_accents) == (True, False)
    assert_same_as_backend(ours, backend)
    # Asked for explicitly, a setting still wins.
    assert BertTokenizer.from_pretrained(tmp_path, do_lower_case=False).tokenize("Hello") != ours.tokenize("Hello")


def test_saved_again_reads_the_same_in_the_references(minilm_dir, tmp_path):
    """bertforge saves it as one BertNormalizer(lowercase=True, strip_accents=False), which transformers and
    tokenizers read as the Sequence."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    normalizers = pytest.importorskip("tokenizers.normalizers")
    backend = save_with_normalizer(minilm_dir, tmp_path / "sequence", normalizers.Sequence([
        normalizers.Lowercase(), normalizers.BertNormalizer(lowercase=False, strip_accents=None)]))
    BertTokenizer.from_pretrained(tmp_path / "sequence").save_pretrained(tmp_path / "again")
    saved = json.loads((tmp_path / "again" / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["normalizer"]["lowercase"] is True and saved["normalizer"]["strip_accents"] is False
    again = tokenizers.Tokenizer.from_file(str(tmp_path / "again" / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "again")
    for text in TEXTS:
        assert again.encode(text).ids == backend.encode(text).ids, text
        assert reference(text)["input_ids"] == backend.encode(text).ids, text
        assert again.normalizer.normalize_str(text) == backend.normalizer.normalize_str(text), text


@pytest.mark.parametrize("steps", [
    [{"type": "NFD"}, {"type": "BertNormalizer"}],
    [{"type": "Lowercase"}, {"type": "NFD"}],
    [{"type": "Lowercase"}, {"type": "BertNormalizer"}, {"type": "StripAccents"}],
    [{"type": "BertNormalizer"}, {"type": "Lowercase"}],
    [{"type": "Lowercase"}],
], ids=["nfd_first", "no_bert_normalizer", "three_steps", "lowercase_after", "lowercase_alone"])
def test_other_sequences_refused(minilm_dir, tmp_path, steps):
    shutil.copy(minilm_dir / "tokenizer.json", tmp_path)
    data = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"] = {"type": "Sequence", "normalizers": steps}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"tokenizer.json: normalizer 'Sequence' is not supported \(BERT's is "
                                             r"BertNormalizer\)"):
        BertTokenizer.from_pretrained(tmp_path)
