"""Vectors, by every API that asks for them: bertforge's and text-embeddings-inference's /embed, /embed_all,
/embed_sparse and /similarity; OpenAI's (and Jina's) /v1/embeddings; Cohere's /v1/embed and /v2/embed; Jina's
/v1/multi-vector for a ColBERT model; Weaviate's text2vec-transformers /vectors. All pool, prompt and cut as
`bertforge embed` does (ServedModel.embed)."""

import asyncio
import time
import uuid
from typing import Any

import torch

from bertforge.heads import encoder_of
from bertforge.inference.serve import schemas
from bertforge.inference.serve.cohere import TRUNCATION, base64_values, check_embedding_types, typed_embeddings
from bertforge.inference.serve.errors import ERRORS, OPENAI_ERRORS
from bertforge.inference.serve.input_types import ROLES, input_prompt
from bertforge.inference.serve.limits import HTTPError
from bertforge.inference.serve.metrics import tei_request
from bertforge.inference.serve.routes import Routes, Served
from bertforge.inference.serve.service import (
    ServedModel,
    check_not_empty,
    first_dimensions,
    input_list,
    is_one_input,
    tei_inputs,
)
from bertforge.inference.sparse_encoder import nonzero_weights

router = Routes(runs_model=True)


@router.post("/embed", response_model=schemas.EmbedResponse | list[list[float]], responses=ERRORS)
async def embed_texts(request: schemas.EmbedRequest, served: Served):
    """One vector per text: the last layer pooled over its tokens (cls, mean or max). With
    text-embeddings-inference's {"inputs": ...} the answer is a bare list of vectors, unit length unless
    "normalize": false (TEI's default)."""
    count_tei_inputs(request.inputs if request.inputs is not None else request.texts or [])
    if (request.texts is None) == (request.inputs is None):
        raise HTTPError(422, 'send "texts" (a list) or "inputs" (a text or a list), one of them')
    request = with_parameters(request)
    tei = request.inputs is not None
    texts = tei_inputs(request.inputs) if tei else request.texts
    served.check_count(len(texts))
    normalize = served.compared if tei and request.normalize is None else request.normalize
    vectors, _, used = await served.embed(texts, request.pooling, normalize, request.truncate,
                                          request.truncation_direction, request.prompt_name)
    vectors = first_dimensions(vectors, request.dimensions, used.normalize)
    if tei:  # floats, as TEI answers whatever encoding_format says: huggingface_hub's client sends it, reads floats
        return [vector.tolist() for vector in vectors]
    values = [encoded(vector, request.encoding_format) for vector in vectors]
    return {"embeddings": values, "dimension": len(vectors[0]), "pooling": used.pooling,
            "normalized": used.normalize}


# text2vec-transformers' pooling strategies, by bertforge's names
WEAVIATE_POOLINGS = {"masked_mean": "mean", "cls": "cls"}


@router.post("/vectors", response_model=schemas.VectorResponse | schemas.VectorsResponse, responses=ERRORS)
@router.post("/vectors/", response_model=schemas.VectorResponse | schemas.VectorsResponse, responses=ERRORS,
             include_in_schema=False)
async def weaviate_vectors(request: schemas.VectorsRequest, served: Served):
    """Weaviate's text2vec-transformers inference API: unit-length vectors with a query's or a document's prompt
    (the config's task_type), pooled as the checkpoint's layout says or, without one, as its pooling_strategy."""
    served.refuse_sparse()
    if (request.text is None) == (request.texts is None):
        raise HTTPError(422, 'send "text" (one text) or "texts" (a list), one of them')
    config = request.config or schemas.VectorsConfig()
    has_layout = getattr(encoder_of(served.model), "sentence_embedding", None) is not None
    pooling = None if has_layout else WEAVIATE_POOLINGS[config.pooling_strategy or "masked_mean"]
    role = "query" if config.task_type == "query" else "document"
    texts = [request.text] if request.texts is None else request.texts
    served.check_count(len(texts))
    vectors, _, _ = await served.embed(texts, pooling, True, prompt=input_prompt(role, served.layout().prompts))
    vectors = [vector.tolist() for vector in first_dimensions(vectors, config.dimensions, normalized=True)]
    if request.texts is not None:
        return {"vectors": vectors, "dims": len(vectors[0])}
    return {"text": request.text, "vector": vectors[0], "dim": len(vectors[0]), "dims": len(vectors[0])}


@router.post("/v1/embeddings", response_model=schemas.OpenAIEmbeddingResponse, responses=OPENAI_ERRORS)
@router.post("/embeddings", response_model=schemas.OpenAIEmbeddingResponse, responses=OPENAI_ERRORS)
async def openai_embeddings(request: schemas.OpenAIEmbeddingRequest, served: Served):
    """OpenAI's embeddings API (Jina's too): unit-length vectors, pooled as the checkpoint says (`bertforge
    embed`)."""
    count_tei_inputs(request.input)
    served.refuse_sparse()
    if request.late_chunking:
        raise HTTPError(422, "late_chunking is not supported: each input is embedded on its own")
    texts = hosted_inputs(request.input, served)
    role = request.input_type or (None if request.is_query is None else "query" if request.is_query
                                  else "document")
    encoding = chosen_encoding(request.embedding_type, request.encoding_type, request.encoding_format)
    if served.colbert is not None:  # as PyLate's server: queries unless asked for documents
        if encoding not in ("float", "base64"):
            raise HTTPError(422, f"encoding {encoding}: a multi-vector model's token vectors come as float or "
                                 f"base64")
        if not request.add_special_tokens:
            raise HTTPError(422, "add_special_tokens: a multi-vector model reads its [CLS] (and a query's marker)")
        vectors, tokens = await served.multi_vectors(texts, role or ROLES.get(request.task, "query"),
                                                     request.truncate, request.truncation_side,
                                                     dimensions=request.dimensions or None,
                                                     max_tokens=served.prompt_limit(request.truncate_prompt_tokens))
        data = [encoded(vector, encoding, request.embed_dtype, request.endianness) for vector in vectors]
    else:
        # the prompt for a query or a document (as encode_query / encode_document pick it), or Jina's task's
        prompt = input_prompt(request.task or role, served.layout().prompts)
        # unit length unless Jina's normalized or vLLM's normalize or use_activation is false: then the vectors as
        # pooled, before any normalisation (the layout's Normalize module too, as TEI's normalize false gives them)
        unit = False not in (request.normalized, request.normalize, request.use_activation)
        vectors, tokens, used = await served.embed(texts, None, unit, request.truncate, request.truncation_side,
                                                   prompt=prompt,
                                                   max_tokens=served.prompt_limit(request.truncate_prompt_tokens),
                                                   add_special_tokens=request.add_special_tokens)
        vectors = torch.stack(first_dimensions(vectors, request.dimensions or None, normalized=used.normalize))
        data = typed_embeddings(vectors, encoding, request.embed_dtype, request.endianness)
    data = [{"object": "embedding", "index": index, "embedding": embedding} for index, embedding in enumerate(data)]
    return {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "data": data,
            "model": served.model_name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


@router.post("/v1/embed", response_model=schemas.CohereEmbedResponse, responses=OPENAI_ERRORS)
async def cohere_embed_v1(request: schemas.CohereEmbedRequest, served: Served):
    """Cohere's embed API, v1: unit vectors, as floats unless embedding_types names others."""
    return await cohere_embeddings(request, served, version=1)


@router.post("/v2/embed", response_model=schemas.CohereEmbedResponse, responses=OPENAI_ERRORS)
async def cohere_embed_v2(request: schemas.CohereEmbedRequest, served: Served):
    """Cohere's embed API, v2: unit vectors by embedding type (floats by default)."""
    return await cohere_embeddings(request, served, version=2)


async def cohere_embeddings(request: schemas.CohereEmbedRequest, served: ServedModel, version: int) -> dict[str, Any]:
    served.refuse_sparse()
    if request.images is not None or request.input_type == "image":
        raise HTTPError(422, "images: this server embeds text")
    if (request.texts is None) == (request.inputs is None):
        raise HTTPError(422, 'send "texts" or "inputs", one of them')
    texts = request.texts or [" ".join(part.text for part in given.content) for given in request.inputs]
    served.check_count(len(texts), "texts")
    check_not_empty(texts)
    kinds = list(dict.fromkeys(request.embedding_types or ["float"]))
    check_embedding_types(kinds)
    prompt = input_prompt(request.input_type, served.layout().prompts)
    cut, side = TRUNCATION[request.truncate or "END"]
    read = texts if request.max_tokens is None else \
        await asyncio.to_thread(served.word_pieces_kept, texts, request.max_tokens, side, cut)
    vectors, tokens, _ = await served.embed(read, None, True, cut, side, prompt=prompt)
    vectors = torch.stack(first_dimensions(vectors, request.output_dimension, True, "output_dimension"))
    embeddings = {kind: typed_embeddings(vectors, kind) for kind in kinds}
    answer = {"id": str(uuid.uuid4()), "texts": texts,
              "meta": {"api_version": {"version": str(version)}, "billed_units": {"input_tokens": tokens}}}
    if version == 1 and request.embedding_types is None:
        return answer | {"response_type": "embeddings_floats", "embeddings": embeddings["float"]}
    return answer | {"response_type": "embeddings_by_type", "embeddings": embeddings}


@router.post("/v1/multi-vector", response_model=schemas.MultiVectorResponse, responses=OPENAI_ERRORS)
@router.post("/multi-vector", response_model=schemas.MultiVectorResponse, responses=OPENAI_ERRORS)
async def jina_multi_vector(request: schemas.MultiVectorRequest, served: Served):
    """Jina's multi-vector API, for a multi-vector (ColBERT) model: each text's token vectors as a query's or a
    document's (input_type, by default document)."""
    if served.colbert is None:
        raise HTTPError(409, f"wrong model: {served.model_name} is not a multi-vector (ColBERT) model; "
                             f"/v1/embeddings gives its vectors")
    texts = hosted_inputs(request.input, served)
    vectors, tokens = await served.multi_vectors(texts, request.input_type, dimensions=request.dimensions)
    encoding_format = chosen_encoding(request.embedding_type, request.encoding_format)
    data = [{"object": "embeddings", "index": index, "embeddings": encoded(rows, encoding_format)}
            for index, rows in enumerate(vectors)]
    return {"object": "list", "data": data, "model": served.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


@router.post("/embed_all", response_model=list[list[list[float]]], responses=ERRORS)
async def embed_all(request: schemas.EmbedAllRequest, served: Served):
    """text-embeddings-inference's: the last layer's vector of every token of each text, [CLS] and [SEP] included
    (not pooled, not normalized)."""
    count_tei_inputs(request.inputs)
    if served.splade is not None:
        raise HTTPError(409, f"wrong model: {served.model_name} is a SPLADE model; /embed_all is for dense encoders "
                             f"(/embed_sparse gives its weights)")
    inputs = tei_inputs(request.inputs)
    served.check_count(len(inputs))
    states, _ = await served.token_states(inputs, request.truncate, request.truncation_direction, request.prompt_name)
    return [vectors.tolist() for vectors in states]


@router.post("/embed_sparse", response_model=list[list[schemas.SparseValue]], responses=ERRORS)
async def embed_sparse(request: schemas.EmbedSparseRequest, served: Served):
    """text-embeddings-inference's, for a SPLADE model: each text's nonzero weights as {index, value}, index being
    the word piece's vocabulary id, in id order."""
    count_tei_inputs(request.inputs)
    if served.splade is None:
        raise HTTPError(409, f"wrong model: {served.model_name} is not a SPLADE model (a masked-LM model with "
                             f"sentence-transformers' SpladePooling); /embed_sparse needs one")
    inputs = tei_inputs(request.inputs)
    served.check_count(len(inputs))
    vectors, _, _ = await served.embed(inputs, None, None, request.truncate, request.truncation_direction,
                                       request.prompt_name)
    return [[{"index": i, "value": v} for i, v in zip(*nonzero_weights(vector))] for vector in vectors]


@router.post("/similarity", response_model=list[float], responses=ERRORS)
async def similarity(request: schemas.SimilarityRequest, served: Served):
    """text-embeddings-inference's (the Hugging Face sentence-similarity task): the cosine similarity of
    source_sentence's embedding with each sentence's."""
    parameters = request.parameters or schemas.SimilarityParameters()
    texts = [request.inputs.source_sentence, *request.inputs.sentences]
    tei_request(single=False, kind="embed", inputs=len(texts))  # TEI passes them on to /embed as a batch
    served.check_count(len(texts))
    check_not_empty(texts)
    if served.colbert is not None:  # the source sentence as the query, the sentences as documents
        scores, _ = await served.late_interaction(texts[0], texts[1:], parameters.truncate,
                                                  parameters.truncation_direction, parameters.prompt_name)
        return scores
    vectors, _, _ = await served.embed(texts, None, served.compared, parameters.truncate,
                                       parameters.truncation_direction, parameters.prompt_name)
    return [float(vectors[0] @ vector) for vector in vectors[1:]]


def count_tei_inputs(inputs: str | list) -> None:
    """Count a request to one of TEI's embedding routes in its metrics: one input (a text or token ids) or a
    list."""
    single = is_one_input(inputs)
    tei_request(single, kind="embed", inputs=1 if single else len(inputs))


def with_parameters(request: schemas.EmbedRequest) -> schemas.EmbedRequest:
    """The request with the feature-extraction parameters it sent in "parameters" as its own fields (a field given
    in both places is 422)."""
    if request.parameters is None:
        return request
    given = request.parameters.model_dump(exclude_unset=True)
    twice = sorted(set(given) & request.model_fields_set)
    if twice:
        raise HTTPError(422, f"{twice[0]} is given twice, in the request and in its parameters: send it once")
    return request.model_copy(update={name: value for name, value in given.items() if value is not None})


def hosted_inputs(given: str | list, served: ServedModel) -> list:
    """OpenAI's and Jina's `input` (a text, texts, token ids, lists of token ids) as a list of texts or of id
    lists, within max_texts. Token ids are a whole model input, [CLS] first and [SEP] last: OpenAI's clients may
    send another tokenizer's ids (LangChain's OpenAIEmbeddings sends tiktoken's to check lengths), which read as
    this vocabulary's would give wrong vectors without a word."""
    texts = input_list(given)
    served.check_count(len(texts), "inputs")
    check_not_empty(texts)  # as OpenAI refuses "", and /embed
    if texts and isinstance(texts[0], list):  # (the vocabulary's ids: checked as the rows are made)
        tokenizer = served.tokenizer
        for index, ids in enumerate(texts):
            if ids[0] != tokenizer.cls_token_id or ids[-1] != tokenizer.sep_token_id:
                raise HTTPError(422, f"input {index}: token ids are read as the model's own, a whole input from "
                                     f"[CLS] ({tokenizer.cls_token_id}) to [SEP] ({tokenizer.sep_token_id}); send "
                                     f"text where a client sends another tokenizer's ids (LangChain's "
                                     f"OpenAIEmbeddings: check_embedding_ctx_length=False)")
    return texts


def chosen_encoding(*given: str | None) -> str:
    """The encoding a request asks for under the first of its names for it that it sends (Jina's embedding_type,
    its older encoding_type, OpenAI's encoding_format); float where it sends none."""
    return next((encoding for encoding in given if encoding is not None), "float")


def encoded(vectors: torch.Tensor, encoding_format: str, dtype: str = "float32", endianness: str = "little"
            ) -> list | str:
    """A vector (or a text's token vectors) as floats, or as base64 of its little-endian float32 values (or of
    vLLM's embed_dtype and endianness)."""
    return base64_values(vectors, dtype, endianness) if encoding_format == "base64" else vectors.tolist()
