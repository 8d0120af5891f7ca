"""How the server answers what goes wrong: one line of {"error": ...} (OpenAI's shape on the hosted APIs' routes,
limits.error_answer), the statuses every route may give as its OpenAPI document publishes them, and the handlers
that turn each kind of failure into its status."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from bertforge.errors import BertforgeError, InputError
from bertforge.inference.serve import schemas
from bertforge.inference.serve.limits import EMPTY, HTTPError, error_answer
from bertforge.inference.serve.metrics import tei_refused_empty
from bertforge.runtime import is_out_of_memory

logger = logging.getLogger("bertforge")

# Answers other than 200 that every JSON route may give, all as {"error": ..., "error_type": ...}.
ERROR_STATUSES = {400: "malformed request, or empty inputs", 401: "missing or wrong API key",
                  409: "the model can't do this", 413: "too large: body, texts or tokens over the server's limits",
                  415: "the body is not JSON (Content-Type)", 422: "invalid request",
                  429: "busy: the queue is full, or too many requests at once; retry",
                  503: "out of memory for the batch; retry"}
ERRORS = {status: {"model": schemas.ErrorResponse, "description": text} for status, text in ERROR_STATUSES.items()}
OPENAI_ERRORS = {400 if status == 422 else status: {"model": schemas.OpenAIErrorResponse, "description": text}
                 for status, text in ERROR_STATUSES.items()}
# An HTML page's errors are JSON all the same (a route's `model` would be published as its media type).
PAGE_ERRORS = {status: {"description": text, "content": {"application/json": {"schema": {
    "$ref": "#/components/schemas/ErrorResponse"}}}} for status, text in ERROR_STATUSES.items()}


def error(request: Request, status: int, message: str, headers: dict[str, str] | None = None,
          kind: str | None = None) -> JSONResponse:
    status, body = error_answer(request.url.path, status, message, kind)
    return JSONResponse(body, status_code=status, headers=headers)


def allowed_methods(request: Request) -> str:
    """Every method some route answers at the request's path (the framework names only the first route's: a path
    served by two routes, GET and HEAD /health, would be said to take one of them)."""
    methods = set()
    for route in request.app.routes:
        if route.matches(request.scope)[0] == Match.PARTIAL:  # the path matches, the method doesn't
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


async def http_error(request: Request, problem: HTTPError):
    retry = problem.status in (429, 503)
    headers = {"Retry-After": "1", **(problem.headers or {})} if retry else problem.headers
    return error(request, problem.status, problem.message, headers, problem.kind)


async def framework_error(request: Request, problem: StarletteHTTPException):  # 404, 405, ...
    headers = getattr(problem, "headers", None)
    if problem.status_code == 405:
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    return error(request, problem.status_code, str(problem.detail), headers)


async def user_error(request: Request, problem: BertforgeError):
    # What the task's own code finds wrong with a well-formed request (a target the model doesn't have, a pair for
    # a tagger) is the same kind of fault as what the request checks find: 422 for both.
    return error(request, 422 if isinstance(problem, InputError) else 400, str(problem))


async def invalid_request(request: Request, problem: RequestValidationError):
    problems = problem.errors()
    if any(item["type"] == "json_invalid" for item in problems):
        return error(request, 400, "the request body is not valid JSON")
    if any(item["type"] == "missing" and tuple(item["loc"]) == ("body",) for item in problems):
        return error(request, 400, "empty request body; send a JSON object")
    message = "; ".join(readable([{**item, "loc": tuple(part for part in item["loc"] if part != "body")}
                                  for item in problems]))
    # An empty list of inputs: TEI's 400, Empty. A field that takes a text or a list has each member refuse it, and
    # a route that takes two request forms (/rerank's own and Cohere's) has the other form's refusals beside it.
    empty = any(item["type"] == "too_short" and item.get("input") == [] for item in problems)
    if empty and not any(is_type_error(item) and item.get("input") != [] for item in problems):
        tei_refused_empty(request.url.path)
        return error(request, 400, "inputs cannot be empty: " + message, kind=EMPTY)
    return error(request, 422, "invalid request: " + message)


# How the tags pydantic gives the members of a union read in an error: each type, alone and in the plural
TYPE_WORDS = {"str": ("a text", "texts"), "int": ("an integer", "integers"), "float": ("a number", "numbers"),
              "bool": ("true or false", "booleans"), "dict": ("an object", "objects"), "none": ("null", "nulls")}


def is_member(part) -> bool:
    """Whether a part of an error's location names a union's member (list[int], function-after[...], a request
    class) rather than a field or an index."""
    return isinstance(part, str) and ("[" in part or part in TYPE_WORDS or part[:1].isupper())


def is_type_error(error: dict) -> bool:
    """Whether pydantic found a value of another type (not a value its type takes but its constraints refuse)."""
    return error["type"].endswith(("_type", "_parsing"))


def described(tag: str, plural: bool = False) -> str:
    """A union member's tag in words: list[int] -> "a list of integers", function-after[unicode_text(), str] ->
    "a text"."""
    if tag.startswith("function-"):  # a validated type: function-after[validator, type]
        return described(tag[tag.index("[") + 1:-1].rsplit(",", 1)[-1].strip(), plural)
    if tag.startswith("list["):
        return ("lists of " if plural else "a list of ") + described(tag[5:-1], plural=True)
    base = tag.split("[", 1)[0].lower()
    return TYPE_WORDS[base][plural] if base in TYPE_WORDS else tag


def distance(errors: list[dict]) -> tuple[int, int]:
    """How far a body is from one request's form: the fields it sends that the request doesn't take, then its
    other problems. {"parameters": {"candidate_labels": []}} is a zero-shot request with no label rather than a
    text classification's with a field too many."""
    return sum(item["type"] == "extra_forbidden" for item in errors), len(readable(errors))


def readable(problems: list[dict]) -> list[str]:
    """A request's validation errors as one message each, by field path. Where a field may take several forms (a
    union: a text, texts or token ids), one message says which forms it takes; where the whole body may be one
    of several requests (POST /), the errors of the request it comes closest to."""
    messages, unions = [], {}
    for item in problems:
        loc = item["loc"]
        at = next((index for index, part in enumerate(loc) if is_member(part)), None)
        if at is None:
            where = ".".join(map(str, loc))
            messages.append(f"{where}: {item['msg']}" if where else item["msg"])
        else:
            members = unions.setdefault(loc[:at], {})
            members.setdefault(loc[at], []).append({**item, "loc": loc[:at] + loc[at + 1:]})
    for path, members in unions.items():
        if not path and all(tag[:1].isupper() for tag in members):
            # the body: the request it comes closest to (the first of equals)
            messages.extend(readable(min(members.values(), key=distance)))
            continue
        # members whose form the value has, but not their constraints (an empty list where one item is needed)
        constrained = [errors for errors in members.values() if not any(map(is_type_error, errors))]
        if constrained:
            messages.extend(min((readable(errors) for errors in constrained), key=len))
        else:
            forms = [described(tag) for tag in members]
            listed = forms[0] if len(forms) == 1 else ", ".join(forms[:-1]) + " or " + forms[-1]
            messages.append(f"{'.'.join(map(str, path))}: expected {listed}")
    return messages


async def client_gone(request: Request, problem: ClientDisconnect):
    return Response(status_code=400)  # nobody reads it; not an error of the server's


async def unexpected_error(request: Request, problem: Exception):
    if is_out_of_memory(problem):  # the batch this request was in, at this moment: it may fit later, or smaller
        logger.warning("%s %s: out of memory", request.method, request.url.path)
        return error(request, 503, "the server ran out of memory on this request's batch; retry, or send fewer or "
                                   "shorter texts", {"Retry-After": "1"})
    logger.error("%s %s failed", request.method, request.url.path, exc_info=problem)
    return error(request, 500, "internal server error")


# kind of failure -> its handler
HANDLERS = {HTTPError: http_error, StarletteHTTPException: framework_error, BertforgeError: user_error,
            RequestValidationError: invalid_request, ClientDisconnect: client_gone, Exception: unexpected_error}


def add_error_handlers(app: FastAPI) -> None:
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
