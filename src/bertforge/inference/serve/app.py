"""The HTTP application over one model (FastAPI): thin routes over the task rows of tasks/registry.py.

/predict encodes with the task's own `encode`, with the settings the model was trained with (max_length, windows,
decoding, doc stride), runs the rows through the micro-batcher and decodes with the task's own `decode`, so its
answers are `bertforge predict`'s. A ColBERT model's token vectors are MultiVectorEncoder's (at /v1/embeddings, as
PyLate's server gives them, and Jina's /v1/multi-vector), and its MaxSim scores rank at /rerank and the Cohere
routes. Also /embed, OpenAI's /v1/embeddings and /v1/models, Cohere's /v1/embed and /v2/embed, /rerank, /tokenize,
/attention, /explain (bertforge.explain), /health, /metrics and an offline /docs page; and text-embeddings-inference's
API for its clients (serve/tei.py): {"inputs": ...} on /embed, /predict and /tokenize, its /embed_all, /similarity,
/decode and /info, and POST / (what huggingface_hub's InferenceClient sends to a server's URL; its token
classification, question answering and zero-shot classification are the Hugging Face Inference API's, answered by
transformers' pipelines of those tasks, inference/pipelines.py, whose rows the batcher runs).
"""

import asyncio
import copy
import dataclasses
import logging
import math
import socket
import uuid
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.checkpoint.sentence_transformers import SentenceEmbedding, SpladePooling, multi_vector_kind
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, InputError
from bertforge.explain.methods import DEFAULT_STEPS
from bertforge.explain.page import explained
from bertforge.inference.attention_view import (
    attention_map,
    attention_weights,
    encode_for_attention,
    render_attention_map,
)
from bertforge.inference.features import (
    after_pooling,
    embedding_texts,
    pool,
    pooling_mask,
    prompt_length,
    sentence_embedding,
)
from bertforge.inference.fill_mask import mask_positions, top_tokens
from bertforge.inference.multi_vector_encoder import MultiVectorEncoder
from bertforge.inference.multi_vector_encoder import first_dimensions as first_token_dimensions
from bertforge.inference.optimize import AS_TRAINED, InferenceOptions
from bertforge.inference.pipelines import MASKED_LM_ARCHITECTURES, Pipeline, fill_answer, target_ids
from bertforge.inference.serve.batcher import Job, MicroBatcher, QueueFull
from bertforge.inference.serve.cohere import (
    TRUNCATION,
    check_embedding_types,
    document_text,
    float32_base64,
    returned_document,
    typed_embeddings,
)
from bertforge.inference.serve.docs import render_docs
from bertforge.inference.serve.input_types import ROLES, input_prompt
from bertforge.inference.serve.limits import (
    HEALTH_PATH,
    HTTPError,
    RequestGuard,
    error_answer,
    protocol_with_read_timeout,
)
from bertforge.inference.serve.metrics import ServerMetrics
from bertforge.inference.serve.settings import ServeSettings
from bertforge.inference.serve.tei import SCORE_FUNCTIONS, TASK_SCORES, predict_inputs, ranked_scores, simple_tokens
from bertforge.inference.sparse_encoder import (
    SPLADE,
    is_splade_checkpoint,
    keep_largest,
    load_splade_model,
    nonzero_weights,
    splade_rows,
)
from bertforge.pretraining import BertForMaskedLM
from bertforge.runtime import is_out_of_memory
from bertforge.tasks import classification
from bertforge.tasks.data import Features, forward_rows
from bertforge.tasks.registry import HEADS, Checkpoint, Task, inspect_checkpoint, task_defaults, task_of_model
from bertforge.tokenizer import BertTokenizer

logger = logging.getLogger("bertforge")

# Answers other than 200 that every JSON route may give, all as {"error": ...}.
UNLIMITED = 1 << 30  # tokens: where nothing is cut (no text is this long)
MULTI_VECTOR = "multi_vector"  # /info's pooling of a multi-vector (ColBERT) model: none, a vector per token
ERROR_STATUSES = {400: "malformed request", 401: "missing or wrong API key", 409: "the model can't do this",
                  413: "too large: body, texts or tokens over the server's limits", 422: "invalid request",
                  503: "busy (the queue is full) or out of memory for the batch; retry"}


def encoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The bare encoder of a model: itself, or a task model's `.bert`."""
    return getattr(model, "bert", model)


# ---------------------------------------------------------------- what the batcher's worker runs per kind of job

def pooled_vectors(model: torch.nn.Module, jobs: list[Job]) -> list[torch.Tensor]:
    """One pooled last-layer vector per job (options: pooling, normalize, and the first positions left out of
    pooling: see features.prompt_length)."""
    hidden = forward_rows(encoder_of(model), [job.row for job in jobs], lambda output: (output.last_hidden_state,))
    vectors = []
    for job, (states,) in zip(jobs, hidden):  # states: (seq, hidden), this row's real tokens only
        mask = pooling_mask(torch.ones(1, len(states), dtype=torch.long), job.options["left_out"])
        vector = pool(states[None], mask, job.options["pooling"])
        vectors.append(after_pooling(encoder_of(model), vector, job.options["normalize"])[0])
    return vectors


def splade_vectors(splade: SpladePooling, max_active_dims: int | None):
    """The worker's function for a SPLADE model's rows: one (vocab,) vector each, from the masked-LM logits pooled
    as `splade` says, its `max_active_dims` largest weights kept (None: all)."""
    def run(model: torch.nn.Module, jobs: list[Job]) -> list[torch.Tensor]:
        vectors = splade_rows(model, [job.row for job in jobs], splade)
        return list(keep_largest(vectors, max_active_dims).cpu())
    return run


def multi_vector_rows(encoder: MultiVectorEncoder, role: str):
    """The worker's function for a multi-vector (ColBERT) model's rows of one role ("query" or "document"): each
    row's scored token vectors, (tokens, dim), as `encoder` encodes a text of that role."""
    def run(model: torch.nn.Module, jobs: list[Job]) -> list[torch.Tensor]:
        return [vectors.cpu() for vectors in encoder.token_vectors([job.row["input_ids"] for job in jobs], role)]
    return run


def token_vectors(model: torch.nn.Module, jobs: list[Job]) -> list[torch.Tensor]:
    """The last layer's (seq, hidden) vectors of each job's tokens, [CLS] and [SEP] included."""
    rows = forward_rows(encoder_of(model), [job.row for job in jobs], lambda output: (output.last_hidden_state,))
    return [states for (states,) in rows]


def attentions(model: torch.nn.Module, jobs: list[Job]) -> list[torch.Tensor]:
    """(layers, heads, seq, seq) weights per job; one forward per text, as each page shows one text."""
    return [attention_weights(model, job.row["input_ids"], job.row["token_type_ids"]) for job in jobs]


def explanations(model: torch.nn.Module, jobs: list[Job]) -> list[dict[str, Any] | str]:
    """/explain's answer per job (bertforge.explain's dict, or its page), out of the worker's inference mode: the
    attributions need gradients."""
    with torch.inference_mode(False):
        return [explained(model, **job.options) for job in jobs]


def masked_token_probabilities(head: torch.nn.Module):
    """/fill_mask's answer per job: every token's probability at the row's [MASK] positions (job.options["masks"]),
    the masked-LM head applied there alone (not to every position of the batch, a vocabulary wide each)."""
    def run(model: torch.nn.Module, jobs: list[Job]) -> list[torch.Tensor]:
        encoder = encoder_of(model)
        hidden = forward_rows(encoder, [job.row for job in jobs], lambda output: (output.last_hidden_state,))
        words = encoder.embeddings.tokens.weight  # the decoder, tied (an untied head holds its own)
        return [head(states[job.options["masks"]].to(words.device, words.dtype), words).float().softmax(-1).cpu()
                for job, (states,) in zip(jobs, hidden)]
    return run


def rows_read(read):
    """The worker's function for rows whose outputs `read(model output)` picks (a task's: what its `decode`
    reads), per row."""
    def run(model: torch.nn.Module, jobs: list[Job]) -> list[tuple[torch.Tensor, ...]]:
        return forward_rows(model, [job.row for job in jobs], read)
    return run


# ---------------------------------------------------------------- the application

def create_app(model: torch.nn.Module, tokenizer: BertTokenizer, settings: ServeSettings | None = None,
               model_name: str = "model", checkpoint: Checkpoint | None = None,
               masked_lm: torch.nn.Module | None = None):
    """The FastAPI application; its micro-batcher starts now and finishes its queue when the application stops.

    `checkpoint` (inspect_checkpoint of the model's directory) says the task and the settings it was trained with;
    without it, an in-memory task model does its head's task with the task's default settings. `masked_lm`: an
    encoder's trained masked-LM head, for /fill_mask (a masked-LM model's own, by default). A MultiVectorEncoder
    (ColBERT) is served as one: token vectors per query or document, MaxSim scores.
    """
    # FastAPI is imported here, so that the CLI and the rest of the library run without it. No postponed
    # annotations in this module: FastAPI must see the request classes as objects, not names.
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect
    from starlette.routing import Match

    from bertforge.inference.serve import schemas

    # The Inference API's requests at POST / of the tasks answered by transformers' pipelines, by pipeline task
    pipeline_requests = {"token-classification": schemas.TokenClassificationRequest,
                         "question-answering": schemas.QuestionAnsweringRequest,
                         "zero-shot-classification": schemas.ZeroShotRequest}
    settings = settings or ServeSettings()
    colbert = model if isinstance(model, MultiVectorEncoder) else None
    if colbert is not None:
        model = colbert.model  # what the batcher runs; `colbert` adds its query [MASK]s, projection and skiplist
    if checkpoint is not None:
        task = checkpoint.task_for() if checkpoint.task is not None else None
        run = checkpoint.settings() if task is not None else None
    else:
        task = task_of_model(model)
        run = task_defaults(task.name, model.config.max_position_embeddings) if task is not None else None
    if task is not None:
        if run.max_length > model.config.max_position_embeddings:
            raise ConfigError(f"{model_name}: trained with max_length {run.max_length}, more than the model's "
                              f"{model.config.max_position_embeddings} positions")
        try:  # encoding no examples checks the window sizes now, rather than failing every request
            task.encode(tokenizer, [], run.settings, model.config.id2label)
        except ConfigError as error:
            raise ConfigError(f"{model_name}: can't encode with its settings: {error}") from None
    max_length = min(settings.max_length, model.config.max_position_embeddings, tokenizer.model_max_length)
    attention_max_length = min(settings.attention_max_length, max_length)
    truncate = settings.long_text == "truncate"
    # TEI's truncation_direction, per request: a tokenizer for each side (they share the vocabulary)
    tokenizers = {"right": copy.copy(tokenizer), "left": copy.copy(tokenizer)}
    for side, sided in tokenizers.items():
        sided.truncation_side = side
    device = next(model.parameters()).device
    if masked_lm is None and task is None:
        masked_lm = getattr(model, "masked_lm", None)
    if masked_lm is not None:
        words = encoder_of(model).embeddings.tokens.weight
        masked_lm = masked_lm.to(words.device, words.dtype).eval()
    run_fill = masked_token_probabilities(masked_lm) if masked_lm is not None else None
    run_rows = rows_read(task.outputs) if task is not None else None
    # transformers' pipelines, for the Inference API's tasks at POST /, read texts as this server cuts them
    pipeline_tokenizer = copy.copy(tokenizer)
    pipeline_tokenizer.model_max_length = max_length
    # A SPLADE model (sentence-transformers' SparseEncoder layout): its vectors are the masked-LM head's weights per
    # vocabulary entry, compared by dot product and never normalized, as text-embeddings-inference serves them.
    layout = getattr(model, "sentence_embedding", None) if task is None else None
    splade = layout.splade if layout is not None else None
    compared = None if splade is not None else True  # embed's `normalize` for vectors to compare: cosine, or dot
    run_splade = splade_vectors(splade, layout.max_active_dims) if splade is not None else None
    run_multi_vector = {role: multi_vector_rows(colbert, role) for role in ("query", "document")} \
        if colbert is not None else None

    metrics = ServerMetrics(lambda: batcher.pending)
    batcher = MicroBatcher(model, settings.max_batch_size, settings.max_batch_tokens, settings.max_wait_ms,
                           settings.max_queue, on_batch=lambda jobs: metrics.count_batch([job.length for job in jobs]))

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(batcher.stop)  # finishes what is queued

    app = FastAPI(title="bertforge", summary=f"BERT inference over {model_name}", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.model, app.state.tokenizer, app.state.batcher = model, tokenizer, batcher
    app.state.settings, app.state.metrics, app.state.task = settings, metrics, task
    errors = {status: {"model": schemas.ErrorResponse, "description": text} for status, text in ERROR_STATUSES.items()}
    openai_errors = {400 if status == 422 else status: {"model": schemas.OpenAIErrorResponse, "description": text}
                     for status, text in ERROR_STATUSES.items()}
    # An HTML page's errors are JSON all the same (a route's `model` would be published as its media type).
    page_errors = {status: {"description": text, "content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/ErrorResponse"}}}} for status, text in ERROR_STATUSES.items()}

    def error(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        status, body = error_answer(request.url.path, status, message)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(HTTPError)
    async def http_error(request: Request, problem: HTTPError):
        headers = {"Retry-After": "1", **(problem.headers or {})} if problem.status == 503 else problem.headers
        return error(request, problem.status, problem.message, headers)

    def allowed_methods(request: Request) -> str:
        """Every method some route answers at the request's path (the framework names only the first route's: a
        path served by two routes, GET and HEAD /health, would be said to take one of them)."""
        methods = set()
        for route in app.routes:
            if route.matches(request.scope)[0] == Match.PARTIAL:  # the path matches, the method doesn't
                methods |= getattr(route, "methods", None) or set()
        return ", ".join(sorted(methods))

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, problem: StarletteHTTPException):  # 404, 405, ...
        headers = getattr(problem, "headers", None)
        if problem.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return error(request, problem.status_code, str(problem.detail), headers)

    @app.exception_handler(BertforgeError)
    async def user_error(request: Request, problem: BertforgeError):
        # What the task's own code finds wrong with a well-formed request (a target the model doesn't have, a pair
        # for a tagger) is the same kind of fault as what the request checks find: 422 for both.
        return error(request, 422 if isinstance(problem, InputError) else 400, str(problem))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, problem: RequestValidationError):
        problems = problem.errors()
        if any(item["type"] == "json_invalid" for item in problems):
            return error(request, 400, "the request body is not valid JSON")
        if any(item["type"] == "missing" and tuple(item["loc"]) == ("body",) for item in problems):
            return error(request, 400, "empty request body; send a JSON object")
        messages = []
        for item in problems:
            where = ".".join(str(part) for part in item["loc"] if part != "body")
            messages.append(f"{where}: {item['msg']}" if where else item["msg"])
        return error(request, 422, "invalid request: " + "; ".join(messages))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, problem: ClientDisconnect):
        return Response(status_code=400)  # nobody reads it; not an error of the server's

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, problem: Exception):
        if is_out_of_memory(problem):  # the batch this request was in, at this moment: it may fit later, or smaller
            logger.warning("%s %s: out of memory", request.method, request.url.path)
            return error(request, 503, "the server ran out of memory on this request's batch; retry, or send fewer "
                                       "or shorter texts", {"Retry-After": "1"})
        logger.error("%s %s failed", request.method, request.url.path, exc_info=problem)
        return error(request, 500, "internal server error")

    # ------------------------------------------------------------ helpers the routes share

    def check_count(count: int, what: str = "texts") -> None:
        if count > settings.max_texts:
            raise HTTPError(413, f"too many {what}: {count}; the limit is {settings.max_texts} per request")

    def refused(what: str, limit: int, asked: bool | None) -> HTTPError:
        """413 for input over `limit` tokens; `asked`: the request's own truncate, if it said."""
        why = "the request asked not to truncate" if asked is False else "this server refuses long texts rather " \
                                                                         "than truncating"
        return HTTPError(413, f"{what}; the limit is {limit} ({why})")

    def encode_texts(texts: list[str], pairs: list[str] | None = None, limit: int = max_length,
                     with_offsets: bool = False, cut: bool | None = None, side: str = "right",
                     add_special_tokens: bool = True) -> list[dict[str, list]]:
        """One row per text (or pair) within `limit` tokens: truncated (`cut`, by default the server's policy; at
        the end `side` says), or 413."""
        asked, cut = cut, truncate if cut is None else cut
        encoded = tokenizers[side.lower()](texts, text_pair=pairs, truncation=cut, max_length=limit,
                                           return_offsets_mapping=with_offsets, return_special_tokens_mask=with_offsets,
                                           add_special_tokens=add_special_tokens)
        rows = [{name: values[i] for name, values in encoded.items()} for i in range(len(texts))]
        for index, row in enumerate(rows):
            if len(row["input_ids"]) > limit:
                raise refused(f"text {index} is {len(row['input_ids'])} tokens long", limit, asked)
        return rows

    def check_ids(id_lists: list[list[int]]) -> None:
        for index, ids in enumerate(id_lists):
            unknown = next((i for i in ids if not 0 <= i < model.config.vocab_size), None)
            if unknown is not None:
                raise HTTPError(422, f"input {index}: token id {unknown} is not in the model's vocabulary "
                                     f"(0 to {model.config.vocab_size - 1})")

    def id_rows(id_lists: list[list[int]], limit: int, asked: bool | None, side: str = "right"
                ) -> list[dict[str, list]]:
        """Rows of token ids sent as they are (OpenAI's and text-embeddings-inference's token input), cut or
        refused as `asked` (the request's truncate), else as the server's policy."""
        check_ids(id_lists)
        rows = []
        for index, ids in enumerate(id_lists):
            if len(ids) > limit and not (truncate if asked is None else asked):
                raise refused(f"input {index} is {len(ids)} tokens long", limit, asked)
            ids = ids[:limit] if side.lower() == "right" else ids[-limit:]
            rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)})
        return rows

    def submitted(jobs: list[Job]) -> list[Future]:
        if len(jobs) > settings.max_queue:  # it could never be queued: 503 would mean "retry" forever
            raise HTTPError(413, f"the request makes {len(jobs)} model inputs; the limit is {settings.max_queue}")
        try:
            return batcher.submit(jobs)
        except QueueFull as problem:
            raise HTTPError(503, str(problem)) from None

    async def run_jobs(jobs: list[Job]) -> list[Any]:
        return await asyncio.gather(*(asyncio.wrap_future(future) for future in submitted(jobs)))

    def batcher_rows(features: Features, read) -> list[tuple[torch.Tensor, ...]]:
        """A pipeline's rows, run by the batcher (a pipeline runs in a worker thread, which waits for them)."""
        longest = max(features.lengths(), default=0)
        if longest > max_length:
            raise HTTPError(413, f"the request makes model inputs of {longest} tokens; the limit is {max_length}")
        return [future.result() for future in submitted([Job(rows_read(read), row) for row in features.rows])]

    def embedding_limit(used: SentenceEmbedding) -> int:
        """Where long texts are cut, or refused: the smaller of the server's and the layout's max_length."""
        return max_length if used.max_length is None else min(max_length, used.max_length)

    async def input_rows(inputs: list[str] | list[list[int]], used: SentenceEmbedding, cut: bool | None,
                         side: str, prompt_name: str | None = None, prompt: str | None = None
                         ) -> list[dict[str, list]]:
        """Model rows of texts (after the prompt, as the sentence-transformers layout reads them) or of lists of
        token ids (as they are)."""
        limit = embedding_limit(used)
        if inputs and isinstance(inputs[0], list):
            return id_rows(inputs, limit, cut, side)
        texts = embedding_texts(inputs, used, used.prompt(prompt_name, prompt))
        return await asyncio.to_thread(encode_texts, texts, None, limit, False, cut, side)

    async def embed(texts: list[str] | list[list[int]], pooling: str | None, normalize: bool | None,
                    cut: bool | None = None, side: str = "right", prompt_name: str | None = None,
                    prompt: str | None = None
                    ) -> tuple[list[torch.Tensor], int, SentenceEmbedding]:
        """Vectors of texts (or of lists of token ids), how many tokens they had, and the settings used: those
        asked for, else the checkpoint's sentence-transformers layout (pooling, max_seq_length, normalisation,
        prompts), as `bertforge embed`."""
        if colbert is not None:
            raise HTTPError(409, f"wrong model: {model_name} is a multi-vector (ColBERT) model, a vector per token: "
                                 f"/v1/embeddings or /v1/multi-vector give its vectors, /rerank and /similarity "
                                 f"its MaxSim scores")
        if splade is not None:
            if pooling is not None:
                raise HTTPError(422, f"pooling: {model_name} is a SPLADE model, which pools its masked-LM logits")
            if normalize:
                raise HTTPError(409, f"normalize: {model_name} is a SPLADE model, whose weights are compared "
                                     f"as they are (dot product); send \"normalize\": false")
            used = sentence_embedding(model)
            rows = await input_rows(texts, used, cut, side, prompt_name, prompt)
            vectors = await run_jobs([Job(run_splade, row) for row in rows])
            return vectors, sum(len(row["input_ids"]) for row in rows), used
        used = sentence_embedding(encoder_of(model), pooling, None, normalize)
        rows = await input_rows(texts, used, cut, side, prompt_name, prompt)
        left_out = 0 if texts and isinstance(texts[0], list) else prompt_length(tokenizer, used,
                                                                                used.prompt(prompt_name, prompt))
        options = {"pooling": used.pooling, "normalize": used.normalize, "left_out": left_out}
        vectors = await run_jobs([Job(pooled_vectors, row, options) for row in rows])
        return vectors, sum(len(row["input_ids"]) for row in rows), used

    async def multi_vectors(inputs: list[str] | list[list[int]], role: str, cut: bool | None = None,
                            side: str = "right", prompt_name: str | None = None, dimensions: int | None = None
                            ) -> tuple[list[torch.Tensor], int]:
        """A multi-vector model's token vectors of each text (or list of token ids, as it is) as it encodes one of
        this role (MultiVectorEncoder.encode_query / encode_document: the role's prompt and length, a query's
        [MASK]s, a document's skiplist), and how many tokens the model read."""
        limit = min(max_length, colbert.role_max_length(role))
        if inputs and isinstance(inputs[0], list):
            rows = id_rows(inputs, limit, cut, side)
        else:
            prompt = colbert.role_prompt(role, prompt_name)
            rows = await asyncio.to_thread(encode_texts, [prompt + text for text in inputs], None, limit, False, cut,
                                           side)
        vectors = await run_jobs([Job(run_multi_vector[role], row) for row in rows])
        if colbert.truncate_dim is not None:
            vectors = first_token_dimensions(vectors, colbert.truncate_dim)
        if dimensions is not None:
            if dimensions > vectors[0].shape[-1]:
                raise HTTPError(422, f"dimensions: {dimensions} is more than the model's {vectors[0].shape[-1]}")
            vectors = first_token_dimensions(vectors, dimensions)
        return vectors, sum(len(row["input_ids"]) for row in rows)

    async def late_interaction(query: str, texts: list[str], cut: bool | None = None, side: str = "right",
                               prompt_name: str | None = None) -> tuple[list[float], int]:
        """A multi-vector model's score of each text for the query (the query's token vectors against each
        text's as a document's: MaxSim, or MeanMaxSim as its layout says), and how many tokens the model read."""
        (queried, query_tokens), (documents, tokens) = await asyncio.gather(
            multi_vectors([query], "query", cut, side, prompt_name),
            multi_vectors(texts, "document", cut, side, prompt_name))
        scores = await asyncio.to_thread(colbert.similarity, queried, documents)
        return scores[0].tolist(), query_tokens + tokens

    def first_dimensions(vectors: list[torch.Tensor], dimensions: int | None, normalized: bool,
                         field: str = "dimensions") -> list:
        """The first `dimensions` of each vector (Matryoshka-style), unit length again when they were; None: all.
        `field`: the request's name for them."""
        if dimensions is None:
            return vectors
        if dimensions > len(vectors[0]):
            raise HTTPError(422, f"{field}: {dimensions} is more than the model's {len(vectors[0])}")
        return [F.normalize(vector[:dimensions], dim=-1) if normalized else vector[:dimensions] for vector in vectors]

    def tei_inputs(inputs: str | list) -> list:
        """TEI's `inputs` (a text, texts, token ids, lists of token ids) as a list of texts or of id lists."""
        inputs = [inputs] if isinstance(inputs, str) or isinstance(inputs[0], int) else inputs
        check_not_empty(inputs)
        return inputs

    def check_not_empty(texts: list) -> None:
        """text-embeddings-inference answers an empty text 422, as nothing to read."""
        empty = next((index for index, text in enumerate(texts) if text == ""), None)
        if empty is not None:
            raise HTTPError(422, f"inputs cannot be empty: text {empty} is \"\"")

    def require_task() -> Task:
        if task is None:
            raise HTTPError(409, f"wrong task: {model_name} has no trained task head (an encoder); use /embed, "
                                 f"/v1/embeddings or /rerank, or serve a fine-tuned model")
        return task

    async def task_outputs(examples: list, cut: bool | None = None, side: str = "right"):
        """(features, outputs per row) of examples, encoded with the task's own `encode` and its settings."""
        features = await asyncio.to_thread(task.encode, tokenizers[side.lower()], examples, run.settings,
                                           model.config.id2label)
        if features.truncated and not (truncate if cut is None else cut):
            raise refused(f"{features.truncated} of the inputs are longer than the model's max_length", run.max_length,
                          cut)
        return features, await run_jobs([Job(run_rows, row) for row in features.rows])

    async def predict_examples(examples: list, cut: bool | None = None, side: str = "right"
                               ) -> tuple[list[dict[str, Any]], int]:
        """The task's answers for examples, each with its input, exactly as `bertforge predict` gives them, and how
        many tokens the model read."""
        features, outputs = await task_outputs(examples, cut, side)
        answers = await asyncio.to_thread(task.decode, features, examples, outputs, model.config)
        return [{**task.inputs(example), **answer} for example, answer in zip(examples, answers)], \
            sum(features.lengths())

    async def relevance(query: str, texts: list[str], raw_scores: bool = False, cut: bool | None = None,
                        side: str = "right") -> tuple[list[float], int]:
        """Each text's relevance to the query, and how many tokens the model read: a pair classifier's probability
        of its last label (or the sigmoid of a one-output model's score; raw_scores: the logit or score), or, for
        an encoder, the cosine similarity of the texts' embeddings (a SPLADE model's dot product)."""
        # A fine-tuned model that read single texts (its run config names no second column), or a multi-label one,
        # has no relevance of a text to a query to give; a checkpoint from elsewhere may be a cross-encoder.
        single_texts = checkpoint is not None and checkpoint.run is not None and \
            checkpoint.run.columns.text_pair is None
        if task is not None and (task.name == "multi_label" or single_texts):
            raise HTTPError(409, f"wrong task: {model_name} was fine-tuned on "
                                 f"{'single texts' if single_texts else 'labels to tag a text with'}; reranking "
                                 f"needs a pair classifier (trained on text pairs) or an encoder")
        if colbert is not None:
            return await late_interaction(query, texts, cut, side)
        if task is None:
            vectors, tokens, _ = await embed([query, *texts], None, compared, cut, side)
            return [float(vectors[0] @ vector) for vector in vectors[1:]], tokens
        if task.head != "sequence_classification":
            raise HTTPError(409, f"wrong task: {model_name} does {task.name}; reranking needs a pair classifier or "
                                 f"an encoder")
        answers, tokens = await predict_examples([task.example(query, text) for text in texts], cut, side)
        if "score" in answers[0]:
            return [a["score"] if raw_scores else 1 / (1 + math.exp(-a["score"])) for a in answers], tokens
        last = model.config.id2label[model.config.num_labels - 1]
        probabilities = [a["probabilities"][last] for a in answers]
        return [math.log(p / max(1 - p, 1e-12)) if raw_scores else p for p in probabilities], tokens

    def first_word_pieces(texts: list[str], count: int) -> list[str]:
        """Each text cut after its first `count` word pieces (at the last one's end in the text)."""
        offsets = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return [text if len(spans) <= count else text[:spans[count - 1][1]] for text, spans in zip(texts, offsets)]

    # ------------------------------------------------------------ routes

    @app.post("/predict", response_model=schemas.PredictResponse | list[schemas.Prediction]
              | list[list[schemas.Prediction]], response_model_exclude_unset=True, responses=errors)
    async def predict(request: schemas.PredictRequest):
        """The fine-tuned model's answers, as `bertforge predict` gives them: a label with probabilities, a score,
        entities with character spans into each text, or per question the answer's span of its context. With
        text-embeddings-inference's "inputs", a sequence classifier's scores in its shape."""
        current = require_task()
        if request.inputs is not None:
            return await tei_predict(current, request)
        takes_questions = current.name == "qa"
        if request.questions is not None and (request.texts is not None or request.text_pairs is not None):
            raise HTTPError(422, 'send either "texts" (and "text_pairs") or "questions", not both')
        wanted = '"questions": [{"question", "context"}]' if takes_questions else '"texts" (and "text_pairs")'
        given = request.questions if takes_questions else request.texts
        if given is None:
            other = request.texts if takes_questions else request.questions
            status = 409 if other is not None else 422
            raise HTTPError(status, f"{'wrong task' if other is not None else 'nothing to predict'}: "
                                    f"{model_name} does {current.name}, which takes {wanted}")
        check_count(len(given), "questions" if takes_questions else "texts")
        if takes_questions:
            for index, item in enumerate(given):
                for name in ("question", "context"):
                    if not getattr(item, name).strip():
                        raise HTTPError(422, f"questions.{index}.{name} is empty")
            # Each question's id: the client's, else its place in the request (1, 2, ...), as `predict` numbers
            # the questions of a file.
            examples = [dataclasses.replace(current.example(item.question, item.context), id=item.id or str(number))
                        for number, item in enumerate(given, 1)]
        else:
            if request.text_pairs is not None and len(request.text_pairs) != len(given):
                raise HTTPError(422, f"got {len(given)} texts but {len(request.text_pairs)} text_pairs")
            pairs = request.text_pairs or [None] * len(given)
            examples = [current.example(text, pair) for text, pair in zip(given, pairs)]
        return {"task": current.name, "predictions": (await predict_examples(examples))[0]}

    async def tei_predict(current: Task, request: schemas.PredictRequest) -> list:
        """TEI's answer for a sequence classifier: per input, {score, label} highest first; a bare list for one."""
        if current.head != "sequence_classification":
            raise HTTPError(409, f"wrong task: {model_name} does {current.name}; \"inputs\" (text-embeddings-"
                                 f"inference's) is for a sequence classifier: send "
                                 f"{'questions' if current.name == 'qa' else 'texts'}")
        if request.texts is not None or request.text_pairs is not None or request.questions is not None:
            raise HTTPError(422, 'send "inputs" (text-embeddings-inference\'s) or "texts", not both')
        single, items = predict_inputs(request.inputs)
        check_count(len(items), "inputs")
        check_not_empty([text for item in items for text in item if text is not None])
        # TEI takes single texts and pairs in one batch; the task encodes one kind at a time
        logits = torch.empty(len(items), model.config.num_labels)
        for paired in (False, True):
            indices = [index for index, (_, pair) in enumerate(items) if (pair is not None) == paired]
            if indices:
                examples = [current.example(*items[index]) for index in indices]
                features, outputs = await task_outputs(examples, request.truncate, request.truncation_direction)
                logits[indices] = classification.example_logits(features, outputs, len(examples))
        parameters = request.parameters or schemas.TextClassificationParameters()
        function = "none" if request.raw_scores else parameters.function_to_apply or TASK_SCORES[current.name]
        scores = SCORE_FUNCTIONS[function](logits)
        answers = [ranked_scores(row, model.config.id2label, parameters.top_k) for row in scores]
        return answers[0] if single else answers

    @app.post("/embed", response_model=schemas.EmbedResponse | list[list[float]], responses=errors)
    async def embed_texts(request: schemas.EmbedRequest):
        """One vector per text: the last layer pooled over its tokens (cls, mean or max). With
        text-embeddings-inference's {"inputs": ...} the answer is a bare list of vectors, unit length unless
        "normalize": false (TEI's default)."""
        if (request.texts is None) == (request.inputs is None):
            raise HTTPError(422, 'send "texts" (a list) or "inputs" (a text or a list), one of them')
        tei = request.inputs is not None
        texts = tei_inputs(request.inputs) if tei else request.texts
        check_count(len(texts))
        normalize = compared if tei and request.normalize is None else request.normalize
        vectors, _, used = await embed(texts, request.pooling, normalize, request.truncate,
                                       request.truncation_direction, request.prompt_name)
        values = [vector.tolist() for vector in first_dimensions(vectors, request.dimensions, used.normalize)]
        if tei:
            return values
        return {"embeddings": values, "dimension": len(values[0]), "pooling": used.pooling,
                "normalized": used.normalize}

    @app.post("/v1/embeddings", response_model=schemas.OpenAIEmbeddingResponse, responses=openai_errors)
    @app.post("/embeddings", response_model=schemas.OpenAIEmbeddingResponse, responses=openai_errors)
    async def openai_embeddings(request: schemas.OpenAIEmbeddingRequest):
        """OpenAI's embeddings API (Jina's too): unit-length vectors, pooled as the checkpoint says (`bertforge
        embed`)."""
        refuse_sparse()
        if request.late_chunking:
            raise HTTPError(422, "late_chunking is not supported: each input is embedded on its own")
        texts = hosted_inputs(request.input)
        role = request.input_type or (None if request.is_query is None else "query" if request.is_query
                                      else "document")
        encoding = request.embedding_type or request.encoding_format
        if colbert is not None:  # as PyLate's server: queries unless asked for documents
            if encoding not in ("float", "base64"):
                raise HTTPError(422, f"embedding_type {encoding}: a multi-vector model's token vectors come as float "
                                     f"or base64")
            vectors, tokens = await multi_vectors(texts, role or ROLES.get(request.task, "query"), request.truncate,
                                                  dimensions=request.dimensions)
            data = [encoded(vector, encoding) for vector in vectors]
        else:
            # the prompt for a query or a document (as encode_query / encode_document pick it), or Jina's task's
            prompt = input_prompt(request.task or role, sentence_embedding(encoder_of(model)).prompts)
            vectors, tokens, used = await embed(texts, None, True if request.normalized is not False else None,
                                                request.truncate, prompt=prompt)
            vectors = torch.stack(first_dimensions(vectors, request.dimensions, normalized=used.normalize))
            data = typed_embeddings(vectors, encoding)
        data = [{"object": "embedding", "index": index, "embedding": embedding} for index, embedding in enumerate(data)]
        return {"object": "list", "data": data, "model": model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/embed", response_model=schemas.CohereEmbedResponse, responses=openai_errors)
    async def cohere_embed_v1(request: schemas.CohereEmbedRequest):
        """Cohere's embed API, v1: unit vectors, as floats unless embedding_types names others."""
        return await cohere_embeddings(request, version=1)

    @app.post("/v2/embed", response_model=schemas.CohereEmbedResponse, responses=openai_errors)
    async def cohere_embed_v2(request: schemas.CohereEmbedRequest):
        """Cohere's embed API, v2: unit vectors by embedding type (floats by default)."""
        return await cohere_embeddings(request, version=2)

    async def cohere_embeddings(request: schemas.CohereEmbedRequest, version: int) -> dict[str, Any]:
        refuse_sparse()
        if request.images is not None or request.input_type == "image":
            raise HTTPError(422, "images: this server embeds text")
        if request.max_tokens is not None:
            raise HTTPError(422, "max_tokens is not supported; truncate says how a text over the model's length "
                                 "is cut")
        if (request.texts is None) == (request.inputs is None):
            raise HTTPError(422, 'send "texts" or "inputs", one of them')
        texts = request.texts or [" ".join(part.text for part in given.content) for given in request.inputs]
        check_count(len(texts), "texts")
        kinds = list(dict.fromkeys(request.embedding_types or ["float"]))
        check_embedding_types(kinds)
        prompt = input_prompt(request.input_type, sentence_embedding(encoder_of(model)).prompts)
        cut, side = TRUNCATION[request.truncate or "END"]
        vectors, tokens, _ = await embed(texts, None, True, cut, side, prompt=prompt)
        vectors = torch.stack(first_dimensions(vectors, request.output_dimension, True, "output_dimension"))
        embeddings = {kind: typed_embeddings(vectors, kind) for kind in kinds}
        answer = {"id": str(uuid.uuid4()), "texts": texts,
                  "meta": {"api_version": {"version": str(version)}, "billed_units": {"input_tokens": tokens}}}
        if version == 1 and request.embedding_types is None:
            return answer | {"response_type": "embeddings_floats", "embeddings": embeddings["float"]}
        return answer | {"response_type": "embeddings_by_type", "embeddings": embeddings}

    def refuse_sparse() -> None:
        """The hosted APIs' dense vectors are not a SPLADE model's."""
        if splade is not None:
            raise HTTPError(409, f"wrong model: {model_name} is a SPLADE model, whose vectors are sparse; use "
                                 f"/embed_sparse")

    def hosted_inputs(given: str | list) -> list:
        """OpenAI's and Jina's `input` (a text, texts, token ids, lists of token ids) as a list of texts or of id
        lists, within max_texts."""
        texts = [given] if isinstance(given, str) or isinstance(given[0], int) else given
        check_count(len(texts), "inputs")
        return texts

    def encoded(vectors: torch.Tensor, encoding_format: str) -> list | str:
        """A vector (or a text's token vectors) as floats, or as base64 of its little-endian float32 values."""
        return float32_base64(vectors) if encoding_format == "base64" else vectors.tolist()

    @app.post("/v1/multi-vector", response_model=schemas.MultiVectorResponse, responses=openai_errors)
    @app.post("/multi-vector", response_model=schemas.MultiVectorResponse, responses=openai_errors)
    async def jina_multi_vector(request: schemas.MultiVectorRequest):
        """Jina's multi-vector API, for a multi-vector (ColBERT) model: each text's token vectors as a query's or
        a document's (input_type, by default document)."""
        if colbert is None:
            raise HTTPError(409, f"wrong model: {model_name} is not a multi-vector (ColBERT) model; "
                                 f"/v1/embeddings gives its vectors")
        texts = hosted_inputs(request.input)
        vectors, tokens = await multi_vectors(texts, request.input_type, dimensions=request.dimensions)
        encoding_format = request.encoding_format or request.embedding_type or "float"
        data = [{"object": "embeddings", "index": index, "embeddings": encoded(rows, encoding_format)}
                for index, rows in enumerate(vectors)]
        return {"object": "list", "data": data, "model": model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.get("/v1/models", response_model=schemas.ModelList, responses=openai_errors)
    @app.get("/models", response_model=schemas.ModelList, responses=openai_errors)
    async def openai_models():
        """The one model this server holds, as OpenAI's model list."""
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "bertforge"}]}

    @app.post("/rerank", response_model=list[schemas.RerankResult] | schemas.CohereRerankResponse,
              response_model_exclude_unset=True, responses=errors)
    async def rerank(request: schemas.RerankRequest | schemas.CohereRerankRequest):
        """The texts ranked by relevance to the query, best first: a pair classifier's probability of its last
        label (or the sigmoid of a one-output model's score; raw_scores: the logit or score), or, for an encoder,
        the cosine similarity of the texts' embeddings. Sent "documents" (as vLLM's and Infinity's /rerank take),
        Cohere's answer, as /v1/rerank."""
        if isinstance(request, schemas.CohereRerankRequest):
            return await cohere_answer(request)
        check_count(len(request.texts))
        scores, _ = await relevance(request.query, request.texts, request.raw_scores, request.truncate,
                                    request.truncation_direction)
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [{"index": i, "score": scores[i], **({"text": request.texts[i]} if request.return_text else {})}
                for i in ranked]

    @app.post("/v1/rerank", response_model=schemas.CohereRerankResponse, response_model_exclude_unset=True,
              responses=openai_errors)
    @app.post("/v2/rerank", response_model=schemas.CohereRerankResponse, response_model_exclude_unset=True,
              responses=openai_errors)
    async def cohere_rerank(request: schemas.CohereRerankRequest):
        """Cohere's rerank API (Jina's and vLLM's clients send the same): the documents ranked by relevance to the
        query, best first, scored as /rerank scores them; a long document is cut, as Cohere cuts it."""
        return await cohere_answer(request)

    async def cohere_answer(request: schemas.CohereRerankRequest) -> dict[str, Any]:
        """Cohere's answer to a request in its shape, at /v1/rerank, /v2/rerank or /rerank."""
        check_count(len(request.documents), "documents")
        texts = [document_text(document, request.rank_fields, index)
                 for index, document in enumerate(request.documents)]
        if request.max_tokens_per_doc is not None:
            texts = await asyncio.to_thread(first_word_pieces, texts, request.max_tokens_per_doc)
        scores, tokens = await relevance(request.query, texts, request.raw_scores, cut=True)
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:request.top_n]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": returned_document(request.documents[i])} if request.return_documents else {})}
                   for i in ranked]
        return {"id": str(uuid.uuid4()), "model": model_name, "results": results, "usage": {"total_tokens": tokens}}

    @app.post("/tokenize", response_model=schemas.TokenizeResponse | list[list[schemas.SimpleToken]],
              responses=errors)
    async def tokenize(request: schemas.TokenizeRequest):
        """Tokens, ids, segment ids and (start, end) character offsets ((0, 0) for special tokens). With
        text-embeddings-inference's {"inputs": ...}, its list of tokens per text, after the prompt /embed puts
        before it (prompt_name, else the model's default prompt), as TEI tokenizes it."""
        if (request.text is None) == (request.inputs is None):
            raise HTTPError(422, 'send "text" (and "text_pair") or "inputs" (a text or a list), one of them')
        if request.inputs is None and request.prompt_name is not None:
            raise HTTPError(422, '"prompt_name" goes with "inputs", not "text"')
        if request.inputs is not None:
            if request.text_pair is not None:
                raise HTTPError(422, '"text_pair" goes with "text", not "inputs"')
            texts = tei_inputs(request.inputs)
            check_count(len(texts))
            prompt = sentence_embedding(model if splade is not None else encoder_of(model)).prompt(
                request.prompt_name)
            texts = [prompt + text for text in texts]
            # as TEI: every token, however long the text (tokenizing is not reading)
            rows = await asyncio.to_thread(encode_texts, texts, None, UNLIMITED, True, False, "right",
                                           request.add_special_tokens)
            return [simple_tokens(text, row, tokenizer.convert_ids_to_tokens(row["input_ids"]))
                    for text, row in zip(texts, rows)]
        pairs = None if request.text_pair is None else [request.text_pair]
        row = (await asyncio.to_thread(encode_texts, [request.text], pairs, max_length, True))[0]
        return {"tokens": tokenizer.convert_ids_to_tokens(row["input_ids"]), "ids": row["input_ids"],
                "token_type_ids": row["token_type_ids"], "offsets": row["offset_mapping"]}

    @app.post("/decode", response_model=list[str], responses=errors)
    async def decode(request: schemas.DecodeRequest):
        """text-embeddings-inference's: the text of each list of token ids."""
        id_lists = tei_inputs(request.ids)
        check_count(len(id_lists), "id lists")
        check_ids(id_lists)
        return tokenizer.batch_decode(id_lists, skip_special_tokens=request.skip_special_tokens)

    @app.post("/embed_all", response_model=list[list[list[float]]], responses=errors)
    async def embed_all(request: schemas.EmbedAllRequest):
        """text-embeddings-inference's: the last layer's vector of every token of each text, [CLS] and [SEP]
        included (not pooled, not normalized)."""
        if splade is not None:
            raise HTTPError(409, f"wrong model: {model_name} is a SPLADE model; /embed_all is for dense encoders "
                                 f"(/embed_sparse gives its weights)")
        inputs = tei_inputs(request.inputs)
        check_count(len(inputs))
        rows = await input_rows(inputs, sentence_embedding(encoder_of(model)), request.truncate,
                                request.truncation_direction, request.prompt_name)
        states = await run_jobs([Job(token_vectors, row) for row in rows])
        return [vectors.tolist() for vectors in states]

    @app.post("/embed_sparse", response_model=list[list[schemas.SparseValue]], responses=errors)
    async def embed_sparse(request: schemas.EmbedSparseRequest):
        """text-embeddings-inference's, for a SPLADE model: each text's nonzero weights as {index, value}, index
        being the word piece's vocabulary id, in id order."""
        if splade is None:
            raise HTTPError(409, f"wrong model: {model_name} is not a SPLADE model (a masked-LM model with "
                                 f"sentence-transformers' SpladePooling); /embed_sparse needs one")
        inputs = tei_inputs(request.inputs)
        check_count(len(inputs))
        vectors, _, _ = await embed(inputs, None, None, request.truncate, request.truncation_direction,
                                    request.prompt_name)
        return [[{"index": i, "value": v} for i, v in zip(*nonzero_weights(vector))] for vector in vectors]

    @app.post("/fill_mask", response_model=list[schemas.FilledToken] | list[list[schemas.FilledToken]]
              | list[list[schemas.FilledToken] | list[list[schemas.FilledToken]]], responses=errors)
    async def fill_mask(request: schemas.FillMaskRequest):
        """transformers' fill-mask pipeline over HTTP, as the Hugging Face Inference API answers fill-mask
        (huggingface_hub's InferenceClient.fill_mask given this route's URL): per [MASK] of a text, its top_k
        tokens {score, token, token_str, sequence}; a list per mask for a text of several, a list per text for
        several texts. Needs a masked-LM checkpoint's trained head."""
        if run_fill is None:
            raise HTTPError(409, f"wrong model: {model_name} has no trained masked-LM head; /fill_mask needs a "
                                 f"masked-LM checkpoint (BertForMaskedLM, BertForPreTraining)")
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        check_count(len(texts))
        parameters = request.parameters or schemas.FillMaskParameters()
        targets = target_ids(tokenizer, parameters.targets)
        rows = await asyncio.to_thread(encode_texts, texts, None, UNLIMITED, False, False)
        masks = []
        for index, row in enumerate(rows):
            if len(row["input_ids"]) > max_length:  # not cut: that could lose a [MASK], or the words that decide it
                raise HTTPError(413, f"text {index} is {len(row['input_ids'])} tokens long; the limit is "
                                     f"{max_length}")
            masks.append(mask_positions(tokenizer, row["input_ids"], f"text {index}"))
        probabilities = await run_jobs([Job(run_fill, row, {"masks": positions})
                                        for row, positions in zip(rows, masks)])
        kept = parameters.top_k if targets is None else model.config.vocab_size  # targets: from every token
        answers = [fill_answer(tokenizer, row["input_ids"], top_tokens(scores, tokenizer, kept), parameters.top_k,
                               targets) for row, scores in zip(rows, probabilities)]
        return answers[0] if len(answers) == 1 else answers

    @app.post("/similarity", response_model=list[float], responses=errors)
    async def similarity(request: schemas.SimilarityRequest):
        """text-embeddings-inference's (the Hugging Face sentence-similarity task): the cosine similarity of
        source_sentence's embedding with each sentence's."""
        parameters = request.parameters or schemas.SimilarityParameters()
        texts = [request.inputs.source_sentence, *request.inputs.sentences]
        check_count(len(texts))
        check_not_empty(texts)
        if colbert is not None:  # the source sentence as the query, the sentences as documents
            scores, _ = await late_interaction(texts[0], texts[1:], parameters.truncate,
                                               parameters.truncation_direction, parameters.prompt_name)
            return scores
        vectors, _, _ = await embed(texts, None, compared, parameters.truncate, parameters.truncation_direction,
                                    parameters.prompt_name)
        return [float(vectors[0] @ vector) for vector in vectors[1:]]

    def validated(request_class, body: dict[str, Any]):
        try:
            return request_class.model_validate(body)
        except ValidationError as problem:
            raise RequestValidationError(problem.errors()) from None

    async def inference_api(body: dict[str, Any]) -> Any:
        """The Hugging Face Inference API's answer for a token classifier, a question answerer or, given
        candidate_labels, zero-shot classification by a sequence classifier: transformers' pipeline of the task
        (inference/pipelines.py) with the request's parameters, its rows run by the batcher."""
        name = "zero-shot-classification" if task.head == "sequence_classification" else HEADS[task.head].onnx_task
        request = validated(pipeline_requests[name], body)
        inputs = request.model_dump()["inputs"]
        count = 1 if isinstance(inputs, str | dict) else len(inputs)
        check_count(count, "questions" if name == "question-answering" else "texts")
        parameters = request.parameters.model_dump(exclude_none=True) if request.parameters is not None else {}
        pipe = Pipeline(name, model, pipeline_tokenizer, device, task, run.settings, rows=batcher_rows)
        answer = await asyncio.to_thread(pipe, inputs, **parameters)
        if name != "zero-shot-classification":
            return answer
        ranked = [[{"label": label, "score": score} for label, score in zip(item["labels"], item["scores"])]
                  for item in (answer if isinstance(answer, list) else [answer])]
        return ranked if isinstance(answer, list) else ranked[0]

    @app.post("/", response_model=list[list[float]] | list[float] | list[schemas.Prediction]
              | list[list[schemas.Prediction]] | list[schemas.EntityGroup] | list[schemas.TokenPrediction]
              | list[list[schemas.EntityGroup]] | list[list[schemas.TokenPrediction]] | schemas.SpanAnswer
              | list[schemas.SpanAnswer] | list[list[schemas.SpanAnswer] | schemas.SpanAnswer]
              | schemas.EmbedResponse | schemas.PredictResponse,  # the last two: bertforge's own forms' answers
              response_model_exclude_unset=True, responses=errors)
    async def tei_root(request: schemas.EmbedRequest | schemas.SimilarityRequest | schemas.PredictRequest
                       | schemas.TokenClassificationRequest | schemas.QuestionAnsweringRequest
                       | schemas.ZeroShotRequest):
        """The route for the model's task that huggingface_hub's InferenceClient calls given the server's URL, as
        text-embeddings-inference and the Hugging Face Inference API answer it: an encoder embeds {"inputs"} (as
        /embed) or compares {"inputs": {"source_sentence", "sentences"}} (as /similarity); a sequence classifier
        predicts {"inputs"} (as /predict), or with "parameters": {"candidate_labels"} classifies zero-shot ({label,
        score} best first); a token classifier tags {"inputs"} (its "parameters": aggregation_strategy,
        ignore_labels) and a question answerer answers {"inputs": {"question", "context"}}, as transformers'
        pipelines of those tasks."""
        if isinstance(request, schemas.SimilarityRequest):
            return await similarity(request)
        body = request.model_dump(exclude_unset=True)
        if task is not None and "inputs" in body and (task.head != "sequence_classification" or "candidate_labels"
                                                      in (body.get("parameters") or {})):
            return await inference_api(body)
        own, other = (schemas.EmbedRequest, schemas.PredictRequest) if task is None else \
            (schemas.PredictRequest, schemas.EmbedRequest)
        foreign = sorted(set(body) - set(own.model_fields))
        if foreign and set(foreign) <= set(other.model_fields):
            doing = "is an encoder (it embeds)" if task is None else f"does {task.name}"
            wanted = "a sequence classifier's" if task is None else "an encoder's"
            raise HTTPError(409, f"wrong task: {model_name} {doing}; {', '.join(foreign)} are for {wanted} route")
        if task is None:
            return await embed_texts(validated(schemas.EmbedRequest, body))
        return await predict(validated(schemas.PredictRequest, body))

    @app.get("/info", response_model=schemas.InfoResponse, response_model_exclude_none=True)
    async def info():
        """text-embeddings-inference's description of the model and the server's limits (max_input_length: where
        the model's inputs are cut or refused: an encoder's sentence-transformers max_seq_length, a task model's
        max_length)."""
        embedded = sentence_embedding(model if splade is not None else encoder_of(model))
        input_limit = embedding_limit(embedded) if task is None else run.max_length
        if colbert is not None:
            input_limit = min(max_length, colbert.role_max_length("document"))
            model_type = {"embedding": {"pooling": MULTI_VECTOR}}
        elif task is None:
            model_type = {"embedding": {"pooling": SPLADE if splade is not None else embedded.pooling}}
        elif task.head == "sequence_classification":
            id2label = {str(index): label for index, label in model.config.id2label.items()}
            model_type = {"classifier": {"id2label": id2label, "label2id": model.config.label2id},
                          "task": task.name}
        else:
            model_type = {"task": task.name}
        return {"model_id": model_name, "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "model_type": model_type, "max_concurrent_requests": settings.max_queue,
                "max_input_length": input_limit, "max_batch_tokens": settings.max_batch_tokens,
                "max_batch_requests": settings.max_batch_size, "max_client_batch_size": settings.max_texts,
                "auto_truncate": truncate, "tokenization_workers": 1, "version": bertforge_version()}

    @app.get("/attention", response_class=HTMLResponse, responses=page_errors)
    async def attention(text: str = Query(min_length=1), pair: str | None = None) -> HTMLResponse:
        """The attention viewer page (every layer and head) for a text, or a pair of texts."""
        if not text.strip():
            raise HTTPError(422, "text is empty: nothing to show attention over")
        pair = pair if pair and pair.strip() else None  # an empty pair is no pair, as the query string can't omit
        try:
            row = await asyncio.to_thread(encode_for_attention, tokenizer, text, pair, attention_max_length,
                                          truncate)
        except InputError as problem:  # over the viewer's limit, on a server that refuses long texts
            raise HTTPError(413, str(problem)) from None
        (weights,) = await run_jobs([Job(attentions, row)])
        # Rendering writes layers * heads * seq^2 numbers: off the event loop.
        page = await asyncio.to_thread(render_attention_map, attention_map(tokenizer, row, weights),
                                       f"Attention: {text[:80]}")
        return HTMLResponse(page)

    async def explanation(request: schemas.ExplainRequest, as_page: bool) -> dict[str, Any] | str:
        """One job for the worker, the only code that touches the model (the explanation hooks it)."""
        pairs = None if request.text_pair is None else [request.text_pair]
        row = (await asyncio.to_thread(encode_texts, [request.text], pairs))[0]
        # Integrated gradients runs the model `steps` times over the text; the worker, which every route shares,
        # takes one explanation at a time: a request costs at most a default one on the longest text.
        work, budget = request.steps * len(row["input_ids"]), DEFAULT_STEPS * max_length
        if request.method == "integrated_gradients" and work > budget:
            raise HTTPError(413, f"steps x tokens is {request.steps} x {len(row['input_ids'])} = {work}; the limit "
                                 f"is {budget} ({DEFAULT_STEPS} steps x max_length {max_length}): ask for fewer "
                                 f"steps or send a shorter text")
        # As /predict reads the text: the fine-tuned task's max_length, else the server's.
        reads = min(run.max_length, max_length) if run is not None else max_length
        options = {**request.model_dump(), "tokenizer": tokenizer, "max_length": reads, "as_page": as_page}
        (result,) = await run_jobs([Job(explanations, row, options)])
        return result

    @app.post("/explain", responses=errors)
    async def explain_json(request: schemas.ExplainRequest) -> dict[str, Any]:
        """Attributions of the model's prediction to the words of the text (bertforge.explain), as JSON."""
        return await explanation(request, as_page=False)

    @app.get("/explain", response_class=HTMLResponse, responses=page_errors)
    async def explain_page(text: str = Query(min_length=1), pair: str | None = None, target: str | None = None,
                           method: schemas.ExplainMethod = "integrated_gradients") -> HTMLResponse:
        """The explanation page: the words shaded by attribution, beside the attention views."""
        request = schemas.ExplainRequest(text=text, text_pair=pair or None, target=target or None, method=method)
        return HTMLResponse(await explanation(request, as_page=True))

    @app.head(HEALTH_PATH, include_in_schema=False)
    async def health_probe():  # load balancers that probe with HEAD
        return Response(status_code=200)

    @app.get(HEALTH_PATH, response_model=schemas.HealthResponse)
    async def health():
        """Liveness, what is loaded, and how requests have been batched (answered without the API key)."""
        return {"status": "ok", "model": model_name, "architecture": type(colbert or model).__name__,
                "task": task.name if task else None, "device": str(device), "queued": batcher.pending,
                "batches": batcher.batches, "texts": batcher.rows, "largest_batch": batcher.largest_batch,
                "limits": {"max_texts": settings.max_texts, "max_length": max_length, "long_text": settings.long_text,
                           "max_queue": settings.max_queue, "max_batch_size": settings.max_batch_size,
                           "max_batch_tokens": settings.max_batch_tokens, "max_body_bytes": settings.max_body_bytes}}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus_metrics():
        """Prometheus metrics: requests by route and status, latency, queue depth, batch sizes, tokens."""
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    async def docs():
        return HTMLResponse(render_docs(app.openapi()))

    # What a route added later needs (e.g. an /explain route): run model jobs, the task row, its settings, errors.
    app.state.run_jobs, app.state.run_settings, app.state.error_responses = run_jobs, run, errors
    routes = {route.path for route in app.routes}
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes, api_key=settings.api_key,
                       metrics=metrics, routes=routes)
    if settings.cors_allow_origins:
        # Outside the guard: a browser's preflight carries no API key, and an error answer (401, 413) needs the
        # CORS headers too, or the page can't read it.
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_allow_origins),
                           allow_methods=["GET", "POST", "HEAD"], expose_headers=["Retry-After"],
                           allow_headers=["Authorization", "Content-Type", "X-API-Key"])
    return app


def bertforge_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bertforge")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def load_app(name_or_path: str | Path, settings: ServeSettings | None = None,
             inference: InferenceOptions = AS_TRAINED):
    """The application over a model directory or 'default': the model its checkpoint holds, with the task and
    settings it was trained with. An encoder is pooled as `settings.pooling` says, else as its layout says: a
    SPLADE model (pooling "splade", or sentence-transformers' SparseEncoder layout) reads its masked-LM head; a
    ColBERT checkpoint (any layout MultiVectorEncoder loads) is served as MultiVectorEncoder."""
    settings = settings or ServeSettings()
    checkpoint = inspect_checkpoint(name_or_path)
    if checkpoint.task is not None:
        checkpoint.task_for()  # a run config whose head was never saved is refused here, naming the folder
        if settings.pooling is not None:
            raise ConfigError(f"--pooling {settings.pooling}: {name_or_path} is a fine-tuned {checkpoint.task} "
                              f"model; pooling is for an encoder's embeddings")
    tokenizer = BertTokenizer.from_pretrained(checkpoint.directory)
    if settings.pooling == SPLADE or settings.pooling is None and is_splade_checkpoint(checkpoint.directory):
        model = load_splade_model(checkpoint.directory)
        routes = model.sentence_embedding.routes
        if routes is not None and routes.default == routes.static:  # the server runs the model on every text
            raise ConfigError(f"{name_or_path}: an inference-free SPLADE model whose default route is its static "
                              f"table ({routes.static!r}); the server runs the masked-LM model's route "
                              f"({routes.model!r}) only: use SparseEncoder")
    elif settings.pooling is None and checkpoint.task is None and multi_vector_kind(checkpoint.directory):
        colbert = MultiVectorEncoder(checkpoint.directory)
        colbert.model = inference.apply(colbert.model, colbert.tokenizer)
        colbert.projection.to(colbert.device)
        return create_app(colbert, colbert.tokenizer, settings, model_name=str(name_or_path), checkpoint=checkpoint)
    else:
        model = checkpoint.model_class.from_pretrained(checkpoint.directory)
        layout = getattr(model, "sentence_embedding", None) or SentenceEmbedding()
        if settings.pooling is not None:  # the server's pooling in place of the layout's (a SPLADE or ColBERT one's)
            model.sentence_embedding = dataclasses.replace(layout, pooling=settings.pooling, splade=None,
                                                           multi_vector=False)
    masked_lm = masked_lm_head(checkpoint) if checkpoint.task is None and not hasattr(model, "masked_lm") else None
    model = inference.apply(model, tokenizer)
    return create_app(model, tokenizer, settings, model_name=str(name_or_path), checkpoint=checkpoint,
                      masked_lm=masked_lm)


def masked_lm_head(checkpoint: Checkpoint) -> torch.nn.Module | None:
    """The trained masked-LM head of an encoder's checkpoint (BertForMaskedLM, BertForPreTraining), for /fill_mask;
    None for one without (a sentence encoder, or a masked-LM config whose head was not saved)."""
    if not MASKED_LM_ARCHITECTURES & set(checkpoint.architectures):
        return None
    try:
        return BertForMaskedLM.from_pretrained(checkpoint.directory, require_heads=True).masked_lm
    except CheckpointError:
        return None


def server_config(app, host: str = "127.0.0.1", port: int = 8000, settings: ServeSettings | None = None, **extra):
    """uvicorn's configuration for the application: the read deadline and idle timeout of `settings`."""
    import uvicorn
    settings = settings or app.state.settings
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                          http=protocol_with_read_timeout(settings.read_timeout),
                          timeout_keep_alive=max(1, math.ceil(settings.idle_timeout)), **extra)


def serve(name_or_path: str | Path, host: str = "127.0.0.1", port: int = 8000,
          settings: ServeSettings | None = None, inference: InferenceOptions = AS_TRAINED) -> None:
    """Load the model and answer HTTP requests until interrupted; queued work is finished before it exits."""
    try:
        import fastapi  # noqa: F401  (create_app needs it)
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as problem:
        raise BertforgeError(f"the server needs FastAPI, uvicorn and prometheus-client ({problem}); "
                             f"install them with: pip install 'bertforge[serve]'") from None
    listener = listening_socket(host, port)  # a port in use is the user's error, found before the model loads
    app = load_app(name_or_path, settings, inference)
    logger.warning("serving %s (%s) on http://%s:%d (API docs at /docs)", name_or_path,
                   type(app.state.model).__name__, host, port)
    uvicorn.Server(server_config(app, host, port, settings)).run(sockets=[listener])


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, as uvicorn would bind it; a port in use (or a host not of this machine) is a
    one-line error naming --host and --port."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, protocol)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as error:
        raise BertforgeError(f"--host {host} --port {port}: can't listen there: {error.strerror or error}") from None
    return listener
