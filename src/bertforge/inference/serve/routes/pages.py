"""What a person reads in a browser: the attention viewer, the explanation of a prediction (also as JSON), and
the offline /docs page."""

import asyncio
from typing import Any

from fastapi import Query, Request
from fastapi.responses import HTMLResponse

from bertforge.errors import InputError
from bertforge.explain.methods import DEFAULT_STEPS, shapley_passes
from bertforge.explain.targets import explained_length, integration_paths
from bertforge.inference.attention_view import attention_map, encode_for_attention, render_attention_map
from bertforge.inference.serve import schemas
from bertforge.inference.serve.batcher import Job
from bertforge.inference.serve.docs import render_docs
from bertforge.inference.serve.errors import ERRORS, PAGE_ERRORS
from bertforge.inference.serve.jobs import attentions, explanations
from bertforge.inference.serve.limits import HTTPError
from bertforge.inference.serve.routes import Routes, Served
from bertforge.inference.serve.service import ServedModel

router = Routes()


@router.get("/attention", runs_model=True, response_class=HTMLResponse, responses=PAGE_ERRORS)
async def attention(served: Served, text: str = Query(min_length=1), pair: str | None = None) -> HTMLResponse:
    """The attention viewer page (every layer and head) for a text, or a pair of texts."""
    if not text.strip():
        raise HTTPError(422, "text is empty: nothing to show attention over")
    pair = pair if pair and pair.strip() else None  # an empty pair is no pair, as the query string can't omit it
    try:
        row = await asyncio.to_thread(encode_for_attention, served.tokenizer, text, pair,
                                      served.attention_max_length, served.truncate)
    except InputError as problem:  # over the viewer's limit, on a server that refuses long texts
        raise HTTPError(413, str(problem)) from None
    ((weights, queries, keys),) = await served.run_jobs([Job(attentions, row)])
    # Rendering writes layers * heads * seq^2 numbers: off the event loop.
    page = await asyncio.to_thread(render_attention_map, attention_map(served.tokenizer, row, weights, queries, keys),
                                   f"Attention: {text[:80]}")
    return HTMLResponse(page)


@router.post("/explain", runs_model=True, responses=ERRORS)
async def explain_json(request: schemas.ExplainRequest, served: Served) -> dict[str, Any]:
    """Attributions of the model's prediction to the words of the text (bertforge.explain), as JSON."""
    return await explanation(request, served, as_page=False)


@router.get("/explain", runs_model=True, response_class=HTMLResponse, responses=PAGE_ERRORS)
async def explain_page(served: Served, text: str = Query(min_length=1), pair: str | None = None,
                       target: str | None = None,
                       method: schemas.ExplainMethod = "integrated_gradients",
                       baseline: schemas.ExplainBaseline = "pad") -> HTMLResponse:
    """The explanation page: the words shaded by attribution, beside the attention views."""
    request = schemas.ExplainRequest(text=text, text_pair=pair or None, target=target or None, method=method,
                                     baseline=baseline)
    return HTMLResponse(await explanation(request, served, as_page=True))


async def explanation(request: schemas.ExplainRequest, served: ServedModel, as_page: bool) -> dict[str, Any] | str:
    """One job for the worker, the only code that touches the model (the explanation hooks it)."""
    pairs = None if request.text_pair is None else [request.text_pair]
    row = (await asyncio.to_thread(served.encode_texts, [request.text], pairs))[0]
    # Integrated gradients runs the model `steps` times over the text; the worker, which every route shares, takes
    # one explanation at a time: a request costs at most a default one on the longest text.
    max_length = served.max_length
    # As /predict reads the text (the fine-tuned task's max_length), and an encoder as /embed and /similarity do
    # (its sentence-transformers layout's), within the server's.
    reads = min(served.run.max_length if served.run is not None else
                explained_length(served.model, served.tokenizer), max_length)
    paths = integration_paths(served.model, request.text_pair)
    tokens = min(len(row["input_ids"]), reads)
    if served.run is not None and getattr(served.run.settings, "long_text", None) == "windows":
        # a classifier fine-tuned on windows is explained over every window of the text, which hold each of its
        # tokens about twice (they advance by half a window)
        whole = await asyncio.to_thread(served.tokenizer, request.text, text_pair=request.text_pair,
                                        truncation=False)
        tokens = max(tokens, 2 * len(whole["input_ids"]))
    # Integrated gradients runs forward and backward `steps` times per path (each text against the other: two),
    # SmoothGrad `steps` times over both texts at once.
    runs = paths if request.method == "integrated_gradients" else 1
    work, budget = request.steps * tokens * runs, DEFAULT_STEPS * max_length
    if request.method in ("integrated_gradients", "smoothgrad") and work > budget:
        per_text = " x 2 (each text against the other)" if runs == 2 else ""
        raise HTTPError(413, f"steps x tokens is {request.steps} x {tokens}{per_text} = {work}; the limit is "
                             f"{budget} ({DEFAULT_STEPS} steps x max_length {max_length}): ask for fewer steps or "
                             f"send a shorter text")
    # Occlusion runs the model forward once per token, a third of a step of integrated gradients (forward and
    # backward): the same limit.
    if request.method == "occlusion" and tokens * tokens > 3 * budget:
        raise HTTPError(413, f"occlusion runs the model once per token: {tokens} x {tokens} tokens = "
                             f"{tokens * tokens}; the limit is {3 * budget} (3 x {DEFAULT_STEPS} steps x max_length "
                             f"{max_length}): send a shorter text or use integrated_gradients")
    # Shapley values run the model forward once per subset of the tokens (exact) or per token and sampled order, LIME
    # once per sample: a third of a step of integrated gradients each, as occlusion's.
    if request.method in ("shapley", "lime"):
        per_path = shapley_passes(max(1, tokens - 2), request.steps) if request.method == "shapley" else request.steps
        passes = paths * per_path  # [CLS] and [SEP] are their own baseline
        if passes * tokens > 3 * budget:
            fewer = "sampled orders" if request.method == "shapley" else "samples"
            raise HTTPError(413, f"{request.method} runs the model {passes} times over {tokens} tokens = "
                                 f"{passes * tokens}; the limit is {3 * budget} (3 x {DEFAULT_STEPS} steps x "
                                 f"max_length {max_length}): ask for fewer steps ({fewer}), send a shorter text or "
                                 f"use integrated_gradients")
    options = {**request.model_dump(), "tokenizer": served.tokenizer, "max_length": reads, "as_page": as_page,
               "attention_max_length": served.attention_max_length}
    (result,) = await served.run_jobs([Job(explanations, row, options)])
    return result


@router.get("/docs", response_class=HTMLResponse, include_in_schema=False)
async def docs(request: Request):
    return HTMLResponse(render_docs(request.app.openapi()))


@router.get("/api-doc/openapi.json", include_in_schema=False)
async def openapi_document(request: Request) -> dict:
    """The OpenAPI document where text-embeddings-inference publishes its own (also at /openapi.json)."""
    return request.app.openapi()
