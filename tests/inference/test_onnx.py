"""ONNX export: the graph reproduces PyTorch on real padded text of shapes it wasn't traced with."""

import dataclasses
import sys

import numpy as np
import pytest
import torch

from bertforge import BertforgeError, BertForQuestionAnswering, BertForSequenceClassification, BertModel
from bertforge.inference.onnx import INPUT_NAMES, export_onnx, onnx_session

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
onnx = pytest.importorskip("onnx")


def real_batches(tokenizer, texts):
    """Two padded batches of real text with different batch sizes and lengths, the second with text pairs."""
    first = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    second = tokenizer(texts[:3], texts[-3:], padding=True, truncation=True, max_length=40, return_tensors="pt")
    assert first["input_ids"].shape != second["input_ids"].shape and not first["attention_mask"].all()
    return [first, second]


def max_difference_at_real_tokens(session, model, batch, names, per_token):
    actual = session.run(names, {name: batch[name].numpy() for name in INPUT_NAMES})
    with torch.no_grad():
        output = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    is_real = batch["attention_mask"].bool().numpy()
    worst = 0.0
    for name, values in zip(names, actual):
        difference = np.abs(values - getattr(output, name).numpy())
        worst = max(worst, float((difference[is_real] if name in per_token else difference).max()))
    return worst


def assert_dynamic_axes(path):
    graph = onnx.load(str(path)).graph
    assert [value.name for value in graph.input] == list(INPUT_NAMES)
    for value in graph.input:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64
        batch, seq = value.type.tensor_type.shape.dim
        assert batch.dim_param and seq.dim_param  # named symbols, not fixed sizes


@pytest.fixture(scope="module")
def minilm_onnx(minilm, tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "minilm.onnx"
    return path, export_onnx(minilm, tokenizer, path)


def test_minilm_matches_pytorch_on_real_text(minilm_onnx, minilm, tokenizer, real_sentences):
    path, report = minilm_onnx
    assert report.output_names == ("last_hidden_state", "pooler_output") and report.task == "feature-extraction"
    assert report.max_difference <= 1e-4 and len(set(report.checked_shapes)) == 3
    assert_dynamic_axes(path)
    session = onnx_session(path)
    assert [output.name for output in session.get_outputs()] == list(report.output_names)
    for batch in real_batches(tokenizer, real_sentences):
        assert max_difference_at_real_tokens(session, minilm, batch, list(report.output_names),
                                             {"last_hidden_state"}) <= 1e-4


def test_export_leaves_the_model_as_it_was(minilm_onnx, minilm):
    assert not minilm.training


@pytest.mark.parametrize("model_class, names, per_token", [
    (BertForSequenceClassification, ["logits"], set()),
    (BertForQuestionAnswering, ["start_logits", "end_logits"], {"start_logits", "end_logits"}),
])
def test_task_models_match_pytorch(tmp_path, tiny_config, tokenizer, real_sentences, model_class, names, per_token):
    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config, vocab_size=tokenizer.vocab_size, initializer_range=0.5)
    model = model_class(config).train()  # export must evaluate in eval mode and give the mode back
    report = export_onnx(model, tokenizer, tmp_path / "task.onnx")
    assert model.training and list(report.output_names) == names
    assert_dynamic_axes(tmp_path / "task.onnx")
    session, model = onnx_session(tmp_path / "task.onnx"), model.eval()
    for batch in real_batches(tokenizer, real_sentences):
        assert max_difference_at_real_tokens(session, model, batch, names, per_token) <= 1e-4


def test_a_graph_off_by_more_than_the_tolerance_is_not_written(tmp_path, tiny_config, tokenizer):
    model = BertModel(dataclasses.replace(tiny_config, vocab_size=tokenizer.vocab_size))
    with pytest.raises(BertforgeError, match="nothing was written"):
        export_onnx(model, tokenizer, tmp_path / "model.onnx", tolerance=-1.0)
    assert list(tmp_path.iterdir()) == []


def test_wrong_task_and_missing_packages_are_clear_errors(monkeypatch, tmp_path, tiny_config, tokenizer):
    model = BertModel(tiny_config)
    with pytest.raises(BertforgeError, match="task 'question-answering' exports a BertForQuestionAnswering"):
        export_onnx(model, tokenizer, tmp_path / "model.onnx", task="question-answering")
    with pytest.raises(BertforgeError, match="unknown task"):
        export_onnx(model, tokenizer, tmp_path / "model.onnx", task="translation")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(BertforgeError, match=r"pip install bertforge\[onnx\]"):
        export_onnx(model, tokenizer, tmp_path / "model.onnx")
