"""Inference options on the real MiniLM: int8, bf16 and auto keep the model's class and float32 outputs and stay close
to fp32 on real text; compile is applied in place; impossible choices are one-line errors."""

import copy
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertforge import BertConfig, BertForSequenceClassification, BertModel, runtime
from bertforge.cli.main import main
from bertforge.compress import QuantizedLinear
from bertforge.errors import ConfigError
from bertforge.fast_cpu import PrepackedLinear as Linear
from bertforge.inference import InferenceOptions, extract_features

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def sentences(sst2_dev):
    return [text for text, _ in sst2_dev[:16]]


def sentence_similarity(model, reference, tokenizer, sentences) -> torch.Tensor:
    """Cosine similarity of each sentence's mean-pooled embedding under `model` and under `reference`."""
    ours = extract_features(model, tokenizer, sentences, pooling="mean")
    theirs = extract_features(reference, tokenizer, sentences, pooling="mean")
    assert ours.dtype == torch.float32
    return F.cosine_similarity(ours, theirs, dim=-1)


def test_int8_is_bertforges_per_channel_quantizer_and_stays_close_on_real_text(minilm, minilm_dir, tokenizer,
                                                                               sentences):
    """One int8 path: `--precision int8` is compress.quantize's per-channel int8 with float32 outlier channels,
    calibrated on the bundled sentences (real text) when the caller has none of its own."""
    model = InferenceOptions(precision="int8").apply(BertModel.from_pretrained(minilm_dir), tokenizer)
    assert isinstance(model, BertModel) and not model.training
    quantized = [module for module in model.modules() if isinstance(module, QuantizedLinear)]
    assert len(quantized) == 6 * model.config.num_hidden_layers + 1  # q, k, v, output, up, down per layer; pooler
    assert not any(type(module) in (torch.nn.Linear, Linear) for module in model.modules())
    assert any(len(module.outlier_index) for module in quantized)  # calibration found MiniLM's outlier channels
    similarity = sentence_similarity(model, minilm, tokenizer, sentences)
    # 0.997 on these sentences (torch's per-tensor quantize_dynamic, the former int8 path: 0.91); the cost on a
    # task's metric is `bertforge evaluate --precision int8`
    assert similarity.min() > 0.99
    with pytest.raises(ConfigError, match="int8 calibrates on text"):
        InferenceOptions(precision="int8").apply(BertModel.from_pretrained(minilm_dir))


def test_auto_is_bf16_where_native_and_fp32_elsewhere(minilm_dir, monkeypatch):
    monkeypatch.setattr(runtime, "bf16_supported", lambda device_type: True)
    model = InferenceOptions(precision="auto").apply(BertModel.from_pretrained(minilm_dir))
    assert model.embeddings.tokens.weight.dtype == torch.bfloat16
    monkeypatch.setattr(runtime, "bf16_supported", lambda device_type: False)
    model = InferenceOptions(precision="auto").apply(BertModel.from_pretrained(minilm_dir))
    assert model.embeddings.tokens.weight.dtype == torch.float32


def test_bf16_casts_the_weights_and_gives_float32_outputs(minilm, minilm_dir, tokenizer, sentences, monkeypatch):
    # Where the CPU lacks native bf16 the kernels are emulated: slow, but the numbers are what bf16 gives.
    monkeypatch.setattr(runtime, "bf16_supported", lambda device_type: True)
    model = InferenceOptions(precision="bf16").apply(BertModel.from_pretrained(minilm_dir))
    assert model.embeddings.tokens.weight.dtype == torch.bfloat16
    batch = tokenizer(sentences[:2], padding=True, return_tensors="pt")
    output = model(**batch)
    assert output.last_hidden_state.dtype == output.pooler_output.dtype == torch.float32
    assert sentence_similarity(model, minilm, tokenizer, sentences).min() > 0.99


def test_bf16_without_hardware_support_is_an_error(minilm_dir, monkeypatch):
    monkeypatch.setattr(runtime, "bf16_supported", lambda device_type: False)
    with pytest.raises(ConfigError, match="has no native bf16"):
        InferenceOptions(precision="bf16").apply(BertModel.from_pretrained(minilm_dir))


def test_compile_is_applied_in_place(minilm_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **options: calls.append((self, options)))
    model = BertModel.from_pretrained(minilm_dir)
    assert InferenceOptions(compile=True).apply(model) is model
    assert calls == [(model, {"dynamic": True})]


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile's CPU backend needs a C++ compiler")
def test_compiled_int8_model_runs_and_computes_what_the_eager_one_does(tiny_config, tokenizer, sentences):
    """--precision int8 --compile: the int8 layers run eagerly inside the compiled model (inductor cannot lower their
    kernel; it was an InductorError at the first batch), the float32 parts compile, the outputs stay the eager ones."""
    torch.manual_seed(0)
    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})
    fp32 = BertModel(config).eval()
    batch = tokenizer(sentences[:4], padding=True, return_tensors="pt")
    calibration = [dict(batch)]
    eager = InferenceOptions(precision="int8").apply(copy.deepcopy(fp32), calibration=calibration)
    compiled = InferenceOptions(precision="int8", compile=True).apply(copy.deepcopy(fp32), calibration=calibration)
    assert any(isinstance(module, QuantizedLinear) for module in compiled.modules())
    with torch.no_grad():
        expected, got = eager(**batch).last_hidden_state, compiled(**batch).last_hidden_state
    real = batch["attention_mask"].bool()  # a compiled graph computes padding too, as a traced one does
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile's CPU backend needs a C++ compiler")
def test_the_models_compile_whole_as_transformers_models_do(tiny_config, tokenizer, sentences):
    """torch.compile(fullgraph=True): no branch on the data to break the graph at (a compiled model computes every
    position, as transformers' does); the outputs at real tokens and the classifier's are the eager ones."""
    torch.manual_seed(0)
    config = BertConfig(**{**tiny_config.to_dict(), "vocab_size": tokenizer.vocab_size, "num_labels": 2})
    batch = tokenizer(sentences[:4], padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    for model in (BertModel(config).eval(), BertForSequenceClassification(config).eval()):
        with torch.no_grad():
            expected, got = model(**batch)[0], torch.compile(model, fullgraph=True)(**batch)[0]
        if got.dim() == 3:
            expected, got = expected[real], got[real]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_unknown_precision_is_an_error():
    with pytest.raises(ConfigError, match=r"unknown precision 'fp8'; choose from fp32, auto, bf16, int8"):
        InferenceOptions(precision="fp8")


def test_embed_command_takes_the_precision(capsys, tmp_path, sentences, minilm, tokenizer):
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    output = tmp_path / "vectors.npy"
    assert main(["embed", "-i", str(lines), "-o", str(output), "--precision", "int8"]) == 0
    vectors = torch.from_numpy(np.load(output))
    expected = extract_features(minilm, tokenizer, sentences, pooling="mean")
    assert F.cosine_similarity(vectors, expected, dim=-1).min() > 0.99  # the per-channel int8 path
    assert not torch.allclose(vectors, expected, atol=1e-5)  # quantized, not the fp32 model


def test_an_int8_checkpoint_is_refused_on_a_gpu_before_it_moves_there(monkeypatch):
    """int8 layers run on oneDNN's CPU kernels: asked for a GPU, a quantized checkpoint gets a one-line error
    before anything is moved (not a kernel failure at the first batch). The GPU itself is pretended: the check
    comes first."""
    from bertforge.compress.quantize import QuantizationConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=32))
    model.quantization = QuantizationConfig("int8")
    with pytest.raises(ConfigError, match="int8, which runs on CPU only"):
        InferenceOptions(device="cuda").apply(model)
    assert next(model.parameters()).device.type == "cpu"


def test_a_bf16_checkpoint_held_in_float32_runs_in_bf16_where_the_device_has_it(monkeypatch):
    """A bf16 checkpoint loaded where bf16 is not native holds its (bf16-valued) weights in float32; prepared for a
    device that computes bf16 natively (here: this CPU, pretended to have it), it runs in bf16 there."""
    from bertforge.compress.quantize import QuantizationConfig

    monkeypatch.setattr(runtime, "bf16_supported", lambda device_type: True)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=32))
    model.quantization = QuantizationConfig("bf16")
    InferenceOptions().apply(model)
    assert next(model.parameters()).dtype == torch.bfloat16
    output = model(torch.tensor([[1, 5, 7, 2]]))
    assert output.last_hidden_state.dtype == torch.float32
