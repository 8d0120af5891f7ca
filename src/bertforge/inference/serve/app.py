"""The HTTP application over one model (FastAPI): the served model (service.py), its routes (routes/, one module
per concept), the error answers (errors.py) and the guard of limits.py, put together; load_app and serve.

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
import dataclasses
import logging
import math
import socket
from contextlib import asynccontextmanager
from pathlib import Path

import torch

from bertforge.checkpoint.sentence_transformers import SentenceEmbedding, multi_vector_kind
from bertforge.errors import BertforgeError, CheckpointError, ConfigError
from bertforge.inference.multi_vector_encoder import MultiVectorEncoder
from bertforge.inference.optimize import AS_TRAINED, InferenceOptions
from bertforge.inference.pipelines import MASKED_LM_ARCHITECTURES
from bertforge.inference.serve.limits import RequestGuard, protocol_with_read_timeout
from bertforge.inference.serve.metrics import COST_HEADERS
from bertforge.inference.serve.service import ServedModel
from bertforge.inference.serve.settings import ServeSettings
from bertforge.inference.sparse_encoder import SPLADE, is_splade_checkpoint, load_splade_model
from bertforge.pretraining import BertForMaskedLM
from bertforge.tasks.checkpoint_contents import Checkpoint, inspect_checkpoint
from bertforge.tokenizer import BertTokenizer

logger = logging.getLogger("bertforge")


def create_app(model: torch.nn.Module, tokenizer: BertTokenizer, settings: ServeSettings | None = None,
               model_name: str = "model", checkpoint: Checkpoint | None = None,
               masked_lm: torch.nn.Module | None = None):
    """The FastAPI application; its micro-batcher starts now and finishes its queue when the application stops.

    `checkpoint` (inspect_checkpoint of the model's directory) says the task and the settings it was trained with;
    without it, an in-memory task model does its head's task with the task's default settings. `masked_lm`: an
    encoder's trained masked-LM head, for /fill_mask (a masked-LM model's own, by default). A MultiVectorEncoder
    (ColBERT) is served as one: token vectors per query or document, MaxSim scores.
    """
    # FastAPI is imported here, so that the CLI and the rest of the library run without it.
    from fastapi import FastAPI

    from bertforge.inference.serve.errors import add_error_handlers
    from bertforge.inference.serve.routes import embeddings, pages, ranking, status, tasks, tokens

    served = ServedModel(model, tokenizer, settings or ServeSettings(), model_name, checkpoint, masked_lm)

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(served.batcher.stop)  # finishes what is queued

    app = FastAPI(title="bertforge", summary=f"BERT inference over {model_name}", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.served = served  # what the routes serve (routes.served_model), and the tests inspect
    add_error_handlers(app)
    modules = (tasks, embeddings, ranking, tokens, pages, status)
    for routes in modules:
        routes.router.add_to(app)
    app.add_middleware(RequestGuard, max_body_bytes=served.settings.max_body_bytes, api_key=served.settings.api_key,
                       metrics=served.metrics, routes={route.path for route in app.routes},
                       compute_type="cpu" if served.device.type == "cpu" else "gpu",
                       max_concurrent_requests=served.settings.max_concurrent_requests,
                       model_routes=set().union(*(routes.router.model_routes for routes in modules)))
    if served.settings.cors_allow_origins:
        # Outside the guard: a browser's preflight carries no API key, and an error answer (401, 413) needs the
        # CORS headers too, or the page can't read it.
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(served.settings.cors_allow_origins),
                           allow_methods=["GET", "POST", "HEAD"], expose_headers=["Retry-After", *COST_HEADERS],
                           allow_headers=["Authorization", "Content-Type", "X-API-Key"])
    return app


def load_app(name_or_path: str | Path, settings: ServeSettings | None = None,
             inference: InferenceOptions = AS_TRAINED):
    """The application over a model directory or 'default': the model its checkpoint holds, with the task and
    settings it was trained with. An encoder is pooled as `settings.pooling` says, else as its layout says: a
    SPLADE model (pooling "splade", or sentence-transformers' SparseEncoder layout) reads its masked-LM head; a
    ColBERT checkpoint (any layout MultiVectorEncoder loads) is served as MultiVectorEncoder."""
    settings = settings or ServeSettings()
    checkpoint = inspect_checkpoint(name_or_path)
    model_name = settings.served_model_name or str(name_or_path)
    prompted = settings.default_prompt_name is not None or settings.default_prompt is not None
    if checkpoint.task is not None:
        checkpoint.task_for()  # a run config whose head was never saved is refused here, naming the folder
        for given, what in ((settings.pooling is not None, f"--pooling {settings.pooling}"),
                            (prompted, "a default prompt (--default-prompt-name, --default-prompt)")):
            if given:
                raise ConfigError(f"{what}: {name_or_path} is a fine-tuned {checkpoint.task} model; it is for an "
                                  f"encoder's embeddings")
    tokenizer = BertTokenizer.from_pretrained(checkpoint.directory)
    if settings.pooling == SPLADE or settings.pooling is None and is_splade_checkpoint(checkpoint.directory):
        model = load_splade_model(checkpoint.directory)
        routes = model.sentence_embedding.routes
        if routes is not None and routes.default == routes.static:  # the server runs the model on every text
            raise ConfigError(f"{name_or_path}: an inference-free SPLADE model whose default route is its static "
                              f"table ({routes.static!r}); the server runs the masked-LM model's route "
                              f"({routes.model!r}) only: use SparseEncoder")
    elif settings.pooling is None and checkpoint.task is None and multi_vector_kind(checkpoint.directory):
        if prompted:  # its query's and document's prompts (markers) are what it was trained with
            raise ConfigError(f"a default prompt: {name_or_path} is a ColBERT model, which puts its query's or "
                              f"document's prompt before each text")
        colbert = MultiVectorEncoder(checkpoint.directory)
        colbert.model = inference.apply(colbert.model, colbert.tokenizer)
        colbert.projection.to(colbert.device)
        return create_app(colbert, colbert.tokenizer, settings, model_name=model_name, checkpoint=checkpoint)
    else:
        model = checkpoint.model_class.from_pretrained(checkpoint.directory)
        layout = getattr(model, "sentence_embedding", None) or SentenceEmbedding()
        if settings.pooling is not None:  # the server's pooling in place of the layout's (a SPLADE or ColBERT one's)
            model.sentence_embedding = dataclasses.replace(layout, pooling=settings.pooling, splade=None,
                                                           multi_vector=False)
    if prompted:
        layout = getattr(model, "sentence_embedding", None) or SentenceEmbedding()
        model.sentence_embedding = with_default_prompt(layout, settings, name_or_path)
    masked_lm = masked_lm_head(checkpoint) if checkpoint.task is None and not hasattr(model, "masked_lm") else None
    model = inference.apply(model, tokenizer)
    return create_app(model, tokenizer, settings, model_name=model_name, checkpoint=checkpoint,
                      masked_lm=masked_lm)


SERVER_PROMPT = "server_default"  # the name --default-prompt's text goes by among the model's prompts


def with_default_prompt(layout: SentenceEmbedding, settings: ServeSettings, name_or_path) -> SentenceEmbedding:
    """The encoder's layout with the server's default prompt: one of its prompts, named, or a text of its own."""
    if settings.default_prompt is not None:
        return dataclasses.replace(layout, prompts={**layout.prompts, SERVER_PROMPT: settings.default_prompt},
                                   default_prompt_name=SERVER_PROMPT)
    if settings.default_prompt_name not in layout.prompts:
        known = f"its prompts are {', '.join(map(repr, sorted(layout.prompts)))}" if layout.prompts else \
            "it has no prompts (config_sentence_transformers.json); give the text with --default-prompt"
        raise ConfigError(f"--default-prompt-name {settings.default_prompt_name!r}: no such prompt in "
                          f"{name_or_path}: {known}")
    return dataclasses.replace(layout, default_prompt_name=settings.default_prompt_name)


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
    settings = settings or app.state.served.settings
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                          http=protocol_with_read_timeout(settings.read_timeout),
                          timeout_keep_alive=max(1, math.ceil(settings.idle_timeout)), **extra)


def serve(name_or_path: str | Path, host: str = "127.0.0.1", port: int = 8000,
          settings: ServeSettings | None = None, inference: InferenceOptions = AS_TRAINED,
          json_logs: bool = False) -> None:
    """Load the model and answer HTTP requests until interrupted; queued work is finished before it exits.
    `json_logs`: uvicorn logs through the root logger's handlers (which cli/json_log.py makes write JSON lines)."""
    try:
        import fastapi  # noqa: F401  (create_app needs it)
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as problem:
        raise BertforgeError(f"the server needs FastAPI, uvicorn and prometheus-client ({problem}); "
                             f"install them with: pip install 'bertforge[serve]'") from None
    listener = listening_socket(host, port)  # a port in use is the user's error, found before the model loads
    app = load_app(name_or_path, settings, inference)
    port = listener.getsockname()[1]  # the port the system chose for --port 0
    # at INFO on the logger the command shows without -v: a log watched for warnings stays quiet at each start
    logging.getLogger("bertforge.progress").info("serving %s (%s) on %s (API docs at /docs)", name_or_path,
                                                 type(app.state.served.model).__name__, server_url(host, port))
    # uvicorn's own logging configuration would give its loggers handlers of their own, in its format
    plain = {"log_config": None} if json_logs else {}
    uvicorn.Server(server_config(app, host, port, settings, **plain)).run(sockets=[listener])


def server_url(host: str, port: int) -> str:
    """The URL clients reach host:port at: an IPv6 address goes in brackets ("http://[::1]:8000")."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


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
