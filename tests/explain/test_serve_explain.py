"""/explain on `bertforge serve` (a real server on loopback): the same attributions as `bertforge explain`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import torch

pytest.importorskip("fastapi", reason="the server needs FastAPI: pip install 'bertforge[serve]'")
uvicorn = pytest.importorskip("uvicorn", reason="the server needs uvicorn: pip install 'bertforge[serve]'")

from bertforge.inference.serve import ServeSettings  # noqa: E402
from bertforge.inference.serve.app import load_app  # noqa: E402

REVIEW = "A  gripping,   beautifully acted film — but the ending? Dull."


@pytest.fixture(scope="module")
def server_url(sst2_classifier_dir):
    app = load_app(sst2_classifier_dir, ServeSettings())  # as `bertforge serve` builds it
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def fetch(url: str, body: dict | None = None) -> tuple[int, str, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.headers.get("content-type", ""), response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("content-type", ""), error.read().decode("utf-8")


def test_explain_over_http_equals_the_command_line(server_url, sst2_classifier_dir, tmp_path):
    status, kind, body = fetch(server_url + "/explain", {"text": REVIEW, "target": "positive"})
    assert status == 200 and kind.startswith("application/json")
    served = json.loads(body)
    output = tmp_path / "why.json"
    result = subprocess.run([sys.executable, "-m", "bertforge", "explain", "--model", str(sst2_classifier_dir),
                             "--text", REVIEW, "--target", "positive", "--output", str(output)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    written = json.loads(output.read_text(encoding="utf-8"))
    assert served["target"] == written["target"] == "positive" and served["texts"] == [REVIEW]
    assert [(w["word"], w["start"], w["end"]) for w in served["words"]] == [
        (w["word"], w["start"], w["end"]) for w in written["words"]]
    for ours, theirs in zip(served["tokens"], written["tokens"]):
        assert ours["token"] == theirs["token"] and ours["attribution"] == pytest.approx(theirs["attribution"],
                                                                                        abs=1e-6)
    # The gap is float32 rounding (a few 1e-6 on this sum), whose last digits follow the summation order of the
    # process's kernels and threads: both small, and alike to that rounding.
    assert served["completeness_gap"] == pytest.approx(written["completeness_gap"], abs=1e-5)
    assert max(abs(served["completeness_gap"]), abs(written["completeness_gap"])) < 1e-4


def test_explain_page_and_errors_over_http(server_url):
    query = urllib.parse.urlencode({"text": REVIEW, "method": "attention_rollout"})
    status, kind, page = fetch(f"{server_url}/explain?{query}")
    assert status == 200 and kind.startswith("text/html")
    assert 'id="explanation"' in page and 'id="model-grid"' in page and "attention-data" in page
    status, kind, body = fetch(server_url + "/explain", {"text": REVIEW, "target": "neutral"})
    assert status == 422 and "choose from: negative, positive" in json.loads(body)["error"]
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW, "method": "anchors"})
    assert status == 422
    # Bounded work: the worker every route shares takes one explanation at a time.
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW * 40, "steps": 1000})
    assert status == 413 and "steps x tokens is 1000 x" in json.loads(body)["error"]
    # Occlusion runs the model once per token: within a default integrated gradients' work, whose steps also run
    # backward (a third of the cost each).
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW * 40, "method": "occlusion"})
    assert status == 413 and "occlusion runs the model once per token: 512 x 512" in json.loads(body)["error"]
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW * 10, "method": "occlusion", "baseline": "mask"})
    assert status == 200 and json.loads(body)["method"] == "occlusion" and json.loads(body)["baseline"] == "mask"
    # Shapley values run the model once per sampled order and token: the same bound, fewer orders fit.
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW * 3, "method": "shapley"})
    assert status == 413 and "shapley runs the model" in json.loads(body)["error"]
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW * 3, "method": "shapley", "steps": 8})
    answer = json.loads(body)
    assert status == 200 and answer["method"] == "shapley" and abs(answer["completeness_gap"]) < 1e-4
    # LIME runs the model once per sample, SmoothGrad forward and backward once per noisy copy: the same bounds.
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW * 10, "method": "lime", "steps": 1000})
    assert status == 413 and "lime runs the model 1000 times" in json.loads(body)["error"]
    assert "fewer steps (samples)" in json.loads(body)["error"]
    status, _, body = fetch(server_url + "/explain", {"text": REVIEW * 40, "method": "smoothgrad", "steps": 51})
    assert status == 413 and "steps x tokens is 51 x 512" in json.loads(body)["error"]
    for method in ("lime", "smoothgrad"):
        status, _, body = fetch(server_url + "/explain", {"text": REVIEW, "method": method, "steps": 20})
        answer = json.loads(body)
        assert status == 200 and answer["method"] == method and answer["steps"] == 20, body


def test_an_encoders_explanation_counts_a_path_per_text():
    """An encoder explains each of its two texts against the other: the work bound counts both integrations."""
    from fastapi.testclient import TestClient

    client = TestClient(load_app("default", ServeSettings()))
    pair = {"text": "A man is playing an old acoustic guitar on the stage of a small club, late at night.",
            "text_pair": "Someone plays music for a crowd in a bar."}
    tokens = len(client.post("/tokenize", json={"text": pair["text"], "text_pair": pair["text_pair"]}).json()["ids"])
    steps = 50 * 512 // tokens  # one path of these fits the bound (50 steps x max_length 512); two don't
    assert steps <= 1000  # steps' own limit
    answer = client.post("/explain", json=pair | {"steps": steps})
    assert answer.status_code == 413 and f"{steps} x {tokens} x 2 (each text against the other)" in \
        answer.json()["error"]
    answer = client.post("/explain", json=pair | {"steps": 8})
    assert answer.status_code == 200 and len(answer.json()["inner"]["baseline_scores"]) == 2


def test_an_encoders_explanation_over_http_is_its_similarity(minilm_dir, sst2_dev):
    """/explain reads an encoder's texts as /similarity does (the layout's 256 tokens, where the server allows 512):
    the same score, and a long text within the default budget."""
    from fastapi.testclient import TestClient

    long_text = " ".join(text for text, _ in sst2_dev[:40])
    with TestClient(load_app(minilm_dir, ServeSettings())) as client:
        explained = client.post("/explain", json={"text": long_text, "text_pair": "a great movie", "steps": 4})
        similar = client.post("/similarity", json={"inputs": {"source_sentence": long_text,
                                                              "sentences": ["a great movie"]}})
        assert explained.status_code == 200 and similar.status_code == 200, (explained.text, similar.text)
        assert explained.json()["score"] == pytest.approx(similar.json()[0], abs=1e-5)
        assert client.post("/explain", json={"text": long_text, "text_pair": "a great movie"}).status_code == 200


def test_a_windowed_classifiers_explanation_counts_every_window(tokenizer, tiny_config, sst2_dev, tmp_path):
    """A classifier fine-tuned on windows is explained over all of them: occlusion's work grows with the square of
    the text, so the bound counts the whole text (about twice: the windows overlap by half), not one window."""
    from fastapi.testclient import TestClient

    from bertforge import BertConfig, BertForSequenceClassification
    from bertforge.config import FINETUNE_KEY

    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size, "max_position_embeddings": 512,
                           "id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}})
    torch.manual_seed(0)
    classifier = BertForSequenceClassification(config)
    classifier.config.extra |= {"finetuning_task": "classification",
                                FINETUNE_KEY: {"max_length": 16, "long_text": "windows"}}
    classifier.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    text = " ".join(text for text, _ in sst2_dev[:20])
    tokens = len(tokenizer(text, truncation=False)["input_ids"])
    with TestClient(load_app(tmp_path, ServeSettings())) as client:
        answer = client.post("/explain", json={"text": text, "method": "occlusion"})
        assert answer.status_code == 413, answer.text
        assert f"{2 * tokens} x {2 * tokens} tokens" in answer.json()["error"]
        short = client.post("/explain", json={"text": sst2_dev[0][0], "method": "occlusion"})
        assert short.status_code == 200 and short.json()["method"] == "occlusion"


def test_the_explanation_pages_attention_views_keep_the_servers_attention_bound(minilm_dir, sst2_dev):
    """GET /explain's attention views read at most --attention-max-length tokens, as /attention does (the page grows
    with their square); the attributions still cover the text as /explain reads it."""
    import re

    from fastapi.testclient import TestClient

    long_text = " ".join(text for text, _ in sst2_dev[:10])
    query = {"text": long_text, "pair": "a great movie", "method": "saliency"}
    with TestClient(load_app(minilm_dir, ServeSettings(attention_max_length=40))) as client:
        page = client.get("/explain", params=query)
        read = len(client.post("/tokenize", json={"text": long_text}).json()["ids"])
        words = client.post("/explain", json={"text": long_text, "text_pair": "a great movie",
                                              "method": "saliency"}).json()["words"]
    assert page.status_code == 200 and read > 40
    data = json.loads(re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page.text,
                                re.S).group(1))
    assert len(data["tokens"]) == 40  # an encoder's page shows the attention of its first text
    assert f"cut to 40 of its {read} tokens" in page.text
    assert page.text.count('class="word"') == len(words) > 150  # every word of both texts shaded
