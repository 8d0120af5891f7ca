"""Texts ranked by relevance to a query, best first: bertforge's and text-embeddings-inference's /rerank, and
Cohere's /v1/rerank and /v2/rerank (which Jina's and vLLM's clients send too); and vLLM's /score, pairs of texts
scored. A pair classifier, an encoder and a ColBERT model each score relevance their own way
(ServedModel.relevance)."""

import asyncio
import time
import uuid
from typing import Any

from bertforge.inference.serve import schemas
from bertforge.inference.serve.cohere import document_text, returned_document
from bertforge.inference.serve.errors import ERRORS, OPENAI_ERRORS
from bertforge.inference.serve.limits import HTTPError
from bertforge.inference.serve.metrics import tei_request
from bertforge.inference.serve.routes import Routes, Served, sent_by_infinity_client
from bertforge.inference.serve.service import ServedModel

router = Routes(runs_model=True)


@router.post("/rerank", response_model=list[schemas.RerankResult] | schemas.CohereRerankResponse,
             response_model_exclude_unset=True, responses=ERRORS)
async def rerank(request: schemas.RerankRequest | schemas.CohereRerankRequest, served: Served):
    """The texts ranked by relevance to the query, best first: a pair classifier's probability of its last label
    (or the sigmoid of a one-output model's score; raw_scores: the logit or score), or, for an encoder, the cosine
    similarity of the texts' embeddings. Sent "documents" (as vLLM's and Infinity's /rerank take), Cohere's answer,
    as /v1/rerank; Infinity's, sent by Infinity's client."""
    # TEI's rerank predicts each (query, text) pair, and counts the request as a batch
    tei_request(single=False, kind="predict", inputs=len(request.texts if isinstance(request, schemas.RerankRequest)
                                                         else request.documents))
    if isinstance(request, schemas.CohereRerankRequest):
        return await cohere_answer(request, served, infinity=sent_by_infinity_client(request))
    served.check_count(len(request.texts))
    scores, _ = await served.relevance(request.query, request.texts, request.raw_scores, request.truncate,
                                       request.truncation_direction)
    # best first; of equal scores the later text first, as text-embeddings-inference orders them
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], -i))[:request.top_n]
    return [{"index": i, "score": scores[i], **({"text": request.texts[i]} if request.return_text else {})}
            for i in ranked]


@router.post("/v1/rerank", response_model=schemas.CohereRerankResponse, response_model_exclude_unset=True,
             responses=OPENAI_ERRORS)
@router.post("/v2/rerank", response_model=schemas.CohereRerankResponse, response_model_exclude_unset=True,
             responses=OPENAI_ERRORS)
async def cohere_rerank(request: schemas.CohereRerankRequest, served: Served):
    """Cohere's rerank API (Jina's and vLLM's clients send the same): the documents ranked by relevance to the
    query, best first, scored as /rerank scores them; a long document is cut, as Cohere cuts it."""
    return await cohere_answer(request, served)


async def cohere_answer(request: schemas.CohereRerankRequest, served: ServedModel, infinity: bool = False
                        ) -> dict[str, Any]:
    """Cohere's answer to a request in its shape, at /v1/rerank, /v2/rerank or /rerank; each result with its
    document unless return_documents is false (vLLM always returns it, Jina by default). `infinity`: Infinity's
    answer (its /rerank's): each document as its text, and only when asked."""
    served.check_count(len(request.documents), "documents")
    sent = [document_text(document, request.rank_fields, index) for index, document in enumerate(request.documents)]
    texts = await word_pieces_kept(served, sent, request.max_tokens_per_doc)
    [query] = await word_pieces_kept(served, [request.query], request.max_tokens_per_query)
    scores, tokens = await served.relevance(query, texts, request.raw_scores or request.raw, cut=True,
                                            side=request.truncation_side,
                                            max_tokens=served.prompt_limit(request.truncate_prompt_tokens))
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:request.top_n or None]
    answer = {"id": str(uuid.uuid4()), "model": served.model_name,
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if infinity:
        return answer | {"object": "rerank", "created": int(time.time()), "results": [
            {"index": i, "relevance_score": scores[i], **({"document": sent[i]} if request.return_documents else {})}
            for i in ranked]}
    return answer | {"results": [{"index": i, "relevance_score": scores[i], **(
        {"document": returned_document(request.documents[i])} if request.return_documents is not False else {})}
        for i in ranked]}


async def word_pieces_kept(served: ServedModel, texts: list[str], count: int | None) -> list[str]:
    """Each text within a request's `count` word pieces (None or 0: as it is)."""
    return await asyncio.to_thread(served.word_pieces_kept, texts, count) if count else texts


# vLLM's names for the two sides of its score request: the first texts, and those each is scored against
SCORE_FIELDS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


@router.post("/score", response_model=schemas.ScoreResponse, responses=OPENAI_ERRORS)
@router.post("/v1/score", response_model=schemas.ScoreResponse, responses=OPENAI_ERRORS)
async def score(request: schemas.ScoreRequest, served: Served):
    """vLLM's score API: each pair of texts scored as /rerank scores a text for a query (a pair classifier's
    probability, its logit with use_activation false; an encoder's cosine similarity): one first text against
    every second one (1:N), or the two lists pair by pair (N:N)."""
    sent = {name for pair in SCORE_FIELDS for name in pair if getattr(request, name) is not None}
    names = next((pair for pair in SCORE_FIELDS if set(pair) == sent), None)
    if names is None:
        forms = ", ".join(" and ".join(pair) for pair in SCORE_FIELDS)
        raise HTTPError(422, f"send the two sides of the pairs under one of vLLM's names: {forms}")
    firsts, seconds = ([value] if isinstance(value, str) else value for value in (getattr(request, name)
                                                                                  for name in names))
    if len(firsts) not in (1, len(seconds)):
        raise HTTPError(422, f"{names[0]} has {len(firsts)} texts and {names[1]} {len(seconds)}: score one against "
                             f"many (1:N) or as many of each, pair by pair (N:N)")
    served.check_count(len(seconds), "pairs")
    firsts = await word_pieces_kept(served, firsts, request.max_tokens_per_query)
    seconds = await word_pieces_kept(served, seconds, request.max_tokens_per_doc)
    limit = served.prompt_limit(request.truncate_prompt_tokens)
    # one relevance call per distinct first text, all at once: the batcher runs their rows together
    by_first: dict[str, list[int]] = {}
    for index in range(len(seconds)):
        by_first.setdefault(firsts[index if len(firsts) > 1 else 0], []).append(index)
    answers = await asyncio.gather(*(served.relevance(first, [seconds[i] for i in indices], request.raw,
                                                      side=request.truncation_side, max_tokens=limit)
                                     for first, indices in by_first.items()))
    scores = [0.0] * len(seconds)
    for indices, (values, _) in zip(by_first.values(), answers):
        for index, value in zip(indices, values):
            scores[index] = value
    tokens = sum(count for _, count in answers)
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": served.model_name, "data": [{"index": i, "object": "score", "score": value}
                                                 for i, value in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
