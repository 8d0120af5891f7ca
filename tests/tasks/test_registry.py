"""What a checkpoint holds (tasks/checkpoint_contents.py): one answer for the CLI, the tasks, ONNX export and the
server; a model whose task head was never trained is refused by every command that would use the head."""

import json

import pytest
import torch

from bertforge import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertModel
from bertforge.cli.main import main
from bertforge.errors import BertforgeError, CheckpointError
from bertforge.tasks.checkpoint_contents import RUN_CONFIG_FILE, inspect_checkpoint, stated_length
from bertforge.tasks.classification import ClassificationSettings
from bertforge.tasks.finetune import FinetuneConfig
from bertforge.tasks.registry import HEADS, TASKS, task_of_model


def save(model, tokenizer, directory, run: FinetuneConfig | None = None):
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if run is not None:
        run.save(directory / RUN_CONFIG_FILE)
    return directory


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return BertConfig.tiny(vocab_size=tokenizer.vocab_size)


def test_every_task_row_names_a_head_and_every_head_an_onnx_task():
    assert {row.head for row in TASKS.values()} <= set(HEADS)
    assert {head.onnx_task for head in HEADS.values()} == {"feature-extraction", "text-classification",
                                                           "token-classification", "question-answering"}


def test_the_default_model_is_an_encoder_without_a_task(minilm_dir):
    checkpoint = inspect_checkpoint("default")
    assert (checkpoint.head, checkpoint.task, checkpoint.run) == ("encoder", None, None)
    with pytest.raises(CheckpointError, match="no trained task head"):
        checkpoint.task_for()


def test_the_run_config_gives_the_task_and_its_settings(tmp_path, tokenizer, tiny):
    run = FinetuneConfig(task="regression", settings=ClassificationSettings(max_length=24))
    one_output = BertForSequenceClassification(BertConfig.tiny(vocab_size=tokenizer.vocab_size,
                                                                     id2label={0: "LABEL_0"}))
    checkpoint = inspect_checkpoint(save(one_output, tokenizer, tmp_path, run))
    assert (checkpoint.head, checkpoint.task) == ("sequence_classification", "regression")
    assert checkpoint.settings().max_length == 24
    assert task_of_model(one_output).name == "regression" and task_of_model(BertModel(tiny)) is None
    with pytest.raises(CheckpointError, match="needs a trained question_answering head"):
        checkpoint.task_for("qa")


def test_a_multi_label_checkpoint_is_known_by_its_problem_type(tmp_path, tokenizer):
    # From transformers (no run config): config.json's problem_type says multi-label, as transformers reads it.
    config = BertConfig.tiny(vocab_size=tokenizer.vocab_size, id2label={0: "a", 1: "b", 2: "c"},
                             problem_type="multi_label_classification")
    model = BertForSequenceClassification(config)
    checkpoint = inspect_checkpoint(save(model, tokenizer, tmp_path))
    assert (checkpoint.head, checkpoint.task) == ("sequence_classification", "multi_label")
    assert task_of_model(model).name == "multi_label"
    assert checkpoint.settings().settings.threshold is None  # chosen on a dev set, else 0.5


@pytest.mark.parametrize("architectures", [2.5, "BertModel", [["BertModel"]]])
def test_architectures_that_are_not_a_list_of_names_are_named(tmp_path, tokenizer, tiny, architectures):
    """config.json's "architectures" decides a checkpoint's head: a value of the wrong kind was a TypeError."""
    save(BertModel(tiny), tokenizer, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"architectures": architectures}))
    with pytest.raises(BertforgeError, match=r"config.json: \"architectures\" must be a list of class names"):
        inspect_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"architectures": None}))
    assert inspect_checkpoint(tmp_path).head == "encoder"


def test_a_run_config_without_the_head_it_trained_is_refused(tmp_path, tokenizer, tiny):
    # A run that stopped before its first save: the run config is there, the weights are the encoder's.
    checkpoint = inspect_checkpoint(save(BertModel(tiny), tokenizer, tmp_path, FinetuneConfig(task="ner")))
    with pytest.raises(CheckpointError, match=f"{tmp_path}: task 'ner' needs a trained token_classification"):
        checkpoint.task_for()


@pytest.mark.parametrize("argv", [
    ["predict", "--model", "default", "--text", "John lives in Paris."],
    ["evaluate", "--model", "default", "--data", "train.csv"],
    ["serve", "--model", "default", "--port", "0"],
])
def test_commands_refuse_a_model_without_a_trained_head(argv, capsys, tmp_path, monkeypatch, tokenizer, tiny):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.csv").write_text("sentence,label\ngood,pos\n")
    if argv[0] == "serve":  # the server serves an encoder (embeddings); a run config naming a task it refuses
        pytest.importorskip("fastapi")
        model_dir = save(BertModel(tiny), tokenizer, tmp_path / "m", FinetuneConfig(task="classification"))
        argv = ["serve", "--model", str(model_dir), "--port", "0"]
    assert main(argv) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and ("no trained task head" in error or "needs a trained" in error), error
    assert not (tmp_path / "default").exists()  # evaluate wrote no metrics anywhere


def test_export_keeps_the_fine_tuned_head_and_refuses_an_untrained_one(tmp_path, tokenizer, tiny, capsys):
    torch.manual_seed(0)
    qa = save(BertForQuestionAnswering(tiny), tokenizer, tmp_path / "qa", FinetuneConfig(task="qa"))
    assert main(["export", "hf", "--model", str(qa), "--output", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    assert inspect_checkpoint(tmp_path / "out").head == "question_answering"
    assert main(["export", "hf", "--model", "default", "--task", "text-classification",
                 "--output", str(tmp_path / "none")]) == 1
    assert "needs a trained BertForSequenceClassification head" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_a_question_answering_checkpoint_of_few_positions_reads_contexts(tmp_path, tokenizer, squad_contexts):
    """A checkpoint from elsewhere (no run config) of 64 positions: the default windows (a 64-token question, a
    128-token stride, for 384 tokens) shrink with it, keeping their shares, so `predict` reads long contexts."""
    torch.manual_seed(0)
    BertForQuestionAnswering(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
                             ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    settings = inspect_checkpoint(tmp_path).settings().settings
    assert (settings.max_length, settings.max_query_length, settings.doc_stride) == (64, 64 // 6, 128 // 6)
    context = squad_contexts[0]
    assert main(["predict", "--model", str(tmp_path), "--text", "Who won?", "--text-pair", context,
                 "--output", str(tmp_path / "answers.jsonl")]) == 0
    [answer] = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert context[answer["start"]:answer["end"]] == answer["answer"] and answer["end"] > answer["start"]


def test_a_copy_without_its_run_config_reads_the_settings_config_json_recorded(tiny, tokenizer, tmp_path):
    """`export hf` writes config.json (with the run's record, "bertforge_finetune") and no finetune_config.json:
    the copy decodes as the run did, not with the task's defaults."""
    from bertforge import BertForTokenClassification

    config = BertConfig(**{**tiny.__dict__, "id2label": {0: "O", 1: "B-PER", 2: "I-PER"}})
    model = BertForTokenClassification(config)
    model.config.extra |= {"finetuning_task": "ner", "bertforge_finetune": {"max_length": 48, "decoding": "viterbi",
                                                                           "doc_stride": 8}}
    save(model, tokenizer, tmp_path / "copy")
    settings = inspect_checkpoint(tmp_path / "copy").settings().settings
    assert (settings.max_length, settings.decoding, settings.doc_stride) == (48, "viterbi", 8)
    model.config.extra["finetuning_task"] = "classification"  # another task's record: the defaults
    save(model, tokenizer, tmp_path / "other")
    assert inspect_checkpoint(tmp_path / "other").settings().settings.decoding == "argmax"
    model.config.extra |= {"finetuning_task": "ner", "bertforge_finetune": {"decoding": "beam"}}
    save(model, tokenizer, tmp_path / "damaged")
    with pytest.raises(CheckpointError, match=r"config.json: bertforge_finetune: unknown decoding 'beam'"):
        inspect_checkpoint(tmp_path / "damaged").settings()


def test_a_checkpoint_from_elsewhere_reads_as_long_inputs_as_its_files_allow(tmp_path, tokenizer, caplog):
    """Without a run config a classifier reads up to sentence-transformers' max_seq_length, else the tokenizer's
    model_max_length, within its positions; a value that is no length, or a file that can't be read, is passed over
    with a warning naming the file (the tokenizer's own loading refuses a broken tokenizer_config.json)."""
    config = BertConfig.tiny(vocab_size=tokenizer.vocab_size)
    config.max_position_embeddings, config.num_labels = 300, 2
    folder = save(BertForSequenceClassification(config), tokenizer, tmp_path / "classifier")
    settings_file = folder / "tokenizer_config.json"
    written = json.loads(settings_file.read_text())

    def with_length(value):
        settings_file.write_text(json.dumps({**written, "model_max_length": value}))
        return inspect_checkpoint(folder).settings().max_length

    assert with_length(256) == stated_length(folder) == 256
    assert with_length(1000) == 300  # no longer than the positions
    assert with_length(int(1e30)) == 300  # transformers' "no limit"
    with caplog.at_level("WARNING", logger="bertforge"):
        assert with_length(2) == 300
    assert "model_max_length 2 is no input length" in caplog.text
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 200}))
    assert with_length(256) == 200
    (folder / "sentence_bert_config.json").write_text("{not json")
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertforge"):
        assert with_length(256) == 256
    assert "sentence_bert_config.json" in caplog.text
