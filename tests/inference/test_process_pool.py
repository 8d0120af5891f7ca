"""sentence-transformers' multi-process pool on SentenceEncoder and CrossEncoder: the texts shared between worker
processes in chunks give what one process gives (real MiniLM, SST-2 sentences); a worker's error reaches the
caller, a dead worker gives an error rather than a wait forever, and bad pool arguments a one-line error."""

import concurrent.futures
import multiprocessing
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from bertforge import CrossEncoder, SentenceEncoder
from bertforge.errors import BertforgeError, ConfigError, InputError
from bertforge.inference import process_pool


@pytest.fixture(scope="module")
def texts(sst2_dev):
    return [text for text, _ in sst2_dev[:37]]


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    return SentenceEncoder(minilm_dir)


@pytest.fixture(scope="module")
def pool(encoder):
    pool = encoder.start_multi_process_pool(["cpu", "cpu"])
    yield pool
    encoder.stop_multi_process_pool(pool)


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 100])
def test_a_pool_encodes_as_one_process(encoder, pool, texts, chunk_size):
    expected = encoder.encode(texts)
    pooled = encoder.encode(texts, pool=pool, chunk_size=chunk_size)
    assert isinstance(pooled, np.ndarray) and pooled.shape == (len(texts), 384)
    np.testing.assert_allclose(pooled, expected, atol=1e-6, rtol=0)


def test_a_pool_gives_every_output_as_one_process(encoder, pool, texts):
    options = dict(normalize_embeddings=True, truncate_dim=64, convert_to_tensor=True)
    torch.testing.assert_close(encoder.encode(texts, pool=pool, **options), encoder.encode(texts, **options),
                               atol=1e-6, rtol=0)
    # int8 and binary vectors scale each dimension over all the texts, not chunk by chunk
    for precision in ("int8", "ubinary"):
        pooled, alone = (encoder.encode(texts, precision=precision, **options)
                         for options in ({"pool": pool, "chunk_size": 4}, {}))
        if precision == "ubinary":
            pooled, alone = np.unpackbits(pooled), np.unpackbits(alone)
        # The workers' float32 noise (another thread count) moves a value on a step's edge to either side of it,
        # as it may the values that set a dimension's range (see test_sentence_transformers): 3 in 14,000 on a Xeon.
        difference = np.abs(pooled.astype(np.int32) - alone.astype(np.int32))
        assert difference.max() <= 1 and (difference == 0).mean() > 0.99
    tokens = encoder.encode(texts[:7], pool=pool, chunk_size=2, output_value="token_embeddings")
    for pooled, alone in zip(tokens, encoder.encode(texts[:7], output_value="token_embeddings"), strict=True):
        torch.testing.assert_close(pooled, alone, atol=1e-5, rtol=0)  # other batches, other padding
    rows = encoder.encode(texts[:3], pool=pool, chunk_size=2, output_value=None)
    assert [row.keys() for row in rows] == [row.keys() for row in encoder.encode(texts[:3], output_value=None)]
    np.testing.assert_allclose(encoder.encode(texts[0], pool=pool), encoder.encode(texts[0]), atol=1e-6, rtol=0)
    np.testing.assert_allclose(encoder.encode_multi_process(texts, pool), encoder.encode(texts), atol=1e-6, rtol=0)
    assert encoder.encode([], pool=pool).shape == (0,)


def test_a_list_of_devices_is_a_pool_for_one_call(minilm_dir, sst2_dev):
    reranker = CrossEncoder(minilm_dir)
    pairs = [(sst2_dev[i][0], sst2_dev[i + 1][0]) for i in range(0, 24, 2)]
    before = set(multiprocessing.active_children())
    np.testing.assert_allclose(reranker.predict(pairs, device=["cpu", "cpu"], chunk_size=3), reranker.predict(pairs),
                               atol=1e-6, rtol=0)
    assert set(multiprocessing.active_children()) == before  # its workers ended with the call
    pool = reranker.start_multi_process_pool(["cpu"])
    try:
        query, documents = pairs[0][0], [second for _, second in pairs]
        pooled, alone = reranker.rank(query, documents, pool=pool), reranker.rank(query, documents)
        assert [row["corpus_id"] for row in pooled] == [row["corpus_id"] for row in alone]
        assert [row["score"] for row in pooled] == pytest.approx([row["score"] for row in alone], abs=1e-6)
    finally:
        reranker.stop_multi_process_pool(pool)



def test_calls_another_thread_makes_on_the_pool_meanwhile_get_their_own_results(encoder, pool, texts, monkeypatch):
    """A web app starts one pool and calls encode(pool=pool) from its request threads: a call another thread makes
    while this one waits for its results gets its own texts' vectors, and this call its own, though the workers
    answer both on one queue. Found by 4 threads' calls on a 2-worker pool: "TypeError: expected Tensor as element
    3 in argument 0, but got NoneType" (another call had taken its chunks' results). This call waits for the other
    up to a second: in that time the other either ends (having taken this call's results, before the fix) or waits
    for this call to end; either way the answers compared below do not depend on timing."""
    first, second = texts[:20], texts[20:]
    alone = [encoder.encode(batch, pool=pool, chunk_size=4) for batch in (first, second)]
    this_thread, meanwhile, next_result = threading.get_ident(), [], process_pool.next_result

    def another_call_first(pool):
        if threading.get_ident() == this_thread and not meanwhile:
            meanwhile.append(other_thread.submit(encoder.encode, second, pool=pool, chunk_size=4))
            concurrent.futures.wait(meanwhile, timeout=1)
        return next_result(pool)

    monkeypatch.setattr(process_pool, "next_result", another_call_first)
    with concurrent.futures.ThreadPoolExecutor(1) as other_thread:
        during = encoder.encode(first, pool=pool, chunk_size=4)
    np.testing.assert_allclose(during, alone[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(meanwhile[0].result(), alone[1], atol=1e-6, rtol=0)

def test_an_error_in_a_worker_is_raised_to_the_caller(pool):
    with pytest.raises(AttributeError, match="no_such_method"):
        process_pool.run_in_pool(pool, "no_such_method", ["a text"], {})


def test_a_dead_worker_is_an_error_not_a_wait(encoder):
    pool = encoder.start_multi_process_pool(["cpu"])
    try:
        pool["processes"][0].kill()
        pool["processes"][0].join()
        with pytest.raises(BertforgeError, match="worker.*ended.*exit code"):
            encoder.encode(["A text no worker is left to encode."], pool=pool)
        with pytest.raises(InputError, match="the pool is stopped"):  # and so it stays, in one line
            encoder.encode(["Another text."], pool=pool)
    finally:
        encoder.stop_multi_process_pool(pool)


def test_a_bf16_model_goes_to_a_pool_too(minilm_dir, texts):
    """run_in_bf16's output hook is a named function, so the model pickles for its workers (a lambda didn't)."""
    from bertforge import BertModel, BertTokenizer
    from bertforge.compress import QuantizationConfig, quantize

    encoder = SentenceEncoder(quantize(BertModel.from_pretrained(minilm_dir), QuantizationConfig("bf16")),
                              BertTokenizer.from_pretrained(minilm_dir))
    pool = encoder.start_multi_process_pool(["cpu"])
    try:  # bf16 keeps 8 bits of mantissa; the worker's batches are other batches
        np.testing.assert_allclose(encoder.encode(texts[:6], pool=pool, chunk_size=2), encoder.encode(texts[:6]),
                                   atol=1e-2, rtol=0)
    finally:
        encoder.stop_multi_process_pool(pool)


def test_a_script_without_a_main_guard_gets_an_error_not_a_wait(minilm_dir, tmp_path):
    """Each spawned worker imports the script, which (unguarded) starts a pool of its own and so dies: the caller
    is told why, and exits, where Process.start used to wait forever for the dead worker to read its model."""
    script = tmp_path / "unguarded.py"
    script.write_text(f"from bertforge import SentenceEncoder\n"
                      f"encoder = SentenceEncoder({str(minilm_dir)!r})\n"
                      f"pool = encoder.start_multi_process_pool(['cpu'])\n"
                      f"encoder.encode(['A text.'], pool=pool)\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1
    assert "BertforgeError: 1 worker(s) of the multi-process pool ended" in done.stderr
    assert 'start a pool under `if __name__ == "__main__":`' in done.stderr


@pytest.mark.parametrize("devices, message", [("cpu", "a non-empty list"), ([], "a non-empty list"),
                                              (["cpu", "gpu7"], "'gpu7' is not a device")])
def test_bad_devices_are_named(encoder, devices, message):
    with pytest.raises(InputError, match=message):
        encoder.start_multi_process_pool(devices)


def test_bad_pool_arguments_are_named(encoder, pool, texts):
    with pytest.raises(InputError, match="chunk_size must be"):
        encoder.encode(texts, pool=pool, chunk_size=0)
    with pytest.raises(InputError, match="pool must be what start_multi_process_pool returned"):
        encoder.encode(texts, pool={"input": None})


def test_a_device_this_machine_lacks_is_refused_before_the_model_moves(minilm_dir, texts):
    """A call's device: "meta" threw the weights away (every later call failed), and one the machine lacks failed
    halfway through the move with torch's AssertionError or RuntimeError."""
    encoder, reranker = SentenceEncoder(minilm_dir), CrossEncoder(minilm_dir)
    expected = encoder.encode(texts[:3])
    weights = {name: tensor.clone() for name, tensor in encoder.state_dict().items()}
    missing = ["meta", "tpu"] + ([] if torch.cuda.is_available() else ["cuda", "cuda:1"])
    for device in missing:
        with pytest.raises(ConfigError, match=f"^device '{device}'"):
            encoder.encode(texts[:3], device=device)
        with pytest.raises(ConfigError, match=f"^device '{device}'"):
            reranker.predict([(texts[0], texts[1])], device=device)
    assert encoder.device.type == "cpu" and reranker.device.type == "cpu"
    for name, tensor in encoder.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    np.testing.assert_array_equal(encoder.encode(texts[:3]), expected)
    np.testing.assert_array_equal(encoder.encode(texts[:3], device="cpu"), expected)
