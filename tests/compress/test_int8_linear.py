"""The int8 layer on its own: the static product on each of its kernels against the arithmetic it stands for,
folded outliers and fused activations, an up-projection writing its down-projection's codes, query, key and value
as one product, and a sentence alone against the same sentence in a batch."""

import concurrent.futures
import importlib
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertModel
from bertforge.compress import QuantizationConfig, QuantizedLinear, quantize
from bertforge.compress.calibration import calibration_batches
from bertforge.compress.int8_linear import (
    FusedProjections,
    concatenate,
    small_product_kernel_available,
    static_kernel_available,
)
from bertforge.model import SelfAttention

pytestmark = pytest.mark.usefixtures("one_thread")
int8_linear = importlib.import_module("bertforge.compress.int8_linear")


@pytest.fixture(params=["onednn", "fbgemm"])
def kernel(request, monkeypatch):
    """The static int8 product on each of its kernels: oneDNN's, and fbgemm's, which takes products of few rows on
    a CPU without VNNI (made to here on any CPU: 7-bit weights, as such a CPU gets)."""
    if request.param == "onednn":
        monkeypatch.setattr(int8_linear, "SMALL_PRODUCT_ROWS", 0)
    else:
        if not small_product_kernel_available():
            pytest.skip("this build of torch has no fbgemm static-input int8 linear kernel")
        monkeypatch.setattr(int8_linear, "int8_reduce_range", lambda: True)
    return request.param


def token_states(model, batch):
    with torch.inference_mode():
        return model(**batch).last_hidden_state[batch["attention_mask"].bool()]  # (tokens, hidden)


@pytest.mark.skipif(not static_kernel_available(), reason="this build of torch has no oneDNN int8 linear kernel")
def test_static_kernel_computes_the_int8_product_it_stands_for(kernel):
    """oneDNN's product against the same integers multiplied in float64: the calibrated step and zero point, the
    weight's codes (halved to 7 bits on CPUs without VNNI, whose int16 sums would saturate on 8), the outlier
    channels left to the float32 product."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(2, 10, 64) * 3 + 1
    x[..., 5] *= 40  # an outlier channel
    layer = QuantizedLinear.from_linear(linear, x.reshape(-1, 64).amin(0), x.reshape(-1, 64).amax(0), 1)
    assert layer.runs_static() and layer.outlier_index.tolist() == [5]
    step, zero_point = (float(number) for number in layer.input_quantization(x))
    codes = (torch.round(x / step) + zero_point).clamp(0, 255)
    codes[..., 5] = zero_point
    weight, scale = layer.weight.double(), layer.weight_scale.double()
    if int8_linear.int8_reduce_range():  # as the fixture set it
        weight, scale = torch.round(weight / 2), scale * 2
    expected = ((codes.double() - zero_point) * step) @ (weight * scale[:, None]).t() + linear.bias.double()
    expected += x[..., 5:6].double() * linear.weight[:, 5].double()
    with torch.inference_mode():
        assert torch.allclose(layer(x).double(), expected, atol=1e-4, rtol=1e-5)
    assert (layer.small_packed is not None) == (kernel == "fbgemm")  # the kernel the test meant ran


@pytest.mark.skipif(not static_kernel_available(), reason="this build of torch has no oneDNN int8 linear kernel")
def test_folded_outliers_and_a_fused_activation_compute_what_they_stand_for(kernel):
    """A layer followed by GELU folds its outlier channel into the int8 product (the input divided by how far the
    channel reaches beyond the others, its weight column multiplied by as much) and applies GELU in the kernel:
    against the same integers in float64, then GELU."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(2, 10, 64) * 3 + 1
    x[..., 5] *= 40  # an outlier channel
    low, high = x.reshape(-1, 64).amin(0), x.reshape(-1, 64).amax(0)
    layer = QuantizedLinear.from_linear(linear, low, high, 1, fold_outliers=True, activation="gelu")
    assert len(layer.outlier_index) == 0 and layer.fuses_activation()
    reach = torch.maximum(low.abs(), high.abs())
    expected_scale = torch.ones(64)
    expected_scale[5] = reach[torch.arange(64) != 5].max() / reach[5]
    assert torch.allclose(layer.input_scale, expected_scale)
    scaled = x * layer.input_scale
    step, zero_point = (float(number) for number in layer.input_quantization(scaled))
    codes = (torch.round(scaled / step) + zero_point).clamp(0, 255)
    weight, scale = layer.weight.double(), layer.weight_scale.double()
    if int8_linear.int8_reduce_range():
        weight, scale = torch.round(weight / 2), scale * 2
    expected = F.gelu(((codes.double() - zero_point) * step) @ (weight * scale[:, None]).t() + linear.bias.double())
    with torch.inference_mode():
        assert torch.allclose(layer(x).double(), expected, atol=1e-4, rtol=1e-5)
    assert (layer.small_packed is not None) == (kernel == "fbgemm")
    # and the product stands for the float layer: the folded channel keeps its contribution. Its weight column is
    # 40x the others', so rows leaning on it get a coarse step: more so with the 7-bit weights of a CPU without
    # VNNI, which the fbgemm case makes on any CPU (measured min 0.973, mean 0.995-0.996 on an AVX2 EPYC and on an
    # AMX Xeon; 8-bit, on the Xeon: min 0.996, mean 0.999).
    similarity = F.cosine_similarity(layer(x), F.gelu(linear(x)).detach(), dim=-1)
    assert similarity.min() > (0.95 if int8_linear.int8_reduce_range() else 0.99) and similarity.mean() > 0.99


@pytest.mark.skipif(not static_kernel_available(), reason="this build of torch has no oneDNN int8 linear kernel")
def test_an_up_projection_writes_its_down_projections_codes(minilm_dir, tokenizer, sentences, monkeypatch):
    """Where a feed-forward's down-projection has no outliers, the up-projection writes its output as the down-
    projection's uint8 input codes: the same numbers as writing float32 and quantizing it after, up to a code's
    rounding of a value on a boundary."""
    monkeypatch.setattr(int8_linear, "SMALL_PRODUCT_ROWS", 0)  # oneDNN's kernel, which can write codes
    model = quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"),
                     calibration_batches(tokenizer, sentences[:32]))
    chained = [layer.feed_forward for layer in model.encoder.layers
               if layer.feed_forward.up.next_input_range is not None]
    assert chained and all(feed_forward.down.takes_codes() for feed_forward in chained)
    assert all(len(layer.feed_forward.down.outlier_index) for layer in model.encoder.layers
               if layer.feed_forward.up.next_input_range is None)  # those that don't chain keep outliers
    x = torch.randn(40, 384)
    with torch.inference_mode():
        feed_forward = chained[0]
        codes = feed_forward.up(x)
        assert codes.dtype == torch.uint8
        through_codes = feed_forward.down(codes)
        feed_forward.up.writes_codes(None)  # float32 out
        through_float = feed_forward.down(feed_forward.up(x))
    assert torch.allclose(through_codes, through_float, atol=1e-3 * through_float.abs().max())


@pytest.mark.skipif(not static_kernel_available(), reason="this build of torch has no oneDNN int8 linear kernel")
def test_query_key_and_value_run_as_one_product_with_the_numbers_of_three(minilm_dir, tokenizer, sentences):
    model = quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"),
                     calibration_batches(tokenizer, sentences[:32]))
    batch = dict(tokenizer(sentences[32:48], padding=True, return_tensors="pt"))
    attentions = [layer.attention for layer in model.encoder.layers]
    assert all(isinstance(attention.project, FusedProjections) for attention in attentions)
    with torch.inference_mode():
        fused = token_states(model, batch)
        assert all(attention.project.fused is not None for attention in attentions)  # each layer took one product
        x = torch.randn(30, 384)
        for attention in attentions:  # side by side, the three layers' own numbers
            for joint, alone in zip(attention.project(x), (attention.query(x), attention.key(x), attention.value(x))):
                assert torch.allclose(joint, alone, atol=1e-5, rtol=1e-5)
        one_by_one = {}
        for attention in attentions:  # a hook on a layer makes the attention layer run its layers one by one
            one_by_one[attention] = []
            attention.value.register_forward_hook(lambda module, inputs, output, seen=one_by_one[attention]:
                                                  seen.append(output.shape))
        assert torch.allclose(token_states(model, batch), fused, atol=1e-4)
    assert all(len(seen) == 1 for seen in one_by_one.values())


@pytest.mark.skipif(not static_kernel_available(), reason="this build of torch has no oneDNN int8 linear kernel")
def test_first_token_only_takes_the_last_layers_queries_of_first_tokens_alone(minilm_dir, tokenizer, sentences):
    """The last layer of a [CLS]-only pass joins key and value in one product and asks the query layer for the
    first tokens alone, with the [CLS] vectors of the full pass of the same int8 model."""
    model = quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"),
                     calibration_batches(tokenizer, sentences[:32]))
    batch = dict(tokenizer(sentences[32:48], padding=True, return_tensors="pt"))
    last = model.encoder.layers[-1].attention
    asked = []
    with torch.inference_mode():
        full = model(**batch)
        handle = last.query.register_forward_hook(lambda module, inputs, output: asked.append(inputs[0].shape[0]))
        hooked = model(**batch, first_token_only=True)  # the query layer alone: a hook does not split the others
        handle.remove()
        first = model(**batch, first_token_only=True)
    assert asked == [16]  # one query row per sentence
    assert last.project.products[("key", "value")][1] is not None
    assert torch.equal(hooked.last_hidden_state, first.last_hidden_state)
    assert torch.allclose(first.last_hidden_state[:, 0], full.last_hidden_state[:, 0], atol=1e-4)


@pytest.mark.skipif(not static_kernel_available(), reason="this build of torch has no oneDNN int8 linear kernel")
def test_one_product_is_made_again_when_its_layers_load_new_tensors(minilm_dir, tokenizer, sentences):
    model = quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"),
                     calibration_batches(tokenizer, sentences[:32]))
    attention = model.encoder.layers[1].attention
    x = torch.randn(12, 384)
    with torch.inference_mode():
        before = attention.project(x)
        state = {name: tensor.clone() for name, tensor in attention.key.state_dict().items()}
        state["bias"] += 1.0
        attention.key.load_state_dict(state)
        query, key, value = attention.project(x)
    assert torch.equal(query, before[0]) and torch.equal(value, before[2])
    assert torch.allclose(key, before[1] + 1.0, atol=1e-5)


def test_layers_that_quantize_their_input_differently_are_not_joined():
    layers = [QuantizedLinear.from_linear(torch.nn.Linear(16, 8), -torch.ones(16) * scale, torch.ones(16) * scale, 0)
              for scale in (1.0, 1.0, 2.0)]
    assert concatenate(layers[:2]) is not None or not static_kernel_available()
    assert concatenate(layers) is None  # the third calibrated a wider input range
    attention = SelfAttention(16, 2, 0.0)
    attention.query, attention.key, attention.value = layers
    projections = FusedProjections(attention)
    x = torch.randn(5, 16)
    with torch.inference_mode():
        for joint, layer in zip(projections(x), layers):
            assert torch.equal(joint, layer(x))
        attention.value = layers[1]  # a layer replaced: the product follows the attention layer's own
        assert projections.fused is None and torch.equal(projections(x)[2], layers[1](x))
        if static_kernel_available():
            assert projections.fused is not None  # now the three quantize alike


@pytest.mark.skipif(not (static_kernel_available() and small_product_kernel_available()),
                    reason="this build of torch lacks one of the two int8 kernels")
def test_one_sentence_at_a_time_computes_what_a_batch_computes(minilm, minilm_dir, tokenizer, sentences,
                                                                monkeypatch):
    """A CPU without VNNI runs products of few rows (one sentence) on fbgemm and a batch's on oneDNN: the same
    codes and weights, the float32 rounding of two kernels apart, which can move a code of a later layer by one."""
    monkeypatch.setattr(int8_linear, "int8_reduce_range", lambda: True)  # such a CPU, on any CPU
    model = quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"),
                     calibration_batches(tokenizer, sentences[:32]))
    texts = sentences[200:232]
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    batched = token_states(model, batch)
    alone = torch.cat([token_states(model, dict(tokenizer(text, return_tensors="pt"))) for text in texts])
    layers = [model.pooler.dense] + [linear for layer in model.encoder.layers
                                     for linear in (layer.feed_forward.up, layer.feed_forward.down)]
    assert all(layer.small_packed is not None for layer in layers)  # they took few rows (one sentence's) on fbgemm
    apart = (batched - alone).abs().max()
    from_fp32 = (batched - token_states(minilm, batch)).abs().max()
    similarity = F.cosine_similarity(batched, alone, dim=-1)
    # Measured (a 2-core AVX2 EPYC): largest difference 0.135, 0.44 of int8's own from fp32 (0.31); token cosine
    # min 0.9973, mean 0.99973. oneDNN alone gives a sentence the same numbers in any batch.
    assert apart < 0.6 * from_fp32
    assert similarity.min() > 0.995 and similarity.mean() > 0.9995


@pytest.mark.skipif(not static_kernel_available(), reason="this build of torch has no oneDNN int8 linear kernel")
def test_int8_products_of_another_thread_meanwhile_leave_the_process_warning_filters_as_they_were(monkeypatch):
    """Each int8 product silences torch's note on quantized tensors around the call that makes one, and Python's
    warning filters are the process's: two threads' blocks interleaved (one in, the other in, the first out, the
    second out) left every warning of the process silenced, as 24 large batches of an int8 MiniLM from 4 threads
    did. Here the other thread's product starts while this thread's is in its block, and the first one out waits up
    to a second for the other to be in its own (it is, or waits its turn); the filters after both are those before."""
    monkeypatch.setattr(int8_linear, "SMALL_PRODUCT_ROWS", 0)  # oneDNN's kernel, whatever the rows and the CPU
    torch.manual_seed(0)
    x = torch.randn(40, 64)
    layer = QuantizedLinear.from_linear(torch.nn.Linear(64, 48), x.amin(0), x.amax(0), 0)
    with torch.inference_mode():
        alone = layer(x)
    this_thread, other_in_block, first_out, quantize = threading.get_ident(), threading.Event(), threading.Event(), \
        torch.quantize_per_tensor

    def quantize_in_turn(*args):
        if threading.get_ident() != this_thread:
            other_in_block.set()
            first_out.wait(timeout=60)
        elif not first_out.is_set() and not meanwhile:
            meanwhile.append(other_thread.submit(run, layer, x))
            other_in_block.wait(timeout=1)
        return quantize(*args)

    def run(layer, x):
        with torch.inference_mode():
            return layer(x)

    before, meanwhile = list(warnings.filters), []
    monkeypatch.setattr(torch, "quantize_per_tensor", quantize_in_turn)
    with concurrent.futures.ThreadPoolExecutor(1) as other_thread:
        first = run(layer, x)
        first_out.set()
    assert warnings.filters == before
    assert torch.equal(first, alone) and torch.equal(meanwhile[0].result(), alone)
