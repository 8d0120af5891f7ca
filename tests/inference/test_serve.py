"""The HTTP server over real sockets on 127.0.0.1: every endpoint, the limits, and micro-batching."""

from __future__ import annotations

import base64
import csv
import json
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

pytest.importorskip("fastapi", reason="the server needs FastAPI: pip install 'bertforge[serve]'")
uvicorn = pytest.importorskip("uvicorn", reason="the server needs uvicorn: pip install 'bertforge[serve]'")

from bertforge import (  # noqa: E402
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertTokenizer,
    MultiVectorEncoder,
)
from bertforge.errors import BertforgeError, ConfigError  # noqa: E402
from bertforge.inference import extract_features  # noqa: E402
from bertforge.inference.attention_view import compute_attention, render_attention_map  # noqa: E402
from bertforge.inference.serve import Job, ServeSettings  # noqa: E402
from bertforge.inference.serve.app import create_app, load_app, server_config  # noqa: E402
from bertforge.tasks.checkpoint_contents import RUN_CONFIG_FILE, inspect_checkpoint  # noqa: E402
from bertforge.tasks.finetune import FinetuneConfig  # noqa: E402
from bertforge.tasks.finetuned_model import predict as predict_offline  # noqa: E402
from bertforge.tasks.multi_label import MultiLabelSettings  # noqa: E402
from bertforge.tasks.question_answering import QAExample, QASettings, span_features  # noqa: E402
from bertforge.tasks.registry import get_task  # noqa: E402

LABELS = {0: "negative", 1: "positive"}
TEXTS = ["A gorgeous, witty, seductive movie.", "Boring.", "The story is too predictable and the acting flat, "
         "though the score is lovely."]
TRACEBACK_MARKERS = ("Traceback", 'File "', "line ", "Error:")


def make_config(tokenizer: BertTokenizer, **overrides) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=64, **overrides)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("encoder")
    BertModel(make_config(tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("classifier")
    model = BertForSequenceClassification(make_config(tokenizer, id2label=LABELS))
    torch.nn.init.normal_(model.classifier.weight, std=1.0)  # confident, distinct probabilities per text
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class Server:
    """A uvicorn server in a thread on a free loopback port, with JSON helpers."""

    def __init__(self, model_dir, **settings):
        self.directory = model_dir
        self.app = load_app(model_dir, ServeSettings(**settings))  # as `bertforge serve` builds it
        served = self.app.state.served
        self.model, self.tokenizer, self.batcher = served.model, served.tokenizer, served.batcher
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        self.server = uvicorn.Server(server_config(self.app))  # as `bertforge serve` runs it
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [listener]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)

    def request(self, path: str, body: dict | bytes | None = None, method: str | None = None,
                headers: dict[str, str] | None = None):
        """(status, parsed JSON or text, headers); a dict body is sent as JSON."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        request = urllib.request.Request(self.url + path, data=data, method=method or ("POST" if data is not None
                                                                                        else "GET"),
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, raw, headers = error.code, error.read(), error.headers
        text = raw.decode("utf-8")
        is_json = headers.get("content-type", "").startswith("application/json")
        return status, json.loads(text) if is_json else text, headers


def running(directory, **settings):
    """A Server for the fixture that yields it, stopped when the fixture ends."""
    server = Server(directory, **settings)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def encoder_server(encoder_dir):
    yield from running(encoder_dir, max_texts=8)


@pytest.fixture(scope="module")
def colbert_server(encoder_dir, tmp_path_factory):
    """A ColBERT model over the tiny encoder, as MultiVectorEncoder makes and saves one (a new projection)."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("colbert")
    MultiVectorEncoder(encoder_dir).save(directory)
    yield from running(directory, max_texts=8)


@pytest.fixture(scope="module")
def classifier_server(classifier_dir):
    yield from running(classifier_dir)


@pytest.fixture
def make_server():
    servers = []

    def start(model_dir, **settings):
        servers.append(Server(model_dir, **settings))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


# text-embeddings-inference's error_type by status: an error of the model (its 424) or the server, being busy
TEI_KINDS = {409: "Backend", 429: "Overloaded", 500: "Backend", 503: "Overloaded"}


def assert_error(response, status: int, *fragments: str, kind: str | None = None):
    """One line naming the problem: OpenAI's {"error": {"message", ...}} on its routes, else TEI's {"error",
    "error_type"} (`kind`, else Validation or what TEI_KINDS says for the status)."""
    code, body, _ = response
    assert code == status, body
    if isinstance(body["error"], dict):
        assert set(body) == {"error"}, body
        message = body["error"]["message"]
    else:
        assert set(body) == {"error", "error_type"}, body
        assert body["error_type"] == (kind or TEI_KINDS.get(status, "Validation")), body
        message = body["error"]
    assert all(fragment in message for fragment in fragments), body
    assert not any(marker in message for marker in TRACEBACK_MARKERS), body


# ---------------------------------------------------------------- endpoints


def test_health_describes_the_model_and_limits(encoder_server):
    status, body, _ = encoder_server.request("/health")
    assert status == 200 and body["status"] == "ok"
    assert body["architecture"] == "BertModel" and body["task"] is None
    assert body["limits"]["max_texts"] == 8 and body["limits"]["max_length"] == 64  # the model's positions


@pytest.mark.parametrize("pooling", ["cls", "mean", "max", "lasttoken"])
@pytest.mark.parametrize("normalize", [False, True])
def test_embed_equals_extract_features(encoder_server, pooling, normalize):
    status, body, _ = encoder_server.request("/embed", {"texts": TEXTS, "pooling": pooling, "normalize": normalize})
    expected = extract_features(encoder_server.model, encoder_server.tokenizer, TEXTS, pooling=pooling,
                                normalize=normalize, max_length=64)
    assert status == 200 and body["dimension"] == 32 and body["pooling"] == pooling
    assert torch.allclose(torch.tensor(body["embeddings"]), expected, atol=1e-5)


def test_embed_truncates_long_texts_by_default(encoder_server):
    long_text = "word " * 200
    status, body, _ = encoder_server.request("/embed", {"texts": [long_text]})
    expected = extract_features(encoder_server.model, encoder_server.tokenizer, [long_text], max_length=64)
    assert status == 200 and torch.allclose(torch.tensor(body["embeddings"]), expected, atol=1e-5)


def test_tokenize_matches_the_tokenizer(encoder_server, tokenizer):
    status, body, _ = encoder_server.request("/tokenize", {"text": "Unaffable café!", "text_pair": "Yes."})
    expected = tokenizer("Unaffable café!", text_pair="Yes.", return_offsets_mapping=True)
    assert status == 200
    assert body["ids"] == expected["input_ids"] and body["token_type_ids"] == expected["token_type_ids"]
    assert body["tokens"] == tokenizer.convert_ids_to_tokens(expected["input_ids"])
    assert [tuple(span) for span in body["offsets"]] == expected["offset_mapping"]
    assert body["tokens"][4] == "cafe" and "Unaffable café!"[slice(*body["offsets"][4])] == "café"


def test_attention_page(encoder_server):
    status, page, headers = encoder_server.request("/attention?text=The%20cat%20sat.&pair=It%20slept.")
    assert status == 200 and headers["content-type"].startswith("text/html")
    data = json.loads(page.split('id="attention-data">')[1].split("</script>")[0])
    assert data["tokens"] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "it", "slept", ".", "[SEP]"]
    assert data["segment_b_start"] == 6
    assert (data["layers"], data["heads"], len(data["attention"][0][0])) == (2, 4, 10)  # [layer][head][token]
    # the neuron view's queries and keys too: the page `bertforge attention` writes for the same text
    model, tokenizer = BertModel.from_pretrained(encoder_server.directory), BertTokenizer.from_pretrained(
        encoder_server.directory)
    offline = render_attention_map(compute_attention(model, tokenizer, "The cat sat.", "It slept."))
    expected = json.loads(offline.split('id="attention-data">')[1].split("</script>")[0])
    assert {"queries", "keys"} <= set(data) and data == expected
    assert_error(encoder_server.request("/attention"), 422, "text")


def test_openapi_and_docs(encoder_server):
    status, schema, _ = encoder_server.request("/openapi.json")
    paths = {"/embed", "/predict", "/tokenize", "/attention", "/health", "/v1/embeddings", "/v1/models", "/rerank",
             "/v1/rerank", "/v2/rerank", "/metrics", "/", "/similarity", "/embed_all", "/decode", "/info"}
    assert status == 200 and paths <= set(schema["paths"])
    # Typed answers: every JSON route names its response model, and its errors' {"error"} shape.
    predict = schema["paths"]["/predict"]["post"]["responses"]
    answers = predict["200"]["content"]["application/json"]["schema"]["anyOf"]  # bertforge's, or TEI's lists
    assert {"$ref": "#/components/schemas/PredictResponse"} in answers
    assert predict["413"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    # The pages' errors are JSON too; OpenAI's routes publish OpenAI's error shape.
    page = schema["paths"]["/attention"]["get"]["responses"]
    assert set(page["200"]["content"]) == {"text/html"} and set(page["413"]["content"]) == {"application/json"}
    openai_errors = schema["paths"]["/v1/embeddings"]["post"]["responses"]["400"]["content"]["application/json"]
    assert openai_errors["schema"] == {"$ref": "#/components/schemas/OpenAIErrorResponse"}
    status, page, _ = encoder_server.request("/docs")
    # Rendered on the server: no script or stylesheet to fetch, so it works offline.
    assert status == 200 and "/v1/embeddings" in page and "EmbedRequest" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_predict_labels_with_probabilities(classifier_server, tokenizer):
    status, body, _ = classifier_server.request("/predict", {"texts": TEXTS})
    assert status == 200 and body["task"] == "classification"
    model = classifier_server.model
    for text, prediction in zip(TEXTS, body["predictions"]):
        with torch.inference_mode():
            probs = model(**tokenizer(text, return_tensors="pt")).logits.softmax(-1)[0]
        assert set(prediction["probabilities"]) == {"negative", "positive"}
        assert sum(prediction["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
        assert prediction["probabilities"]["positive"] == pytest.approx(float(probs[1]), abs=1e-5)
        assert prediction["label"] == LABELS[int(probs.argmax())] and prediction["text"] == text


def test_predict_pairs(classifier_server, tokenizer):
    status, body, _ = classifier_server.request("/predict", {"texts": ["A cat."], "text_pairs": ["A dog."]})
    with torch.inference_mode():
        encoding = tokenizer("A cat.", text_pair="A dog.", return_tensors="pt")
        probs = classifier_server.model(**encoding).logits.softmax(-1)
    assert status == 200
    assert body["predictions"][0]["probabilities"]["positive"] == pytest.approx(float(probs[0, 1]), abs=1e-5)
    assert_error(classifier_server.request("/predict", {"texts": ["a", "b"], "text_pairs": ["c"]}), 422,
                 "2 texts", "1 text_pairs")


def test_predict_multi_label_gives_the_labels_over_the_saved_threshold(make_server, tmp_path, tokenizer):
    torch.manual_seed(0)
    model = BertForSequenceClassification(make_config(tokenizer, id2label={0: "grain", 1: "trade", 2: "oil"},
                                                      problem_type="multi_label_classification")).eval()
    torch.nn.init.normal_(model.classifier.weight, std=1.0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    FinetuneConfig(task="multi_label", settings=MultiLabelSettings(max_length=64, threshold=0.4)).save(
        tmp_path / RUN_CONFIG_FILE)
    status, body, _ = make_server(tmp_path).request("/predict", {"texts": TEXTS})
    assert status == 200 and body["task"] == "multi_label"
    for text, prediction in zip(TEXTS, body["predictions"]):
        with torch.inference_mode():
            probs = model(**tokenizer(text, return_tensors="pt")).logits.sigmoid()[0].tolist()
        expected = {name: p for name, p in zip(["grain", "trade", "oil"], probs) if p > 0.4}
        assert prediction["labels"].keys() == expected.keys() and prediction["text"] == text
        assert prediction["probabilities"]["oil"] == pytest.approx(probs[2], abs=1e-5)
    assert body["predictions"] == [{**answer} for answer in predict_offline(tmp_path, texts=TEXTS)]


def test_predict_on_a_bare_encoder_is_the_wrong_task(encoder_server):
    assert_error(encoder_server.request("/predict", {"texts": ["hello"]}), 409, "wrong task", "no trained task head",
                 "/embed")


def test_the_head_comes_from_the_weights_and_architectures(tmp_path, tokenizer, encoder_dir, classifier_dir):
    assert inspect_checkpoint(encoder_dir).model_class is BertModel
    assert inspect_checkpoint(encoder_dir).task is None
    assert (inspect_checkpoint(classifier_dir).model_class, inspect_checkpoint(classifier_dir).task) == \
        (BertForSequenceClassification, "classification")
    BertForTokenClassification(make_config(tokenizer, id2label={0: "O", 1: "B-PER"})).save_pretrained(tmp_path)
    assert inspect_checkpoint(tmp_path).model_class is BertForTokenClassification
    config = json.loads((tmp_path / "config.json").read_text())
    # Without the name, a classifier with no pooler reads every token: a tagger.
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": []}))
    assert inspect_checkpoint(tmp_path).task == "ner"


# ---------------------------------------------------------------- limits and errors


def test_request_errors_are_one_json_line_without_traceback(encoder_server):
    assert_error(encoder_server.request("/embed", {"texts": ["x"] * 9}), 413, "too many texts", "8")
    assert_error(encoder_server.request("/embed", b'{"texts": ["unclosed'), 400, "not valid JSON")
    assert_error(encoder_server.request("/embed", b""), 400, "empty request body")
    assert_error(encoder_server.request("/embed", {"texts": []}), 400, "texts", kind="Empty")  # TEI's answer
    for content_type in ("application/x-www-form-urlencoded", "text/plain"):  # curl -d's, and a text's: TEI's 415
        assert_error(encoder_server.request("/embed", b'{"inputs": "hi"}', headers={"Content-Type": content_type}),
                     415, "Content-Type: application/json")
    assert encoder_server.request("/embed", b'{"inputs": "hi"}', headers={
        "Content-Type": "application/json; charset=utf-8"})[0] == 200
    # where a field takes a text or a list (inputs), or a route two request forms (/rerank's and Cohere's), too
    assert_error(encoder_server.request("/embed", {"inputs": []}), 400, "inputs", kind="Empty")
    assert_error(encoder_server.request("/rerank", {"query": "q", "texts": []}), 400, "texts", kind="Empty")
    assert_error(encoder_server.request("/rerank", {"query": 5, "texts": []}), 422, "query")  # and another fault
    assert_error(encoder_server.request("/embed", {"texts": "one string"}), 422, "texts")
    assert_error(encoder_server.request("/embed", {"texts": [1, 2]}), 422, "texts.0")
    assert_error(encoder_server.request("/embed", {"texts": ["a"], "pooling": "median"}), 422, "pooling")
    assert_error(encoder_server.request("/embed", {"text": ["a"]}), 422, "text")
    assert_error(encoder_server.request("/embed", b"[1, 2]"), 422, "invalid request")
    assert_error(encoder_server.request("/tokenize", {"text": None}), 422, "text")
    assert_error(encoder_server.request("/attention?text=%20%20"), 422, "text is empty")
    # Half of a UTF-16 pair, which JSON's escapes can spell and Python's JSON reader lets through: no text.
    assert_error(encoder_server.request("/embed", b'{"texts": ["ok", "a\\ud800b"]}'), 422, "texts.1",
                 "unpaired surrogate (U+D800)")
    assert encoder_server.request("/embed", {"texts": ["caf\u00e9 \U0001F600"]})[0] == 200  # a pair is fine
    # A field of several forms says which it takes (not pydantic's tags of each form); a value of the right form
    # that fails its constraints says why; a body that may be several requests, the closest one's problem.
    status, answer, _ = encoder_server.request("/embed", {"inputs": [1, "a"]})
    assert (status, answer) == (422, {"error": "invalid request: inputs: expected a text, a list of texts, a list "
                                               "of integers or a list of lists of integers",
                                      "error_type": "Validation"})
    assert_error(encoder_server.request("/embed", {"inputs": [[]]}), 422, "inputs.0: List should have at least 1")
    status, answer, _ = encoder_server.request("/v2/rerank", {"query": "q", "documents": [3]})
    assert status == 400 and answer["error"]["message"] == "invalid request: documents.0: expected a text or an object"
    status, answer, _ = encoder_server.request("/rerank", {"query": "q", "texts": "one"})
    assert (status, answer) == (422, {"error": "invalid request: texts: Input should be a valid list",
                                      "error_type": "Validation"})
    # The framework's own errors have the same shape.
    assert_error(encoder_server.request("/embed", method="GET"), 405, "Method Not Allowed")
    # Allow names every method the path answers, across the routes that serve it
    assert encoder_server.request("/embed", method="GET")[2]["Allow"] == "POST"
    assert encoder_server.request("/health", method="POST")[2]["Allow"] == "GET, HEAD"
    assert_error(encoder_server.request("/nowhere"), 404, "Not Found")


def test_health_answers_a_head_probe(encoder_server):
    assert encoder_server.request("/health", method="HEAD")[0] == 200


def test_rerank_takes_as_many_texts_as_embed(encoder_server):
    status, ranked, _ = encoder_server.request("/rerank", {"query": "q", "texts": ["x"] * 8})  # max_texts: 8
    assert status == 200 and len(ranked) == 8  # the query is not one of the texts
    assert_error(encoder_server.request("/rerank", {"query": "q", "texts": ["x"] * 9}), 413, "too many texts: 9")


def test_long_texts_refused_when_configured(make_server, encoder_dir):
    server = make_server(encoder_dir, max_length=16, long_text="refuse")
    assert server.request("/embed", {"texts": ["short text"]})[0] == 200
    assert_error(server.request("/embed", {"texts": ["short", "word " * 20]}), 413, "text 1", "22 tokens",
                 "limit is 16")
    assert_error(server.request("/tokenize", {"text": "word " * 20}), 413, "limit is 16")
    assert_error(server.request("/attention?text=" + "word%20" * 20), 413, "limit is 16")


def with_sentence_transformers_length(encoder_dir, directory, max_seq_length: int):
    """A copy of the encoder with a sentence-transformers layout that reads max_seq_length tokens."""
    shutil.copytree(encoder_dir, directory)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return directory


def test_embeddings_refuse_or_cut_at_the_checkpoints_own_length(make_server, encoder_dir, tmp_path):
    """The model's sentence-transformers max_seq_length (16) is below the server's limit (64): a refusing server
    refuses there rather than cutting silently; a request's `truncate` overrides the server's policy."""
    directory = with_sentence_transformers_length(encoder_dir, tmp_path / "st", 16)
    long_text = "word " * 20  # 22 tokens
    refusing = make_server(directory, long_text="refuse")
    assert_error(refusing.request("/embed", {"inputs": long_text}), 413, "22 tokens", "limit is 16")
    assert refusing.request("/info")[1]["max_input_length"] == 16  # what TEI's clients size their texts by
    assert_error(refusing.request("/v1/embeddings", {"input": long_text}), 413, "limit is 16")
    assert_error(refusing.request("/rerank", {"query": "q", "texts": [long_text]}), 413, "limit is 16")
    status, cut, _ = refusing.request("/embed", {"inputs": long_text, "truncate": True, "normalize": False})
    expected = extract_features(refusing.model, refusing.tokenizer, [long_text], max_length=16)
    assert status == 200 and torch.allclose(torch.tensor(cut), expected, atol=1e-5)
    truncating = make_server(directory)
    status, body, _ = truncating.request("/v1/embeddings", {"input": long_text})
    assert status == 200 and body["usage"]["prompt_tokens"] == 16
    assert_error(truncating.request("/embed", {"inputs": long_text, "truncate": False}), 413,
                 "limit is 16", "asked not to truncate")
    assert_error(truncating.request("/embed", {"inputs": long_text, "truncate": 0}), 422, "truncate")


def test_unexpected_errors_are_500_with_a_generic_message(make_server, encoder_dir, caplog):
    server = make_server(encoder_dir)

    class Broken(torch.nn.Module):
        config = server.model.config

        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # where the inputs go

        def forward(self, *args, **kwargs):
            raise RuntimeError("secret internal detail")

    server.batcher.model = Broken()
    with caplog.at_level("ERROR", logger="bertforge"):
        response = server.request("/embed", {"texts": ["hello"]})
    assert_error(response, 500, "internal server error")
    assert "secret" not in json.dumps(response[1])
    assert "secret internal detail" in caplog.text  # logged on the server's side


def test_running_out_of_memory_is_503_with_what_to_do(make_server, encoder_dir, caplog):
    """A real failed allocation (40 TB, as too large a batch would ask): torch's RuntimeError was a 500 and a
    traceback in the log. The batch that failed is this moment's: a retry, or fewer or shorter texts, may fit."""
    server = make_server(encoder_dir)

    class Huge(torch.nn.Module):
        config = server.model.config

        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward(self, *args, **kwargs):
            return torch.empty(10**13)

    working, server.batcher.model = server.batcher.model, Huge()
    with caplog.at_level("WARNING", logger="bertforge"):
        for path, body in (("/embed", {"inputs": ["hello"]}), ("/v1/embeddings", {"input": "hello"})):
            response = server.request(path, body)
            assert_error(response, 503, "ran out of memory", "fewer or shorter texts")
            assert response[2]["Retry-After"] == "1"
    assert "Traceback" not in caplog.text and "POST /embed: out of memory" in caplog.text
    server.batcher.model = working
    assert server.request("/embed", {"inputs": ["hello"]})[0] == 200


def block_worker(batcher) -> threading.Event:
    """Occupy the worker with a job that waits for the returned event; it holds no queue slot once taken."""
    release = threading.Event()
    batcher.submit([Job(lambda model, jobs: [release.wait(30) for _ in jobs], {"input_ids": [0]})])
    deadline = time.monotonic() + 10
    while batcher.pending:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return release


def wait_until_queued(batcher, count: int):
    deadline = time.monotonic() + 10
    while batcher.pending < count:
        assert time.monotonic() < deadline, f"only {batcher.pending} of {count} texts got queued"
        time.sleep(0.01)


def in_threads(calls):
    """Start each call in its own thread; the returned function joins them and gives their results."""
    results = [None] * len(calls)

    def call(index, function):
        results[index] = function()

    threads = [threading.Thread(target=call, args=(i, function)) for i, function in enumerate(calls)]
    for thread in threads:
        thread.start()

    def join():
        for thread in threads:
            thread.join(30)
        return results

    return join


def test_full_queue_answers_429_as_text_embeddings_inference_does(make_server, encoder_dir):
    """A request that finds the queue full gets 429 with Retry-After ("Overloaded"), TEI's answer, on which its
    clients and the openai client retry."""
    server = make_server(encoder_dir, max_queue=2, max_texts=2)
    release = block_worker(server.batcher)
    try:
        join = in_threads([lambda: server.request("/embed", {"texts": ["one", "two"]})])
        wait_until_queued(server.batcher, 2)
        response = server.request("/embed", {"texts": ["three"]})
        assert_error(response, 429, "busy")
        assert response[2]["retry-after"] == "1"
    finally:
        release.set()
    assert join()[0][0] == 200
    assert server.request("/embed", {"texts": ["three"]})[0] == 200  # room again


def test_requests_over_max_concurrent_requests_answer_429_as_text_embeddings_inference_does(make_server,
                                                                                             encoder_dir):
    """TEI's --max-concurrent-requests: with that many requests in flight on the routes that run the model, the next
    gets 429 ("Overloaded", OpenAI's rate_limit_error on its routes), counted in the metrics; the status, docs and
    tokenizer routes still answer, and once the requests are answered there is room again."""
    server = make_server(encoder_dir, max_concurrent_requests=2, max_queue=8)
    release = block_worker(server.batcher)
    try:
        join = in_threads([lambda text=text: server.request("/embed", {"texts": [text]}) for text in TEXTS[:2]])
        wait_until_queued(server.batcher, 2)  # both admitted, and held in flight by the busy worker
        response = server.request("/embed", {"texts": ["three"]})
        assert_error(response, 429, "busy", "2 requests at once", "--max-concurrent-requests")
        assert response[2]["retry-after"] == "1"
        status, body, _ = server.request("/v1/embeddings", {"input": "three"})
        assert status == 429 and body["error"]["type"] == "rate_limit_error", body
        assert server.request("/attention?text=three")[0] == 429  # a page that runs the model counts too
        for path in ("/health", "/metrics", "/info", "/docs", "/openapi.json"):
            assert server.request(path)[0] == 200, path
        assert server.request("/tokenize", {"inputs": "three"})[0] == 200
    finally:
        release.set()
    assert [status for status, _, _ in join()] == [200, 200]
    assert server.request("/embed", {"texts": ["three"]})[0] == 200  # room again
    metrics = server.request("/metrics")[1]
    assert 'bertforge_requests_total{route="/embed",status="429"} 1.0' in metrics
    assert 'bertforge_requests_total{route="/v1/embeddings",status="429"} 1.0' in metrics
    assert server.request("/info")[1]["max_concurrent_requests"] == 2  # TEI's /info says it
    assert server.request("/health")[1]["limits"]["max_concurrent_requests"] == 2


def test_concurrent_requests_share_a_forward_pass(make_server, encoder_dir):
    server = make_server(encoder_dir, max_batch_size=8, max_wait_ms=50)
    release = block_worker(server.batcher)
    try:
        join = in_threads([lambda text=text: server.request("/embed", {"texts": [text]}) for text in TEXTS]
                          + [lambda: server.request("/embed", {"texts": TEXTS[:2], "pooling": "cls"})])
        wait_until_queued(server.batcher, len(TEXTS) + 2)
    finally:
        release.set()
    results = join()
    health = server.request("/health")[1]
    assert health["largest_batch"] == len(TEXTS) + 2 and health["texts"] == 1 + len(TEXTS) + 2
    # Batched with others, each request still gets what extract_features gives for its texts alone.
    mean = extract_features(server.model, server.tokenizer, TEXTS, max_length=64)
    cls = extract_features(server.model, server.tokenizer, TEXTS[:2], pooling="cls", max_length=64)
    for text_index, (status, body, _) in enumerate(results[:-1]):
        assert status == 200 and torch.allclose(torch.tensor(body["embeddings"][0]), mean[text_index], atol=1e-5)
    assert torch.allclose(torch.tensor(results[-1][1]["embeddings"]), cls, atol=1e-5)


def test_settings_are_validated():
    with pytest.raises(BertforgeError, match="unknown long_text 'ignore'; choose from truncate, refuse"):
        ServeSettings(long_text="ignore")
    with pytest.raises(BertforgeError, match=r"unknown pooling \['mean'\]; choose from cls, mean, max, .*, splade"):
        ServeSettings(pooling=["mean"])
    assert ServeSettings(pooling="last-token").pooling == "lasttoken"  # text-embeddings-inference's spelling
    with pytest.raises(BertforgeError, match="max_queue"):
        ServeSettings(max_queue=0)
    with pytest.raises(BertforgeError, match="max_concurrent_requests must be at least 1, got 0"):
        ServeSettings(max_concurrent_requests=0)
    assert ServeSettings().max_concurrent_requests == 512  # text-embeddings-inference's default
    with pytest.raises(BertforgeError, match="read_timeout"):
        ServeSettings(read_timeout=float("nan"))
    with pytest.raises(BertforgeError, match="max_wait_ms must be at most 60000"):
        ServeSettings(max_wait_ms=1e308)  # the worker's timed wait overflowed at the first request
    with pytest.raises(BertforgeError, match="max_wait_ms must be at least 0"):
        ServeSettings(max_wait_ms=-1)
    with pytest.raises(BertforgeError, match="max_batch_size must be an integer, got True"):
        ServeSettings(max_batch_size=True)
    with pytest.raises(BertforgeError, match="idle_timeout must be above 0"):
        ServeSettings(idle_timeout=0)
    assert ServeSettings(max_wait_ms=0).max_wait_ms == 0
    with pytest.raises(BertforgeError, match="the API key is empty or not text"):
        ServeSettings(api_key=1234)  # was an AttributeError
    with pytest.raises(BertforgeError, match="cors_allow_origins must be a list of origins, got 'https://a.example'"):
        ServeSettings(cors_allow_origins="https://a.example")  # was read letter by letter
    assert ServeSettings(cors_allow_origins=["https://a.example"]).cors_allow_origins == ("https://a.example",)


TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


@pytest.fixture(scope="module")
def tagger_server(tmp_path_factory, tokenizer):
    """A tagger whose bias makes every word I-PER, so the expected entities follow from the text alone."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tagger")
    model = BertForTokenClassification(make_config(tokenizer, id2label=TAGS))
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0]))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    yield from running(directory)


def test_predict_entities_with_character_spans(tagger_server):
    text = "  Jean-Luc Picard visited Zürich!"
    status, body, _ = tagger_server.request("/predict", {"texts": [text, "Hi"]})
    assert status == 200 and body["task"] == "ner"
    first = body["predictions"][0]
    # words, as CoNLL-2003 splits them: Jean-Luc, Picard, visited, Zürich, !  -> all I-PER -> one PER chunk
    assert first["tags"] == ["I-PER"] * 5 and first["text"] == text
    [entity] = first["entities"]
    assert (entity["type"], entity["start"], entity["end"]) == ("PER", 2, len(text))
    assert entity["text"] == text[2:] and 0.5 < entity["score"] <= 1.0
    assert body["predictions"][1]["entities"][0]["text"] == "Hi"
    # What the task's own code refuses is answered like what the request checks refuse: 422, one line.
    assert_error(tagger_server.request("/predict", {"texts": ["Hi"], "text_pairs": ["there"]}), 422, "pair")


# ---------------------------------------------------------------- question answering

# The fine-tuning settings saved with the QA model: windows of 48 tokens sharing 8, questions cut to 16 tokens.
QA_WINDOWS = {"max_length": 48, "doc_stride": 8, "max_query_length": 16}
RIVER = ("The river rises in the northern hills, where snow melts each spring and feeds a chain of small lakes. "
         "From the lakes it flows south through farmland for about two hundred kilometres, passing the market "
         "towns of Alder and Brook. A stone bridge built in 1742 crosses it at Alder; the bridge was widened in "
         "1911 and closed to lorries in 1987. Below Brook the valley narrows, and the river drops through a gorge "
         "that once powered eleven mills. Only one mill still turns today, grinding flour for a bakery that opened "
         "in 1856. The river reaches the sea at Port Hallow, a harbour town known for its lighthouse.")
QUESTIONS = [
    {"question": "When was the bridge at Alder built?", "context": RIVER},
    {"question": "Who moved to Zürich?", "context": "Zoë Ångström moved to Zürich in 2019 to study glaciers."},
    {"question": "Where is the lighthouse?", "context": RIVER},
]


def windows_of(tokenizer, questions) -> int:
    examples = [QAExample(str(i), item["question"], item["context"], []) for i, item in enumerate(questions)]
    return len(span_features(examples, tokenizer, QA_WINDOWS["max_length"], QA_WINDOWS["doc_stride"],
                             QA_WINDOWS["max_query_length"]))


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory, tokenizer):
    """A span model saved as `bertforge finetune --task qa` saves one, with the settings its windows follow."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("qa")
    model = BertForQuestionAnswering(make_config(tokenizer))
    # Span scores far apart, so that batching the windows differently can't reorder near-ties.
    torch.nn.init.normal_(model.qa_outputs.weight, std=1.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    FinetuneConfig.from_dict({"task": "qa", **QA_WINDOWS}).save(directory / RUN_CONFIG_FILE)
    return directory


@pytest.fixture(scope="module")
def qa_server(qa_dir):
    yield from running(qa_dir, max_texts=4)


@pytest.fixture(scope="module")
def offline_answers(qa_dir):
    """What `bertforge predict` answers for QUESTIONS: the same model and windows, without the server."""
    return predict_offline(qa_dir, texts=[item["question"] for item in QUESTIONS],
                           text_pairs=[item["context"] for item in QUESTIONS])


def assert_same_answer(served: dict, offline: dict):
    assert (served["answer"], served["start"], served["end"]) == (offline["answer"], offline["start"],
                                                                  offline["end"])
    assert served["score"] == pytest.approx(offline["score"], abs=1e-4)
    assert [(a["text"], a["start"], a["end"]) for a in served["n_best"]] == \
        [(a["text"], a["start"], a["end"]) for a in offline["n_best"]]
    assert [a["score"] for a in served["n_best"]] == pytest.approx([a["score"] for a in offline["n_best"]],
                                                                   abs=1e-4)


def test_qa_answers_are_spans_of_the_context(qa_server, tokenizer):
    before = qa_server.request("/health")[1]
    status, body, _ = qa_server.request("/predict", {"questions": QUESTIONS})
    after = qa_server.request("/health")[1]
    assert status == 200 and body["task"] == "qa" and after["task"] == "qa"
    assert after["texts"] - before["texts"] == windows_of(tokenizer, QUESTIONS) > len(QUESTIONS)
    for item, prediction in zip(QUESTIONS, body["predictions"]):
        context = item["context"]
        assert prediction["answer"] and context[prediction["start"]:prediction["end"]] == prediction["answer"]
        assert prediction["n_best"][0] == {"text": prediction["answer"], "start": prediction["start"],
                                           "end": prediction["end"], "score": prediction["score"]}
        scores = [answer["score"] for answer in prediction["n_best"]]
        assert scores == sorted(scores, reverse=True) and len(scores) <= 20
        assert all(context[a["start"]:a["end"]] == a["text"] for a in prediction["n_best"])
    # RIVER's first window holds its first 48 - 3 - (question tokens) tokens: answers come from the later ones too.
    question_tokens = len(tokenizer(QUESTIONS[0]["question"])["input_ids"]) - 2
    offsets = tokenizer(RIVER, return_offsets_mapping=True)["offset_mapping"][1:-1]
    first_window_end = offsets[QA_WINDOWS["max_length"] - 3 - question_tokens - 1][1]
    assert max(answer["start"] for answer in body["predictions"][0]["n_best"]) >= first_window_end


def test_qa_answers_equal_offline_prediction(qa_server, offline_answers):
    status, body, _ = qa_server.request("/predict", {"questions": QUESTIONS})
    assert status == 200
    for served, offline in zip(body["predictions"], offline_answers, strict=True):
        assert_same_answer(served, offline)


def test_concurrent_qa_requests_share_forward_passes(make_server, qa_dir, tokenizer, offline_answers):
    server = make_server(qa_dir, max_batch_size=64, max_wait_ms=50)
    release = block_worker(server.batcher)
    try:
        join = in_threads([lambda item=item: server.request("/predict", {"questions": [item]}) for item in QUESTIONS]
                          + [lambda: server.request("/predict", {"questions": QUESTIONS[::-1]}),
                             lambda: server.request("/embed", {"texts": ["Port Hallow"]})])
        windows = 2 * windows_of(tokenizer, QUESTIONS)
        wait_until_queued(server.batcher, windows + 1)
    finally:
        release.set()
    results = join()
    assert all(status == 200 for status, _, _ in results), results
    assert server.request("/health")[1]["largest_batch"] == windows + 1  # every window and the /embed text
    for (_, body, _), offline in zip(results, offline_answers):
        assert_same_answer(body["predictions"][0], offline)
    for served, offline in zip(results[len(QUESTIONS)][1]["predictions"], offline_answers[::-1]):
        assert_same_answer(served, offline)


def test_qa_request_errors(qa_server, classifier_server, encoder_server):
    question = {"question": "Who?", "context": "Maria wrote it."}
    assert_error(qa_server.request("/predict", {"texts": ["Who?"]}), 409, "wrong task", "does qa", '"questions"')
    assert_error(classifier_server.request("/predict", {"questions": [question]}), 409, "wrong task",
                 "does classification", '"texts"')
    assert_error(encoder_server.request("/predict", {"questions": [question]}), 409, "wrong task",
                 "no trained task head")
    assert_error(qa_server.request("/predict", {}), 422, "nothing to predict", '"questions"')
    assert_error(qa_server.request("/predict", {"questions": [question], "texts": ["Who?"]}), 422, "not both")
    assert_error(qa_server.request("/predict", {"questions": [question], "text_pairs": ["x"]}), 422, "not both")
    assert_error(qa_server.request("/predict", {"questions": []}), 400, "questions", kind="Empty")
    assert_error(qa_server.request("/predict", {"questions": [{"question": "Who?"}]}), 422, "questions.0.context",
                 "required")
    assert_error(qa_server.request("/predict", {"questions": ["Who?"]}), 422, "questions.0")
    assert_error(qa_server.request("/predict", {"questions": [{**question, "id": 7}]}), 422, "questions.0.id")
    status, answered, _ = qa_server.request("/predict", {"questions": [{**question, "id": "q-7"}, question]})
    assert status == 200 and [answer["id"] for answer in answered["predictions"]] == ["q-7", "2"]
    assert_error(qa_server.request("/predict", {"questions": [{**question, "question": " "}]}), 422,
                 "questions.0.question is empty")
    assert_error(qa_server.request("/predict", {"questions": [question, {**question, "context": ""}]}), 422,
                 "questions.1.context is empty")
    assert_error(qa_server.request("/predict", {"questions": [question] * 5}), 413, "too many questions", "4")


def test_qa_long_contexts_refused_when_configured(make_server, qa_dir):
    server = make_server(qa_dir, long_text="refuse")
    short = QUESTIONS[1]
    assert server.request("/predict", {"questions": [short]})[0] == 200
    assert_error(server.request("/predict", {"questions": [short, QUESTIONS[0]]}), 413, "1 of the inputs",
                 "longer than the model's max_length", "limit is 48", "refuses")


def test_qa_windows_must_fit_the_queue(make_server, qa_dir, tokenizer):
    server = make_server(qa_dir, max_queue=4, max_texts=2)
    windows = windows_of(tokenizer, QUESTIONS[:1])
    assert windows > 4
    assert_error(server.request("/predict", {"questions": QUESTIONS[:1]}), 413, f"{windows} model inputs",
                 "limit is 4")
    assert server.request("/predict", {"questions": QUESTIONS[1:2]})[0] == 200


def test_qa_windows_that_leave_no_room_stop_the_server_starting(tokenizer, tmp_path):
    model = BertForQuestionAnswering(make_config(tokenizer)).eval()
    # Without a run config the qa defaults (384 tokens, doc_stride 128, questions up to 64) shrink to the model's
    # 64 positions, keeping their shares; a run config's own settings are taken as they are.
    create_app(model, tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    FinetuneConfig(task="qa", settings=QASettings(max_length=64, max_query_length=64, doc_stride=128)).save(
        tmp_path / RUN_CONFIG_FILE)
    with pytest.raises(ConfigError, match="max_length=64"):
        load_app(tmp_path)


# ---------------------------------------------------------------- one answer everywhere: server, Python API, CLI

# Natural sentences: hyphens, initialisms, numbers with points, several spaces, punctuation glued to words.
SENTENCES = [
    "John Smith, of Acme Corp., visited Paris.",
    "Jean-Luc Picard  met the U.S. delegation in São Paulo on 25.10.2024 -- twice!",
    "Shares of Hewlett-Packard rose 25.76 % to $ 3.14 (the best day since 1987).",
    "The well-known author (née Brontë) lived at 221B Baker St., London, until 1890; later, she moved.",
    "AL-AIN , United Arab Emirates 1996-12-06",
]
REVIEWS = ["A gorgeous, witty, seductive movie.",
           "The story is too predictable and the acting flat, though the score is lovely; " * 6]  # > 16 tokens
# Each kind of fine-tuned model: its head, labels, and the run settings saved beside it (short max_length, so that
# the texts above are longer than what the model was trained on).
TASK_MODELS = {
    "classification": (BertForSequenceClassification, LABELS, {"max_length": 16, "long_text": "windows"}),
    "classification-pairs": (BertForSequenceClassification, LABELS,
                             {"max_length": 16, "long_text": "windows", "text_pair_column": "sentence2"}),
    "regression": (BertForSequenceClassification, {0: "LABEL_0"}, {"max_length": 16}),
    "ner": (BertForTokenClassification, TAGS, {"max_length": 12}),
    "ner-viterbi": (BertForTokenClassification, TAGS, {"max_length": 12, "decoding": "viterbi"}),
}


@pytest.fixture(scope="module")
def task_model_dirs(tmp_path_factory, tokenizer, qa_dir):
    """A model directory per task as `bertforge finetune` leaves one: weights, tokenizer, finetune_config.json."""
    directories = {"qa": qa_dir}
    for name, (model_class, labels, run) in TASK_MODELS.items():
        torch.manual_seed(1)
        directory = tmp_path_factory.mktemp(name)
        task = name.split("-")[0]
        # config.json's problem_type as finetune writes it (a regression model's score is its own, not a sigmoid's)
        model = model_class(make_config(tokenizer, id2label=labels, problem_type=get_task(task).problem_type))
        torch.nn.init.normal_(model.classifier.weight, std=2.0)  # distinct, confident answers
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        FinetuneConfig.from_dict({"task": task, **run}).save(directory / RUN_CONFIG_FILE)
        directories[name] = directory
    return directories


def task_inputs(name: str, tmp_path) -> tuple[dict, dict, list[str]]:
    """(the /predict body, predict()'s keyword arguments, `bertforge predict` arguments) for the same inputs."""
    if name == "qa":
        path = tmp_path / "questions.jsonl"
        path.write_text("".join(json.dumps({"id": str(number), **item}) + "\n"
                                for number, item in enumerate(QUESTIONS, 1)))
        return ({"questions": QUESTIONS}, {"texts": [q["question"] for q in QUESTIONS],
                                           "text_pairs": [q["context"] for q in QUESTIONS]}, ["--input", str(path)])
    if name == "classification-pairs":  # long texts on either side of a pair: windows of the longer one
        texts, pairs = [REVIEWS[0], REVIEWS[1], SENTENCES[0]], [REVIEWS[1], REVIEWS[0], SENTENCES[1]]
        path = tmp_path / "pairs.jsonl"
        path.write_text("".join(json.dumps({"sentence": text, "sentence2": pair}) + "\n"
                                for text, pair in zip(texts, pairs)))
        return ({"texts": texts, "text_pairs": pairs}, {"texts": texts, "text_pairs": pairs},
                ["--input", str(path)])
    texts = SENTENCES if name.startswith("ner") else REVIEWS + SENTENCES[:2]
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(texts) + "\n")
    return {"texts": texts}, {"texts": texts}, ["--input", str(path)]


def assert_same_answers(first: list[dict], second: list[dict]):
    """Equal labels, tags, texts and spans; scores and probabilities equal to float32 rounding."""
    def exact(value):
        if isinstance(value, dict):
            return {key: exact(item) for key, item in value.items() if not isinstance(item, float)}
        return [exact(item) for item in value] if isinstance(value, list) else value

    def numbers(value):
        if isinstance(value, dict):
            return [number for key in sorted(value) for number in numbers(value[key])]
        if isinstance(value, list):
            return [number for item in value for number in numbers(item)]
        return [value] if isinstance(value, float) else []

    assert exact(first) == exact(second)
    assert numbers(first) == pytest.approx(numbers(second), abs=1e-4)


@pytest.mark.parametrize("name", [*TASK_MODELS, "qa"])
def test_server_python_api_and_cli_give_one_answer(name, task_model_dirs, tmp_path, capsys):
    from bertforge.cli.main import main

    directory = task_model_dirs[name]
    body, arguments, cli_arguments = task_inputs(name, tmp_path)
    offline = predict_offline(directory, **arguments)
    output = tmp_path / "answers.jsonl"
    assert main(["predict", "--model", str(directory), *cli_arguments, "--output", str(output)]) == 0
    from_cli = [json.loads(line) for line in output.read_text().splitlines()]
    server = Server(directory)
    try:
        status, served, _ = server.request("/predict", body)
    finally:
        server.stop()
    assert status == 200, served
    if name == "qa":  # questions given directly are numbered by their place, as a file's here
        assert [answer["id"] for answer in served["predictions"]] == [str(n) for n in range(1, len(QUESTIONS) + 1)]
    assert_same_answers(served["predictions"], offline)
    assert_same_answers(from_cli, offline)
    for answer in served["predictions"]:  # every span indexes the text as given
        for entity in answer.get("entities", []):
            assert answer["text"][entity["start"]:entity["end"]] == entity["text"]


def test_ner_decoding_and_windows_follow_the_training_run(task_model_dirs, tmp_path):
    argmax = predict_offline(task_model_dirs["ner"], texts=SENTENCES)
    viterbi = predict_offline(task_model_dirs["ner-viterbi"], texts=SENTENCES)
    assert argmax != viterbi  # the same weights decode differently, as their runs say
    for answer in viterbi:
        tags = answer["tags"]
        assert all(tag[2:] == previous[2:] and previous != "O" for previous, tag in zip(["O", *tags], tags)
                   if tag.startswith("I-")), tags  # valid IOB2


# ---------------------------------------------------------------- the APIs clients already speak


def test_openai_client_gets_the_embeddings_of_bertforge_embed(encoder_server, encoder_dir, tmp_path):
    openai = pytest.importorskip("openai")
    import numpy

    from bertforge.cli.main import main

    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(TEXTS) + "\n")
    assert main(["embed", "--model", str(encoder_dir), "--input", str(lines), "--output", str(tmp_path / "v.npy"),
                 "--normalize"]) == 0
    expected = numpy.load(tmp_path / "v.npy")
    client = openai.OpenAI(base_url=encoder_server.url + "/v1", api_key="unused", max_retries=0)
    # The client asks for base64 by default and decodes it; floats are asked for explicitly.
    for encoding_format in (openai.NOT_GIVEN, "float"):
        response = client.embeddings.create(model="bertforge", input=TEXTS, encoding_format=encoding_format)
        assert [item.index for item in response.data] == [0, 1, 2]
        numpy.testing.assert_allclose(numpy.array([item.embedding for item in response.data]), expected, atol=1e-5)
        assert response.usage.prompt_tokens == sum(len(encoder_server.tokenizer(text)["input_ids"]) for text in TEXTS)
    one = client.embeddings.create(model="bertforge", input=TEXTS[0], dimensions=8, encoding_format="float")
    shortened = torch.nn.functional.normalize(torch.tensor(expected[0][:8]), dim=-1)
    assert torch.allclose(torch.tensor(one.data[0].embedding), shortened, atol=1e-5)
    assert [model.id for model in client.models.list()] == [str(encoder_dir)]
    assert client.models.retrieve(str(encoder_dir)).id == str(encoder_dir)
    with pytest.raises(openai.NotFoundError, match="The model 'gpt-4' does not exist"):
        client.models.retrieve("gpt-4")
    # Token ids (of the model's vocabulary, taken as they are): one list, or a list of lists.
    ids = [encoder_server.tokenizer(text)["input_ids"] for text in TEXTS]
    for given in (ids[0], ids):
        response = client.embeddings.create(model="bertforge", input=given, encoding_format="float")
        vectors = numpy.array([item.embedding for item in response.data])
        numpy.testing.assert_allclose(vectors, expected[:len(vectors)], atol=1e-5)
    # Errors in OpenAI's shape and statuses, which the client turns into its exceptions with the message.
    with pytest.raises(openai.BadRequestError, match="List should have at least 1 item"):
        client.embeddings.create(model="bertforge", input=[])
    with pytest.raises(openai.BadRequestError, match="token id 99999 is not in the model's vocabulary"):
        client.embeddings.create(model="bertforge", input=[[101, 99999, 102]])
    # another tokenizer's ids (tiktoken's, as LangChain's OpenAIEmbeddings sends them to check lengths) are refused,
    # rather than read as this vocabulary's
    with pytest.raises(openai.BadRequestError, match=r"input 1: token ids are read as the model's own, a whole input "
                                                     r"from \[CLS\] \(101\) to \[SEP\] \(102\).*"
                                                     r"check_embedding_ctx_length=False"):
        client.embeddings.create(model="bertforge", input=[ids[0], [1820, 8415, 7731, 389, 279, 5634]])
    # Infinity's client sends dimensions 0 for all of them
    status, answer, _ = encoder_server.request("/embeddings", {"input": TEXTS, "model": "m", "dimensions": 0,
                                                              "modality": "text"})
    numpy.testing.assert_allclose([item["embedding"] for item in answer["data"]], expected, atol=1e-5)
    with pytest.raises(openai.APIStatusError, match="too many inputs: 9") as raised:
        client.embeddings.create(model="bertforge", input=["x"] * 9)
    assert raised.value.status_code == 413 and raised.value.type == "invalid_request_error"
    # Given the server's bare URL (as Infinity serves OpenAI's routes), the client reaches the same routes.
    bare = openai.OpenAI(base_url=encoder_server.url, api_key="unused", max_retries=0)
    response = bare.embeddings.create(model="bertforge", input=TEXTS, encoding_format="float")
    numpy.testing.assert_allclose(numpy.array([item.embedding for item in response.data]), expected, atol=1e-5)
    assert [model.id for model in bare.models.list()] == [str(encoder_dir)]
    assert encoder_server.request("/models")[1]["data"][0]["capabilities"] == ["embed", "rerank"]
    with pytest.raises(openai.BadRequestError, match="List should have at least 1 item"):
        bare.embeddings.create(model="bertforge", input=[])


def test_tei_embed_and_rerank(encoder_server):
    status, vectors, _ = encoder_server.request("/embed", {"inputs": TEXTS[0], "normalize": False})
    expected = extract_features(encoder_server.model, encoder_server.tokenizer, TEXTS, max_length=64)
    assert status == 200 and torch.allclose(torch.tensor(vectors), expected[:1], atol=1e-5)
    status, vectors, _ = encoder_server.request("/embed", {"inputs": TEXTS})  # TEI's default: unit length
    normalized = torch.nn.functional.normalize(expected, dim=-1)
    assert status == 200 and torch.allclose(torch.tensor(vectors), normalized, atol=1e-5)
    status, ranked, _ = encoder_server.request("/rerank", {"query": TEXTS[0], "texts": TEXTS, "return_text": True})
    similarity = [float(normalized[0] @ vector) for vector in normalized]
    assert status == 200 and ranked[0] == {"index": 0, "score": pytest.approx(1.0, abs=1e-5), "text": TEXTS[0]}
    assert [item["index"] for item in ranked] == sorted(range(3), key=lambda i: -similarity[i])
    assert [item["score"] for item in ranked] == pytest.approx(sorted(similarity, reverse=True), abs=1e-5)
    # Elasticsearch's Hugging Face rerank service sends top_n (and parses index, score and text alone)
    status, best, _ = encoder_server.request("/rerank", {"texts": TEXTS, "query": TEXTS[0], "return_text": True,
                                                         "top_n": 2})
    assert status == 200 and best == ranked[:2]
    assert_error(encoder_server.request("/rerank", {"texts": TEXTS, "query": "a", "top_n": 0}), 422, "top_n")
    # TEI's own rerank test: of equal scores, the later text first
    status, ranked, _ = encoder_server.request("/rerank", {"query": "test", "texts": ["test", "other", "test"]})
    assert status == 200 and [item["index"] for item in ranked][:2] == [2, 0]
    assert ranked[0]["score"] == ranked[1]["score"]


def last_layer(model, ids: list[int]) -> torch.Tensor:
    """(seq, hidden): the model's last layer over one row of token ids, computed here rather than by the server."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).last_hidden_state[0]


def test_tei_clients_embed_and_compare(encoder_server):
    """huggingface_hub's InferenceClient given the server's URL, as TEI's documentation uses it (POST /)."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    client = huggingface_hub.InferenceClient(model=encoder_server.url)
    expected = torch.nn.functional.normalize(
        extract_features(encoder_server.model, encoder_server.tokenizer, TEXTS, max_length=64), dim=-1)
    vectors = client.feature_extraction(TEXTS[0])
    assert vectors.shape == (1, 32) and torch.allclose(torch.from_numpy(vectors), expected[:1], atol=1e-5)
    similarities = client.sentence_similarity(TEXTS[0], TEXTS[1:])
    assert similarities == pytest.approx([float(expected[0] @ vector) for vector in expected[1:]], abs=1e-5)
    assert encoder_server.request("/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]},
                                                  "parameters": {"truncate": True}})[1] == similarities
    # huggingface_hub 2's feature_extraction also sends dimensions and encoding_format (TEI ignores what it lacks)
    shortened = client.feature_extraction(TEXTS, dimensions=8, encoding_format="float")
    assert torch.allclose(torch.from_numpy(shortened), torch.nn.functional.normalize(expected[:, :8], dim=-1),
                          atol=1e-5)
    # base64 is asked of bertforge's own form; TEI's form answers floats whatever encoding_format says, as TEI
    # does, so that the client, which sends it and reads floats, gets its vectors
    raw = extract_features(encoder_server.model, encoder_server.tokenizer, TEXTS, max_length=64)
    for route, body, floats in (("/", {"texts": TEXTS}, raw), ("/embed", {"texts": TEXTS}, raw)):
        status, answer, _ = encoder_server.request(route, {**body, "encoding_format": "base64"})
        decoded = torch.stack([torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.float32)
                               for text in answer["embeddings"]])
        assert status == 200 and torch.allclose(decoded, floats, atol=1e-5), (route, body)
    for route in ("/", "/embed"):
        status, answer, _ = encoder_server.request(route, {"inputs": TEXTS, "encoding_format": "base64"})
        assert status == 200 and torch.allclose(torch.tensor(answer), expected, atol=1e-5), route
    vectors = client.feature_extraction(TEXTS, encoding_format="base64")
    assert torch.allclose(torch.from_numpy(vectors), expected, atol=1e-5)

    status, shortened, _ = encoder_server.request("/embed", {"inputs": TEXTS, "dimensions": 8})
    assert status == 200 and torch.allclose(torch.tensor(shortened),
                                            torch.nn.functional.normalize(expected[:, :8], dim=-1), atol=1e-5)
    assert_error(encoder_server.request("/embed", {"inputs": TEXTS, "dimensions": 33}), 422, "dimensions")

    # A long text cut at the left keeps its end: the last 63 word pieces and [SEP], after [CLS].
    long_text = " ".join(f"word{i}" for i in range(100))
    ids = encoder_server.tokenizer(long_text, truncation=False)["input_ids"]
    kept = ids[:1] + ids[-63:]
    status, (cut_left,), _ = encoder_server.request("/embed", {"inputs": long_text, "truncate": True,
                                                               "truncation_direction": "Left", "normalize": False})
    assert status == 200 and torch.allclose(torch.tensor(cut_left), last_layer(encoder_server.model, kept).mean(0),
                                            atol=1e-5)


def test_tei_tokenize_decode_embed_all_and_info(encoder_server, tokenizer):
    texts = ["Héllo, wörld!", TEXTS[1]]
    status, tokens, _ = encoder_server.request("/tokenize", {"inputs": texts, "add_special_tokens": False})
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    assert status == 200 and [[token["id"] for token in row] for row in tokens] == encoded["input_ids"]
    for text, row, offsets in zip(texts, tokens, encoded["offset_mapping"]):
        assert [(token["start"], token["stop"]) for token in row] == [tuple(pair) for pair in offsets]
        assert [token["text"] for token in row] == [text[start:stop] for start, stop in offsets]
        assert not any(token["special"] for token in row)
    status, (with_specials,), _ = encoder_server.request("/tokenize", {"inputs": texts[0]})
    assert [token["text"] for token in with_specials][::len(with_specials) - 1] == ["[CLS]", "[SEP]"]
    assert with_specials[0] == {"id": tokenizer.cls_token_id, "text": "[CLS]", "special": True, "start": None,
                                "stop": None}

    ids = tokenizer(TEXTS[:2])["input_ids"]
    assert encoder_server.request("/decode", {"ids": ids[0]})[1] == [tokenizer.decode(ids[0], skip_special_tokens=True)]
    assert encoder_server.request("/decode", {"ids": ids, "skip_special_tokens": False})[1] == \
        tokenizer.batch_decode(ids)
    assert_error(encoder_server.request("/decode", {"ids": [101, 10 ** 6]}), 422, "token id 1000000")

    status, states, _ = encoder_server.request("/embed_all", {"inputs": TEXTS[:2]})
    assert status == 200 and [len(rows) for rows in states] == [len(row) for row in ids]
    for row, served in zip(ids, states):
        assert torch.allclose(torch.tensor(served), last_layer(encoder_server.model, row), atol=1e-5)

    status, info, _ = encoder_server.request("/info")
    assert status == 200 and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert (info["max_input_length"], info["max_client_batch_size"], info["model_dtype"]) == (64, 8, "float32")

    # TEI's /tokenize gives every token of a text over the limit (tokenizing is not reading it)
    long_text = " ".join(f"word{i}" for i in range(100))
    status, (every,), _ = encoder_server.request("/tokenize", {"inputs": long_text})
    assert status == 200 and [token["id"] for token in every] == tokenizer(long_text)["input_ids"]
    assert len(every) > 64
    for route, body in (("/embed", {"inputs": ["a", ""]}), ("/tokenize", {"inputs": ""}),
                        ("/embed_all", {"inputs": ""}), ("/", {"inputs": ""}),
                        ("/similarity", {"inputs": {"source_sentence": "", "sentences": ["a"]}}),
                        ("/v1/embeddings", {"input": ["a", ""]}), ("/v2/embed", {"texts": [""]})):
        assert_error(encoder_server.request(route, body), 400, "inputs cannot be empty", kind="Empty")
    assert_error(encoder_server.request("/", {"inputs": "a", "parameters": {"top_k": 1}}), 409, "wrong task",
                 "parameters", "sequence classifier")


COST_HEADERS = ("x-compute-type", "x-compute-time", "x-compute-characters", "x-compute-tokens", "x-total-time",
                "x-tokenization-time", "x-queue-time", "x-inference-time")


def test_answers_say_what_they_cost_in_tei_headers(encoder_server, encoder_dir, qa_server):
    """text-embeddings-inference's x-compute-* headers: the characters sent, the tokens the model read (counted
    here by transformers' tokenizer), and times in whole milliseconds; none where the model did not run."""
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast.from_pretrained(encoder_dir)
    texts = ["Héllo, wörld!", TEXTS[2]]
    for route, body in (("/embed", {"inputs": texts}), ("/v1/embeddings", {"input": texts}),
                        ("/rerank", {"query": texts[0], "texts": texts[1:]})):
        status, _, headers = encoder_server.request(route, body)
        assert status == 200 and headers["x-compute-type"] == "cpu"
        assert int(headers["x-compute-characters"]) == sum(len(text) for text in texts), route
        assert int(headers["x-compute-tokens"]) == sum(len(ids) for ids in reference(texts)["input_ids"]), route
        times = {name: int(headers[name]) for name in COST_HEADERS[4:]}
        assert min(times.values()) >= 0 and int(headers["x-compute-time"]) == times["x-total-time"]
        assert times["x-total-time"] >= times["x-inference-time"]
    ids = reference(texts)["input_ids"]
    headers = encoder_server.request("/embed", {"inputs": ids})[2]  # token ids count as TEI counts them: each one
    assert int(headers["x-compute-characters"]) == int(headers["x-compute-tokens"]) == sum(map(len, ids))
    question = {"question": "What is the story?", "context": TEXTS[2]}
    status, _, headers = qa_server.request("/predict", {"questions": [question]})
    assert status == 200 and int(headers["x-compute-characters"]) == len(question["question"] + TEXTS[2])
    for route, body in (("/health", None), ("/tokenize", {"inputs": texts}), ("/embed", {"inputs": ""})):
        assert not set(COST_HEADERS) & set(encoder_server.request(route, body)[2]), route


def test_served_model_name_and_tei_openapi_path(make_server, encoder_dir, encoder_server):
    server = make_server(encoder_dir, served_model_name="tiny-encoder")
    assert server.request("/info")[1]["model_id"] == "tiny-encoder"
    assert [model["id"] for model in server.request("/v1/models")[1]["data"]] == ["tiny-encoder"]
    assert server.request("/v1/models/tiny-encoder")[0] == 200
    assert server.request("/v1/embeddings", {"input": "a", "model": "tiny-encoder"})[1]["model"] == "tiny-encoder"
    assert encoder_server.request("/info")[1]["model_id"] == str(encoder_dir)  # without it: the path it loaded
    assert encoder_server.request("/api-doc/openapi.json")[1] == encoder_server.request("/openapi.json")[1]
    with pytest.raises(ConfigError, match="served_model_name must be a name"):
        ServeSettings(served_model_name=" ")


def assert_same_json(answer, expected):
    """JSON answers equal but for float rounding (computed in different batches)."""
    if isinstance(expected, float):
        assert answer == pytest.approx(expected, abs=1e-6)
    elif isinstance(expected, list | dict):
        assert type(answer) is type(expected) and len(answer) == len(expected)
        keys = expected.keys() if isinstance(expected, dict) else range(len(expected))
        for key in keys:
            assert_same_json(answer[key], expected[key])
    else:
        assert answer == expected


def test_vertex_instances_are_answered_as_their_routes_answer(encoder_server, classifier_server, qa_server):
    """text-embeddings-inference's Vertex AI route: each instance answered as the route of its kind answers it."""
    query = {"query": TEXTS[0], "texts": TEXTS[1:], "return_text": True}
    instances = [{"inputs": TEXTS[0]}, {"inputs": TEXTS, "normalize": False}, query]
    status, answer, _ = encoder_server.request("/vertex", {"instances": instances})
    one, several, ranked = answer["predictions"]  # the instances share forward passes: equal to float precision
    assert status == 200 and torch.allclose(torch.tensor(one),
                                            torch.tensor(encoder_server.request("/embed", instances[0])[1]), atol=1e-6)
    assert torch.allclose(torch.tensor(several),
                          extract_features(encoder_server.model, encoder_server.tokenizer, TEXTS, max_length=64),
                          atol=1e-5)
    alone = encoder_server.request("/rerank", query)[1]
    assert [(item["index"], item["text"]) for item in ranked] == [(item["index"], item["text"]) for item in alone]
    assert [item["score"] for item in ranked] == pytest.approx([item["score"] for item in alone], abs=1e-6)
    instances = [{"inputs": [[TEXTS[0]], [TEXTS[1], TEXTS[2]]]}, {"texts": TEXTS[:2]}]
    status, answer, _ = classifier_server.request("/vertex", {"instances": instances})
    assert status == 200
    assert_same_json(answer["predictions"], [classifier_server.request("/predict", body)[1] for body in instances])
    question = {"questions": [{"question": "What is the story?", "context": TEXTS[2]}]}
    assert qa_server.request("/vertex", {"instances": [question]})[1]["predictions"] == \
        [qa_server.request("/predict", question)[1]]
    assert_error(encoder_server.request("/vertex", {"instances": [{"inputs": "a"}, {"inputs": 3.5}]}), 422,
                 "instances.1.inputs")
    assert_error(encoder_server.request("/vertex", {"instances": [{"inputs": "a"}, {"inputs": ""}]}), 400,
                 "cannot be empty", kind="Empty")
    assert_error(encoder_server.request("/vertex", {"instances": [{"inputs": "a"}] * 9}), 413, "too many instances")
    # max_texts (8) bounds the texts of all the instances, not of each
    assert_error(encoder_server.request("/vertex", {"instances": [{"inputs": ["a"] * 5}] * 2}), 413,
                 "too many texts in the instances: 10; the limit is 8")
    assert encoder_server.request("/vertex", {"instances": [{"inputs": ["a"] * 4}] * 2})[0] == 200


def test_tei_predict_with_a_classifier(classifier_server, tagger_server):
    expected = classifier_server.request("/predict", {"texts": TEXTS})[1]["predictions"]
    huggingface_hub = pytest.importorskip("huggingface_hub")
    client = huggingface_hub.InferenceClient(model=classifier_server.url)
    # every label, best first, as the Inference API answers the client (which reads the first of a list of lists)
    ranked = client.text_classification(TEXTS[0])
    assert [(item.label, item.score) for item in ranked] == [
        (label, pytest.approx(score, abs=1e-5)) for label, score in sorted(
            expected[0]["probabilities"].items(), key=lambda item: -item[1])]
    assert [item.label for item in client.text_classification(TEXTS[0], top_k=1)] == [expected[0]["label"]]
    assert isinstance(classifier_server.request("/predict", {"inputs": TEXTS[0]})[1][0], dict)  # TEI's: bare

    status, answers, _ = classifier_server.request("/predict", {"inputs": [[text] for text in TEXTS]})
    assert status == 200 and len(answers) == 3
    for answer, offline in zip(answers, expected):
        assert answer == sorted(answer, key=lambda item: -item["score"])
        assert {item["label"]: item["score"] for item in answer} == pytest.approx(offline["probabilities"], abs=1e-5)
    raw = classifier_server.request("/predict", {"inputs": TEXTS[0], "raw_scores": True})[1]
    logits = torch.tensor([item["score"] for item in raw])
    probabilities = sorted(expected[0]["probabilities"].values(), reverse=True)
    assert torch.allclose(logits.softmax(-1), torch.tensor(probabilities), atol=1e-5)
    top_one = classifier_server.request("/", {"inputs": TEXTS[0], "parameters": {"top_k": 1}})[1][0]  # a list of one
    # one text alone against the same text in a batch of three: float32 noise apart (a matmul's blocking follows
    # the number of rows)
    assert [item["label"] for item in top_one] == [answers[0][0]["label"]]
    assert top_one[0]["score"] == pytest.approx(answers[0][0]["score"], abs=1e-6)
    pair = classifier_server.request("/predict", {"inputs": [TEXTS[0], TEXTS[1]]})[1]
    offline_pair = classifier_server.request("/predict", {"texts": TEXTS[:1], "text_pairs": TEXTS[1:2]})[1]
    assert {item["label"]: item["score"] for item in pair} == \
        pytest.approx(offline_pair["predictions"][0]["probabilities"], abs=1e-5)

    # TEI takes single texts and pairs in one batch: each answered as it is alone
    status, mixed, _ = classifier_server.request("/predict", {"inputs": [[TEXTS[0], TEXTS[1]], [TEXTS[2]]]})
    assert status == 200 and [item["label"] for item in mixed[0]] == [item["label"] for item in pair]
    assert [item["score"] for item in mixed[0]] == pytest.approx([item["score"] for item in pair], abs=1e-5)
    assert [item["score"] for item in mixed[1]] == pytest.approx([item["score"] for item in answers[2]], abs=1e-5)
    # three texts or more can be no pair: a batch of single texts, as TEI reads them (two are a pair, above)
    for route in ("/predict", "/"):
        status, flat, _ = classifier_server.request(route, {"inputs": TEXTS})
        assert status == 200 and len(flat) == 3
        assert [[item["score"] for item in answer] for answer in flat] == [
            pytest.approx([item["score"] for item in answer], abs=1e-5) for answer in answers]
    assert_error(classifier_server.request("/predict", {"inputs": [["a"], [""]]}), 400, "inputs cannot be empty",
                 "text 1", kind="Empty")
    # the other kind of model's fields on POST / are the wrong task, not a malformed request
    assert_error(classifier_server.request("/", {"inputs": "a", "normalize": False}), 409, "wrong task",
                 "normalize", "encoder")
    assert_error(classifier_server.request("/predict", {"inputs": "a", "texts": ["b"]}), 422, "not both")
    assert_error(tagger_server.request("/predict", {"inputs": "a"}), 409, "sequence classifier")
    assert classifier_server.request("/info")[1]["model_type"]["classifier"]["id2label"] == \
        {"0": "negative", "1": "positive"}


def test_the_pipelines_pair_form_is_a_pair(classifier_server, data_dir):
    """transformers' text-classification pipeline takes a pair as {"text", "text_pair"}, alone or in a list: POST /
    and /predict read it as a pair too, with the pipeline's scores (every label, best first, as for a text)."""
    transformers = pytest.importorskip("transformers")
    pipeline = transformers.pipeline("text-classification", model=str(classifier_server.directory), device="cpu")
    pairs = [{"text": row["sentence1"], "text_pair": row["sentence2"]} for row in stsb_rows(data_dir, 3)]
    expected = [pipeline(pair, top_k=None) for pair in pairs]
    for route in ("/", "/predict"):
        status, one, _ = classifier_server.request(route, {"inputs": pairs[0]})
        assert status == 200
        assert [item["label"] for item in one] == [item["label"] for item in expected[0]]
        assert [item["score"] for item in one] == pytest.approx([item["score"] for item in expected[0]], abs=1e-5)
        status, batch, _ = classifier_server.request(route, {"inputs": pairs})
        assert status == 200 and len(batch) == 3
        for answer, theirs in zip(batch, expected):
            assert {item["label"]: item["score"] for item in answer} == pytest.approx(
                {item["label"]: item["score"] for item in theirs}, abs=1e-5)
    alone = classifier_server.request("/predict", {"inputs": {"text": pairs[0]["text"]}})[1]  # no pair: the text
    assert alone == classifier_server.request("/predict", {"inputs": pairs[0]["text"]})[1]
    assert_error(classifier_server.request("/predict", {"inputs": {"text": "a", "pair": "b"}}), 422, "pair")


def test_tei_model_types_and_the_root_route_of_a_reranker(cross_encoder_server, classifier_server, tagger_server,
                                                          encoder_server):
    """TEI's /info names one kind of model (a one-output classifier is its reranker), and its POST / of a reranker
    ranks {"query", "texts"} as /rerank does; bertforge's task sits beside the kind."""
    status, info, _ = cross_encoder_server.request("/info")
    assert status == 200 and info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"},
                                                                 "label2id": {"LABEL_0": 0}}}
    assert info["task"] == "regression"
    assert list(classifier_server.request("/info")[1]["model_type"]) == ["classifier"]
    status, info, _ = tagger_server.request("/info")
    assert status == 200 and info["model_type"] == {} and info["task"] == "ner"
    assert "task" not in encoder_server.request("/info")[1]
    body = {"query": "What is the capital of France?", "texts": ["Paris is the capital.", "I like cheese.", "test"],
            "return_text": True}
    for server in (cross_encoder_server, encoder_server):
        status, ranked, _ = server.request("/", body)
        assert status == 200 and ranked == server.request("/rerank", body)[1] and len(ranked) == 3
        assert server.request("/invocations", body)[1] == ranked  # SageMaker's route, as TEI serves it
    for path in ("/", "/ping"):  # TEI's other health routes
        status, health, _ = encoder_server.request(path)
        assert status == 200 and health["status"] == "ok"


def test_inference_client_tasks_answer_as_the_pipelines(tagger_server, qa_server, classifier_server, make_server):
    """huggingface_hub's InferenceClient's token_classification, question_answering and zero_shot_classification
    (the Hugging Face Inference API's requests at POST /) on served task models answer as transformers' pipeline
    of the task (bertforge's, tested against transformers' in test_pipeline.py) answers offline on the same
    model, the client's parameters included."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from bertforge.inference.pipelines import pipeline

    def client(server):
        return huggingface_hub.InferenceClient(model=server.url)

    def fields(elements) -> list[dict]:
        return [{key: value for key, value in vars(element).items() if value is not None} for element in elements]

    texts = ["  Jean-Luc Picard visited Zürich!", "Hi there"]
    tagger = pipeline("token-classification", model=str(tagger_server.directory))
    for options in ({}, {"aggregation_strategy": "simple"}, {"aggregation_strategy": "first"},
                    {"aggregation_strategy": "none", "ignore_labels": ["O", "B-PER"]}):
        served = fields(client(tagger_server).token_classification(texts[0], **options))
        expected = tagger(texts[0], **options)
        assert [{**item, "score": pytest.approx(item["score"], abs=1e-5)} for item in expected] == served
        assert served  # every piece is I-PER: one entity of the whole text, or a piece each
    status, both, _ = tagger_server.request("/", {"inputs": texts, "parameters": {"aggregation_strategy": "max"}})
    assert status == 200 and len(both) == 2
    assert [[item["word"] for item in row] for row in both] == \
        [[item["word"] for item in row] for row in tagger(texts, aggregation_strategy="max")]

    answerer = pipeline("question-answering", model=str(qa_server.directory))
    question = QUESTIONS[0]
    for options in ({}, {"top_k": 3}, {"max_answer_len": 3, "align_to_words": False, "doc_stride": 16},
                    {"handle_impossible_answer": True}):
        served = client(qa_server).question_answering(question["question"], question["context"], **options)
        expected = answerer(question=question["question"], context=question["context"], max_seq_len=64, **options)
        served, expected = (fields(served), expected) if isinstance(expected, list) else \
            (fields([served]), [expected])
        assert [{**item, "score": pytest.approx(item["score"], abs=1e-5)} for item in expected] == served
    status, answers, _ = qa_server.request("/", {"inputs": QUESTIONS[:2]})
    assert status == 200 and [answer["answer"] for answer in answers] == \
        [answer["answer"] for answer in answerer(QUESTIONS[:2], max_seq_len=64)]

    classifier = pipeline("zero-shot-classification", model=str(classifier_server.directory))
    labels = ["cinema", "weather", "sports"]
    for options in ({}, {"multi_label": True, "hypothesis_template": "It is about {}."}):
        served = client(classifier_server).zero_shot_classification(TEXTS[0], labels, **options)
        expected = classifier(TEXTS[0], candidate_labels=labels, **options)
        assert [element.label for element in served] == expected["labels"]
        assert [element.score for element in served] == pytest.approx(expected["scores"], abs=1e-5)

    # what the pipelines can't take, and the server's limits, are one-line errors
    long_text = " ".join([texts[0]] * 40)  # 480 tokens, the server's windows 64
    served = fields(client(tagger_server).token_classification(long_text, aggregation_strategy="first", stride=8))
    expected = tagger(long_text, aggregation_strategy="first", stride=8)
    assert served and [{**item, "score": pytest.approx(item["score"], abs=1e-5)} for item in expected] == served
    assert_error(tagger_server.request("/", {"inputs": "a b", "parameters": {"stride": 8}}), 400, "stride",
                 "aggregation_strategy")
    assert_error(tagger_server.request("/", {"inputs": "a b", "parameters": {"top_k": 1}}), 422, "top_k")
    assert_error(qa_server.request("/", {"inputs": QUESTIONS[0], "parameters": {"max_seq_len": 128}}), 400,
                 "max_seq_len 128", "max_position_embeddings (64)")
    shorter = make_server(qa_server.directory, max_length=32)  # windows of 32 tokens unless a request asks more
    assert shorter.request("/", {"inputs": QUESTIONS[0]})[0] == 200
    assert_error(shorter.request("/", {"inputs": QUESTIONS[0], "parameters": {"max_seq_len": 48}}), 413,
                 "48 tokens", "limit is 32")
    assert_error(qa_server.request("/", {"inputs": QUESTIONS[:1] * 5}), 413, "too many questions")
    # read as the zero-shot request its fields name, not as text classification's with a field too many
    assert_error(classifier_server.request("/", {"inputs": "a", "parameters": {"candidate_labels": []}}), 422,
                 "parameters.candidate_labels: List should have at least 1 item")
    assert_error(classifier_server.request("/", {"inputs": "a", "parameters": {"candidate_labels": 3}}), 422,
                 "parameters.candidate_labels: expected a text or a list of texts")
    assert_error(classifier_server.request("/", {"inputs": "a", "parameters": {
        "candidate_labels": ["x"], "hypothesis_template": "no place"}}), 400, "hypothesis_template")


def test_root_takes_bertforge_own_forms_too(encoder_server, classifier_server):
    """POST / given bertforge's own request ({"texts"}) answers as the model's own route does (it was a 500: the
    answer was not among the route's declared shapes)."""
    for server, route in ((encoder_server, "/embed"), (classifier_server, "/predict")):
        status, answer, _ = server.request("/", {"texts": TEXTS})
        assert status == 200 and answer == server.request(route, {"texts": TEXTS})[1], route


def test_the_inference_apis_options_change_nothing(encoder_server, classifier_server, tagger_server):
    """The Hugging Face Inference API's "options", which its clients send beside "inputs" (LangChain's
    HuggingFaceInferenceAPIEmbeddings posts {"inputs": texts, "options": {"wait_for_model": true, "use_cache":
    true}} to its api_url; Weaviate's text2vec-huggingface sends use_gpu too), are taken on each route of that
    shape and change nothing; an option the API never had is refused by name. They were refused as extra fields."""
    options = {"wait_for_model": True, "use_cache": True, "use_gpu": False}
    expected = torch.nn.functional.normalize(
        extract_features(encoder_server.model, encoder_server.tokenizer, TEXTS, max_length=64), dim=-1)
    for route in ("/", "/embed"):
        status, vectors, _ = encoder_server.request(route, {"inputs": TEXTS, "options": options})
        assert status == 200 and torch.allclose(torch.tensor(vectors), expected, atol=1e-5), route
    comparison = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    for route in ("/", "/similarity"):
        status, similarities, _ = encoder_server.request(route, {**comparison, "options": options})
        assert status == 200 and similarities == pytest.approx(
            [float(expected[0] @ vector) for vector in expected[1:]], abs=1e-5), route
    for server, body in ((classifier_server, {"inputs": TEXTS[0]}),
                         (classifier_server, {"inputs": TEXTS[0], "parameters": {"candidate_labels": ["a", "b"]}}),
                         (tagger_server, {"inputs": TEXTS[0], "parameters": {"aggregation_strategy": "simple"}})):
        status, answer, _ = server.request("/", {**body, "options": options})
        assert status == 200 and answer == server.request("/", body)[1], body
    status, answer, _ = classifier_server.request("/predict", {"inputs": TEXTS[1], "options": {"use_cache": False}})
    assert status == 200 and answer == classifier_server.request("/predict", {"inputs": TEXTS[1]})[1]
    assert_error(encoder_server.request("/embed", {"inputs": TEXTS, "options": {"wait_for_mode": True}}), 422,
                 "options.wait_for_mode")
    assert_error(encoder_server.request("/embed", {"inputs": TEXTS, "options": {"use_cache": "yes"}}), 422,
                 "options.use_cache")

def test_feature_extraction_parameters_where_older_clients_send_them(encoder_server, classifier_server):
    """LangChain's HuggingFaceHubEmbeddings (and h2oGPT's) post {"inputs": texts, "parameters": model_kwargs},
    {} by default, to the model's URL: an encoder reads the feature-extraction fields there as it reads them at the
    top level (TEI ignores the field; bertforge answered 409, as if the parameters were a classifier's)."""
    plain = encoder_server.request("/", {"inputs": TEXTS})[1]
    assert encoder_server.request("/", {"inputs": TEXTS, "parameters": {}})[:2] == (200, plain)
    raw = encoder_server.request("/embed", {"inputs": TEXTS, "normalize": False})[1]
    for route in ("/", "/embed"):
        assert encoder_server.request(route, {"inputs": TEXTS, "parameters": {"normalize": False}})[:2] == (200, raw)
    long_text = " ".join(f"word{i}" for i in range(100))
    left = {"truncate": True, "truncation_direction": "Left"}
    expected = encoder_server.request("/", {"inputs": long_text, **left})[1]
    assert expected != encoder_server.request("/", {"inputs": long_text, "truncate": True})[1]
    assert encoder_server.request("/", {"inputs": long_text, "parameters": left})[:2] == (200, expected)
    assert_error(encoder_server.request("/", {"inputs": long_text, "parameters": {"truncate": False}}), 413,
                 "asked not to truncate")
    assert_error(encoder_server.request("/embed", {"inputs": TEXTS, "normalize": True, "parameters": {
        "normalize": False}}), 422, "normalize is given twice")
    # a classifier's parameters sent to an encoder, and an encoder's to a classifier, are the wrong task
    assert_error(encoder_server.request("/", {"inputs": "a", "parameters": {"top_k": 1}}), 409, "wrong task",
                 "parameters.top_k", "sequence classifier")
    assert_error(classifier_server.request("/", {"inputs": "a", "parameters": {"normalize": True}}), 409,
                 "wrong task", "parameters.normalize", "encoder")
    assert_error(encoder_server.request("/embed", {"inputs": "a", "parameters": {"pooling": "cls"}}), 422,
                 "parameters.pooling")

def test_tei_predict_reads_as_predict_does(task_model_dirs):
    """Texts longer than the fine-tuned max_length (windows, their logits averaged) and a regression model: TEI's
    answers carry the same numbers as bertforge's own."""
    for name in ("classification", "regression"):
        server = Server(task_model_dirs[name])
        try:
            expected = server.request("/predict", {"texts": TEXTS})[1]["predictions"]
            status, answers, _ = server.request("/predict", {"inputs": [[text] for text in TEXTS]})
        finally:
            server.stop()
        assert status == 200
        for answer, offline in zip(answers, expected):
            if name == "regression":  # the score itself, under the one label's name
                assert answer == [{"score": pytest.approx(offline["score"], abs=1e-5), "label": "LABEL_0"}]
            else:
                assert {item["label"]: item["score"] for item in answer} == \
                    pytest.approx(offline["probabilities"], abs=1e-5)


def test_rerank_with_a_pair_classifier(task_model_dirs):
    directory = task_model_dirs["classification-pairs"]
    expected = predict_offline(directory, texts=["the query"] * 2, text_pairs=TEXTS[:2])
    server, single = Server(directory), Server(task_model_dirs["classification"])
    try:
        status, ranked, _ = server.request("/rerank", {"query": "the query", "texts": TEXTS[:2]})
        # A classifier fine-tuned on single texts has no relevance of a text to a query to give.
        assert_error(single.request("/rerank", {"query": "the query", "texts": TEXTS[:2]}), 409, "single texts")
        # ... which Infinity's model list says: it classifies, and only the pair classifier reranks
        assert [model.request("/models")[1]["data"][0]["capabilities"] for model in (server, single)] == \
            [["classify", "rerank"], ["classify"]]
    finally:
        server.stop()
        single.stop()
    scores = [answer["probabilities"]["positive"] for answer in expected]
    assert status == 200 and [item["index"] for item in ranked] == sorted(range(2), key=lambda i: -scores[i])
    assert [item["score"] for item in ranked] == pytest.approx(sorted(scores, reverse=True), abs=1e-5)


@pytest.fixture(scope="module")
def cross_encoder_server(tmp_path_factory, seeded_classifier):
    """A cross-encoder as a user has one from elsewhere: MiniLM with a one-output head, no bertforge run config."""
    folder = seeded_classifier(tmp_path_factory.mktemp("cross-encoder"), {0: "LABEL_0"}, seed=1)
    yield from running(folder, max_texts=8)



def test_a_cross_encoder_from_elsewhere_reads_pairs_as_its_references_do(cross_encoder_server, squad_contexts):
    """A one-output classifier without a bertforge run reads pairs up to the length its files give (not a task
    default of 128 tokens), and TEI's /predict answers the sigmoid of its score (the logit with raw_scores), as
    sentence-transformers' CrossEncoder and text-embeddings-inference do."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.CrossEncoder(str(cross_encoder_server.directory), device="cpu")
    status, info, _ = cross_encoder_server.request("/info")
    assert status == 200 and info["max_input_length"] == reference.max_length == 512
    pairs = [("Which river flows through the city?", context) for context in squad_contexts[:3]]
    lengths = [len(reference.tokenizer(*pair)["input_ids"]) for pair in pairs]
    assert max(lengths) > 128 and max(lengths) <= 512  # past the old cut, within the model's
    expected = reference.predict(pairs)
    logits = reference.predict(pairs, activation_fn=torch.nn.Identity())
    status, answers, _ = cross_encoder_server.request("/predict", {"inputs": [list(pair) for pair in pairs]})
    assert status == 200
    assert [answer[0]["score"] for answer in answers] == pytest.approx(expected.tolist(), abs=1e-5)
    status, answers, _ = cross_encoder_server.request("/predict", {"inputs": [list(pair) for pair in pairs],
                                                                   "raw_scores": True})
    assert [answer[0]["score"] for answer in answers] == pytest.approx(logits.tolist(), abs=1e-4)
    status, ranked, _ = cross_encoder_server.request("/rerank", {"query": pairs[0][0],
                                                                 "texts": [pair[1] for pair in pairs]})
    assert {item["index"]: item["score"] for item in ranked} == pytest.approx(dict(enumerate(expected.tolist())),
                                                                               abs=1e-5)

def stsb_rows(data_dir, count: int) -> list[dict[str, str]]:
    with open(data_dir / "stsb" / "dev.tsv", encoding="utf-8") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[::97][:count]


def test_cohere_clients_rerank_as_sentence_transformers(cross_encoder_server, data_dir):
    """Cohere's own clients, v1 and v2 APIs, against sentence-transformers' CrossEncoder.rank on the same folder, on
    real STS-B sentences: the order, the scores (the sigmoid of the one output), top_n, the documents returned,
    object documents, max_tokens_per_doc, and errors the clients raise with the server's message."""
    cohere = pytest.importorskip("cohere")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    rows = stsb_rows(data_dir, 6)
    query, documents = rows[0]["sentence1"], [row["sentence2"] for row in rows]
    reference = sentence_transformers.CrossEncoder(str(cross_encoder_server.directory), device="cpu")
    v1 = cohere.Client(api_key="unused", base_url=cross_encoder_server.url, max_retries=0)
    v2 = cohere.ClientV2(api_key="unused", base_url=cross_encoder_server.url, max_retries=0)

    def assert_ranked(results, expected):
        assert [result.index for result in results] == [item["corpus_id"] for item in expected]
        assert [result.relevance_score for result in results] == \
            pytest.approx([float(item["score"]) for item in expected], abs=1e-5)

    answer = v1.rerank(query=query, documents=documents, top_n=3, return_documents=True)
    expected = reference.rank(query, documents, top_k=3)
    assert_ranked(answer.results, expected)
    assert [result.document.text for result in answer.results] == [documents[i["corpus_id"]] for i in expected]
    assert answer.id and answer.usage["total_tokens"] == sum(  # an extra field to Cohere: Jina's and vLLM's usage
        len(reference.tokenizer(query, document)["input_ids"]) for document in documents)
    answer = v2.rerank(model="bertforge", query=query, documents=documents)
    assert_ranked(answer.results, reference.rank(query, documents))
    # each with its document unless told not to (vLLM always returns it, Jina by default)
    assert [result.document["text"] for result in answer.results] == [documents[r.index] for r in answer.results]
    answer = v1.rerank(query=query, documents=documents, return_documents=False)
    assert all(getattr(result, "document", None) is None for result in answer.results)
    # max_tokens_per_doc: each document cut after its first word pieces, where the reference tokenizer ends them
    fast = transformers.AutoTokenizer.from_pretrained(str(cross_encoder_server.directory))
    cut = [document[:fast(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"][4][1]]
           for document in documents]
    assert all(len(fast(text, add_special_tokens=False)["input_ids"]) == 5 for text in cut)
    assert_ranked(v2.rerank(model="bertforge", query=query, documents=documents, max_tokens_per_doc=5).results,
                  reference.rank(query, cut))
    # Objects: their "text", or the rank_fields named, as "field: value" lines in that order
    objects = [{"title": row["genre"], "text": row["sentence2"]} for row in rows]
    assert_ranked(v1.rerank(query=query, documents=objects).results, reference.rank(query, documents))
    answer = v1.rerank(query=query, documents=objects, rank_fields=["title", "text"], return_documents=True)
    assert_ranked(answer.results, reference.rank(query, [f"title: {row['genre']}\ntext: {row['sentence2']}"
                                                         for row in rows]))
    assert answer.results[0].document.title == objects[answer.results[0].index]["title"]
    with pytest.raises(cohere.errors.BadRequestError) as raised:
        v1.rerank(query=query, documents=objects, rank_fields=["author"])
    assert raised.value.body["error"]["message"] == "documents.0 has no field 'author'"
    with pytest.raises(cohere.core.api_error.ApiError) as raised:
        v2.rerank(model="bertforge", query=query, documents=documents * 2)
    assert raised.value.status_code == 413 and "too many documents: 12" in raised.value.body["error"]["message"]
    with pytest.raises(cohere.errors.BadRequestError, match="top_n"):
        v2.rerank(model="bertforge", query=query, documents=documents, top_n=-1)
    # vLLM's and Infinity's /rerank take the same shape (Infinity's raw_scores: the logit itself)
    status, answer, _ = cross_encoder_server.request("/rerank", {"query": query, "documents": documents,
                                                                 "raw_scores": True, "top_n": 2})
    logits = reference.predict([(query, document) for document in documents], activation_fn=torch.nn.Identity())
    best = sorted(range(len(documents)), key=lambda i: -logits[i])[:2]
    assert status == 200 and [(item["index"], item["relevance_score"]) for item in answer["results"]] == \
        [(i, pytest.approx(float(logits[i]), abs=1e-4)) for i in best]
    # ... and Infinity's client, which always sends raw_scores, reads Infinity's answer (its pymodels.py: object
    # "rerank", created; a document as its text, only with return_documents, which is false by default)
    assert answer["object"] == "rerank" and isinstance(answer["created"], int)
    assert all("document" not in item for item in answer["results"])
    answer = cross_encoder_server.request("/rerank", {"query": query, "documents": documents, "raw_scores": False,
                                                      "return_documents": True, "model": "default/not-specified"})[1]
    assert [item["document"] for item in answer["results"]] == [documents[item["index"]] for item in answer["results"]]
    # without raw_scores, or on Cohere's routes, vLLM's and Cohere's answer: each document as {"text": ...}
    for route, body in (("/rerank", {}), ("/v1/rerank", {"raw_scores": True}), ("/v2/rerank", {"raw_scores": False})):
        answer = cross_encoder_server.request(route, {"query": query, "documents": documents, **body})[1]
        assert "object" not in answer and all(item["document"] == {"text": documents[item["index"]]}
                                              for item in answer["results"]), route
    # Infinity's model list at /models (OpenAI's at /v1/models): the fields its generated client requires
    card = cross_encoder_server.request("/models")[1]["data"][0]
    assert {key: card[key] for key in ("object", "owned_by", "stats", "capabilities")} == {
        "object": "model", "owned_by": "infinity", "stats": {}, "capabilities": ["classify", "rerank"]}
    assert cross_encoder_server.request("/v1/models")[1]["data"][0]["owned_by"] == "bertforge"


def test_vllm_score_and_rerank_as_sentence_transformers(cross_encoder_server, data_dir):
    """vLLM's /score (its four pairs of field names, 1:N and N:N) and its rerank body (its own fields: model, user,
    request_id, use_activation, truncate_prompt_tokens, top_n 0) on a cross-encoder, against sentence-transformers'
    CrossEncoder on the same folder and real STS-B sentences; answers in vLLM's shapes."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    rows = stsb_rows(data_dir, 6)
    query, documents = rows[0]["sentence1"], [row["sentence2"] for row in rows]
    firsts = [row["sentence1"] for row in rows]
    reference = sentence_transformers.CrossEncoder(str(cross_encoder_server.directory), device="cpu")
    expected = reference.predict([(query, document) for document in documents])
    for first, second in (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        status, answer, _ = cross_encoder_server.request("/score", {"model": "m", first: query, second: documents})
        assert status == 200 and set(answer) == {"id", "object", "created", "model", "data", "usage"}, answer
        assert [item["index"] for item in answer["data"]] == list(range(6))
        assert {item["object"] for item in answer["data"]} == {"score"} and answer["object"] == "list"
        assert [item["score"] for item in answer["data"]] == pytest.approx(expected.tolist(), abs=1e-5)
    tokens = sum(len(reference.tokenizer(query, document)["input_ids"]) for document in documents)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # N:N pair by pair; logits with use_activation false
    status, answer, _ = cross_encoder_server.request("/v1/score", {"text_1": firsts, "text_2": documents,
                                                                   "use_activation": False})
    logits = reference.predict(list(zip(firsts, documents)), activation_fn=torch.nn.Identity())
    assert status == 200 and [item["score"] for item in answer["data"]] == pytest.approx(logits.tolist(), abs=1e-4)
    # truncate_prompt_tokens: each pair cut to 12 tokens, longer text first, as a CrossEncoder of max_length 12
    short = sentence_transformers.CrossEncoder(str(cross_encoder_server.directory), device="cpu", max_length=12)
    status, answer, _ = cross_encoder_server.request("/score", {"text_1": query, "text_2": documents,
                                                                "truncate_prompt_tokens": 12})
    assert status == 200 and [item["score"] for item in answer["data"]] == pytest.approx(
        short.predict([(query, document) for document in documents]).tolist(), abs=1e-5)
    # ... with truncation_side left, each pair's last tokens, as the tokenizer cuts at the left (/score and the
    # rerank routes alike)
    cut_right = [item["score"] for item in answer["data"]]
    short.tokenizer.truncation_side = "left"
    cut_left = short.predict([(query, document) for document in documents]).tolist()
    assert cut_left != pytest.approx(cut_right, abs=1e-3)  # the texts are longer than 12 tokens: the ends differ
    status, answer, _ = cross_encoder_server.request("/score", {"text_1": query, "text_2": documents,
                                                                "truncate_prompt_tokens": 12,
                                                                "truncation_side": "left"})
    assert [item["score"] for item in answer["data"]] == pytest.approx(cut_left, abs=1e-5)
    status, answer, _ = cross_encoder_server.request("/v1/rerank", {"query": query, "documents": documents,
                                                                    "truncate_prompt_tokens": 12,
                                                                    "truncation_side": "left"})
    assert {item["index"]: item["relevance_score"] for item in answer["results"]} == pytest.approx(
        dict(enumerate(cut_left)), abs=1e-5)
    # vLLM's rerank body: its fields are taken, and each result has its document, usage its prompt_tokens
    status, answer, _ = cross_encoder_server.request("/rerank", {
        "model": "m", "query": query, "documents": documents, "top_n": 0, "user": "u", "request_id": "r1",
        "priority": 0, "use_activation": None, "max_tokens_per_doc": 0, "truncate_prompt_tokens": -1})
    ranked = reference.rank(query, documents)
    assert status == 200 and [(item["index"], item["document"]["text"]) for item in answer["results"]] == \
        [(item["corpus_id"], documents[item["corpus_id"]]) for item in ranked]
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    status, answer, _ = cross_encoder_server.request("/v1/rerank", {"query": query, "documents": documents,
                                                                    "use_activation": False, "top_n": 2})
    assert [item["relevance_score"] for item in answer["results"]] == pytest.approx(
        sorted(reference.predict([(query, d) for d in documents], activation_fn=torch.nn.Identity()).tolist(),
               reverse=True)[:2], abs=1e-4)
    # SageMaker's /invocations tells vLLM's bodies apart as vLLM does
    assert cross_encoder_server.request("/invocations", {"text_1": query, "text_2": documents})[1]["data"][0][
        "score"] == pytest.approx(float(expected[0]), abs=1e-5)
    assert len(cross_encoder_server.request("/invocations", {"query": query, "documents": documents})[1][
        "results"]) == 6
    assert_error(cross_encoder_server.request("/score", {"text_1": firsts[:2], "text_2": documents}), 400,
                 "text_1 has 2 texts and text_2 6: score one against many (1:N) or as many of each")
    assert_error(cross_encoder_server.request("/score", {"text_1": query, "documents": documents}), 400,
                 "send the two sides of the pairs under one of vLLM's names: text_1 and text_2, queries and documents")
    assert_error(cross_encoder_server.request("/v1/score", {"text_1": query, "text_2": documents,
                                                            "truncate_prompt_tokens": 100000}), 400,
                 "truncate_prompt_tokens: 100000 tokens; a model input takes from 2")


def test_vllm_classify_as_transformers(make_server, seeded_classifier, sst2_dev, tmp_path):
    """vLLM's /classify on a sequence classifier (MiniLM with a seeded head): each label's probability (or logit
    with use_activation false) and the most probable label, against transformers' model on the same folder and
    real SST-2 reviews; an encoder is 409 in OpenAI's shape."""
    transformers = pytest.importorskip("transformers")
    folder = seeded_classifier(tmp_path / "clf", {0: "negative", 1: "positive"}, seed=3)
    server = make_server(folder)
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    fast = transformers.AutoTokenizer.from_pretrained(str(folder))
    texts = [text for text, _ in sst2_dev[:5]]
    with torch.no_grad():
        logits = reference(**fast(texts, padding=True, return_tensors="pt")).logits
    status, answer, _ = server.request("/classify", {"model": "m", "input": texts, "user": "u"})
    assert status == 200 and set(answer) == {"id", "object", "created", "model", "data", "usage"}, answer
    assert [item["num_classes"] for item in answer["data"]] == [2] * 5
    assert [item["label"] for item in answer["data"]] == [["negative", "positive"][int(row.argmax())]
                                                          for row in logits]
    torch.testing.assert_close(torch.tensor([item["probs"] for item in answer["data"]]), logits.softmax(-1),
                               atol=1e-5, rtol=0)
    tokens = sum(len(ids) for ids in fast(texts)["input_ids"])
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    status, answer, _ = server.request("/v1/classify", {"input": texts[0], "use_activation": False})
    torch.testing.assert_close(torch.tensor(answer["data"][0]["probs"]), logits[0], atol=1e-4, rtol=0)
    # vLLM's truncate_prompt_tokens with truncation_side left: each text's last tokens, as transformers cuts them
    fast.truncation_side = "left"
    with torch.no_grad():
        cut = reference(**fast(texts, padding=True, truncation=True, max_length=8, return_tensors="pt")).logits
    fast.truncation_side = "right"
    status, answer, _ = server.request("/classify", {"input": texts, "truncate_prompt_tokens": 8,
                                                     "truncation_side": "left", "use_activation": False})
    torch.testing.assert_close(torch.tensor([item["probs"] for item in answer["data"]]), cut, atol=1e-4, rtol=0)
    invoked = server.request("/invocations", {"input": texts[:2]})[1]  # the body vLLM's /invocations classifies
    torch.testing.assert_close(torch.tensor([item["probs"] for item in invoked["data"]]), logits[:2].softmax(-1),
                               atol=1e-5, rtol=0)
    # vLLM's /pooling: a classifier's task is classify, its answer /classify's probabilities
    status, answer, _ = server.request("/pooling", {"model": "m", "input": texts})
    torch.testing.assert_close(torch.tensor([item["data"] for item in answer["data"]]), logits.softmax(-1),
                               atol=1e-5, rtol=0)
    assert_error(server.request("/pooling", {"input": texts[0], "task": "token_embed"}), 409, "not a dense encoder")
    # Infinity's client sends raw_scores, and reads its own shape: per text {score, label}, highest first
    for raw, scores in ((False, logits.softmax(-1)), (True, logits)):
        status, answer, _ = server.request("/classify", {"input": texts, "model": "m", "raw_scores": raw})
        assert status == 200 and answer["object"] == "classify"
        for row, expected in zip(answer["data"], scores):
            order = expected.argsort(descending=True).tolist()
            assert [item["label"] for item in row] == [["negative", "positive"][i] for i in order]
            assert [item["score"] for item in row] == pytest.approx(expected[order].tolist(), abs=1e-4)
    assert_error(server.request("/classify", {"input": texts[0], "add_special_tokens": False}), 400,
                 "add_special_tokens: false leaves out the [CLS]")
    assert_error(make_server("default").request("/classify", {"input": "x"}), 409, "wrong task")
    # a server that refuses long texts refuses them on vLLM's routes too (vLLM answers a prompt over its
    # max_model_len with an error); truncate_prompt_tokens -1 asks for the cut
    refusing, long_text = make_server(folder, long_text="refuse"), " ".join(["word"] * 600)
    for route, body in (("/classify", {"input": [texts[0], long_text]}), ("/score", {"text_1": texts[0],
                                                                                   "text_2": long_text}),
                        ("/pooling", {"input": long_text})):
        assert_error(refusing.request(route, body), 413, "longer than the model's max_length; the limit is 512")
        status, answer, _ = refusing.request(route, body | {"truncate_prompt_tokens": -1})
        assert status == 200 and answer["usage"]["prompt_tokens"] >= 512, answer


def make_prompt_excluded(folder: str, tmp_path) -> str:
    """A copy of a sentence-transformers folder with a "query: " prompt that mean pooling leaves out."""
    copy = tmp_path / "prompt-excluded"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config_sentence_transformers.json").read_text())
    (copy / "config_sentence_transformers.json").write_text(json.dumps(config | {"prompts": {"query": "query: "}}))
    pooling = json.loads((copy / "1_Pooling" / "config.json").read_text())
    (copy / "1_Pooling" / "config.json").write_text(json.dumps(pooling | {"include_prompt": False}))
    return str(copy)


def test_vllm_embedding_options_and_tokenizer_routes(make_server, tokenizer, tmp_path):
    """vLLM's /v1/embeddings options on the default model (truncate_prompt_tokens, add_special_tokens,
    normalize, embed_dtype and endianness of base64), against sentence-transformers and transformers; its
    /tokenize and /detokenize; /version and POST /ping."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    import numpy as np

    from bertforge.checkpoint.default_model import resolve_model_dir

    server = make_server("default")
    folder = str(resolve_model_dir("default"))
    reference = sentence_transformers.SentenceTransformer(folder, device="cpu")
    texts = list(TEXTS)

    def vectors(body):
        status, answer, _ = server.request("/v1/embeddings", {"model": "m", "input": texts, **body})
        assert status == 200, answer
        return answer

    reference.max_seq_length = 6
    answer = vectors({"truncate_prompt_tokens": 6})
    np.testing.assert_allclose([item["embedding"] for item in answer["data"]], reference.encode(texts), atol=1e-5)
    assert answer["usage"]["prompt_tokens"] == sum(min(6, len(reference.tokenizer(text)["input_ids"]))
                                                   for text in texts)
    assert answer["id"].startswith("embd-") and isinstance(answer["created"], int)  # vLLM's and Infinity's fields
    reference.tokenizer.truncation_side = "left"  # vLLM's truncation_side left: the last tokens kept
    answer = vectors({"truncate_prompt_tokens": 6, "truncation_side": "left", "cache_salt": "s"})
    np.testing.assert_allclose([item["embedding"] for item in answer["data"]], reference.encode(texts), atol=1e-5)
    reference.tokenizer.truncation_side = "right"
    reference.max_seq_length = 256
    expected = reference.encode(texts)
    for dtype, endianness, numpy_type in (("float16", "little", "<f2"), ("float16", "big", ">f2"),
                                          ("float32", "big", ">f4"), ("float32", "native", "=f4")):
        answer = vectors({"encoding_format": "base64", "embed_dtype": dtype, "endianness": endianness})
        decoded = [np.frombuffer(base64.b64decode(item["embedding"]), dtype=numpy_type) for item in answer["data"]]
        np.testing.assert_allclose(decoded, expected, atol=1e-3 if dtype == "float16" else 1e-5)
    answer = vectors({"encoding_format": "base64", "embed_dtype": "bfloat16"})
    raw = np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<i2") for item in answer["data"]])
    decoded = torch.from_numpy(raw.copy()).view(torch.bfloat16).float().numpy()
    np.testing.assert_allclose(decoded, expected, atol=4e-3)
    # without [CLS] and [SEP]: the mean of the word pieces' vectors alone, as transformers' model gives them; with
    # normalize (or, in vLLM's newer name, use_activation) false, not scaled to unit length, though the layout's
    # Normalize module would scale them (as vLLM's test_normalize expects, and TEI's /embed gives them)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    fast = transformers.AutoTokenizer.from_pretrained(folder)
    for body in ({"normalize": False}, {"use_activation": False}, {"normalized": False}, {}):
        answer = vectors({"add_special_tokens": False, **body})
        for text, item in zip(texts, answer["data"]):
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                mean = model(input_ids=ids).last_hidden_state[0].mean(0)
            np.testing.assert_allclose(item["embedding"], torch.nn.functional.normalize(mean, dim=0) if not body
                                       else mean, atol=1e-5)
    answer = server.request("/pooling", {"input": texts, "normalize": False, "add_special_tokens": False})[1]
    assert [item["data"] for item in answer["data"]] == [item["embedding"] for item in vectors(
        {"add_special_tokens": False, "normalize": False})["data"]]
    # truncate_prompt_tokens above the model's max_model_len (the layout's 256) is refused, as vLLM refuses it
    assert server.request("/tokenize", {"prompt": "a"})[1]["max_model_len"] == 256
    assert_error(server.request("/v1/embeddings", {"input": texts, "truncate_prompt_tokens": 257}), 400,
                 "truncate_prompt_tokens: 257 tokens; a model input takes from 2 ([CLS] and [SEP]) to the model's "
                 "max_model_len 256")
    assert vectors({"input": [" ".join(["word"] * 300)], "truncate_prompt_tokens": -1})["usage"]["prompt_tokens"] \
        == 256
    assert_error(server.request("/v1/embeddings", {"input": ["a", " "], "add_special_tokens": False}), 400,
                 "input 1 has no word piece to read without [CLS] and [SEP]")
    # ... and with a query prompt the layout leaves out of the pooling (include_prompt false): its pieces alone
    prompted = make_server(make_prompt_excluded(folder, tmp_path))
    status, answer, _ = prompted.request("/v1/embeddings", {"input": texts, "input_type": "query",
                                                            "add_special_tokens": False})
    skipped = len(fast.tokenize("query: "))
    for text, item in zip(texts, answer["data"]):
        ids = fast("query: " + text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            mean = model(input_ids=ids).last_hidden_state[0, skipped:].mean(0)
        np.testing.assert_allclose(item["embedding"], torch.nn.functional.normalize(mean, dim=0), atol=1e-5)
    # vLLM's /pooling: embed as /v1/embeddings, token_embed every token's vector, unit length unless normalize false
    status, answer, _ = server.request("/pooling", {"model": "m", "input": texts})  # an encoder's task: embed
    assert status == 200 and {item["object"] for item in answer["data"]} == {"pooling"} and answer["object"] == "list"
    np.testing.assert_allclose([item["data"] for item in answer["data"]], expected, atol=1e-5)
    for normalize in (True, False):
        status, answer, _ = server.request("/pooling", {"input": texts, "task": "token_embed", "normalize": normalize})
        for text, item in zip(texts, answer["data"]):
            with torch.no_grad():
                states = model(**fast(text, return_tensors="pt")).last_hidden_state[0]
            states = torch.nn.functional.normalize(states, dim=-1) if normalize else states
            np.testing.assert_allclose(item["data"], states, atol=1e-4)
    assert answer["usage"]["prompt_tokens"] == sum(len(fast(text)["input_ids"]) for text in texts)
    assert_error(server.request("/pooling", {"input": "x", "task": "classify"}), 409, "wrong task")
    # vLLM's tokenizer routes, as its tests ask them
    for add_special in (True, False):
        status, answer, _ = server.request("/tokenize", {"model": "m", "prompt": texts[2],
                                                         "add_special_tokens": add_special})
        ids = fast(texts[2], add_special_tokens=add_special)["input_ids"]
        # max_model_len: where MiniLM's inputs are cut, its layout's max_seq_length, as /info's max_input_length
        assert status == 200 and answer == {"count": len(ids), "max_model_len": 256, "tokens": ids,
                                            "token_strs": None}
    assert server.request("/info")[1]["max_input_length"] == 256
    status, answer, _ = server.request("/tokenize", {"prompt": texts[0], "return_token_strs": True})
    assert answer["token_strs"] == fast.convert_ids_to_tokens(fast(texts[0])["input_ids"])
    ids = fast(texts[0], add_special_tokens=False)["input_ids"]
    assert server.request("/detokenize", {"model": "m", "tokens": ids})[1] == {"prompt": fast.decode(ids)}
    assert_error(server.request("/detokenize", {"tokens": [10 ** 6]}), 422, "token id 1000000 is not in the model's")
    assert_error(server.request("/tokenize", {"prompt": "a", "text": "b"}), 422, '"prompt", one of them')
    assert server.request("/version")[1]["version"] and server.request("/ping", {})[0] == 200


def test_cohere_rerank_with_an_encoder(encoder_server, task_model_dirs):
    """An encoder ranks by the cosine similarity of the embeddings, as /rerank; a tagger is 409 in OpenAI's shape."""
    status, answer, _ = encoder_server.request("/v2/rerank", {"model": "m", "query": TEXTS[0], "documents": TEXTS,
                                                              "top_n": 2, "return_documents": True})
    _, ranked, _ = encoder_server.request("/rerank", {"query": TEXTS[0], "texts": TEXTS})
    assert status == 200 and set(answer) == {"id", "model", "results", "usage"}
    assert answer["results"] == [{"index": item["index"], "relevance_score": pytest.approx(item["score"], abs=1e-6),
                                  "document": {"text": TEXTS[item["index"]]}} for item in ranked[:2]]
    server = Server(task_model_dirs["ner"])
    try:
        assert_error(server.request("/v1/rerank", {"query": "q", "documents": ["a"]}), 409, "wrong task")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def masked_lm_dir(tmp_path_factory, tokenizer):
    """A tiny masked LM over MiniLM's vocabulary, its output bias peaked so that rankings are clear, saved as
    transformers saves a BertForMaskedLM."""
    from bertforge.pretraining import BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(make_config(tokenizer))
    with torch.no_grad():
        model.masked_lm.bias.normal_(0, 3)
    directory = tmp_path_factory.mktemp("masked_lm")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def same_fill(ours, theirs):
    """Equal answers of fill-mask: the same nesting, tokens and sequences, scores within float32 rounding."""
    if isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (ours, theirs)
        return all(same_fill(mine, other) for mine, other in zip(ours, theirs))
    assert {key: ours[key] for key in ("token", "token_str", "sequence")} == \
        {key: theirs[key] for key in ("token", "token_str", "sequence")}
    assert ours["score"] == pytest.approx(float(theirs["score"]), abs=1e-5)
    return True


def test_fill_mask_answers_as_the_transformers_pipeline(masked_lm_dir, encoder_server):
    """/fill_mask of a masked-LM checkpoint, through huggingface_hub's InferenceClient and as JSON, against
    transformers' fill-mask pipeline on the same folder: one mask, several, several texts, top_k and targets; the
    rows run by the batcher. The checkpoint still embeds as an encoder; one without the head is 409."""
    transformers = pytest.importorskip("transformers")
    huggingface_hub = pytest.importorskip("huggingface_hub")
    reference = transformers.pipeline("fill-mask", model=str(masked_lm_dir), device="cpu")
    texts = ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK], purring.", "I [MASK] this film!"]
    server = Server(masked_lm_dir, max_texts=3)
    try:
        client = huggingface_hub.InferenceClient(model=server.url + "/fill_mask")
        served = [vars(element) for element in client.fill_mask(texts[0])]
        assert same_fill(served, reference(texts[0])) and len(served) == 5
        served = [vars(element) for element in client.fill_mask(texts[2], top_k=2, targets=["love", "hate", "ok"])]
        assert same_fill(served, reference(texts[2], top_k=2, targets=["love", "hate", "ok"]))
        status, answers, _ = server.request("/fill_mask", {"inputs": texts, "parameters": {"top_k": 3}})
        assert status == 200 and same_fill(answers, reference(texts, top_k=3))  # texts, then masks, then tokens
        status, answer, _ = server.request("/fill_mask", {"inputs": texts[1:2]})
        assert status == 200 and same_fill(answer, reference(texts[1]))  # a list of one text: as the text alone
        assert server.request("/embed", {"inputs": texts[0]})[0] == 200
        assert_error(server.request("/fill_mask", {"inputs": [texts[0], "No mask here."]}), 422,
                     "text 1 has no [MASK] token")
        assert_error(server.request("/fill_mask", {"inputs": "word " * 70 + "[MASK]"}), 413, "text 0 is 73 tokens",
                     "limit is 64")
        assert_error(server.request("/fill_mask", {"inputs": texts + texts[:1]}), 413, "too many texts: 4")
    finally:
        server.stop()
    assert_error(encoder_server.request("/fill_mask", {"inputs": texts[0]}), 409, "no trained masked-LM head")


def test_api_key(make_server, encoder_dir):
    server = make_server(encoder_dir, api_key="s3cret")
    assert_error(server.request("/embed", {"texts": ["a"]}), 401, "API key")
    assert_error(server.request("/embed", {"texts": ["a"]}, headers={"Authorization": "Bearer wrong"}), 401)
    assert server.request("/embed", {"texts": ["a"]}, headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert server.request("/metrics", headers={"X-API-Key": "s3cret"})[0] == 200
    assert server.request("/health")[0] == 200  # for load balancers
    assert server.request("/")[0] == 200  # GET / is /health too, where TEI's probes ask
    assert_error(server.request("/", {"inputs": "a"}), 401, "API key")  # POST / predicts: the key is needed


def test_cors_lets_the_origins_given_call_from_a_browser(make_server, encoder_dir, encoder_server):
    server = make_server(encoder_dir, api_key="s3cret", cors_allow_origins=("https://app.example",))
    page = {"Origin": "https://app.example"}
    # The browser's preflight carries no key, and is answered
    status, _, headers = server.request("/embed", method="OPTIONS", headers={
        **page, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "authorization" in headers["Access-Control-Allow-Headers"].lower()
    status, body, headers = server.request("/embed", {"inputs": "a"},
                                           headers={**page, "Authorization": "Bearer s3cret"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "x-inference-time" in headers["Access-Control-Expose-Headers"]  # the page may read what it cost
    status, _, headers = server.request("/embed", {"inputs": "a"}, headers=page)  # the page can read its error
    assert status == 401 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    other = server.request("/embed", {"inputs": "a"}, headers={"Origin": "https://elsewhere.example",
                                                               "Authorization": "Bearer s3cret"})[2]
    assert "Access-Control-Allow-Origin" not in other
    assert "Access-Control-Allow-Origin" not in encoder_server.request("/embed", {"inputs": "a"}, headers=page)[2]
    with pytest.raises(ConfigError, match="CORS origin 'https://app.example/'"):
        ServeSettings(cors_allow_origins=("https://app.example/",))


# ---------------------------------------------------------------- schema conformance


@pytest.mark.parametrize("served", ["encoder_server", "classifier_server", "tagger_server", "qa_server",
                                    "colbert_server"])
def test_schemathesis_finds_no_server_error_or_schema_break(served, request):
    """Bounded: a few generated requests per route of each kind of model, each checked for 5xx and against its
    response schema."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    server = request.getfixturevalue(served)
    checks = [schemathesis.checks.not_a_server_error, schemathesis.checks.response_schema_conformance]
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate(base_url=server.url, checks=checks)

        check()


# ---------------------------------------------------------------- limits


def test_oversized_body_is_refused_before_it_is_read_while_health_answers(make_server, encoder_dir):
    server = make_server(encoder_dir, max_body_bytes=10_000)
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        # Declares 16 MB and sends none of it: the answer can only come from the header.
        connection.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 16000000\r\n\r\n")
        assert server.request("/health")[0] == 200  # meanwhile, other clients are served
        head = connection.recv(65536).decode()
    assert head.startswith("HTTP/1.1 413") and '"error"' in head and "limit is 10000" in head
    assert_error(server.request("/embed", json.dumps({"texts": ["x" * 20_000]}).encode()), 413, "limit is 10000")


def test_a_chunked_body_is_read_up_to_the_limit(make_server, encoder_dir):
    server = make_server(encoder_dir, max_body_bytes=10_000)
    port = int(server.url.rsplit(":", 1)[1])

    def send_chunked(body: bytes, declared: bytes = b"") -> str:
        request = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + declared
                   + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        for start in range(0, len(body), 4096):
            chunk = body[start:start + 4096]
            request += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        request += b"0\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            # In one write: a server that answers 413 part-way and closes with bytes of ours still unread resets
            # the connection, and a client still writing then gets the reset instead of the answer.
            connection.sendall(request)
            answer = b""
            while part := connection.recv(65536):
                answer += part
        return answer.decode()

    small = send_chunked(json.dumps({"texts": TEXTS}).encode())
    assert small.startswith("HTTP/1.1 200") and '"embeddings"' in small
    large = send_chunked(json.dumps({"texts": ["x" * 20_000]}).encode())
    assert large.startswith("HTTP/1.1 413") and "limit is 10000" in large
    # A small Content-Length beside a chunked body of any size: the parser reads the chunks, past the limit
    # checked on the length (a 300 MB body was read whole).
    smuggled = send_chunked(json.dumps({"texts": ["x" * 20_000]}).encode(), declared=b"Content-Length: 10\r\n")
    assert smuggled.startswith("HTTP/1.1 400") and "both Content-Length and Transfer-Encoding" in smuggled


def test_a_slow_client_is_cut_off(make_server, encoder_dir):
    server = make_server(encoder_dir, read_timeout=1.0)
    port = int(server.url.rsplit(":", 1)[1])
    body = json.dumps({"texts": ["a"]}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           + f"Content-Length: {len(body)}\r\n\r\n".encode())
        closed = False
        for byte in body:  # a byte every half second: the whole body would take several seconds
            try:
                connection.sendall(bytes([byte]))
                time.sleep(0.5)
                if connection.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                    closed = True
                    break
            except BlockingIOError:
                continue
            except OSError:
                closed = True
                break
        assert closed, "the server waited for the whole slow body"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as silent:  # headers never finished
        silent.sendall(b"GET /health HTTP/1.1\r\n")
        assert silent.recv(100) == b""  # closed by the server, not by the 30 s socket timeout
    assert server.request("/health")[0] == 200


def test_bounded_overload_answers_every_request_and_metrics_count_them(make_server, encoder_dir):
    server = make_server(encoder_dir, max_queue=16, max_texts=16, max_batch_size=8, max_wait_ms=1)
    bodies = [{"texts": TEXTS[:1]}, {"texts": TEXTS * 5}]  # one text, and fifteen
    calls = [lambda body=bodies[i % 2]: server.request("/embed", body) for i in range(48)]
    results = in_threads(calls)()
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    big = [status for (status, _, _), i in zip(results, range(48)) if i % 2]
    assert 200 in big  # large requests are admitted on the same terms as small ones, not starved
    metrics = server.request("/metrics")[1]
    served = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith('bertforge_requests_total{route="/embed",status="200"}'))
    assert served == statuses.count(200)
    rows = next(float(line.split()[1]) for line in metrics.splitlines() if line.startswith("bertforge_rows_total"))
    assert rows == sum(1 if i % 2 == 0 else 15 for i, status in enumerate(statuses) if status == 200)
    assert "bertforge_batch_size_bucket" in metrics and "bertforge_request_seconds_bucket" in metrics
    assert "bertforge_queue_depth 0.0" in metrics



# text-embeddings-inference's metric families: name -> type, as TEI's exporter declares them
TEI_FAMILIES = {"te_request_count": "counter", "te_request_success": "counter", "te_request_failure": "counter",
                "te_embed_count": "counter", "te_embed_success": "counter", "te_predict_count": "counter",
                "te_predict_success": "counter", "te_queue_size": "gauge", "te_request_input_length": "histogram",
                "te_batch_next_size": "histogram", "te_batch_next_tokens": "histogram",
                "te_request_duration": "histogram", "te_request_tokenization_duration": "histogram",
                "te_request_queue_duration": "histogram", "te_request_inference_duration": "histogram",
                **{f"te_{kind}_{part}duration": "histogram" for kind in ("embed", "predict")
                   for part in ("", "tokenization_", "queue_", "inference_")}}
TEI_DURATIONS = ("te_request_duration", "te_request_tokenization_duration", "te_request_queue_duration",
                 "te_request_inference_duration")


def assert_input_durations(samples: dict[str, float], kind: str) -> None:
    """te_embed_*_duration or te_predict_*_duration: one observation per input answered, each input's duration its
    tokenizing, queue and inference time."""
    parts = [f"te_{kind}_{part}_duration" for part in ("tokenization", "queue", "inference")]
    for name in (f"te_{kind}_duration", *parts):
        assert samples[f"{name}_count"] == samples[f"te_{kind}_success"], name
        assert samples[f"{name}_sum"] >= 0, name
    assert samples[f"te_{kind}_inference_duration_sum"] > 0
    assert samples[f"te_{kind}_duration_sum"] == pytest.approx(sum(samples[f"{name}_sum"] for name in parts))


def tei_samples(exposition: str) -> dict[str, float]:
    """The te_* samples of a /metrics page by their exact written name and labels ('te_request_count{method=
    "batch"}'), after checking that the page parses as Prometheus' text format and that each te_* family has TEI's
    type."""
    from prometheus_client.parser import text_string_to_metric_families

    types = {family.name: family.type for family in text_string_to_metric_families(exposition)}
    assert {name: kind for name, kind in types.items() if name.startswith("te_")} == \
        {name: kind for name, kind in TEI_FAMILIES.items() if name in types}
    samples = {}
    for line in exposition.splitlines():
        if line.startswith("te_"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_count_embed_requests_with_text_embeddings_inference_names(make_server, encoder_dir, tokenizer):
    """/metrics also gives TEI's families, by TEI's exact sample names (a counter without `_total`), labels and
    types: requests by method (single: one input; batch: a list) and by failure, the inputs embedded, each model
    input's tokens, the batches, the queue, the four duration histograms of the successful requests and those of
    each input embedded."""
    server = make_server(encoder_dir, max_texts=4, max_concurrent_requests=1, max_wait_ms=1)
    single = [("/embed", {"inputs": TEXTS[1]}), ("/v1/embeddings", {"input": TEXTS[0]})]
    batch = [("/embed", {"inputs": TEXTS}), ("/embed", {"inputs": TEXTS[:1]}), ("/v1/embeddings", {"input": TEXTS[:2]}),
             ("/embed_all", {"inputs": TEXTS[1:]}), ("/similarity", {"inputs": {"source_sentence": TEXTS[0],
                                                                              "sentences": TEXTS[1:]}})]
    for path, body in single + batch:
        assert server.request(path, body)[0] == 200, path
    texts = [TEXTS[1], TEXTS[0], *TEXTS, TEXTS[0], *TEXTS[:2], *TEXTS[1:], TEXTS[0], *TEXTS[1:]]
    assert server.request("/tokenize", {"inputs": TEXTS[0]})[0] == 200  # not one of TEI's counted routes
    refused = [(("/embed", {"inputs": TEXTS + TEXTS}), 413), (("/embed", {"inputs": [TEXTS[0], ""]}), 400),
               (("/embed", {"inputs": []}), 400), (("/embed_sparse", {"inputs": TEXTS[0]}), 409)]
    for (path, body), status in refused:
        assert server.request(path, body)[0] == status, (path, body)
    release = block_worker(server.batcher)  # a job of one token, run as a batch of its own
    try:
        join = in_threads([lambda: server.request("/embed", {"inputs": [TEXTS[2]]})])
        wait_until_queued(server.batcher, 1)
        assert tei_samples(server.request("/metrics")[1])["te_queue_size"] == 1
        assert server.request("/embed", {"inputs": TEXTS[0]})[0] == 429  # over --max-concurrent-requests
    finally:
        release.set()
    assert join()[0][0] == 200
    batch.append(("/embed", {"inputs": [TEXTS[2]]}))
    texts.append(TEXTS[2])
    samples = tei_samples(server.request("/metrics")[1])

    assert samples['te_request_count{method="single"}'] == len(single) + 1  # the model-type refusal's one text
    assert samples['te_request_count{method="batch"}'] == len(batch) + 3
    assert samples['te_request_success{method="single"}'] == len(single)
    assert samples['te_request_success{method="batch"}'] == len(batch)
    assert {name: value for name, value in samples.items() if name.startswith("te_request_failure")} == {
        'te_request_failure{err="batch_size"}': 1, 'te_request_failure{err="validation"}': 2,
        'te_request_failure{err="model_type"}': 1, 'te_request_failure{err="overloaded"}': 1}
    assert samples["te_embed_count"] == samples["te_embed_success"] == len(texts)
    assert "te_predict_count" not in samples
    lengths = [len(tokenizer(text)["input_ids"]) for text in texts] + [1]  # and the blocking job's
    assert samples["te_request_input_length_count"] == len(lengths)
    assert samples["te_request_input_length_sum"] == sum(lengths)
    assert samples['te_request_input_length_bucket{le="+Inf"}'] == len(lengths)
    assert samples['te_request_input_length_bucket{le="8.0"}'] == sum(length <= 8 for length in lengths)
    assert samples["te_batch_next_size_sum"] == len(lengths)
    assert samples["te_batch_next_tokens_sum"] == sum(lengths)
    assert samples["te_batch_next_size_count"] == samples['te_batch_next_size_bucket{le="+Inf"}'] >= len(batch)
    for name in TEI_DURATIONS:
        assert samples[f"{name}_count"] == len(single) + len(batch), name
        assert samples[f"{name}_sum"] >= 0, name
        assert samples[f'{name}_bucket{{le="+Inf"}}'] == len(single) + len(batch), name
    assert samples["te_request_duration_sum"] >= samples["te_request_inference_duration_sum"] > 0
    assert_input_durations(samples, "embed")
    assert samples["te_queue_size"] == 0
    exposition = server.request("/metrics")[1]
    assert f"\nte_embed_count {len(texts)}\n" in exposition and "te_embed_count_total" not in exposition
    assert not any(line.startswith("te_") and "_total" in line.split(" ")[0] for line in exposition.splitlines())
    assert 'bertforge_requests_total{route="/embed",status="200"} 4.0' in exposition  # bertforge's own, as before


def test_metrics_count_predict_and_rerank_requests_with_text_embeddings_inference_names(make_server,
                                                                                       classifier_dir, tokenizer):
    """A classifier's /predict and /rerank count in te_predict_count, per input (TEI's rerank predicts each
    (query, text) pair), their requests by method; an input over the model's length in err="tokenization"."""
    server = make_server(classifier_dir, max_wait_ms=1)
    query = "Which review is positive?"
    assert server.request("/predict", {"inputs": TEXTS[0]})[0] == 200  # single
    assert server.request("/predict", {"inputs": [[TEXTS[0]], [TEXTS[1]]]})[0] == 200  # batch of two
    assert server.request("/rerank", {"query": query, "texts": TEXTS})[0] == 200  # batch of three pairs
    assert server.request("/predict", {"inputs": "word " * 100, "truncate": False})[0] == 413  # too long
    samples = tei_samples(server.request("/metrics")[1])

    assert samples['te_request_count{method="single"}'] == 2
    assert samples['te_request_count{method="batch"}'] == 2
    assert samples['te_request_success{method="single"}'] == 1
    assert samples['te_request_success{method="batch"}'] == 2
    assert samples['te_request_failure{err="tokenization"}'] == 1
    assert samples["te_predict_count"] == 1 + 2 + 3 + 1  # the refused input was counted before tokenizing
    assert samples["te_predict_success"] == 1 + 2 + 3
    lengths = [len(tokenizer(text)["input_ids"]) for text in [TEXTS[0], TEXTS[0], TEXTS[1]]]
    lengths += [len(tokenizer(query, text)["input_ids"]) for text in TEXTS]
    assert samples["te_request_input_length_count"] == len(lengths)
    assert samples["te_request_input_length_sum"] == sum(lengths)
    for name in TEI_DURATIONS:
        assert samples[f"{name}_count"] == 3, name
    assert_input_durations(samples, "predict")
    assert "te_embed_count" not in samples

def test_token_budget_splits_batches(make_server, encoder_dir):
    server = make_server(encoder_dir, max_batch_size=64, max_batch_tokens=64, max_wait_ms=50)
    release = block_worker(server.batcher)
    try:
        join = in_threads([lambda: server.request("/embed", {"texts": ["word " * 20] * 8})])
        wait_until_queued(server.batcher, 8)
    finally:
        release.set()
    assert join()[0][0] == 200
    assert server.batcher.largest_batch == 2  # 22-token rows: two fit in 64 padded tokens, three don't


def test_shutdown_finishes_queued_work(make_server, encoder_dir):
    server = make_server(encoder_dir)
    release = block_worker(server.batcher)
    join = in_threads([lambda: server.request("/embed", {"texts": TEXTS})])
    wait_until_queued(server.batcher, len(TEXTS))
    server.server.should_exit = True  # as on SIGINT: stop accepting, finish what was asked
    release.set()
    [(status, body, _)] = join()
    assert status == 200 and len(body["embeddings"]) == len(TEXTS)
    server.thread.join(30)


@pytest.fixture(scope="module")
def prompted_server(minilm_dir, tmp_path_factory):
    """MiniLM with a query's, a document's and a classification prompt, as a sentence-transformers user saves it."""
    folder = tmp_path_factory.mktemp("prompted")
    shutil.copytree(minilm_dir, folder, dirs_exist_ok=True)
    config = folder / "config_sentence_transformers.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"prompts": {
        "query": "query: ", "document": "passage: ", "classification": "classify: "}}))
    yield from running(folder, max_texts=8)


def test_the_servers_default_prompt_is_text_embeddings_inferences(prompted_server, make_server, minilm_dir,
                                                                    classifier_dir, colbert_server, data_dir,
                                                                    run_cli, capsys):
    """--default-prompt-name and --default-prompt (text-embeddings-inference's flags): the prompt before each text
    whose request names none, as sentence-transformers' encode(prompt_name=...) and encode(prompt=...) put it; a
    request's own prompt_name still wins. Refused, in one line, where the model has no such prompt or is no encoder."""
    import numpy

    sentence_transformers = pytest.importorskip("sentence_transformers")
    texts = [row["sentence1"] for row in stsb_rows(data_dir, 4)]
    prompted = sentence_transformers.SentenceTransformer(str(prompted_server.directory), device="cpu")
    server = make_server(prompted_server.directory, default_prompt_name="document")
    status, body, _ = server.request("/embed", {"inputs": texts})
    assert status == 200
    numpy.testing.assert_allclose(body, prompted.encode(texts, prompt_name="document"), atol=1e-5)
    status, body, _ = server.request("/v1/embeddings", {"input": texts, "model": "m"})
    numpy.testing.assert_allclose([row["embedding"] for row in body["data"]],
                                  prompted.encode(texts, prompt_name="document"), atol=1e-5)
    status, body, _ = server.request("/embed", {"inputs": texts, "prompt_name": "query"})
    numpy.testing.assert_allclose(body, prompted.encode(texts, prompt_name="query"), atol=1e-5)

    plain = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    server = make_server(minilm_dir, default_prompt="query: ")
    status, body, _ = server.request("/embed", {"inputs": texts})
    numpy.testing.assert_allclose(body, plain.encode(texts, prompt="query: "), atol=1e-5)
    assert not numpy.allclose(body, plain.encode(texts), atol=1e-3)

    with pytest.raises(ConfigError, match="--default-prompt-name 'query': no such prompt in .*: it has no prompts"):
        load_app(minilm_dir, ServeSettings(default_prompt_name="query"))
    with pytest.raises(ConfigError, match="its prompts are 'classification', 'document', 'query'"):
        load_app(prompted_server.directory, ServeSettings(default_prompt_name="passage"))
    with pytest.raises(ConfigError, match="is a ColBERT model, which puts its query's or document's prompt"):
        load_app(colbert_server.directory, ServeSettings(default_prompt="query: "))
    with pytest.raises(ConfigError, match="give one default prompt"):
        ServeSettings(default_prompt_name="query", default_prompt="query: ")
    capsys.readouterr()  # sentence-transformers' progress bars
    code, _, err = run_cli("serve", "--model", str(classifier_dir), "--port", "0", "--default-prompt", "query: ")
    assert code == 1 and err.count("\n") == 1 and "is a fine-tuned classification model" in err


def test_cohere_clients_embed_as_sentence_transformers(prompted_server, data_dir):
    """Cohere's own clients, v1 and v2 APIs, get sentence-transformers' vectors of the same folder on real STS-B
    sentences: input_type as the prompt (a query's, a document's, one named classification; none for clustering),
    each embedding type (base64 of the floats, binary and ubinary as sentence-transformers packs them),
    output_dimension, v2's content inputs, max_tokens, the tokens billed, and errors the clients raise with the
    message."""
    import numpy

    cohere = pytest.importorskip("cohere")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from sentence_transformers.quantization import quantize_embeddings

    texts = [row["sentence1"] for row in stsb_rows(data_dir, 5)]
    reference = sentence_transformers.SentenceTransformer(str(prompted_server.directory), device="cpu")
    v1 = cohere.Client(api_key="unused", base_url=prompted_server.url, max_retries=0)
    v2 = cohere.ClientV2(api_key="unused", base_url=prompted_server.url, max_retries=0)

    answer = v1.embed(texts=texts, input_type="search_query")
    assert answer.response_type == "embeddings_floats" and answer.texts == texts
    numpy.testing.assert_allclose(answer.embeddings, reference.encode_query(texts), atol=1e-5)
    assert answer.meta.billed_units.input_tokens == sum(
        len(reference.tokenizer("query: " + text)["input_ids"]) for text in texts)
    documents = reference.encode_document(texts)
    answer = v2.embed(model="m", texts=texts, input_type="search_document",
                      embedding_types=["float", "base64", "binary", "ubinary"])
    numpy.testing.assert_allclose(answer.embeddings.float_, documents, atol=1e-5)
    decoded = [numpy.frombuffer(base64.b64decode(text), dtype="<f4") for text in answer.embeddings.base64]
    numpy.testing.assert_array_equal(decoded, numpy.array(answer.embeddings.float_, dtype=numpy.float32))
    for kind in ("binary", "ubinary"):
        assert getattr(answer.embeddings, kind) == quantize_embeddings(documents, kind).tolist()
    for input_type, prompt_name in (("classification", "classification"), ("clustering", None)):
        answer = v2.embed(model="m", texts=texts, input_type=input_type)
        numpy.testing.assert_allclose(answer.embeddings.float_, reference.encode(texts, prompt_name=prompt_name),
                                      atol=1e-5)
    inputs = [{"content": [{"type": "text", "text": text}]} for text in texts]
    answer = v2.embed(model="m", inputs=inputs, input_type="search_document", output_dimension=64)
    shortened = torch.nn.functional.normalize(torch.tensor(documents[:, :64]), dim=-1)
    numpy.testing.assert_allclose(answer.embeddings.float_, shortened.numpy(), atol=1e-5)
    with pytest.raises(cohere.errors.BadRequestError, match="int8 and uint8 need calibration ranges"):
        v2.embed(model="m", texts=texts, input_type="search_query", embedding_types=["int8"])
    with pytest.raises(cohere.core.api_error.ApiError) as raised:
        v2.embed(model="m", texts=[" ".join(texts) * 20], input_type="search_query", truncate="NONE")
    assert raised.value.status_code == 413
    assert v2.embed(model="m", texts=[" ".join(texts) * 20], input_type="search_query", truncate="START").texts
    with pytest.raises(cohere.errors.BadRequestError, match="output_dimension: 500 is more than the model's 384"):
        v2.embed(model="m", texts=texts, input_type="search_query", output_dimension=500)
    status, answer, _ = prompted_server.request("/v2/embed", {"texts": texts, "input_type": "image"})
    assert status == 400 and answer["error"]["message"] == "images: this server embeds text"
    # max_tokens: each text's first (END) or last (START) word pieces, where the reference tokenizer ends them
    spans = [reference.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
             for text in texts]
    assert all(len(pieces) > 6 for pieces in spans)
    firsts = [text[:pieces[5][1]] for text, pieces in zip(texts, spans)]
    lasts = [text[pieces[-6][0]:] for text, pieces in zip(texts, spans)]
    for truncate, kept in (("END", firsts), ("START", lasts)):
        answer = v2.embed(model="m", texts=texts, input_type="search_query", max_tokens=6, truncate=truncate)
        numpy.testing.assert_allclose(answer.embeddings.float_, reference.encode_query(kept), atol=1e-5)
        assert answer.texts == texts
    with pytest.raises(cohere.core.api_error.ApiError, match="8 word pieces long; the limit is 6") as raised:
        v2.embed(model="m", texts=["one two three four five six seven eight"], input_type="search_query",
                 max_tokens=6, truncate="NONE")
    assert raised.value.status_code == 413


def test_jina_embedding_requests(prompted_server, encoder_server, data_dir):
    """Jina's fields on /v1/embeddings: task as the prompt (retrieval.query and retrieval.passage those of
    encode_query and encode_document, another task the model's prompt of its name, if any), embedding_type binary
    and ubinary, normalized false, truncate; late_chunking is refused by name."""
    import numpy

    sentence_transformers = pytest.importorskip("sentence_transformers")
    from sentence_transformers.quantization import quantize_embeddings

    texts = [row["sentence1"] for row in stsb_rows(data_dir, 4)]
    reference = sentence_transformers.SentenceTransformer(str(prompted_server.directory), device="cpu")

    def vectors(**fields):
        status, answer, _ = prompted_server.request("/v1/embeddings", {"input": texts, "model": "m", **fields})
        assert status == 200, answer
        return [item["embedding"] for item in answer["data"]]

    numpy.testing.assert_allclose(vectors(task="retrieval.query"), reference.encode_query(texts), atol=1e-5)
    documents = reference.encode_document(texts)
    numpy.testing.assert_allclose(vectors(task="retrieval.passage"), documents, atol=1e-5)
    numpy.testing.assert_allclose(vectors(task="classification"),
                                  reference.encode(texts, prompt_name="classification"), atol=1e-5)
    numpy.testing.assert_allclose(vectors(task="text-matching"), reference.encode(texts), atol=1e-5)  # no prompt
    for kind in ("binary", "ubinary"):  # as integers, as Jina sends them; under its older name encoding_type too
        packed = quantize_embeddings(documents, kind).tolist()
        assert vectors(task="retrieval.passage", embedding_type=kind) == packed
        assert vectors(task="retrieval.passage", encoding_type=kind) == packed
        status, answer, _ = prompted_server.request("/v1/embeddings", {"input": texts, "embedding_type": kind})
        assert all(type(value) is int for item in answer["data"] for value in item["embedding"])
    # OpenAI reads "encoding_format": null (which litellm's openai provider sends) as float
    numpy.testing.assert_allclose(vectors(encoding_format=None), reference.encode(texts), atol=1e-5)
    long_text = " ".join(texts) * 20
    status, answer, _ = prompted_server.request("/v1/embeddings", {"input": [long_text], "truncate": False})
    assert status == 413
    status, _, _ = prompted_server.request("/v1/embeddings", {"input": [long_text], "truncate": True})
    assert status == 200
    status, answer, _ = prompted_server.request("/v1/embeddings", {"input": texts, "late_chunking": True})
    assert status == 400 and "late_chunking is not supported" in answer["error"]["message"]
    # a model whose layout does not normalize: its own vectors with normalized false, unit ones by default
    norms = {}
    for normalized in (None, False):
        status, answer, _ = encoder_server.request("/v1/embeddings", {"input": TEXTS, **(
            {} if normalized is None else {"normalized": normalized})})
        norms[normalized] = [numpy.linalg.norm(item["embedding"]) for item in answer["data"]]
    assert norms[None] == pytest.approx([1.0] * len(TEXTS)) and all(abs(norm - 1) > 0.01 for norm in norms[False])


def weaviate_request(text, **config) -> dict:
    """The body Weaviate's text2vec-transformers module sends (its Go struct, answer fields included and empty)."""
    return {"text": text, "dims": 0, "vector": None, "error": "", "config": config}


def test_weaviate_text2vec_transformers_gets_sentence_transformers_vectors(prompted_server, encoder_server,
                                                                          make_server, data_dir):
    """Weaviate's text2vec-transformers module, as its client and its inference image's tests call it: the probes,
    /meta, and /vectors (one text, or the batch format) giving what the image's sentence-transformers vectorizer
    gives, encode_document or encode_query (task_type) with unit length and truncate_dim (dimensions)."""
    import numpy

    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(prompted_server.directory), device="cpu")
    texts = [row["sentence1"] for row in stsb_rows(data_dir, 4)]
    for path in ("/vectors", "/vectors/"):
        status, body, _ = prompted_server.request(path, weaviate_request(texts[0], pooling_strategy="masked_mean",
                                                                         task_type="passage"))
        assert status == 200 and body["text"] == texts[0] and body["dim"] == body["dims"] == 384
        numpy.testing.assert_allclose(body["vector"], reference.encode_document(texts[0], normalize_embeddings=True),
                                      atol=1e-5)
    status, body, _ = prompted_server.request("/vectors", weaviate_request(texts[1], task_type="query",
                                                                           dimensions=64))
    assert status == 200 and body["dims"] == 64
    numpy.testing.assert_allclose(body["vector"], reference.encode_query(
        texts[1], normalize_embeddings=True, truncate_dim=64), atol=1e-5)
    # the module's batch format; a checkpoint with a pooling of its own keeps it whatever pooling_strategy says
    status, body, _ = prompted_server.request("/vectors", {"texts": texts, "config": {
        "pooling_strategy": "cls", "task_type": "passage"}})
    assert status == 200 and body["dims"] == 384
    numpy.testing.assert_allclose(body["vectors"], reference.encode_document(texts, normalize_embeddings=True),
                                  atol=1e-5)
    # a plain BERT checkpoint pools as pooling_strategy says: masked_mean (the module's default) or cls
    plain = {}
    for strategy, pooling in (("masked_mean", "mean"), ("cls", "cls"), (None, "mean")):
        config = {} if strategy is None else {"pooling_strategy": strategy}
        status, body, _ = encoder_server.request("/vectors", weaviate_request(texts[2], **config))
        expected = encoder_server.request("/embed", {"texts": [texts[2]], "pooling": pooling, "normalize": True})
        assert status == 200 and body["vector"] == pytest.approx(expected[1]["embeddings"][0], abs=1e-6)
        plain[strategy] = body["vector"]
    assert plain["cls"] != pytest.approx(plain["masked_mean"], abs=1e-3)

    keyed = make_server(prompted_server.directory, api_key="secret")
    for path in ("/.well-known/live", "/.well-known/ready"):  # probed without the key
        status, body, _ = keyed.request(path)
        assert status == 204 and body == ""
    assert keyed.request("/meta")[0] == 401
    status, body, _ = prompted_server.request("/meta")
    assert status == 200 and body["model"]["hidden_size"] == 384 and body["model"]["model_type"] == "bert"

    # errors come as {"error": ...}, which the module reports
    assert_error(prompted_server.request("/vectors", {"text": "a", "texts": ["b"]}), 422, '"text"', '"texts"')
    assert_error(prompted_server.request("/vectors", weaviate_request("a", pooling_strategy="max")), 422,
                 "pooling_strategy")
    assert_error(prompted_server.request("/vectors", {"texts": ["a"] * 9}), 413, "too many texts")
