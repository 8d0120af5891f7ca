"""The printed tables line up in a terminal whatever script their texts are in: widths measured by wcwidth (the
reference implementation of POSIX wcwidth(3), which terminals follow), not by bertforge's own count."""

import json

import pytest
from wcwidth import wcswidth

from bertforge.cli.columns import fit
from bertforge.cli.evaluate import confusion_table, label_table
from bertforge.cli.similarity import format_table

TEXTS = ["東京は日本の首都です。", "서울은 한국의 수도입니다.", "Cafe\u0301 au lait 🙂 and a tab\there.",
         "A plain English sentence.", "漢字" * 40, "ᄉ\u1165ᄋ\u116e\u11af in jamo",
         # emoji sequences, one glyph of two cells each: a family joined by ZWJs, a skin tone, flags, VS16
         "A family 👨\u200d👩\u200d👧 coding 👩🏽\u200d💻, 👍🏽 🇫🇷🇯🇵 ❤\ufe0f #\ufe0f\u20e3 🏳\ufe0f\u200d🌈 done"]


def test_similarity_rows_line_up():
    scores = [[1.0 if i == j else 0.1 * (i + j) for j in range(len(TEXTS))] for i in range(len(TEXTS))]
    lines = format_table(TEXTS, scores, width=30).splitlines()
    widths = {wcswidth(line) for line in lines}
    assert len(widths) == 1 and -1 not in widths  # every row as wide as the header, and no control character
    labels = [line[:-7 * len(TEXTS)] for line in lines[1:]]  # each score takes 7 cells
    assert all(wcswidth(label) == 4 + 30 for label in labels)
    assert "…" in lines[5] and "\t" not in "".join(lines)


@pytest.mark.parametrize("width", [1, 2, 5, 8, 13])
def test_fit_cuts_to_the_cells_it_is_given(width):
    for text in TEXTS:
        shown = fit(text, width)
        assert 0 <= wcswidth(shown) <= width
        assert shown.endswith("…") == (wcswidth(text.replace("\t", " ")) > width)


def test_evaluation_tables_line_up_with_labels_in_any_script():
    # labels in any script, and with a tab or a newline as the user's data may hold them
    per_label = {name: {"precision": 0.5, "recall": 0.25, "f1": 0.3333, "support": 12}
                 for name in ("正面", "負面", "neutral", "😐", "two\twords", "two\nlines", "👨\u200d👩\u200d👧 🇫🇷")}
    matrix = [[5, 1, 0, 0, 0, 0, 0], [2, 9, 1, 0, 0, 0, 0], [0, 0, 7, 1, 0, 0, 0], [10, 0, 0, 3, 0, 0, 0],
              [0, 0, 0, 0, 4, 0, 0], [0, 0, 0, 0, 0, 4, 0], [0, 0, 0, 0, 0, 1, 6]]
    for table in (label_table(per_label), confusion_table(list(per_label), matrix)):
        lines = table.splitlines()[table.startswith("confusion"):]
        assert len(lines) == len(per_label) + (3 if table.startswith("label") else 1), table  # a row per label
        assert len({wcswidth(line) for line in lines}) == 1 and "\t" not in table, table


def test_tokenize_table_lines_up_for_cjk(run_cli):
    text = "東京タワーは333メートル、서울 tower"
    code, out, _ = run_cli("tokenize", text)
    _, rows, _ = run_cli("tokenize", text, "--json")
    sources = [text[row["start"]:row["end"]] for row in json.loads(rows)]
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(sources) + 1 and "東" in sources
    assert len({wcswidth(line) - wcswidth(source) for line, source in zip(lines[1:], sources)}) == 1
