"""Writes src/bertforge/tokenizer/unicode_8.py: the Unicode 8.0 character classes BERT's normaliser reads.

The reference tokenizer (Hugging Face tokenizers' BertNormalizer and BertPreTokenizer) takes punctuation,
non-spacing marks and control characters from tables of Unicode 8.0, while Python's unicodedata follows the
Unicode version of the running Python (14.0 in 3.11, 15.1 in 3.13). The General_Category column of Unicode
8.0.0 comes from the tables that unicodedata2 8.0.0 ships as C source (its sdist; nothing is compiled):

    pip download --no-deps --no-binary :all: unicodedata2==8.0.0 -d /tmp/ud8
    python tools/make_unicode_8.py /tmp/ud8/unicodedata2-8.0.0.tar.gz

tests/tokenizer/test_parity.py checks the result against the reference on every code point.
"""

from __future__ import annotations

import re
import sys
import tarfile
from pathlib import Path

OUTPUT = Path(__file__).resolve().parents[1] / "src" / "bertforge" / "tokenizer" / "unicode_8.py"
CLASSES = {  # name in unicode_8.py -> the General_Category values it holds, and what it is for
    "PUNCTUATION": (("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"), "punctuation (P*): split off as words of their own"),
    "NONSPACING_MARKS": (("Mn",), "non-spacing marks (Mn): removed when accents are stripped"),
    "CONTROLS": (("Cc", "Cf", "Co", "Cs"), "control, format, private-use and surrogate code points: deleted"),
}


def c_array(source: str, name: str) -> str:
    return re.search(r"static[^\n]*\b" + name + r"\[\] = \{(.*?)\};", source, re.S).group(1)


def categories(header: str) -> list[str]:
    """Every code point's category, decoded from the two-level index that CPython's makeunicodedata.py writes."""
    records = [int(record.split(",")[0]) for record in re.findall(r"\{([^{}]*)\}",
                                                                  c_array(header, "_PyUnicode_Database_Records"))]
    names = re.findall(r'"(\w*)"', c_array(header, "_PyUnicode_CategoryNames"))
    index1 = [int(x) for x in re.findall(r"\d+", c_array(header, "index1"))]
    index2 = [int(x) for x in re.findall(r"\d+", c_array(header, "index2"))]
    shift = int(re.search(r"#define SHIFT (\d+)", header).group(1))
    mask = (1 << shift) - 1
    return [names[records[index2[(index1[code >> shift] << shift) + (code & mask)]]] for code in range(0x110000)]


def ranges(codes: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for code in codes:
        if runs and runs[-1][1] == code - 1:
            runs[-1] = (runs[-1][0], code)
        else:
            runs.append((code, code))
    return runs


def module_text(category_of: list[str], version: str) -> str:
    lines = [f'"""Unicode {version} character classes, as the reference tokenizer reads them (written by '
             'tools/make_unicode_8.py).',
             "",
             "Hugging Face tokenizers, the reference for BERT's tokenization, classifies characters with Unicode 8.0",
             "tables. Characters added since read there as unassigned: kept, never split off or stripped; a few",
             "changed category since (U+166D was punctuation, U+1734 a non-spacing mark). Each class is a tuple of",
             "(first, last) code point ranges, sorted.",
             '"""']
    for name, (values, meaning) in CLASSES.items():
        runs = ranges([code for code, category in enumerate(category_of) if category in values])
        lines += ["", f"# {meaning}", f"{name} = ("]
        cells = [f"(0x{first:04X}, 0x{last:04X})," for first, last in runs]
        for start in range(0, len(cells), 5):
            lines.append("    " + " ".join(cells[start:start + 5]))
        lines.append(")")
    return "\n".join(lines) + "\n"


def main(sdist: str) -> None:
    with tarfile.open(sdist) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("unicodedata2/unicodedata_db.h"))
        header = archive.extractfile(member).read().decode()
    version = re.search(r'#define UNIDATA_VERSION "([\d.]+)"', header).group(1)
    if version != "8.0.0":
        sys.exit(f"{sdist}: Unicode {version}, not 8.0.0")
    OUTPUT.write_text(module_text(categories(header), version))
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/make_unicode_8.py unicodedata2-8.0.0.tar.gz")
    main(sys.argv[1])
