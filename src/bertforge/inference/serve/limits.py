"""What keeps one client from holding the server: an API key, a body size limit checked before the body is read, a
limit on the requests the model's routes take at once, and a deadline for reading each request (a client sending a
byte a second, or holding a silent connection, is cut off). Also where every request's route, status and time are
counted."""

from __future__ import annotations

import hmac
import json
import time

from bertforge.inference.serve.metrics import REQUEST_COST, RequestCost, tei_failure

HEALTH_PATH = "/health"  # answered without the API key, so that load balancers can probe it
# The probes of Weaviate's text2vec-transformers module and SageMaker's /ping (TEI serves it), keyless as well.
PROBE_PATHS = (HEALTH_PATH, "/ping", "/.well-known/live", "/.well-known/ready")
# The hosted APIs' routes (OpenAI's embeddings, Cohere's rerank) answer errors as OpenAI does, so that their clients
# read them (vLLM answers its Cohere-style rerank routes so too); OpenAI's routes are also served without /v1, as
# Infinity serves them and as the openai client calls them given the server's bare URL; vLLM's own /score,
# /classify and /pooling answer in OpenAI's shape too.
HOSTED_API_PREFIXES = ("/v1/", "/v2/", "/embeddings", "/models", "/multi-vector", "/score", "/classify",
                       "/pooling")
OPENAI_ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


# text-embeddings-inference's error_type of an error answered with this status (else Validation; an empty input is
# Empty, said where it is found).
# A full queue is 429, as text-embeddings-inference answers it (its clients and the openai client retry on it).
TEI_ERROR_TYPES = {409: "Backend", 429: "Overloaded", 500: "Backend", 503: "Overloaded"}
EMPTY = "Empty"


class HTTPError(Exception):
    """An error answered with its status and {"error": message, "error_type": kind (TEI's; by status if None)}."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.headers, self.kind = status, message, headers, kind


def error_answer(path: str, status: int, message: str, kind: str | None = None) -> tuple[int, dict]:
    """(status, body) of an error: {"error": message, "error_type": kind}, as text-embeddings-inference answers;
    on the hosted APIs' routes, OpenAI's shape and its 400 for an invalid request (where bertforge's own routes
    say 422)."""
    if not path.startswith(HOSTED_API_PREFIXES):
        return status, {"error": message, "error_type": kind or TEI_ERROR_TYPES.get(status, "Validation")}
    status = 400 if status == 422 else status
    kind = OPENAI_ERROR_TYPES.get(status, "invalid_request_error")
    return status, {"error": {"message": message, "type": kind, "param": None, "code": None}}


async def send_error(send, path: str, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    """Answer with an error straight from the ASGI layer (before the application runs)."""
    status, answer = error_answer(path, status, message)
    body = json.dumps(answer).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(name.encode(), value.encode()) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def is_json(content_type: bytes | None) -> bool:
    """Whether a request's Content-Type lets its body be read as JSON: none given (the framework reads JSON then),
    application/json, or a JSON-based type (application/problem+json)."""
    if content_type is None:
        return True
    media = content_type.split(b";")[0].strip().lower()
    return media in (b"", b"application/json", b"*/*") or media.endswith(b"+json")


class RequestGuard:
    """ASGI middleware: the API key, the body size, the requests in flight on the model's routes, and metrics per
    request (route, status, seconds); an answer for which the model ran says what it cost in
    text-embeddings-inference's headers."""

    def __init__(self, app, max_body_bytes: int, api_key: str | None, metrics, routes: set[str],
                 compute_type: str = "cpu", max_concurrent_requests: int | None = None,
                 model_routes: set[tuple[str, str]] = frozenset()):
        self.app, self.max_body_bytes, self.api_key, self.metrics = app, max_body_bytes, api_key, metrics
        self.routes = routes  # metric labels: the application's own paths, "other" for the rest
        self.compute_type = compute_type  # x-compute-type: cpu or gpu
        # (method, path) of the routes that run the model: at most max_concurrent_requests of their requests are in
        # flight at once (None: no limit), as text-embeddings-inference limits its inference routes. Probes,
        # /metrics, /info, the docs and the tokenizer's routes are not counted, so that they answer under any load.
        self.max_concurrent_requests, self.model_routes = max_concurrent_requests, model_routes
        self.in_flight = 0  # requests of those routes admitted and not yet answered (one event loop: no lock)

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"authorization", b"").decode("latin-1")
        token = given[7:] if given[:7].lower() == "bearer " else headers.get(b"x-api-key", b"").decode("latin-1")
        return hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.monotonic(), [500]
        route = scope["path"] if scope["path"] in self.routes else "other"
        cost = RequestCost()
        token = REQUEST_COST.set(cost)  # this request's task and the threads it starts see it

        async def recording_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if status[0] == 200 and cost.rows:
                    headers = cost.headers(time.monotonic() - started, self.compute_type)
                    message = {**message, "headers": [*message.get("headers", ()), *headers]}
            await send(message)

        try:
            await self.guard(scope, receive, recording_send)
        finally:
            REQUEST_COST.reset(token)
            self.metrics.count_request(route, status[0], time.monotonic() - started, scope["path"], cost)

    async def guard(self, scope, receive, send):
        headers, path = dict(scope["headers"]), scope["path"]
        # GET / is /health too (TEI's probes ask there); POST / is a prediction, and needs the key
        probe = path in PROBE_PATHS or path == "/" and scope.get("method") in ("GET", "HEAD")
        if self.api_key is not None and not probe and not self.authorized(headers):
            return await send_error(send, path, 401, "missing or wrong API key: send the header "
                                                     "'Authorization: Bearer KEY'", {"www-authenticate": "Bearer"})
        if scope.get("method") in ("POST", "PUT") and not is_json(headers.get(b"content-type")):
            # as TEI answers: a form or plain text would otherwise read as no JSON object at all (422)
            return await send_error(send, path, 415, "the body must be JSON: send the header 'Content-Type: "
                                                     "application/json'")
        declared = headers.get(b"content-length")
        if declared is not None and any(name == b"transfer-encoding" for name, _ in scope["headers"]):
            # The server's HTTP parser reads such a body as chunked, of any size, past the length checked here:
            # refused, as RFC 9112 (6.1) allows and proxies do (the two headers together are request smuggling).
            return await send_error(send, path, 400, "a request may not have both Content-Length and "
                                                     "Transfer-Encoding", {"connection": "close"})
        if declared is not None:
            if not declared.isdigit():
                return await send_error(send, path, 400, "the Content-Length header is not a number")
            if int(declared) > self.max_body_bytes:
                return await send_error(send, path, 413, self.too_large(int(declared)), {"connection": "close"})
            return await self.admit(scope, receive, send)
        # A chunked body declares no length: it is read here, up to the limit, and handed on whole (an error
        # raised while the application reads it would reach the client as the framework's 400).
        chunks, received, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > self.max_body_bytes:
                return await send_error(send, path, 413, self.too_large(received), {"connection": "close"})
            more = message.get("more_body", False)
        whole = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return whole.pop() if whole else await receive()

        await self.admit(scope, replay, send)

    async def admit(self, scope, receive, send):
        """Run the application; a request of a model route finding max_concurrent_requests others in flight gets
        429 (text-embeddings-inference's "Overloaded"), which clients retry."""
        method = "GET" if scope.get("method") == "HEAD" else scope.get("method")  # HEAD runs the GET route
        if self.max_concurrent_requests is None or (method, scope["path"]) not in self.model_routes:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.max_concurrent_requests:
            tei_failure("overloaded")  # as TEI counts a request finding no permit
            return await send_error(send, scope["path"], 429, f"the server is busy: it takes "
                                    f"{self.max_concurrent_requests} requests at once "
                                    f"(--max-concurrent-requests); retry", {"retry-after": "1"})
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    def too_large(self, size: int) -> str:
        return f"the request body is {size} bytes or more; the limit is {self.max_body_bytes}"


def protocol_with_read_timeout(seconds: float) -> type:
    """uvicorn's HTTP/1.1 protocol with a deadline: a connection must deliver each whole request (headers and
    body) within `seconds` of opening or of its previous answer, else it is closed. uvicorn itself times out only
    idle keep-alive connections, so a client sending a byte a second would hold its connection forever."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ReadDeadlineProtocol(H11Protocol):
        _deadline = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self):
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self):
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._cut_off)

        def _disarm(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _cut_off(self):
            self._deadline = None
            # IDLE: the request's headers haven't all come; SEND_BODY: its body hasn't. DONE: the server is working.
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                self.transport.close()

    return ReadDeadlineProtocol
