"""Small batches of an int8 model replayed from a recorded graph: the eager forward's numbers on real MiniLM and
real text, for every way the encoder and its heads call it; everything a graph can't give runs eagerly; a model
that loads new tensors is recorded again."""

import concurrent.futures
import copy
import importlib
import pickle

import pytest
import torch

from bertforge import BertForSequenceClassification, BertForTokenClassification, BertModel
from bertforge.activations import float32_lanes
from bertforge.compress import QuantizationConfig, quantize
from bertforge.compress.int8_linear import small_product_kernel_available
from bertforge.inference import replay

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not small_product_kernel_available(),
                                 reason="this build of torch has no fbgemm static-input int8 kernel to replay")]
int8_linear = importlib.import_module("bertforge.compress.int8_linear")


@pytest.fixture(scope="module")
def texts(sst2_dev):
    return [text for text, _ in sst2_dev]


@pytest.fixture(scope="module")
def calibration(tokenizer, texts):
    return [dict(tokenizer(texts[i:i + 16], padding=True, return_tensors="pt")) for i in range(0, 32, 16)]


@pytest.fixture(scope="module")
def int8(minilm_dir, calibration):
    """MiniLM int8 as a CPU without VNNI runs it, on any CPU: products of fewer than 256 rows on fbgemm, the
    kernel the graph replays, so that replayed and eager numbers can be compared exactly."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(int8_linear, "int8_reduce_range", lambda: True)
        yield quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"), calibration)


@pytest.fixture(autouse=True)
def fbgemm_for_few_rows(monkeypatch):
    monkeypatch.setattr(int8_linear, "int8_reduce_range", lambda: True)


def run(model, eager: bool, **inputs):
    with pytest.MonkeyPatch.context() as patch, torch.inference_mode():
        if eager:
            patch.setattr(replay, "REPLAY_MAX_WORK", 0)
        return model(**inputs)


def graphs(model) -> set:
    encoder = model if isinstance(model, BertModel) else model.bert
    return set(vars(encoder)["replays"].graphs)


@pytest.mark.parametrize("first_token_only", [False, True])
def test_small_batches_replay_the_eager_numbers(int8, tokenizer, texts, first_token_only):
    calls = [dict(tokenizer(texts[200], return_tensors="pt")),  # one sentence
             dict(tokenizer(texts[201:204], padding=True, return_tensors="pt")),  # three, padded
             dict(tokenizer(texts[204], texts[205], return_tensors="pt")),  # a pair: segments 0 and 1
             {"input_ids": tokenizer(texts[206:208], padding=True, return_tensors="pt")["input_ids"]}]  # ids alone
    long = " ".join(texts[210:214])  # past the explicit attention's lengths: the graph with SDPA's kernel
    calls.append(dict(tokenizer(long, return_tensors="pt")))
    assert calls[-1]["input_ids"].shape[1] > 64
    # rows shorter than one vector of the CPU (softmax's branch, on every CPU: 5 positions), and one past it
    calls += [dict(tokenizer(min(texts, key=len), return_tensors="pt")),
              dict(tokenizer(texts[218], return_tensors="pt"))]
    assert calls[-2]["input_ids"].shape[1] <= 5 and 16 < calls[-1]["input_ids"].shape[1] <= 64
    for inputs in calls:
        eager = run(int8, True, **inputs, first_token_only=first_token_only)
        replayed = run(int8, False, **inputs, first_token_only=first_token_only)
        assert replayed.last_hidden_state.shape == eager.last_hidden_state.shape
        torch.testing.assert_close(replayed.last_hidden_state, eager.last_hidden_state, atol=1e-4, rtol=0)
        torch.testing.assert_close(replayed.pooler_output, eager.pooler_output, atol=1e-5, rtol=0)
        if "attention_mask" in inputs and not first_token_only:  # padding positions are zeros, as eagerly
            padding = inputs["attention_mask"] == 0
            assert padding.any() == (len(inputs["input_ids"]) == 3)
            assert not replayed.last_hidden_state[padding].any()
    lengths = {replay.lengths_of(inputs["input_ids"].shape[1]) for inputs in calls}
    assert lengths == {replay.SDPA, replay.EXPLICIT} | ({replay.SHORTER_THAN_A_VECTOR} if float32_lanes() else set())
    assert graphs(int8) >= {(first_token_only, lengths) for lengths in lengths}


def test_heads_replay_their_encoder(minilm_dir, calibration, tokenizer, texts):
    batch = dict(tokenizer(texts[220:222], padding=True, return_tensors="pt"))
    for head in (BertForSequenceClassification, BertForTokenClassification):  # [CLS] alone with the pooler; every
        torch.manual_seed(0)                                                  # token without it
        model = quantize(head.from_pretrained(minilm_dir, num_labels=3), QuantizationConfig("int8"), calibration)
        eager, replayed = run(model, True, **batch).logits, run(model, False, **batch).logits
        torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=0)
        assert graphs(model)


def test_what_a_graph_cannot_give_runs_eagerly(int8, tokenizer, texts):
    batch = dict(tokenizer(texts[230:232], padding=True, return_tensors="pt"))
    vars(int8)["replays"].graphs.clear()
    seen = []
    handle = int8.encoder.layers[2].register_forward_hook(lambda module, inputs, output: seen.append(output))
    run(int8, False, **batch)
    handle.remove()
    assert seen, "a hook on a layer sees the layer run"
    with torch.no_grad():
        assert len(int8(**batch, output_hidden_states=True).hidden_states) == 7
        assert len(int8(**batch, output_attentions=True).attentions) == 6
        int8(inputs_embeds=int8.embeddings.tokens(batch["input_ids"]), attention_mask=batch["attention_mask"])
        int8(**batch, position_ids=torch.arange(batch["input_ids"].shape[1]))
        int8.train()
        int8(**batch)  # training mode
        int8.eval()
    with torch.enable_grad():  # gradients on, after calls in inference mode made the joint query-key-value layers
        assert not replay.replayable(int8, batch["input_ids"], batch["attention_mask"], None, None, None, None, None)
        assert int8(**batch).last_hidden_state.requires_grad
    with torch.no_grad():
        assert replay.replayable(int8, batch["input_ids"], batch["attention_mask"], None, None, None, None, None)
    left = {name: tensor.flip(1) for name, tensor in batch.items()}  # left padding: first positions are padding
    assert not left["attention_mask"][:, 0].all()
    run(int8, False, **left, first_token_only=True)
    big = dict(tokenizer(texts[:24], padding=True, return_tensors="pt"))
    assert big["input_ids"].numel() > replay.REPLAY_MAX_WORK
    run(int8, False, **big)
    padded = dict(tokenizer([" ".join(texts[300:309]), texts[309]], padding=True, return_tensors="pt"))
    positions, padding = padded["input_ids"].numel(), int((padded["attention_mask"] == 0).sum())
    assert positions <= replay.REPLAY_MAX_WORK < positions + 2 * padding  # few positions, but mostly padding
    run(int8, False, **padded)
    assert not graphs(int8)  # none of these was replayed


def test_a_model_that_loads_new_tensors_is_recorded_again(minilm_dir, calibration, tokenizer, texts):
    model = quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"), calibration)
    inputs = dict(tokenizer(texts[240], return_tensors="pt"))
    before = run(model, False, **inputs).last_hidden_state
    state = model.state_dict()
    for name in ("encoder.layers.1.attention.query.weight_scale", "encoder.layers.4.feed_forward.down.weight_scale"):
        state[name] = state[name] * 1.1  # int8 weights: the graph reads them prepacked, not as the model's tensors
    model.load_state_dict(state)
    after = run(model, False, **inputs).last_hidden_state
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, run(model, True, **inputs).last_hidden_state, atol=1e-5, rtol=0)


@pytest.mark.parametrize("duplicate", [copy.deepcopy, lambda model: pickle.loads(pickle.dumps(model))],
                         ids=["deepcopy", "pickle"])
def test_a_copy_replays_on_its_own(int8, tokenizer, texts, duplicate):
    inputs = dict(tokenizer(texts[250], return_tensors="pt"))
    expected = run(int8, False, **inputs).last_hidden_state
    twin, graphs_before = duplicate(int8), graphs(int8)
    assert not graphs(twin)
    torch.testing.assert_close(run(twin, False, **inputs).last_hidden_state, expected, atol=0, rtol=0)
    # replayed by the copy, on graphs of its own
    assert graphs(twin) and graphs(int8) == graphs_before
    assert twin.state_dict().keys() == int8.state_dict().keys()


def test_a_graph_is_recorded_once_per_way_of_calling(minilm_dir, calibration, tokenizer, texts, monkeypatch):
    model = quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("int8"), calibration)
    recorded, record = [], replay.record
    monkeypatch.setattr(replay, "record", lambda *args: recorded.append(args[1:]) or record(*args))
    for text in texts[260:263]:
        run(model, False, **dict(tokenizer(text, return_tensors="pt")))
    run(model, True, **dict(tokenizer(texts[:24], padding=True, return_tensors="pt")))  # eager: nothing new
    for text in texts[263:265]:
        run(model, False, **dict(tokenizer(text, return_tensors="pt")), first_token_only=True)
        run(model, False, **dict(tokenizer(text, return_tensors="pt")))
    assert recorded == [(False, replay.EXPLICIT), (True, replay.EXPLICIT)]  # 21-48 positions each


def test_a_graph_recorded_in_one_thread_leaves_another_threads_eager_kernels_as_they_are(int8, tokenizer, texts):
    """A graph is recorded at a thread's first small batch (~0.5 s), while a web app's other threads may run large
    batches on the same model: theirs take the kernels they take at any other time (oneDNN's for 256 rows and more),
    not the one a graph can hold, and give the same numbers. Deterministic: the other thread runs (waited for)
    while this one is inside what record() runs the tracer in."""
    big = dict(tokenizer(texts[:24], padding=True, return_tensors="pt"))
    assert int(big["attention_mask"].sum()) >= int8_linear.SMALL_PRODUCT_ROWS
    alone = run(int8, True, **big).last_hidden_state
    with concurrent.futures.ThreadPoolExecutor(1) as other_thread, replay.recording_for_replay():
        meanwhile = other_thread.submit(run, int8, True, **big).result().last_hidden_state
    torch.testing.assert_close(meanwhile, alone, atol=0, rtol=0)
