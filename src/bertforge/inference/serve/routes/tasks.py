"""A model's own answers: a fine-tuned model's at /predict (as `bertforge predict` gives them, or
text-embeddings-inference's scores), a sequence classifier's at vLLM's /classify, a masked-LM model's at /fill_mask,
and POST /, where huggingface_hub's InferenceClient sends every task as the Hugging Face Inference API takes it."""

import asyncio
import dataclasses
import functools
import json
import time
import uuid
from typing import Any

import torch
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from bertforge.inference.fill_mask import mask_positions, top_tokens
from bertforge.inference.pipelines import Pipeline, fill_answer, target_ids
from bertforge.inference.serve import schemas
from bertforge.inference.serve.batcher import Job
from bertforge.inference.serve.errors import ERRORS, OPENAI_ERRORS
from bertforge.inference.serve.limits import HTTPError
from bertforge.inference.serve.metrics import count_characters, tei_request
from bertforge.inference.serve.routes import Routes, Served, sent_by_infinity_client
from bertforge.inference.serve.routes.embeddings import (
    embed_sparse,
    embed_texts,
    encoded,
    hosted_inputs,
    openai_embeddings,
    similarity,
)
from bertforge.inference.serve.routes.ranking import SCORE_FIELDS, cohere_answer, rerank, score
from bertforge.inference.serve.service import UNLIMITED, ServedModel, check_not_empty, input_list
from bertforge.inference.serve.tei import predict_inputs
from bertforge.tasks import classification
from bertforge.tasks.registry import HEADS, Task

# The Inference API's requests at POST / of the tasks answered by transformers' pipelines, by pipeline task
PIPELINE_REQUESTS = {"token-classification": schemas.TokenClassificationRequest,
                     "question-answering": schemas.QuestionAnsweringRequest,
                     "zero-shot-classification": schemas.ZeroShotRequest}

# What POST / takes: text-embeddings-inference's requests, and the Hugging Face Inference API's
RootRequest = schemas.EmbedRequest | schemas.SimilarityRequest | schemas.RerankRequest | schemas.PredictRequest \
    | schemas.TokenClassificationRequest | schemas.QuestionAnsweringRequest | schemas.ZeroShotRequest

# What an encoder's and a sequence classifier's requests at POST / take as "parameters"
PARAMETERS = {schemas.EmbedRequest: schemas.FeatureExtractionParameters,
              schemas.PredictRequest: schemas.TextClassificationParameters}

router = Routes(runs_model=True)


@router.post("/predict", response_model=schemas.PredictResponse | list[schemas.Prediction]
             | list[list[schemas.Prediction]], response_model_exclude_unset=True, responses=ERRORS)
async def predict(request: schemas.PredictRequest, served: Served):
    """The fine-tuned model's answers, as `bertforge predict` gives them: a label with probabilities, a score,
    entities with character spans into each text, or per question the answer's span of its context. With
    text-embeddings-inference's "inputs", a sequence classifier's scores in its shape."""
    if request.inputs is not None:
        single, items = predict_inputs(request.inputs)
        tei_request(single, kind="predict", inputs=len(items))
    else:
        tei_request(single=False, kind="predict", inputs=len(request.texts or request.questions or []))
    current = served.require_task()
    if request.inputs is not None:
        return await tei_predict(current, request, served)
    takes_questions = current.name == "qa"
    if request.questions is not None and (request.texts is not None or request.text_pairs is not None):
        raise HTTPError(422, 'send either "texts" (and "text_pairs") or "questions", not both')
    wanted = '"questions": [{"question", "context"}]' if takes_questions else '"texts" (and "text_pairs")'
    given = request.questions if takes_questions else request.texts
    if given is None:
        other = request.texts if takes_questions else request.questions
        status = 409 if other is not None else 422
        raise HTTPError(status, f"{'wrong task' if other is not None else 'nothing to predict'}: "
                                f"{served.model_name} does {current.name}, which takes {wanted}")
    served.check_count(len(given), "questions" if takes_questions else "texts")
    if takes_questions:
        for index, item in enumerate(given):
            for name in ("question", "context"):
                if not getattr(item, name).strip():
                    raise HTTPError(422, f"questions.{index}.{name} is empty")
        # Each question's id: the client's, else its place in the request (1, 2, ...), as `predict` numbers the
        # questions of a file.
        examples = [dataclasses.replace(current.example(item.question, item.context), id=item.id or str(number))
                    for number, item in enumerate(given, 1)]
    else:
        if request.text_pairs is not None and len(request.text_pairs) != len(given):
            raise HTTPError(422, f"got {len(given)} texts but {len(request.text_pairs)} text_pairs")
        pairs = request.text_pairs or [None] * len(given)
        examples = [current.example(text, pair) for text, pair in zip(given, pairs)]
    return {"task": current.name, "predictions": (await served.predict_examples(examples))[0]}


async def tei_predict(current: Task, request: schemas.PredictRequest, served: ServedModel) -> list:
    """TEI's answer for a sequence classifier: per input, {score, label} highest first; a bare list for one."""
    if current.head != "sequence_classification":
        raise HTTPError(409, f"wrong task: {served.model_name} does {current.name}; \"inputs\" (text-embeddings-"
                             f"inference's) is for a sequence classifier: send "
                             f"{'questions' if current.name == 'qa' else 'texts'}")
    if request.texts is not None or request.text_pairs is not None or request.questions is not None:
        raise HTTPError(422, 'send "inputs" (text-embeddings-inference\'s) or "texts", not both')
    single, items = predict_inputs(request.inputs)
    served.check_count(len(items), "inputs")
    check_not_empty([text for item in items for text in item if text is not None])
    config = served.model.config
    logits, _ = await classifier_logits(current, items, served, request.truncate, request.truncation_direction)
    parameters = request.parameters or schemas.TextClassificationParameters()
    function = "none" if request.raw_scores else \
        parameters.function_to_apply or classification.score_function(config)
    scores = classification.SCORE_FUNCTIONS[function](logits)
    answers = [classification.ranked_scores(row, config.id2label, parameters.top_k) for row in scores]
    return answers[0] if single else answers


async def classifier_logits(current: Task, items: list[tuple[str, str | None]], served: ServedModel,
                            cut: bool | None = None, side: str = "right", max_tokens: int | None = None
                            ) -> tuple[torch.Tensor, int]:
    """A sequence classifier's (items, labels) logits of (text, pair or None) items, and the tokens it read."""
    logits, tokens = torch.empty(len(items), served.model.config.num_labels), 0
    # single texts and pairs may come in one batch; the task encodes one kind at a time
    for paired in (False, True):
        indices = [index for index, (_, pair) in enumerate(items) if (pair is not None) == paired]
        if indices:
            examples = [current.example(*items[index]) for index in indices]
            features, outputs = await served.task_outputs(examples, cut, side, max_tokens)
            logits[indices] = classification.example_logits(features, outputs, len(examples))
            tokens += sum(features.lengths())
    return logits, tokens


@router.post("/classify", response_model=schemas.ClassifyResponse, responses=OPENAI_ERRORS)
@router.post("/v1/classify", response_model=schemas.ClassifyResponse, responses=OPENAI_ERRORS)
async def classify(request: schemas.ClassifyRequest, served: Served):
    """vLLM's classify API, for a sequence classifier: per text its most probable label and every label's
    probability in the model's label order (softmax; sigmoid for a multi-label model; a regression model's score
    as it is), or with use_activation false the logits, as /predict's "inputs" scores them. Sent Infinity's
    raw_scores, Infinity's answer: per text its {score, label}, highest first."""
    current = served.require_task()
    if current.head != "sequence_classification":
        raise HTTPError(409, f"wrong task: {served.model_name} does {current.name}; /classify is for a sequence "
                             f"classifier: use /predict")
    if not request.add_special_tokens:
        raise HTTPError(422, "add_special_tokens: false leaves out the [CLS] the classifier reads its answer from")
    texts = input_list(request.input)
    served.check_count(len(texts))
    check_not_empty(texts)
    logits, tokens = await classifier_logits(current, [(text, None) for text in texts], served,
                                             side=request.truncation_side,
                                             max_tokens=served.prompt_limit(request.truncate_prompt_tokens))
    config = served.model.config
    raw = request.raw or request.raw_scores
    scores = classification.SCORE_FUNCTIONS["none" if raw else classification.score_function(config)](logits)
    id2label = config.id2label
    answer = {"id": f"classify-{uuid.uuid4().hex}", "created": int(time.time()), "model": served.model_name,
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if sent_by_infinity_client(request):  # its shape
        return answer | {"object": "classify",
                         "data": [classification.ranked_scores(row, id2label, None) for row in scores]}
    data = [{"index": index, "label": id2label[int(row.argmax())], "probs": row.tolist(), "num_classes": len(row)}
            for index, row in enumerate(scores)]
    return answer | {"object": "list", "data": data}


@router.post("/pooling", response_model=schemas.PoolingResponse, responses=OPENAI_ERRORS)
async def pooling(request: schemas.PoolingRequest, served: Served):
    """vLLM's pooling API: per input its task's output as the task's own route gives it (embed: /v1/embeddings'
    vector; classify: /classify's probabilities), or for token_embed every token's last-layer vector, [CLS] and
    [SEP] included, unit length unless normalize or use_activation is false, as vLLM's token_embed gives them. The
    default task is the model's: an encoder embeds, a sequence classifier classifies."""
    task = request.task or ("embed" if served.task is None else "classify")
    shared = {"model": request.model, "truncate_prompt_tokens": request.truncate_prompt_tokens,
              "truncation_side": request.truncation_side}
    unit = not request.raw and request.normalize is not False
    if task == "classify":
        if not all(isinstance(item, str) for item in input_list(request.input)):
            raise HTTPError(422, "task classify: input is a text or texts (the classifier's task reads words)")
        answer = await classify(schemas.ClassifyRequest(input=request.input, use_activation=not request.raw,
                                                        add_special_tokens=request.add_special_tokens, **shared),
                                served)
        outputs, tokens = [item["probs"] for item in answer["data"]], answer["usage"]["prompt_tokens"]
    elif task == "embed":
        answer = await openai_embeddings(schemas.OpenAIEmbeddingRequest(
            input=request.input, dimensions=request.dimensions, normalize=unit,
            add_special_tokens=request.add_special_tokens, encoding_format=request.encoding_format,
            embed_dtype=request.embed_dtype, endianness=request.endianness, **shared), served)
        outputs, tokens = [item["embedding"] for item in answer["data"]], answer["usage"]["prompt_tokens"]
    else:
        if served.task is not None or served.splade is not None or served.colbert is not None:
            raise HTTPError(409, f"task token_embed: {served.model_name} is not a dense encoder, whose token "
                                 f"vectors it gives (a ColBERT model's are at /v1/embeddings)")
        states, tokens = await served.token_states(hosted_inputs(request.input, served),
                                                   side=request.truncation_side,
                                                   max_tokens=served.prompt_limit(request.truncate_prompt_tokens),
                                                   add_special_tokens=request.add_special_tokens)
        outputs = [encoded(torch.nn.functional.normalize(vectors, dim=-1) if unit else vectors,
                           request.encoding_format, request.embed_dtype, request.endianness) for vectors in states]
    return {"id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": served.model_name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": [{"index": index, "object": "pooling", "data": output} for index, output in enumerate(outputs)]}


@router.post("/fill_mask", response_model=list[schemas.FilledToken] | list[list[schemas.FilledToken]]
             | list[list[schemas.FilledToken] | list[list[schemas.FilledToken]]], responses=ERRORS)
async def fill_mask(request: schemas.FillMaskRequest, served: Served):
    """transformers' fill-mask pipeline over HTTP, as the Hugging Face Inference API answers fill-mask
    (huggingface_hub's InferenceClient.fill_mask given this route's URL): per [MASK] of a text, its top_k tokens
    {score, token, token_str, sequence}; a list per mask for a text of several, a list per text for several texts.
    Needs a masked-LM checkpoint's trained head."""
    if served.run_fill is None:
        raise HTTPError(409, f"wrong model: {served.model_name} has no trained masked-LM head; /fill_mask needs a "
                             f"masked-LM checkpoint (BertForMaskedLM, BertForPreTraining)")
    tokenizer = served.tokenizer
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    served.check_count(len(texts))
    parameters = request.parameters or schemas.FillMaskParameters()
    targets = target_ids(tokenizer, parameters.targets)
    rows = await asyncio.to_thread(served.encode_texts, texts, None, UNLIMITED, False, False)
    masks = []
    for index, row in enumerate(rows):
        if len(row["input_ids"]) > served.max_length:  # not cut: that could lose a [MASK], or the words deciding it
            raise HTTPError(413, f"text {index} is {len(row['input_ids'])} tokens long; the limit is "
                                 f"{served.max_length}")
        masks.append(mask_positions(tokenizer, row["input_ids"], f"text {index}"))
    probabilities = await served.run_jobs([Job(served.run_fill, row, {"masks": positions})
                                           for row, positions in zip(rows, masks)])
    kept = parameters.top_k if targets is None else served.model.config.vocab_size  # targets: from every token
    answers = [fill_answer(tokenizer, row["input_ids"], top_tokens(scores, tokenizer, kept), parameters.top_k,
                           targets) for row, scores in zip(rows, probabilities)]
    return answers[0] if len(answers) == 1 else answers


@router.post("/", response_model=list[list[float]] | list[float] | list[schemas.Prediction]
             | list[list[schemas.Prediction]] | list[schemas.EntityGroup] | list[schemas.TokenPrediction]
             | list[list[schemas.EntityGroup]] | list[list[schemas.TokenPrediction]] | schemas.SpanAnswer
             | list[schemas.SpanAnswer] | list[list[schemas.SpanAnswer] | schemas.SpanAnswer]
             | list[schemas.RerankResult] | list[list[schemas.SparseValue]]
             | schemas.EmbedResponse | schemas.PredictResponse,  # the last two: bertforge's own forms' answers
             response_model_exclude_unset=True, responses=ERRORS)
async def tei_root(request: RootRequest, served: Served):
    """The route for the model's task that huggingface_hub's InferenceClient calls given the server's URL, as
    text-embeddings-inference and the Hugging Face Inference API answer it: an encoder embeds {"inputs"} (as
    /embed) or compares {"inputs": {"source_sentence", "sentences"}} (as /similarity); a sequence classifier
    predicts {"inputs"} (as /predict), or with "parameters": {"candidate_labels"} classifies zero-shot ({label,
    score} best first); a token classifier tags {"inputs"} (its "parameters": aggregation_strategy, ignore_labels)
    and a question answerer answers {"inputs": {"question", "context"}}, as transformers' pipelines of those
    tasks. As in TEI, {"query", "texts"} ranks the texts (as /rerank) and a SPLADE model's {"inputs"} gives its
    sparse weights (as /embed_sparse)."""
    if isinstance(request, schemas.SimilarityRequest):
        return await similarity(request, served)
    if isinstance(request, schemas.RerankRequest):
        return await rerank(request, served)
    task = served.task
    body = request.model_dump(exclude_unset=True)
    if task is not None and "inputs" in body and (task.head != "sequence_classification" or "candidate_labels"
                                                  in (body.get("parameters") or {})):
        return await inference_api(body, served)
    own, other = (schemas.EmbedRequest, schemas.PredictRequest) if task is None else \
        (schemas.PredictRequest, schemas.EmbedRequest)
    foreign = sorted(field_names(body) - request_fields(own))
    if foreign and set(foreign) <= request_fields(other):
        doing = "is an encoder (it embeds)" if task is None else f"does {task.name}"
        wanted = "a sequence classifier's" if task is None else "an encoder's"
        raise HTTPError(409, f"wrong task: {served.model_name} {doing}; {', '.join(foreign)} are for {wanted} route")
    if task is None and served.splade is not None and "inputs" in body:
        return await embed_sparse(validated(schemas.EmbedSparseRequest, body), served)
    if task is None:
        return await embed_texts(validated(schemas.EmbedRequest, body), served)
    answer = await predict(validated(schemas.PredictRequest, body), served)
    # The Inference API, whose "parameters" huggingface_hub's text_classification always sends, answers one text
    # in a list of one (TEI's bare list would read as the first label alone)
    return [answer] if "parameters" in body and isinstance(body.get("inputs"), str) else answer


@router.post("/invocations", include_in_schema=False)
async def invocations(raw: Request, served: Served):
    """SageMaker's route, as text-embeddings-inference and vLLM serve it: TEI's bodies answered as POST / answers
    them, and vLLM's as its routes answer them, told apart by their fields as vLLM tells them: "input" (an
    encoder's embeddings, a classifier's classes), "query" with "documents" (rerank), or the two sides of score."""
    try:
        body = json.loads(await raw.body())
    except ValueError:
        raise HTTPError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HTTPError(422, "invalid request: the body is a JSON object of the request's fields")
    if "input" in body:
        if served.task is None:
            return await openai_embeddings(validated(schemas.OpenAIEmbeddingRequest, body), served)
        return await classify(validated(schemas.ClassifyRequest, body), served)
    if {"query", "documents"} <= set(body):
        return await cohere_answer(validated(schemas.CohereRerankRequest, body), served)
    if set(body) & {name for pair in SCORE_FIELDS for name in pair} - {"documents"}:
        return await score(validated(schemas.ScoreRequest, body), served)
    return await tei_root(validated(RootRequest, body), served)


@router.post("/vertex", response_model=schemas.VertexResponse, responses=ERRORS)
async def vertex(request: schemas.VertexRequest, served: Served):
    """Google Vertex AI's prediction route, as text-embeddings-inference serves it: each instance is a request,
    {"query", "texts"} a rerank, else what the model answers at /embed (an encoder), /embed_sparse (a SPLADE
    model) or /predict (a fine-tuned model); the answers in order as "predictions"."""
    served.check_count(len(request.instances), "instances")
    routes = []  # every instance is read before any runs
    for index, instance in enumerate(request.instances):
        if {"query", "texts"} <= set(instance):
            route, kind = rerank, schemas.RerankRequest
        elif served.task is not None:
            route, kind = predict, schemas.PredictRequest
        else:
            route, kind = (embed_sparse, schemas.EmbedSparseRequest) if served.splade is not None else \
                (embed_texts, schemas.EmbedRequest)
        routes.append((route, validated(kind, instance, ("body", "instances", index))))
    # max_texts for the request: 64 instances of 64 texts each filled the queue in one request
    served.check_count(sum(texts_in(read) for _, read in routes), "texts in the instances")
    return {"predictions": await asyncio.gather(*(route(read, served) for route, read in routes))}


def texts_in(request) -> int:
    """How many texts (or questions, or pairs) a request names: its `texts`, `inputs` or `questions`."""
    for name in ("texts", "inputs", "questions"):
        value = getattr(request, name, None)
        if value is not None:
            single = not isinstance(value, list) or (value and isinstance(value[0], int))  # a text, or token ids
            return 1 if single else len(value)
    return 1


async def inference_api(body: dict[str, Any], served: ServedModel) -> Any:
    """The Hugging Face Inference API's answer for a token classifier, a question answerer or, given
    candidate_labels, zero-shot classification by a sequence classifier: transformers' pipeline of the task
    (inference/pipelines.py) with the request's parameters, its rows run by the batcher."""
    task = served.task
    name = "zero-shot-classification" if task.head == "sequence_classification" else HEADS[task.head].onnx_task
    request = validated(PIPELINE_REQUESTS[name], body)
    inputs = request.model_dump()["inputs"]
    count = 1 if isinstance(inputs, str | dict) else len(inputs)
    served.check_count(count, "questions" if name == "question-answering" else "texts")
    parameters = request.parameters.model_dump(exclude_none=True) if request.parameters is not None else {}
    pipe = Pipeline(name, served.model, served.pipeline_tokenizer, served.device, task, served.run.settings,
                    rows=served.batcher_rows)
    count_characters(inputs)
    answer = await asyncio.to_thread(pipe, inputs, **parameters)
    if name != "zero-shot-classification":
        return answer
    ranked = [[{"label": label, "score": score} for label, score in zip(item["labels"], item["scores"])]
              for item in (answer if isinstance(answer, list) else [answer])]
    return ranked if isinstance(answer, list) else ranked[0]


def field_names(body: dict[str, Any]) -> set[str]:
    """A request body's fields, and those of its "parameters" as parameters.name."""
    parameters = body.get("parameters")
    return set(body) | {f"parameters.{name}" for name in (parameters if isinstance(parameters, dict) else ())}


def request_fields(request_class) -> set[str]:
    """The fields a request of this class takes, its parameters' as parameters.name."""
    return set(request_class.model_fields) | {f"parameters.{name}" for name in PARAMETERS[request_class].model_fields}


@functools.cache
def adapter(request_type) -> TypeAdapter:
    """pydantic's validator of a request type (a class, or a union of them), built once."""
    return TypeAdapter(request_type)


def validated(request_type, body: dict[str, Any], where: tuple = ()):
    """The body as a request of this type (a class, or a union of them), or the errors FastAPI would answer;
    `where`: the body's place in the request, before each error's location."""
    try:
        return adapter(request_type).validate_python(body)
    except ValidationError as problem:
        raise RequestValidationError([{**error, "loc": (*where, *error["loc"])} for error in problem.errors()]
                                     ) from None
