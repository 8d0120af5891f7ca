"""Parquet files and `datasets` save_to_disk folders (written here by pandas/pyarrow and the installed `datasets`)
hold the same rows as a CSV: the same examples, and fine-tuning on them gives the same model (same batches, same
losses in train_log.jsonl); a DatasetDict folder's split is a folder to give, the folder itself an error."""

import csv
import json

import pytest

from bertforge.cli import finetune as finetune_cli
from bertforge.errors import InputError
from bertforge.tasks.data import Columns, read_text_examples

pd = pytest.importorskip("pandas")
datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def sst2_rows(data_dir):
    """The first 40 SST-2 training phrases (text, label)."""
    with open(data_dir / "sst2" / "train.tsv", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:41]
    return [(text, int(label)) for text, label in rows]


@pytest.fixture(scope="module")
def files(tmp_path_factory, sst2_rows):
    """The same rows as CSV, Parquet, a Dataset folder and a DatasetDict folder (train and test splits)."""
    folder = tmp_path_factory.mktemp("formats")
    frame = pd.DataFrame({"sentence": [text for text, _ in sst2_rows], "label": [label for _, label in sst2_rows]})
    frame.to_csv(folder / "train.csv", index=False)
    frame.to_parquet(folder / "train.parquet")
    dataset = datasets.Dataset.from_pandas(frame)
    dataset.save_to_disk(str(folder / "train_dataset"))
    datasets.DatasetDict({"train": dataset, "test": dataset.select(range(5))}).save_to_disk(str(folder / "splits"))
    return folder


@pytest.mark.parametrize("name", ["train.parquet", "train_dataset", "splits/train"])
def test_same_examples_as_the_csv(files, name):
    columns = Columns("sentence", None, "label")
    expected = read_text_examples(files / "train.csv", columns, "class")
    examples = read_text_examples(files / name, columns, "class")
    assert [(e.text, e.label) for e in examples] == [(e.text, e.label) for e in expected]
    assert [e.line for e in examples] == list(range(1, 41))  # rows, where the CSV counts lines


def train_losses(run_command, tiny_model_dir, train, output):
    run_config = output.with_suffix(".json")
    run_config.write_text(json.dumps({"training": {"log_every": 1}}))  # a loss per step
    code, _ = run_command(finetune_cli, "--config", run_config, "--model", tiny_model_dir, "--train", train,
                          "--output", output, "--max-steps", "4", "--batch-size", "8", "--max-length", "32",
                          "--lr", "1e-3", "--no-progress", "--device", "cpu")
    assert code == 0
    log = [json.loads(line) for line in (output / "train_log.jsonl").read_text().splitlines()]
    return [record["loss"] for record in log if record["event"] == "train"]


def test_same_model_as_the_csv(files, tiny_model_dir, run_command, tmp_path, one_thread):
    expected = train_losses(run_command, tiny_model_dir, files / "train.csv", tmp_path / "csv")
    assert len(expected) == 4
    for name in ("train.parquet", "train_dataset", "splits/train"):
        assert train_losses(run_command, tiny_model_dir, files / name, tmp_path / name.replace("/", "_")) == expected
    assert (tmp_path / "csv" / "model.safetensors").read_bytes() == (tmp_path / "train.parquet" /
                                                                     "model.safetensors").read_bytes()


def test_a_datasetdict_folder_names_its_splits(files):
    with pytest.raises(InputError, match=r"splits: holds the splits train, test \(a DatasetDict\); give one split's "
                                         r"folder, e.g. .*splits/train"):
        read_text_examples(files / "splits", Columns(), "class")
    # in memory (fit's data): its splits were read as columns of different lengths
    with pytest.raises(InputError, match=r"^DatasetDict: holds the splits 'train', 'test' \(a DatasetDict\): give "
                                         r"one, e.g. data\['train'\]$"):
        read_text_examples(datasets.load_from_disk(str(files / "splits")), Columns(), "class")


def test_errors_name_the_row_and_field(tmp_path):
    # pyarrow refuses a column of mixed types: the number is in a column of numbers, read as the text
    pd.DataFrame({"sentence": ["fine", "good"], "score": [1, 0]}).to_parquet(tmp_path / "numbers.parquet")
    with pytest.raises(InputError, match=r"numbers.parquet, row 1, field 'score': expected a text, got 1"):
        read_text_examples(tmp_path / "numbers.parquet", Columns("score"), None)
    with pytest.raises(InputError, match=r"numbers.parquet, field 'text': no column 'text' \(--text-column names "
                                         r"it\); the file has 'sentence', 'score'"):
        read_text_examples(tmp_path / "numbers.parquet", Columns("text"), None)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not a parquet file PAR1")
    with pytest.raises(InputError, match=r"broken.parquet: not a readable Parquet file"):
        read_text_examples(tmp_path / "broken.parquet", Columns(), None)


def test_class_label_numbers_are_read_as_their_names(sst2_rows, tmp_path, tiny_model_dir, run_command):
    """Hugging Face's SST-2 keeps its labels as numbers that a ClassLabel feature names (negative, positive): a
    datasets folder, a Parquet file datasets wrote and a Dataset in memory give the names, so the model's labels
    are the names, as transformers' run_glue makes them; a number past the names is a one-line error."""
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    dataset = datasets.Dataset.from_dict({"sentence": [text for text, _ in sst2_rows],
                                          "label": [label for _, label in sst2_rows]}, features=features)
    dataset.save_to_disk(str(tmp_path / "sst2"))
    dataset.to_parquet(str(tmp_path / "sst2.parquet"))
    columns = Columns("sentence", None, "label")
    expected = [(text, ["negative", "positive"][label]) for text, label in sst2_rows]
    for source in (tmp_path / "sst2", tmp_path / "sst2.parquet", dataset):
        assert [(e.text, e.label) for e in read_text_examples(source, columns, "class")] == expected
    code, _ = run_command(finetune_cli, "--model", tiny_model_dir, "--train", tmp_path / "sst2", "--output",
                          tmp_path / "model", "--max-steps", "1", "--batch-size", "8", "--max-length", "16",
                          "--no-progress", "--device", "cpu")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert code == 0 and config["id2label"] == {"0": "negative", "1": "positive"}
    wrong = datasets.Dataset.from_dict({"sentence": ["fine"], "label": [1]}, features=datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])}))
    wrong = wrong.cast_column("label", datasets.ClassLabel(names=["negative"]))
    with pytest.raises(InputError, match="row 1, field 'label': label 1 is not one of the data's label numbers"):
        read_text_examples(wrong, columns, "class")
    # -1 is datasets' "no label" (every row of the Hub's GLUE test splits, SNLI's pairs without a gold label)
    unlabelled = datasets.Dataset.from_dict({"sentence": ["fine", "dull"], "label": [1, -1]},
                                            features=features)
    with pytest.raises(InputError, match=r"row 2, field 'label': label -1 is the data's 'no label' .*leave those rows"):
        read_text_examples(unlabelled, columns, "class")


# Hugging Face's numbering of GLUE MRPC's labels and CoNLL-2003's tags (its glue and conll2003 datasets' features)
MRPC_NAMES = ["not_equivalent", "equivalent"]
CONLL_NAMES = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def test_a_model_keeps_the_datas_label_numbering(data_dir, tmp_path, tiny_model_dir, run_command):
    """Data whose ClassLabel feature numbers its labels trains a model numbered the same way, every name included,
    as transformers' run_glue and run_ner number theirs (sorted, MRPC's label 1 would be not_equivalent, so the F1
    of "label 1" another class's). The same rows written without the names (Dataset.to_json's numbers) are refused
    in one line: a model's own order need not be the data's, and one trained on CoNLL's text files numbers its tags
    otherwise (sorted), so reading the numbers through it would score other tags."""
    from bertforge.cli import evaluate as evaluate_cli
    from bertforge.tasks.token_classification import read_conll

    with open(data_dir / "mrpc" / "train.tsv", encoding="utf-8-sig") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:25]
    mrpc = datasets.Dataset.from_dict(
        {"sentence1": [row[3] for row in rows], "sentence2": [row[4] for row in rows],
         "label": [int(row[0]) for row in rows]},
        features=datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=MRPC_NAMES)}))
    mrpc.save_to_disk(str(tmp_path / "mrpc"))
    code, _ = run_command(finetune_cli, "--model", tiny_model_dir, "--train", tmp_path / "mrpc", "--text-column",
                          "sentence1", "--text-pair-column", "sentence2", "--output", tmp_path / "mrpc_model",
                          "--max-steps", "1", "--batch-size", "8", "--max-length", "32", "--no-progress",
                          "--device", "cpu")
    config = json.loads((tmp_path / "mrpc_model" / "config.json").read_text())
    assert code == 0 and config["id2label"] == {"0": "not_equivalent", "1": "equivalent"}

    sentences = read_conll(data_dir / "conll2003" / "eng.train")[:40]
    conll = datasets.Dataset.from_dict(
        {"tokens": [s.words for s in sentences],
         "ner_tags": [[CONLL_NAMES.index(tag) for tag in s.tags] for s in sentences]},
        features=datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                    "ner_tags": datasets.Sequence(datasets.ClassLabel(names=CONLL_NAMES))}))
    train = conll.select(range(3))  # lacks some of the tags the dev rows have
    assert {CONLL_NAMES[t] for row in train["ner_tags"] for t in row} != set(CONLL_NAMES)
    train.save_to_disk(str(tmp_path / "ner_train"))
    conll.save_to_disk(str(tmp_path / "ner_dev"))
    conll.to_json(str(tmp_path / "ner_dev.jsonl"))  # the numbers alone
    code, _ = run_command(finetune_cli, "--task", "ner", "--model", tiny_model_dir, "--train", tmp_path / "ner_train",
                          "--dev", tmp_path / "ner_dev", "--output", tmp_path / "ner_model", "--max-steps", "3",
                          "--batch-size", "8", "--max-length", "64", "--lr", "1e-3", "--no-progress",
                          "--device", "cpu")
    config = json.loads((tmp_path / "ner_model" / "config.json").read_text())
    assert code == 0 and config["id2label"] == {str(i): name for i, name in enumerate(CONLL_NAMES)}
    code, _ = run_command(evaluate_cli, "--model", tmp_path / "ner_model", "--data", tmp_path / "ner_dev")
    assert code == 0 and json.loads((tmp_path / "ner_model" / "eval_results.json").read_text())["f1"] >= 0
    with pytest.raises(InputError, match=r"ner_dev.jsonl, line 1, field 'ner_tags': tag \d is a number that nothing "
                                         "in the data names"):
        run_command(evaluate_cli, "--model", tmp_path / "ner_model", "--data", tmp_path / "ner_dev.jsonl")
    mrpc.to_json(str(tmp_path / "mrpc.jsonl"))
    with pytest.raises(InputError, match=r"line 1, field 'label': label '1' is not one of the model's labels "
                                         r"\(equivalent, not_equivalent\); a label number is read as a name only"):
        run_command(evaluate_cli, "--model", tmp_path / "mrpc_model", "--data", tmp_path / "mrpc.jsonl")
