"""Reading task data: GLUE files as they are, CSV and JSONL, and one-line errors naming file, line and field."""

import csv
import json

import pytest
import torch

from bertforge.batching import LengthGroupedBatches, collate
from bertforge.errors import InputError
from bertforge.tasks.data import Columns, Features, read_text_examples
from bertforge.tasks.tables import read_table


def test_glue_tsv_files_read_as_they_are(data_dir):
    sst2 = read_text_examples(data_dir / "sst2" / "dev.tsv", Columns("sentence", None, "label"), "class")
    assert len(sst2) == 872 and sst2[0].label == "1" and sst2[0].line == 2
    assert sst2[0].text.startswith("it 's a charming and often affecting journey")
    # MRPC: a byte-order mark before the header and unbalanced quotes inside the texts
    mrpc = read_text_examples(data_dir / "mrpc" / "dev.tsv", Columns("#1 String", "#2 String", "Quality"), "class")
    assert len(mrpc) == 408 and mrpc[0].text_pair.startswith('"The foodservice pie business')
    stsb = read_text_examples(data_dir / "stsb" / "dev.tsv", Columns("sentence1", "sentence2", "score"), "score")
    assert len(stsb) == 1500 and stsb[0].label == 5.0 and stsb[1].label == 4.75


def test_csv_with_quotes_and_jsonl_with_numbers(tmp_path):
    csv_file = tmp_path / "data.csv"
    csv_file.write_text('text,label\n"Hello, ""world""",pos\n\n"two\nlines",neg\n', encoding="utf-8")
    examples = read_text_examples(csv_file, Columns("text"), "class")
    assert [(e.text, e.label, e.line) for e in examples] == [('Hello, "world"', "pos", 2), ("two\nlines", "neg", 4)]
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text('{"q": "a", "p": "b", "y": 1}\n\n{"q": "c\u2028d", "p": "e", "y": 0}\n', encoding="utf-8")
    examples = read_text_examples(jsonl, Columns("q", "p", "y"), "class")
    assert [(e.text, e.text_pair, e.label, e.line) for e in examples] == [("a", "b", "1", 1),
                                                                          ("c\u2028d", "e", "0", 3)]
    assert [e.label for e in read_text_examples(jsonl, Columns("q", "p", "y"), "score")] == [1.0, 0.0]


def test_unlabelled_reading_needs_no_label_column(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("first text\n\nsecond text\n", encoding="utf-8")
    examples = read_text_examples(path, Columns("text"), None)
    assert [(e.text, e.label, e.line) for e in examples] == [("first text", None, 1), ("", None, 2),
                                                             ("second text", None, 3)]  # an answer per line


def error_of(path, columns=None, kind="class", labels=None) -> str:
    with pytest.raises(InputError) as caught:
        read_text_examples(path, columns or Columns(), kind, labels)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path):
    assert error_of(tmp_path / "nope.tsv") == f"{tmp_path / 'nope.tsv'}: no such file"


def test_missing_column_lists_the_available_ones(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nhi\t1\n")
    assert error_of(path, Columns("sentence")) == \
        f"{path}, line 1, field 'sentence': no column 'sentence' (--text-column names it); the file has 'text', 'label'"


def test_a_column_read_by_a_name_the_header_repeats_is_an_error(tmp_path):
    """csv's rows keep the last of two same-named columns, pandas renames the second: neither says which it read."""
    path = tmp_path / "train.csv"
    path.write_text("sentence,sentence,label,notes,notes\nfirst,second,pos,a,b\n")
    assert error_of(path) == f"{path}, line 1, field 'sentence': the header names 2 columns 'sentence'; rename all " \
                             "but one"
    path.write_text("sentence,label,notes,notes\nfirst,pos,a,b\n")  # a repeated column nothing reads is left alone
    assert [(e.text, e.label) for e in read_text_examples(path, Columns(), "class")] == [("first", "pos")]


def test_unknown_label(tmp_path):
    path = tmp_path / "dev.csv"
    path.write_text("sentence,label\ngood,positive\nbad,negtive\n")
    assert error_of(path, labels=["negative", "positive"]) == \
        f"{path}, line 3, field 'label': label 'negtive' is not one of the model's labels (negative, positive)"


def test_malformed_json_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"sentence": "ok", "label": 1}\n{"sentence": "broken", "label": 1\n')
    assert error_of(path).startswith(f"{path}, line 2: not valid JSON: Expecting ',' delimiter")


def test_empty_label(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\nfine\t1\nno label\t \n")
    assert error_of(path) == f"{path}, line 3, field 'label': empty label"


def test_non_numeric_regression_target(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tscore\na\t4.5\nb\thigh\n")
    assert error_of(path, Columns(label="score"), kind="score") == \
        f"{path}, line 3, field 'score': regression target 'high' is not a number"


def test_a_json_list_or_object_is_not_one_label(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"sentence": "a", "label": 1}\n{"sentence": "b", "label": [1, 2]}\n'
                    '{"sentence": "c", "label": {"x": 1}}\n')
    assert error_of(path) == (f"{path}, line 2, field 'label': expected one label, got [1, 2] (several labels per "
                              "example: --task multi_label)")
    assert error_of(path, kind="score") == f"{path}, line 2, field 'label': regression target [1, 2] is not a number"
    path.write_text('{"sentence": "c", "label": {"x": 1}}\n')
    assert error_of(path) == f"""{path}, line 1, field 'label': expected one label, got {{"x": 1}}"""
    assert error_of(path, kind="score").endswith("""regression target {"x": 1} is not a number""")


def test_a_whole_float_is_the_integer_label_as_pandas_reads_it(tmp_path):
    """1, 1.0 and "1" are one class (pandas writes an integer column with a missing value as floats); 1.5 and
    "1.0", text as the file gives it, stay their own."""
    path = tmp_path / "train.jsonl"
    path.write_text('{"sentence": "a", "label": 1}\n{"sentence": "b", "label": 1.0}\n{"sentence": "c", "label": "1"}'
                    '\n{"sentence": "d", "label": 0.0}\n{"sentence": "e", "label": 1.5}\n'
                    '{"sentence": "f", "label": "1.0"}\n')
    examples = read_text_examples(path, Columns("sentence"), "class")
    assert [example.label for example in examples] == ["1", "1", "1", "0", "1.5", "1.0"]
    # a model trained before, whose labels were read as "0.0" and "1.0", still reads its own data
    path.write_text('{"sentence": "a", "label": 1.0}\n{"sentence": "b", "label": 0.0}\n')
    examples = read_text_examples(path, Columns("sentence"), "class", label_names=["0.0", "1.0"])
    assert [example.label for example in examples] == ["1.0", "0.0"]


def test_short_row_and_missing_json_key(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("sentence\tlabel\nonly a text\n")
    assert error_of(tsv) == f"{tsv}, line 2: the row has 1 fields, the header has 2"
    csv_file = tmp_path / "train.csv"
    csv_file.write_text("sentence,label\nwarm, witty and wise,1\n")
    assert error_of(csv_file) == f"{csv_file}, line 2: the row has 3 fields, the header has 2"
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"sentence": "a", "label": 1}\n{"sentence": "b"}\n')
    assert error_of(jsonl) == f"{jsonl}, line 2, field 'label': missing value (the row has 'sentence')"


def test_unsupported_and_empty_files(tmp_path):
    (tmp_path / "data.xlsx").write_text("x")
    with pytest.raises(InputError, match="unsupported file type '.xlsx'"):
        read_table(tmp_path / "data.xlsx")
    (tmp_path / "empty.tsv").write_text("sentence\tlabel\n")
    with pytest.raises(InputError, match="the file has no examples"):
        read_table(tmp_path / "empty.tsv")


def test_collate_pads_per_token_keys_and_stacks_the_rest():
    batch = collate([{"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0], "labels": 1},
                     {"input_ids": [101, 102], "token_type_ids": [0, 0], "labels": 0}], pad_token_id=0)
    assert batch["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [1, 0]
    tags = collate([{"input_ids": [1, 2], "labels": [3, 4]}, {"input_ids": [1], "labels": [5]}], pad_token_id=0)
    assert tags["labels"].tolist() == [[3, 4], [5, -100]]


def test_length_grouped_batches_cover_every_row_once_and_keep_lengths_close():
    lengths = torch.randint(2, 100, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = LengthGroupedBatches(lengths, batch_size=10, seed=3, pool_batches=10)
    first, second = list(sampler), list(sampler)
    assert len(first) == len(sampler) == 100
    assert sorted(i for batch in first for i in batch) == list(range(1000))
    assert first != second  # a new order every epoch...
    assert list(LengthGroupedBatches(lengths, 10, seed=3, pool_batches=10)) == first  # ...the same every run
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in first) / len(first)
    assert spread < 15  # random batches of 10 would spread over ~80


def test_features_lengths():
    features = Features([{"input_ids": [1, 2, 3]}, {"input_ids": [1]}], [0, 0])
    assert features.lengths() == [3, 1] and len(features) == 2
    json.dumps(features.rows)  # plain data


def test_tsv_files_pandas_and_datasets_quote_read_as_they_read_them(data_dir, tmp_path):
    """pandas' and datasets' to_csv(sep="\\t") quote a text holding a quote or a line break (doubling its quotes);
    such a file reads as pandas reads it back, while GLUE's unquoted files, stray quotes and all, read as they are."""
    pd = pytest.importorskip("pandas")
    mrpc = data_dir / "mrpc" / "dev.tsv"
    columns = Columns("#1 String", "#2 String", "Quality")
    glue = read_text_examples(mrpc, columns, "class")
    frame = pd.DataFrame({"#1 String": [e.text for e in glue], "#2 String": [e.text_pair for e in glue],
                          "Quality": [e.label for e in glue]})
    assert frame["#1 String"].str.contains('"').any()
    frame.to_csv(tmp_path / "mrpc.tsv", sep="\t", index=False)
    written = read_text_examples(tmp_path / "mrpc.tsv", columns, "class")
    assert [(e.text, e.text_pair, e.label) for e in written] == [(e.text, e.text_pair, e.label) for e in glue]
    back = pd.read_csv(tmp_path / "mrpc.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert [e.text for e in written] == list(back["#1 String"])
    lines = pd.DataFrame({"sentence": ["one\nline break", "plain"], "label": [1, 0]})
    lines.to_csv(tmp_path / "lines.tsv", sep="\t", index=False)
    assert [(e.text, e.label, e.line) for e in read_text_examples(tmp_path / "lines.tsv", Columns(), "class")] == [
        ("one\nline break", "1", 2), ("plain", "0", 4)]
    (tmp_path / "short.tsv").write_text("sentence\tlabel\nno label here\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"short.tsv, line 2: the row has 1 fields, the header has 2"):
        read_text_examples(tmp_path / "short.tsv", Columns(), "class")



def test_a_tsv_file_is_read_quoted_only_where_a_writer_quoted_it(data_dir, tmp_path):
    """Quoting is read where the file is what pandas' to_csv writes (quoted, its rows written back give the file),
    not where a stray quote happens to close: GLUE rows with a text opening on a quote and a later one ending on
    it, and a doubled quote elsewhere, read as pandas reads them unquoted (they had merged into one row); a
    one-column file of pandas' with a text over two lines reads as pandas reads it back (it gave two rows)."""
    pd = pytest.importorskip("pandas")
    glue = read_text_examples(data_dir / "sst2" / "dev.tsv", Columns(), "class")[:5]
    texts = [f'"{glue[0].text}', glue[1].text, f'{glue[2].text}"', f'{glue[3].text} ""really""', glue[4].text]
    lines = ["sentence\tlabel"] + [f"{text}\t{example.label}" for text, example in zip(texts, glue)]
    (tmp_path / "glue.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = pd.read_csv(tmp_path / "glue.tsv", sep="\t", quoting=csv.QUOTE_NONE, dtype=str)
    examples = read_text_examples(tmp_path / "glue.tsv", Columns(), "class")
    assert [(e.text, e.label) for e in examples] == list(zip(expected["sentence"], expected["label"])) == \
        list(zip(texts, [example.label for example in glue]))
    one_column = pd.DataFrame({"sentence": [glue[0].text, f"{glue[1].text}\n{glue[2].text}", f'"{glue[3].text}"']})
    for ending in ("\n", "\r\n"):
        one_column.to_csv(tmp_path / "texts.tsv", sep="\t", index=False, lineterminator=ending)
        back = pd.read_csv(tmp_path / "texts.tsv", sep="\t", dtype=str)
        assert [e.text for e in read_text_examples(tmp_path / "texts.tsv", Columns(), None)] == \
            list(back["sentence"]) == list(one_column["sentence"])
    # quoting every field, or every field but numbers, as pandas' to_csv may be asked to
    frame = pd.DataFrame({"sentence": one_column["sentence"], "label": [1, 0, 1]})
    for quoting in (csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC):
        frame.to_csv(tmp_path / "quoted.tsv", sep="\t", index=False, quoting=quoting)
        back = pd.read_csv(tmp_path / "quoted.tsv", sep="\t", dtype=str)
        assert [(e.text, e.label) for e in read_text_examples(tmp_path / "quoted.tsv", Columns(), "class")] == \
            list(zip(back["sentence"], back["label"])) == list(zip(frame["sentence"], ["1", "0", "1"])), quoting


def test_a_file_without_a_header_line_is_told_so(data_dir, tmp_path):
    """CoLA's and STS-B's original .tsv files have no header line: the first example is read as the column names,
    and the missing column's error says that those look like data."""
    glue = read_text_examples(data_dir / "sst2" / "dev.tsv", Columns(), "class")[:3]
    (tmp_path / "in_domain_train.tsv").write_text("".join(f"gj04\t{e.label}\t\t{e.text}\n" for e in glue))
    with pytest.raises(InputError, match=r"in_domain_train.tsv, line 1, field 'sentence': no column 'sentence' "
                                         r"\(--text-column names it\); the "
                                         r"file has 'gj04', '\d', '', .* \(its first line, read as the column names, "
                                         r"looks like data: add a header line\)$"):
        read_text_examples(tmp_path / "in_domain_train.tsv", Columns(), "class")
    # STS-B's original sts-dev.tsv: no header, and some rows carry two fields more (their sources)
    with pytest.raises(InputError, match=r"sts-dev.tsv, line \d+: the row has 9 fields, the header has 7 \(its first "
                                         r"line, read as the column names, looks like data: add a header line\)$"):
        read_text_examples(data_dir / "stsb" / "original" / "sts-dev.tsv", Columns(), "score")
    (tmp_path / "named.tsv").write_text("source\tlabel\tstar\ttext\n" + "gj04\t1\t\tfine\n")
    with pytest.raises(InputError, match=r"the file has 'source', 'label', 'star', 'text'$"):
        read_text_examples(tmp_path / "named.tsv", Columns(), "class")

def test_json_files_of_rows_as_datasets_json_loader_reads_them(tmp_path):
    """A .json file of rows: a JSON array (with a byte-order mark too), JSON lines after a blank line, or an object
    whose "data" holds the rows (run_qa's and load_dataset's field="data"); one object over several lines that
    holds no rows is a one-line error."""
    rows = [{"sentence": "fine", "label": 1}, {"sentence": "awful", "label": 0}]
    expected = [("fine", "1"), ("awful", "0")]
    files = {"array.json": "\ufeff" + json.dumps(rows, indent=2),
             "lines.json": "\n" + "\n".join(json.dumps(row) for row in rows) + "\n",
             "field.json": json.dumps({"version": "1", "data": rows}, indent=1),
             "field_line.json": json.dumps({"data": rows})}
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        examples = read_text_examples(tmp_path / name, Columns(), "class")
        assert [(e.text, e.label) for e in examples] == expected, name
    (tmp_path / "columns.json").write_text(json.dumps({"sentence": {"0": "fine"}, "label": {"0": 1}}, indent=1))
    with pytest.raises(InputError, match=r"columns.json: holds no rows this reads: a .json file of data is JSON "
                                         r"lines \(one object a line, not objects spread over several\), a JSON "
                                         r"array of objects, or an object whose \"data\" is one"):
        read_text_examples(tmp_path / "columns.json", Columns(), "class")
    (tmp_path / "columns.jsonl").write_text(json.dumps({"sentence": {"0": "fine"}, "label": {"0": 1}}, indent=1))
    with pytest.raises(InputError, match=r"columns.jsonl: expected JSON lines .* got one object over several lines"):
        read_text_examples(tmp_path / "columns.jsonl", Columns(), "class")


def test_a_nan_label_and_a_list_as_pandas_writes_it(tmp_path):
    """Python's json writes a missing value as NaN: an error, not a class named "nan". pandas writes a list of
    labels into a CSV cell as Python writes it: read as that list."""
    (tmp_path / "nan.jsonl").write_text('{"sentence": "fine", "label": 1}\n{"sentence": "odd", "label": NaN}\n')
    with pytest.raises(InputError, match=r"nan.jsonl, line 2, field 'label': the label is NaN \(a missing label\?\)"):
        read_text_examples(tmp_path / "nan.jsonl", Columns(), "class")
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"sentence": ["wheat up", "quiet"], "label": [["grain", "trade"], []]}).to_csv(
        tmp_path / "topics.csv", index=False)
    examples = read_text_examples(tmp_path / "topics.csv", Columns(), "classes")
    assert [e.label for e in examples] == [("grain", "trade"), ()]
    (tmp_path / "broken.csv").write_text('sentence,label\nwheat,"[grain, trade"\n')
    with pytest.raises(InputError, match=r"broken.csv, line 2, field 'label': not a JSON list of labels"):
        read_text_examples(tmp_path / "broken.csv", Columns(), "classes")


def test_excels_semicolon_csv_reads_as_pandas_writes_it(sst2_dev, tmp_path):
    """Excel where the decimal mark is a comma writes CSV with semicolons (pandas: to_csv(sep=";")), often with
    a byte-order mark: a header with semicolons and no comma is read so, the same rows as the comma file."""
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"sentence": [text for text, _ in sst2_dev[:40]],
                              "label": [label for _, label in sst2_dev[:40]]})
    frame.to_csv(tmp_path / "comma.csv", index=False)
    frame.to_csv(tmp_path / "semicolon.csv", index=False, sep=";", encoding="utf-8-sig")
    assert any("," in text for text, _ in sst2_dev[:40])  # texts with commas, quoted in the semicolon file
    examples = [read_text_examples(tmp_path / name, Columns(), "class") for name in ("comma.csv", "semicolon.csv")]
    assert [(e.text, e.label) for e in examples[1]] == [(e.text, e.label) for e in examples[0]]
    assert [(e.text, e.label) for e in examples[0]] == [(text, str(label)) for text, label in sst2_dev[:40]]


def test_a_dataframes_json_of_columns_is_named(sst2_dev, tmp_path):
    """pandas' to_json() writes a column an object ({"0": text, ...}): the error names the layout to write
    instead; orient="records", lines=True reads."""
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"sentence": [t for t, _ in sst2_dev[:5]], "label": [y for _, y in sst2_dev[:5]]})
    frame.to_json(tmp_path / "columns.json")
    with pytest.raises(InputError, match=r"columns.json, line 1, field 'sentence': expected a text, got .* \(a "
                                         r"DataFrame's to_json\(\) of columns\? write it with orient=\"records\", "
                                         r"lines=True\)$"):
        read_text_examples(tmp_path / "columns.json", Columns(), "class")
    frame.to_json(tmp_path / "records.json", orient="records", lines=True)
    assert [e.text for e in read_text_examples(tmp_path / "records.json", Columns(), "class")] == \
        [t for t, _ in sst2_dev[:5]]
