"""An HTTP server over the encoder (FastAPI): /embed, /predict, /tokenize, /attention, /explain, /health.

Concurrent requests share forward passes: each text becomes a Job on one bounded queue, and a single worker
thread, the only code that touches the model, takes up to max_batch_size jobs (waiting at most max_wait_ms for
more after the oldest arrived), runs them as one padded batch under inference_mode and resolves their futures.
A question's context becomes one job per window, as in tasks/question_answering.py, and its answer is decoded
once all of them are back.
"""

import asyncio
import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import CONFIG_FILE, SAFETENSORS_FILE, read_state_dict
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, InputError
from bertforge.explain.methods import DEFAULT_STEPS, METHODS
from bertforge.explain.page import explained
from bertforge.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertforge.inference.attention_view import (
    DEFAULT_MAX_TOKENS,
    attention_map,
    attention_weights,
    encode_for_attention,
    render_attention_map,
)
from bertforge.inference.features import POOLINGS, pad_ids, pool
from bertforge.inference.optimize import AS_TRAINED, InferenceOptions
from bertforge.model import BertModel
from bertforge.tasks import question_answering
from bertforge.tasks.data import EncodeSettings
from bertforge.tasks.finetune import FinetuneConfig, saved_run_config
from bertforge.tasks.metrics import entities
from bertforge.tasks.question_answering import QAExample
from bertforge.tokenizer import BertTokenizer

logger = logging.getLogger("bertforge")

LONG_TEXT_POLICIES = ("truncate", "refuse")


@dataclass
class ServeSettings:
    """Batching and the limits that keep one client from exhausting the server."""

    max_batch_size: int = 32  # texts per forward pass
    max_wait_ms: float = 5.0  # how long the oldest waiting text may wait for company
    max_queue: int = 256  # texts waiting at most; beyond that requests get 503
    max_texts: int = 64  # texts (or questions) per request
    max_length: int = 512  # tokens per text (or pair), [CLS] and [SEP] included
    long_text: str = "truncate"  # or "refuse": 413 for a text over max_length (a QA context is otherwise windowed)
    attention_max_length: int = DEFAULT_MAX_TOKENS  # the viewer page grows with the square of this

    def __post_init__(self):
        for name in ("max_batch_size", "max_queue", "max_texts", "max_length", "attention_max_length"):
            if getattr(self, name) < 1:
                raise BertforgeError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_wait_ms < 0:
            raise BertforgeError(f"max_wait_ms must not be negative, got {self.max_wait_ms}")
        if self.max_texts > self.max_queue:
            raise BertforgeError(f"max_texts ({self.max_texts}) exceeds max_queue ({self.max_queue}): a full request "
                                 f"could never be queued")
        if self.long_text not in LONG_TEXT_POLICIES:
            raise BertforgeError(f"long_text must be one of {', '.join(LONG_TEXT_POLICIES)}, got {self.long_text!r}")


# ---------------------------------------------------------------- jobs and what the worker runs for them


@dataclass
class Job:
    """One text (or pair) waiting for the model; `run` computes the results of a list of jobs of its kind."""

    run: Callable[[torch.nn.Module, list["Job"]], list[Any]]
    encoding: dict[str, list]  # input_ids, token_type_ids (+ whatever `run` needs) of one row
    options: dict[str, Any] = field(default_factory=dict)
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)


def padded_batch(jobs: Sequence[Job], pad_token_id: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids: (batch, longest) tensors for the jobs' rows."""
    ids = [job.encoding["input_ids"] for job in jobs]
    return {"input_ids": pad_ids(ids, pad_token_id),
            "attention_mask": pad_ids([[1] * len(row) for row in ids], 0),
            "token_type_ids": pad_ids([job.encoding["token_type_ids"] for job in jobs], 0)}


def encoder_of(model: torch.nn.Module) -> BertModel:
    """The bare encoder of a model: itself, or a task model's `.bert`."""
    return getattr(model, "bert", model)


def embed(model: torch.nn.Module, jobs: list[Job]) -> list[list[float]]:
    """Pooled (optionally unit-length) last-layer vectors; options: pooling, normalize."""
    batch = padded_batch(jobs, model.config.pad_token_id)
    hidden = encoder_of(model)(**batch).last_hidden_state  # (batch, seq, hidden)
    vectors = []
    for i, job in enumerate(jobs):
        vector = pool(hidden[i:i + 1], batch["attention_mask"][i:i + 1], job.options["pooling"])[0]
        if job.options["normalize"]:
            vector = F.normalize(vector, dim=-1)
        vectors.append(vector.float().tolist())
    return vectors


def classify_sequences(model: BertForSequenceClassification, jobs: list[Job]) -> list[dict[str, Any]]:
    """The most likely label, its probability and every label's; a regression model gives its score."""
    logits = model(**padded_batch(jobs, model.config.pad_token_id)).logits.float()  # (batch, labels)
    if model.config.num_labels == 1:
        return [{"score": float(value)} for value in logits[:, 0]]
    labels = model.config.id2label
    results = []
    for probs in logits.softmax(dim=-1).tolist():
        best = max(range(len(probs)), key=probs.__getitem__)
        results.append({"label": labels[best], "score": probs[best],
                        "probabilities": {labels[i]: p for i, p in enumerate(probs)}})
    return results


def tag_entities(model: BertForTokenClassification, jobs: list[Job]) -> list[dict[str, Any]]:
    """Entities with character spans in the request's text: each word takes its first piece's tag."""
    batch = padded_batch(jobs, model.config.pad_token_id)
    probs = model(**batch).logits.float().softmax(dim=-1)  # (batch, seq, labels)
    results = []
    for row, job in enumerate(jobs):
        text, offsets, word_ids = job.options["text"], job.encoding["offset_mapping"], job.encoding["word_ids"]
        words: dict[int, list[int]] = {}  # word index -> its token positions
        for position, word in enumerate(word_ids):
            if word is not None and job.encoding["token_type_ids"][position] == 0:
                words.setdefault(word, []).append(position)
        spans = [(offsets[positions[0]][0], offsets[positions[-1]][1]) for positions in words.values()]
        best = [probs[row, positions[0]].max(dim=-1) for positions in words.values()]
        tags = [model.config.id2label[int(choice.indices)] for choice in best]
        found = []
        for kind, first, last in entities(tags):
            start, end = spans[first][0], spans[last][1]
            score = sum(float(best[i].values) for i in range(first, last + 1)) / (last - first + 1)
            found.append({"type": kind, "text": text[start:end], "start": start, "end": end, "score": score})
        results.append({"entities": found, "tags": tags})
    return results


def score_spans(model: BertForQuestionAnswering, jobs: list[Job]) -> list[tuple[list[float], list[float]]]:
    """Start and end logits over each window's own tokens; answers need all windows of a context, so the request
    decodes them."""
    output = model(**padded_batch(jobs, model.config.pad_token_id))
    results = []
    for row, job in enumerate(jobs):
        length = len(job.encoding["input_ids"])
        results.append((output.start_logits[row, :length].float().tolist(),
                        output.end_logits[row, :length].float().tolist()))
    return results


def attentions(model: torch.nn.Module, jobs: list[Job]) -> list[torch.Tensor]:
    """(layers, heads, seq, seq) weights per job; one forward per text, as each page shows one text."""
    return [attention_weights(model, job.encoding["input_ids"], job.encoding["token_type_ids"]) for job in jobs]


def explanations(model: torch.nn.Module, jobs: list[Job]) -> list[dict[str, Any] | str]:
    """/explain's answer per job (bertforge.explain's dict, or its page), out of the worker's inference mode: the
    attributions need gradients."""
    with torch.inference_mode(False):
        return [explained(model, **job.options) for job in jobs]


@dataclass(frozen=True)
class PredictTask:
    """What /predict does for one kind of task model."""

    name: str  # reported by /health
    run: Callable[[torch.nn.Module, list[Job]], list[Any]]
    with_offsets: bool = False  # the rows carry offset_mapping and word_ids (entity spans need them)
    inputs: str = "texts"  # the request field it reads, a key of PREDICT_INPUTS


# Model class -> /predict.
PREDICT_TASKS: dict[type, PredictTask] = {
    BertForSequenceClassification: PredictTask("sequence_classification", classify_sequences),
    BertForTokenClassification: PredictTask("token_classification", tag_entities, with_offsets=True),
    BertForQuestionAnswering: PredictTask("question_answering", score_spans, inputs="questions"),
}

# /predict's request fields for the inputs of a task, as error messages show them.
PREDICT_INPUTS = {"texts": '"texts" (and "text_pairs")', "questions": '"questions": [{"question", "context"}]'}

# config.json "architectures" names (what transformers writes) -> the class to load.
MODEL_CLASSES: dict[str, type] = {cls.__name__: cls for cls in (
    BertModel, BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering)}


def detect_model_class(directory: Path) -> type:
    """The model class of a checkpoint: config.json's "architectures" when it names one we know, else its heads.

    Without the name, a span head means question answering, and a classifier means sequence classification when
    the checkpoint has a pooler (which reads [CLS]) and token classification when it has none.
    """
    try:
        config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{directory / CONFIG_FILE}: unreadable config: {error}") from None
    for name in config.get("architectures") or []:
        if name in MODEL_CLASSES:
            return MODEL_CLASSES[name]
    if (directory / SAFETENSORS_FILE).is_file():
        from safetensors import safe_open
        with safe_open(directory / SAFETENSORS_FILE, framework="pt") as handle:
            names = set(handle.keys())
    else:
        names = set(read_state_dict(directory)[0])
    if any(name.startswith("qa_outputs.") for name in names):
        return BertForQuestionAnswering
    if any(name.startswith("classifier.") for name in names):
        has_pooler = any("pooler." in name for name in names)
        return BertForSequenceClassification if has_pooler else BertForTokenClassification
    return BertModel


def load_model(name_or_path: str | Path, inference: InferenceOptions = AS_TRAINED
               ) -> tuple[torch.nn.Module, BertTokenizer]:
    """The model (of the class its checkpoint holds) and tokenizer of a directory or 'default', in eval mode
    and prepared as `inference` says."""
    directory = resolve_model_dir(name_or_path)
    model = inference.apply(detect_model_class(directory).from_pretrained(directory))
    return model, BertTokenizer.from_pretrained(directory)


def qa_settings_of(name_or_path: str | Path) -> EncodeSettings:
    """How the fine-tuning run of a question-answering model windowed contexts and decoded answers (its
    finetune_config.json: max_length, doc_stride, max_query_length, version_2, n_best, ...), else the qa task's
    defaults; `bertforge predict` reads the same."""
    return (saved_run_config(name_or_path) or FinetuneConfig(task="qa")).settings


# ---------------------------------------------------------------- the micro-batcher


class QueueFull(BertforgeError):
    """The batcher holds max_queue texts already."""


class MicroBatcher:
    """A bounded queue of jobs and the one worker thread that runs them on the model in batches."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int = 32, max_wait_ms: float = 5.0,
                 max_queue: int = 256):
        self.model = model
        self.max_batch_size, self.max_wait, self.max_queue = max_batch_size, max_wait_ms / 1000, max_queue
        self._queue: deque[Job] = deque()
        self._ready = threading.Condition()
        self._stopping = False
        self.batch_sizes: Counter[int] = Counter()  # batch size -> how many forward batches had it
        self._thread = threading.Thread(target=self._work, name="bertforge-batcher", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def submit(self, jobs: list[Job]) -> list[Future]:
        """Queue all of `jobs` or none: QueueFull when they don't fit."""
        with self._ready:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._queue) + len(jobs) > self.max_queue:
                raise QueueFull(f"the server is busy ({len(self._queue)} texts queued, room for "
                                f"{self.max_queue}); retry shortly")
            self._queue.extend(jobs)
            self._ready.notify()
        return [job.future for job in jobs]

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the queued jobs, then end the worker."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join(timeout)

    def _next_batch(self) -> list[Job] | None:
        with self._ready:
            while not self._queue and not self._stopping:
                self._ready.wait()
            if not self._queue:
                return None
            # Wait for company until the oldest job has waited max_wait: jobs that queued up during the previous
            # forward pass go at once.
            deadline = self._queue[0].enqueued + self.max_wait
            while len(self._queue) < self.max_batch_size and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            return [self._queue.popleft() for _ in range(min(self.max_batch_size, len(self._queue)))]

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            # Skip jobs whose request went away; the others can't be cancelled from now on.
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            if batch:
                self.batch_sizes[len(batch)] += 1
            by_run: dict[Callable, list[Job]] = {}
            for job in batch:
                by_run.setdefault(job.run, []).append(job)
            for run, jobs in by_run.items():
                # Longest first: the padded batch then reads like extract_features' length-sorted ones.
                jobs.sort(key=lambda job: len(job.encoding["input_ids"]), reverse=True)
                try:
                    with torch.inference_mode():
                        results = run(self.model, jobs)
                except Exception as error:  # handed to each request, which reports it
                    for job in jobs:
                        job.future.set_exception(error)
                    continue
                for job, result in zip(jobs, results):
                    job.future.set_result(result)


# ---------------------------------------------------------------- the HTTP application


class HTTPError(Exception):
    """An error answered with its status and {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def create_app(model: torch.nn.Module, tokenizer: BertTokenizer, settings: ServeSettings | None = None,
               model_name: str = "model", qa_settings: EncodeSettings | None = None):
    """The FastAPI application; its micro-batcher starts now and stops with the application's lifespan.

    `qa_settings`: how a question-answering model cuts contexts into windows and decodes answers (qa_settings_of
    its directory; None: the qa task's defaults), with windows no longer than the server's max_length.
    """
    # FastAPI is imported here, so that the CLI and the rest of the library run without it. No postponed
    # annotations in this module: FastAPI must see the request classes below as objects, not names.
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse
    from pydantic import BaseModel, ConfigDict, Field

    Pooling = Literal[tuple(POOLINGS)]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class EmbedRequest(Strict):
        texts: list[str] = Field(min_length=1, description="the texts to embed (at most the server's max_texts)")
        pooling: Pooling = "mean"
        normalize: bool = Field(False, description="scale each vector to unit length")

    class Question(Strict):
        question: str
        context: str = Field(description="the text the answer is a span of; a long one is split into windows")

    class PredictRequest(Strict):
        texts: list[str] | None = Field(None, min_length=1, description="the texts (at most the server's "
                                                                        "max_texts), for a classifier or tagger")
        text_pairs: list[str] | None = Field(None, description="a second text per text, for pair tasks")
        questions: list[Question] | None = Field(None, min_length=1, description="for a question-answering "
                                                 "model, instead of texts (at most the server's max_texts)")

    class TokenizeRequest(Strict):
        text: str
        text_pair: str | None = None

    class ExplainRequest(Strict):
        text: str = Field(min_length=1, description="the text (for a question-answering model, the question)")
        text_pair: str | None = Field(None, description="the pair (the context; for an encoder, the text compared)")
        target: str | None = Field(None, description="a label, an entity, answer/start/end (default: the prediction)")
        method: Literal[tuple(METHODS)] = "integrated_gradients"
        steps: int = Field(DEFAULT_STEPS, ge=1, le=1000, description="integrated gradients' interpolation steps")



    settings = settings or ServeSettings()
    max_length = min(settings.max_length, model.config.max_position_embeddings, tokenizer.model_max_length)
    attention_max_length = min(settings.attention_max_length, max_length)
    truncate = settings.long_text == "truncate"
    predict_task = PREDICT_TASKS.get(type(model))
    if isinstance(model, BertForQuestionAnswering):
        qa_settings = qa_settings or FinetuneConfig(task="qa").settings
        qa_settings = replace(qa_settings, max_length=min(qa_settings.max_length, max_length))
        try:  # encoding no questions checks the window sizes now, rather than failing every request
            question_answering.encode(tokenizer, [], qa_settings)
        except ConfigError as error:
            raise ConfigError(f"{model_name}: can't answer questions with windows of {qa_settings.max_length} "
                              f"tokens (the smallest of the fine-tuning's max_length, the server's and the "
                              f"model's): {error}") from None
    batcher = MicroBatcher(model, settings.max_batch_size, settings.max_wait_ms, settings.max_queue)

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(batcher.stop)

    app = FastAPI(title="bertforge", summary=f"BERT inference over {model_name}", lifespan=lifespan)
    app.state.model, app.state.tokenizer = model, tokenizer
    app.state.batcher = batcher
    app.state.settings = settings

    def encode(texts: list[str], pairs: list[str] | None, with_offsets: bool = False) -> list[dict[str, list]]:
        """One encoding row per text, each within max_length (truncated, or 413 when refusing)."""
        if len(texts) > settings.max_texts:
            raise HTTPError(413, f"too many texts: {len(texts)}; the limit is {settings.max_texts} per request")
        if pairs is not None and len(pairs) != len(texts):
            raise HTTPError(422, f"got {len(texts)} texts but {len(pairs)} text_pairs")
        encoded = tokenizer(texts, text_pair=pairs, truncation=truncate, max_length=max_length,
                            return_offsets_mapping=with_offsets, return_word_ids=with_offsets)
        rows = [{name: values[i] for name, values in encoded.items()} for i in range(len(texts))]
        for index, row in enumerate(rows):
            if len(row["input_ids"]) > max_length:
                raise HTTPError(413, f"text {index} is {len(row['input_ids'])} tokens long; the limit is "
                                     f"{max_length} (this server refuses long texts rather than truncating)")
        return rows

    async def run_jobs(jobs: list[Job]) -> list[Any]:
        try:
            futures = batcher.submit(jobs)
        except QueueFull as error:
            raise HTTPError(503, str(error)) from None
        return await asyncio.gather(*(asyncio.wrap_future(future) for future in futures))

    async def answer(questions: list[Question]) -> list[dict[str, Any]]:
        """Per question, the best span of its context over all of the context's windows (and the n best)."""
        if len(questions) > settings.max_texts:
            raise HTTPError(413, f"too many questions: {len(questions)}; the limit is {settings.max_texts} per "
                                 f"request")
        for index, item in enumerate(questions):
            for name in ("question", "context"):
                if not getattr(item, name).strip():
                    raise HTTPError(422, f"questions.{index}.{name} is empty")
        examples = [QAExample(str(index), item.question, item.context, []) for index, item in enumerate(questions)]
        features = question_answering.encode(tokenizer, examples, qa_settings)
        windows = Counter(features.example_index)  # question -> windows of its context, in request order
        split = [index for index, count in windows.items() if count > 1]
        if split and not truncate:
            raise HTTPError(413, f"question {split[0]}: the question and its context are longer than "
                                 f"{qa_settings.max_length} tokens ({windows[split[0]]} windows); this server "
                                 f"refuses long texts rather than splitting them into windows")
        if len(features) > settings.max_queue:  # it could never be queued: 503 would mean "retry" forever
            raise HTTPError(413, f"the contexts make {len(features)} windows of up to {qa_settings.max_length} "
                                 f"tokens; the limit is {settings.max_queue} per request (the server's queue)")
        logits = await run_jobs([Job(predict_task.run, row) for row in features.rows])
        starts, ends = zip(*logits)
        return await asyncio.to_thread(question_answering.decode, examples, features, starts, ends)

    @app.exception_handler(HTTPError)
    async def http_error(request: Request, error: HTTPError):
        headers = {"Retry-After": "1"} if error.status == 503 else None
        return JSONResponse({"error": error.message}, status_code=error.status, headers=headers)

    @app.exception_handler(BertforgeError)
    async def user_error(request: Request, error: BertforgeError):
        return JSONResponse({"error": str(error)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError):
        problems = error.errors()
        if any(problem["type"] == "json_invalid" for problem in problems):
            return JSONResponse({"error": "the request body is not valid JSON"}, status_code=400)
        if any(problem["type"] == "missing" and tuple(problem["loc"]) == ("body",) for problem in problems):
            return JSONResponse({"error": "empty request body; send a JSON object"}, status_code=400)
        messages = []
        for problem in problems:
            where = ".".join(str(part) for part in problem["loc"] if part != "body")
            messages.append(f"{where}: {problem['msg']}" if where else problem["msg"])
        return JSONResponse({"error": "invalid request: " + "; ".join(messages)}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception):
        logger.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return JSONResponse({"error": "internal server error"}, status_code=500)

    @app.post("/embed")
    async def embed_texts(request: EmbedRequest) -> dict[str, Any]:
        """One vector per text: the last layer pooled over its tokens (cls, mean or max)."""
        options = {"pooling": request.pooling, "normalize": request.normalize}
        rows = encode(request.texts, None)
        vectors = await run_jobs([Job(embed, row, options) for row in rows])
        return {"embeddings": vectors, "dimension": len(vectors[0]), "pooling": request.pooling,
                "normalized": request.normalize}

    @app.post("/predict")
    async def predict(request: PredictRequest) -> dict[str, Any]:
        """The task model's prediction per text (or pair): labels with probabilities from a classifier, entities
        from a tagger; per question, the answer's span of its context from a question-answering model."""
        if predict_task is None:
            raise HTTPError(409, f"wrong task: the loaded model is a {type(model).__name__}, which has no "
                                 f"prediction head; use /embed, or serve a task model "
                                 f"({', '.join(cls.__name__ for cls in PREDICT_TASKS)})")
        if request.questions is not None and (request.texts is not None or request.text_pairs is not None):
            raise HTTPError(422, f"send either {PREDICT_INPUTS['texts']} or \"questions\", not both")
        given = "questions" if request.questions is not None else "texts" if request.texts is not None else None
        takes = f"the loaded model is a {type(model).__name__} ({predict_task.name}), which takes " \
                f"{PREDICT_INPUTS[predict_task.inputs]}"
        if given is None:
            raise HTTPError(422, f"nothing to predict: {takes}")
        if given != predict_task.inputs:
            raise HTTPError(409, f"wrong task: {takes}, not \"{given}\"")
        if given == "questions":
            return {"task": predict_task.name, "predictions": await answer(request.questions)}
        rows = encode(request.texts, request.text_pairs, with_offsets=predict_task.with_offsets)
        jobs = [Job(predict_task.run, row, {"text": text}) for row, text in zip(rows, request.texts)]
        return {"task": predict_task.name, "predictions": await run_jobs(jobs)}

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> dict[str, Any]:
        """Tokens, ids, segment ids and (start, end) character offsets ((0, 0) for special tokens)."""
        pairs = None if request.text_pair is None else [request.text_pair]
        row = encode([request.text], pairs, with_offsets=True)[0]
        return {"tokens": tokenizer.convert_ids_to_tokens(row["input_ids"]), "ids": row["input_ids"],
                "token_type_ids": row["token_type_ids"], "offsets": row["offset_mapping"]}

    @app.get("/attention", response_class=HTMLResponse)
    async def attention(text: str = Query(min_length=1), pair: str | None = None) -> HTMLResponse:
        """The attention viewer page (every layer and head) for a text, or a pair of texts."""
        try:
            row = encode_for_attention(tokenizer, text, pair or None, attention_max_length, truncate)
        except InputError as error:  # over the viewer's limit, on a server that refuses long texts
            raise HTTPError(413, str(error)) from None
        (weights,) = await run_jobs([Job(attentions, row)])
        # Rendering writes layers * heads * seq^2 numbers: off the event loop.
        page = await asyncio.to_thread(render_attention_map, attention_map(tokenizer, row, weights),
                                       f"Attention: {text[:80]}")
        return HTMLResponse(page)

    async def explanation(request: ExplainRequest, as_page: bool) -> dict[str, Any] | str:
        """One job for the worker, the only code that touches the model (the explanation hooks it)."""
        row = encode([request.text], None if request.text_pair is None else [request.text_pair])[0]
        options = {**request.model_dump(), "tokenizer": tokenizer, "max_length": max_length, "as_page": as_page}
        (result,) = await run_jobs([Job(explanations, row, options)])
        return result

    @app.post("/explain")
    async def explain_json(request: ExplainRequest) -> dict[str, Any]:
        """Attributions of the model's prediction to the words of the text (bertforge.explain), as JSON."""
        return await explanation(request, as_page=False)

    @app.get("/explain", response_class=HTMLResponse)
    async def explain_page(text: str = Query(min_length=1), pair: str | None = None, target: str | None = None,
                           method: Literal[tuple(METHODS)] = "integrated_gradients") -> HTMLResponse:
        """The explanation page: the words shaded by attribution, beside the attention views."""
        request = ExplainRequest(text=text, text_pair=pair or None, target=target or None, method=method)
        return HTMLResponse(await explanation(request, as_page=True))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, what is loaded, and how requests have been batched."""
        return {"status": "ok", "model": model_name, "architecture": type(model).__name__,
                "task": predict_task.name if predict_task else None, "queued": batcher.pending,
                "batches": sum(batcher.batch_sizes.values()),
                "texts": sum(size * count for size, count in batcher.batch_sizes.items()),
                "largest_batch": max(batcher.batch_sizes, default=0),
                "limits": {"max_texts": settings.max_texts, "max_length": max_length,
                           "long_text": settings.long_text, "max_queue": settings.max_queue,
                           "max_batch_size": settings.max_batch_size}}

    return app


def load_app(name_or_path: str | Path, settings: ServeSettings | None = None,
             inference: InferenceOptions = AS_TRAINED):
    """The application over a model directory or 'default': create_app with what its checkpoint holds."""
    model, tokenizer = load_model(name_or_path, inference)
    qa_settings = qa_settings_of(name_or_path) if isinstance(model, BertForQuestionAnswering) else None
    return create_app(model, tokenizer, settings, model_name=str(name_or_path), qa_settings=qa_settings)


def serve(name_or_path: str | Path, host: str = "127.0.0.1", port: int = 8000,
          settings: ServeSettings | None = None, inference: InferenceOptions = AS_TRAINED) -> None:
    """Load the model and answer HTTP requests until interrupted."""
    try:
        import fastapi  # noqa: F401  (create_app needs it)
        import uvicorn
    except ImportError as error:
        raise BertforgeError(f"the server needs FastAPI and uvicorn ({error}); "
                             f"install them with: pip install 'bertforge[serve]'") from None
    app = load_app(name_or_path, settings, inference)
    logger.warning("serving %s (%s) on http://%s:%d (API docs at /docs)", name_or_path,
                   type(app.state.model).__name__, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning")
