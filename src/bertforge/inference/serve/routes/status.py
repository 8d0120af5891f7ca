"""What the server holds and how it is doing: /health (and HEAD for load balancers), Prometheus' /metrics,
text-embeddings-inference's /info, OpenAI's /v1/models, vLLM's /version, and Weaviate's text2vec-transformers
probes and /meta."""

from importlib.metadata import PackageNotFoundError, version

from fastapi.responses import Response

from bertforge.config import dtype_name
from bertforge.inference.serve import schemas
from bertforge.inference.serve.errors import OPENAI_ERRORS
from bertforge.inference.serve.limits import HEALTH_PATH, HTTPError
from bertforge.inference.serve.routes import Routes, Served
from bertforge.inference.serve.service import ServedModel
from bertforge.inference.sparse_encoder import SPLADE

MULTI_VECTOR = "multi_vector"  # /info's pooling of a multi-vector (ColBERT) model: none, a vector per token

# models.retrieve of a model the server doesn't hold is 404, as OpenAI answers it
MODEL_ERRORS = {**OPENAI_ERRORS, 404: {"model": schemas.OpenAIErrorResponse, "description": "no model of that name"}}

router = Routes()


@router.get("/info", response_model=schemas.InfoResponse, response_model_exclude_none=True)
async def info(served: Served):
    """text-embeddings-inference's description of the model and the server's limits (max_input_length: where the
    model's inputs are cut or refused, ServedModel.input_limit)."""
    task, model, settings = served.task, served.model, served.settings
    embedded = served.layout()
    if served.colbert is not None:
        model_type = {"embedding": {"pooling": MULTI_VECTOR}}
    elif task is None:
        model_type = {"embedding": {"pooling": SPLADE if served.splade is not None else embedded.pooling}}
    elif task.head == "sequence_classification":  # TEI's reranker: one output; else its classifier
        id2label = {str(index): label for index, label in model.config.id2label.items()}
        kind = "reranker" if len(id2label) == 1 else "classifier"
        model_type = {kind: {"id2label": id2label, "label2id": model.config.label2id}}
    else:  # tasks TEI doesn't serve: bertforge's task alone
        model_type = {}
    return {"model_id": served.model_name, "task": task.name if task is not None else None,
            "model_dtype": model_dtype(model), "model_type": model_type,
            "max_concurrent_requests": settings.max_concurrent_requests,
            "max_input_length": served.input_limit(), "max_batch_tokens": settings.max_batch_tokens,
            "max_batch_requests": settings.max_batch_size, "max_client_batch_size": settings.max_texts,
            "auto_truncate": served.truncate, "tokenization_workers": 1, "version": bertforge_version()}


def model_dtype(model) -> str:
    """The precision the model's weights are stored in: a quantized checkpoint's (int8, or bf16 where it computes
    in float32), else its parameters' dtype."""
    quantization = getattr(model, "quantization", None)
    if quantization is not None:
        return {"bf16": "bfloat16"}.get(quantization.precision, quantization.precision)
    return dtype_name(next(model.parameters()).dtype)


@router.get("/v1/models", response_model=schemas.ModelList, responses=OPENAI_ERRORS)
async def openai_models(served: Served):
    """The one model this server holds, as OpenAI's model list."""
    return {"object": "list", "data": [model_card(served.model_name)]}


@router.get("/models", response_model=schemas.InfinityModelList, responses=OPENAI_ERRORS)
async def infinity_models(served: Served):
    """The one model this server holds, as Infinity's model list (which OpenAI's client reads too, given the
    server's bare URL): OpenAI's model object with Infinity's stats, backend and capabilities."""
    return {"object": "list", "data": [model_card(served.model_name) | {
        "owned_by": "infinity", "stats": {}, "backend": "torch", "capabilities": capabilities(served)}]}


def capabilities(served: ServedModel) -> list[str]:
    """Infinity's names for what the model answers: an encoder embeds (a SPLADE model at /embed_sparse alone) and
    reranks; a sequence classifier classifies, and reranks where it reads pairs."""
    if served.task is None:
        return ["rerank"] if served.splade is not None else ["embed", "rerank"]
    if served.task.head != "sequence_classification":
        return []
    return ["classify"] + (["rerank"] if served.ranking_refusal() is None else [])


@router.get("/v1/models/{model:path}", response_model=schemas.ModelCard, responses=MODEL_ERRORS)
@router.get("/models/{model:path}", response_model=schemas.ModelCard, responses=MODEL_ERRORS)
async def openai_model(model: str, served: Served):
    """The model this server holds, as OpenAI's model object (the openai client's models.retrieve); another name
    is 404."""
    if model != served.model_name:
        raise HTTPError(404, f"The model {model!r} does not exist: this server holds {served.model_name!r}")
    return model_card(served.model_name)


def model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "bertforge"}


@router.head(HEALTH_PATH, include_in_schema=False)
async def health_probe():  # load balancers that probe with HEAD
    return Response(status_code=200)


@router.get(HEALTH_PATH, response_model=schemas.HealthResponse)
@router.get("/", response_model=schemas.HealthResponse, include_in_schema=False)  # TEI's health routes too,
@router.get("/ping", response_model=schemas.HealthResponse, include_in_schema=False)  # /ping SageMaker's
@router.post("/ping", response_model=schemas.HealthResponse, include_in_schema=False)  # vLLM's takes POST too
async def health(served: Served):
    """Liveness, what is loaded, and how requests have been batched (answered without the API key)."""
    batcher, settings = served.batcher, served.settings
    return {"status": "ok", "model": served.model_name, "architecture": type(served.colbert or served.model).__name__,
            "task": served.task.name if served.task else None, "device": str(served.device),
            "queued": batcher.pending, "batches": batcher.batches, "texts": batcher.rows,
            "largest_batch": batcher.largest_batch,
            "limits": {"max_texts": settings.max_texts, "max_length": served.max_length,
                       "long_text": settings.long_text, "max_queue": settings.max_queue,
                       "max_batch_size": settings.max_batch_size, "max_batch_tokens": settings.max_batch_tokens,
                       "max_body_bytes": settings.max_body_bytes,
                       "max_concurrent_requests": settings.max_concurrent_requests}}


@router.get("/version", response_model=schemas.VersionResponse)
async def server_version():
    """The server's version, as vLLM's /version gives its own."""
    return {"version": bertforge_version()}


@router.get("/.well-known/live", status_code=204, response_class=Response)
@router.get("/.well-known/ready", status_code=204, response_class=Response)
async def weaviate_probe():
    """Weaviate's text2vec-transformers probes: 204 once the model is loaded (answered without the API key)."""
    return Response(status_code=204)


@router.get("/meta")
async def weaviate_meta(served: Served) -> dict:
    """Weaviate's text2vec-transformers description of the model: {"model": its config.json}."""
    return {"model": served.model.config.to_dict()}


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def prometheus_metrics(served: Served):
    """Prometheus metrics: requests by route and status, latency, queue depth, batch sizes, tokens; and
    text-embeddings-inference's te_* families, by TEI's names."""
    body, content_type = served.metrics.render()
    return Response(body, media_type=content_type)


def bertforge_version() -> str:
    try:
        return version("bertforge")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"
