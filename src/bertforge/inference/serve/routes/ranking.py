"""Texts ranked by relevance to a query, best first: bertforge's and text-embeddings-inference's /rerank, and
Cohere's /v1/rerank and /v2/rerank (which Jina's and vLLM's clients send too). A pair classifier, an encoder and a
ColBERT model each score relevance their own way (ServedModel.relevance)."""

import asyncio
import uuid
from typing import Any

from bertforge.inference.serve import schemas
from bertforge.inference.serve.cohere import document_text, returned_document
from bertforge.inference.serve.errors import ERRORS, OPENAI_ERRORS
from bertforge.inference.serve.routes import Routes, Served
from bertforge.inference.serve.service import ServedModel

router = Routes()


@router.post("/rerank", response_model=list[schemas.RerankResult] | schemas.CohereRerankResponse,
             response_model_exclude_unset=True, responses=ERRORS)
async def rerank(request: schemas.RerankRequest | schemas.CohereRerankRequest, served: Served):
    """The texts ranked by relevance to the query, best first: a pair classifier's probability of its last label
    (or the sigmoid of a one-output model's score; raw_scores: the logit or score), or, for an encoder, the cosine
    similarity of the texts' embeddings. Sent "documents" (as vLLM's and Infinity's /rerank take), Cohere's answer,
    as /v1/rerank."""
    if isinstance(request, schemas.CohereRerankRequest):
        return await cohere_answer(request, served)
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


async def cohere_answer(request: schemas.CohereRerankRequest, served: ServedModel) -> dict[str, Any]:
    """Cohere's answer to a request in its shape, at /v1/rerank, /v2/rerank or /rerank."""
    served.check_count(len(request.documents), "documents")
    texts = [document_text(document, request.rank_fields, index) for index, document in enumerate(request.documents)]
    if request.max_tokens_per_doc is not None:
        texts = await asyncio.to_thread(served.word_pieces_kept, texts, request.max_tokens_per_doc)
    scores, tokens = await served.relevance(request.query, texts, request.raw_scores, cut=True)
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:request.top_n]
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": returned_document(request.documents[i])} if request.return_documents else {})}
               for i in ranked]
    return {"id": str(uuid.uuid4()), "model": served.model_name, "results": results, "usage": {"total_tokens": tokens}}
