"""The served model: one model, its tokenizer and task, the server's limits, and the micro-batcher that runs it.
Every route reads texts and runs the model through it, so that each API answers as `bertforge embed`, `predict`
and `similarity` do, cut or refused at the same limits."""

import asyncio
import copy
import dataclasses
import math
from concurrent.futures import Future
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.checkpoint.sentence_transformers import SentenceEmbedding
from bertforge.errors import ConfigError
from bertforge.heads import encoder_of
from bertforge.inference.features import embedding_texts, prompt_length, sentence_embedding
from bertforge.inference.multi_vector_encoder import MultiVectorEncoder
from bertforge.inference.multi_vector_encoder import first_dimensions as first_token_dimensions
from bertforge.inference.serve.batcher import Job, MicroBatcher, QueueFull
from bertforge.inference.serve.jobs import (
    masked_token_probabilities,
    multi_vector_rows,
    pooled_vectors,
    rows_read,
    splade_vectors,
    token_vectors,
)
from bertforge.inference.serve.limits import EMPTY, HTTPError
from bertforge.inference.serve.metrics import ServerMetrics, count_characters, count_jobs, tei_failure, tokenizing
from bertforge.inference.serve.settings import ServeSettings
from bertforge.tasks.checkpoint_contents import Checkpoint, task_defaults
from bertforge.tasks.classification import TASK_SCORES
from bertforge.tasks.data import Features
from bertforge.tasks.registry import Task, task_of_model
from bertforge.tokenizer import BertTokenizer

UNLIMITED = 1 << 30  # tokens: where nothing is cut (no text is this long)


class ServedModel:
    """The model behind every route: what it is (an encoder, a SPLADE or ColBERT model, a task model), how texts
    become its rows (the server's max_length and long-text policy, a request's truncate), and the batcher that runs
    them. Its methods raise HTTPError for what a request asks beyond the model or the limits."""

    def __init__(self, model: torch.nn.Module, tokenizer: BertTokenizer, settings: ServeSettings,
                 model_name: str, checkpoint: Checkpoint | None, masked_lm: torch.nn.Module | None):
        self.settings, self.model_name, self.checkpoint, self.tokenizer = settings, model_name, checkpoint, tokenizer
        self.colbert = model if isinstance(model, MultiVectorEncoder) else None
        if self.colbert is not None:
            model = self.colbert.model  # what the batcher runs; `colbert` adds its query [MASK]s, projection, skiplist
        self.model = model
        self.task, self.run = self.task_and_settings()
        self.max_length = min(settings.max_length, model.config.max_position_embeddings, tokenizer.model_max_length)
        self.attention_max_length = min(settings.attention_max_length, self.max_length)
        self.truncate = settings.long_text == "truncate"
        # TEI's truncation_direction, per request: a tokenizer for each side (they share the vocabulary)
        self.tokenizers = {"right": copy.copy(tokenizer), "left": copy.copy(tokenizer)}
        for side, sided in self.tokenizers.items():
            sided.truncation_side = side
        self.device = next(model.parameters()).device
        if masked_lm is None and self.task is None:
            masked_lm = getattr(model, "masked_lm", None)
        if masked_lm is not None:
            words = encoder_of(model).embeddings.tokens.weight
            masked_lm = masked_lm.to(words.device, words.dtype).eval()
        self.run_fill = masked_token_probabilities(masked_lm) if masked_lm is not None else None
        self.run_rows = rows_read(self.task.outputs) if self.task is not None else None
        # transformers' pipelines, for the Inference API's tasks at POST /, read texts as this server cuts them
        self.pipeline_tokenizer = copy.copy(tokenizer)
        self.pipeline_tokenizer.model_max_length = self.max_length
        # A SPLADE model (sentence-transformers' SparseEncoder layout): its vectors are the masked-LM head's weights
        # per vocabulary entry, compared by dot product and never normalized, as text-embeddings-inference serves
        # them.
        layout = getattr(model, "sentence_embedding", None) if self.task is None else None
        self.splade = layout.splade if layout is not None else None
        self.compared = None if self.splade is not None else True  # embed's `normalize` to compare: cosine, or dot
        self.run_splade = splade_vectors(self.splade, layout.max_active_dims) if self.splade is not None else None
        self.run_multi_vector = {role: multi_vector_rows(self.colbert, role) for role in ("query", "document")} \
            if self.colbert is not None else None
        self.metrics = ServerMetrics(lambda: self.batcher.pending, self.input_limit())
        self.batcher = MicroBatcher(model, settings.max_batch_size, settings.max_batch_tokens, settings.max_wait_ms,
                                    settings.max_queue, settings.release_memory_after,
                                    on_batch=lambda jobs: self.metrics.count_batch([job.length for job in jobs]))

    def task_and_settings(self) -> tuple[Task | None, Any]:
        """The model's task and the settings it was trained with (the checkpoint's; an in-memory task model's
        task defaults), checked against the model's positions now rather than failing every request."""
        model, checkpoint = self.model, self.checkpoint
        if checkpoint is not None:
            task = checkpoint.task_for() if checkpoint.task is not None else None
            run = checkpoint.settings() if task is not None else None
        else:
            task = task_of_model(model)
            limit = min(model.config.max_position_embeddings, self.tokenizer.model_max_length)
            run = task_defaults(task.name, limit) if task is not None else None
        if task is None:
            return None, None
        if run.max_length > model.config.max_position_embeddings:
            raise ConfigError(f"{self.model_name}: trained with max_length {run.max_length}, more than the model's "
                              f"{model.config.max_position_embeddings} positions")
        try:  # encoding no examples checks the window sizes
            task.encode(self.tokenizer, [], run.settings, model.config.id2label)
        except ConfigError as error:
            raise ConfigError(f"{self.model_name}: can't encode with its settings: {error}") from None
        return task, run

    # ------------------------------------------------------------ requests' limits

    def check_count(self, count: int, what: str = "texts") -> None:
        if count > self.settings.max_texts:
            raise HTTPError(413, f"too many {what}: {count}; the limit is {self.settings.max_texts} per request")

    def require_task(self) -> Task:
        if self.task is None:
            raise HTTPError(409, f"wrong task: {self.model_name} has no trained task head (an encoder); use /embed, "
                                 f"/v1/embeddings or /rerank, or serve a fine-tuned model")
        return self.task

    def refuse_sparse(self) -> None:
        """The hosted APIs' dense vectors are not a SPLADE model's."""
        if self.splade is not None:
            raise HTTPError(409, f"wrong model: {self.model_name} is a SPLADE model, whose vectors are sparse; use "
                                 f"/embed_sparse")

    # ------------------------------------------------------------ texts and token ids -> model rows

    def encode_texts(self, texts: list[str], pairs: list[str] | None = None, limit: int | None = None,
                     with_offsets: bool = False, cut: bool | None = None, side: str = "right",
                     add_special_tokens: bool = True) -> list[dict[str, list]]:
        """One row per text (or pair) within `limit` tokens (None: the server's max_length): truncated (`cut`, by
        default the server's policy; at the end `side` says), or 413."""
        limit = self.max_length if limit is None else limit
        asked, cut = cut, self.truncate if cut is None else cut
        with tokenizing([texts, pairs]):
            encoded = self.tokenizers[side.lower()](texts, text_pair=pairs, truncation=cut, max_length=limit,
                                                    return_offsets_mapping=with_offsets,
                                                    return_special_tokens_mask=with_offsets,
                                                    add_special_tokens=add_special_tokens)
        rows = [{name: values[i] for name, values in encoded.items()} for i in range(len(texts))]
        for index, row in enumerate(rows):
            if len(row["input_ids"]) > limit:
                raise refused(f"text {index} is {len(row['input_ids'])} tokens long", limit, asked)
        return rows

    def prompt_limit(self, truncate_prompt_tokens: int | None) -> int | None:
        """vLLM's truncate_prompt_tokens as the tokens each model input is cut to: None where it was not sent, the
        model's input limit (vLLM's max_model_len, /tokenize's) for -1. More than that limit is refused, as vLLM
        refuses it, rather than cut to the limit unsaid."""
        if truncate_prompt_tokens is None:
            return None
        limit = self.input_limit()
        if truncate_prompt_tokens == -1:
            return limit
        if not 2 <= truncate_prompt_tokens <= limit:
            raise HTTPError(422, f"truncate_prompt_tokens: {truncate_prompt_tokens} tokens; a model input takes from 2 "
                                 f"([CLS] and [SEP]) to the model's max_model_len {limit}, or -1 for that")
        return truncate_prompt_tokens

    def check_ids(self, id_lists: list[list[int]]) -> None:
        vocab_size = self.model.config.vocab_size
        for index, ids in enumerate(id_lists):
            unknown = next((i for i in ids if not 0 <= i < vocab_size), None)
            if unknown is not None:
                raise HTTPError(422, f"input {index}: token id {unknown} is not in the model's vocabulary "
                                     f"(0 to {vocab_size - 1})")

    def id_rows(self, id_lists: list[list[int]], limit: int, asked: bool | None, side: str = "right"
                ) -> list[dict[str, list]]:
        """Rows of token ids sent as they are (OpenAI's and text-embeddings-inference's token input), cut or
        refused as `asked` (the request's truncate), else as the server's policy."""
        count_characters(id_lists)  # nothing to tokenize, but TEI counts the ids as the input's characters
        self.check_ids(id_lists)
        rows = []
        for index, ids in enumerate(id_lists):
            if len(ids) > limit and not (self.truncate if asked is None else asked):
                raise refused(f"input {index} is {len(ids)} tokens long", limit, asked)
            ids = ids[:limit] if side.lower() == "right" else ids[-limit:]
            rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)})
        return rows

    def word_pieces_kept(self, texts: list[str], count: int, side: str = "right", cut: bool = True) -> list[str]:
        """Each text within `count` word pieces (a client's own limit, below the model's): its first ones (side
        "right", cut at the last one's end in the text) or its last ones ("left"); with `cut` false, a longer text
        is 413."""
        with tokenizing():  # the texts kept are tokenized again, and counted, as model inputs
            offsets = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        kept = []
        for index, (text, spans) in enumerate(zip(texts, offsets)):
            if len(spans) <= count:
                kept.append(text)
            elif not cut:
                raise refused(f"text {index} is {len(spans)} word pieces long", count, False)
            else:
                kept.append(text[:spans[count - 1][1]] if side == "right" else text[spans[-count][0]:])
        return kept

    # ------------------------------------------------------------ running rows

    def submitted(self, jobs: list[Job]) -> list[Future]:
        if len(jobs) > self.settings.max_queue:  # it could never be queued: 429 would mean "retry" forever
            raise HTTPError(413, f"the request makes {len(jobs)} model inputs; the limit is {self.settings.max_queue}")
        try:
            return self.batcher.submit(jobs)
        except QueueFull as problem:
            raise HTTPError(429, str(problem)) from None

    async def run_jobs(self, jobs: list[Job]) -> list[Any]:
        results = await asyncio.gather(*(asyncio.wrap_future(future) for future in self.submitted(jobs)))
        count_jobs(jobs)
        return results

    def batcher_rows(self, features: Features, read) -> list[tuple[torch.Tensor, ...]]:
        """A pipeline's rows, run by the batcher (a pipeline runs in a worker thread, which waits for them)."""
        longest = max(features.lengths(), default=0)
        if longest > self.max_length:
            tei_failure("tokenization")  # TEI's count of an input over its max_input_length
            raise HTTPError(413, f"the request makes model inputs of {longest} tokens; the limit is "
                                 f"{self.max_length}")
        jobs = [Job(rows_read(read), row) for row in features.rows]
        results = [future.result() for future in self.submitted(jobs)]
        count_jobs(jobs)
        return results

    # ------------------------------------------------------------ embeddings

    def embedding_limit(self, used: SentenceEmbedding) -> int:
        """Where long texts are cut, or refused: the smaller of the server's and the layout's max_length."""
        return self.max_length if used.max_length is None else min(self.max_length, used.max_length)

    def input_limit(self) -> int:
        """Where the model's inputs are cut or refused (TEI's max_input_length, vLLM's max_model_len): an encoder's
        sentence-transformers max_seq_length, a multi-vector model's document length, a task model's max_length."""
        if self.colbert is not None:
            return min(self.max_length, self.colbert.role_max_length("document"))
        return self.embedding_limit(self.layout()) if self.task is None else self.run.max_length

    async def input_rows(self, inputs: list[str] | list[list[int]], used: SentenceEmbedding, cut: bool | None,
                         side: str, prompt_name: str | None = None, prompt: str | None = None,
                         max_tokens: int | None = None, add_special_tokens: bool = True) -> list[dict[str, list]]:
        """Model rows of texts (after the prompt, as the sentence-transformers layout reads them) or of lists of
        token ids (as they are); `max_tokens` (a request's own limit) cuts them shorter."""
        limit = self.embedding_limit(used) if max_tokens is None else min(self.embedding_limit(used), max_tokens)
        cut = True if max_tokens is not None else cut
        if inputs and isinstance(inputs[0], list):
            return self.id_rows(inputs, limit, cut, side)
        texts = embedding_texts(inputs, used, used.prompt(prompt_name, prompt))
        rows = await asyncio.to_thread(self.encode_texts, texts, None, limit, False, cut, side, add_special_tokens)
        empty = next((index for index, row in enumerate(rows) if not row["input_ids"]), None)
        if empty is not None:  # no [CLS] and no word piece: nothing for the model to read
            raise HTTPError(400, f"input {empty} has no word piece to read without [CLS] and [SEP] "
                                 f"(add_special_tokens false)", kind=EMPTY)
        return rows

    async def embed(self, texts: list[str] | list[list[int]], pooling: str | None, normalize: bool | None,
                    cut: bool | None = None, side: str = "right", prompt_name: str | None = None,
                    prompt: str | None = None, max_tokens: int | None = None, add_special_tokens: bool = True
                    ) -> tuple[list[torch.Tensor], int, SentenceEmbedding]:
        """Vectors of texts (or of lists of token ids), how many tokens they had, and the settings used: those
        asked for, else the checkpoint's sentence-transformers layout (pooling, max_seq_length, normalisation,
        prompts), as `bertforge embed`."""
        if self.colbert is not None:
            raise HTTPError(409, f"wrong model: {self.model_name} is a multi-vector (ColBERT) model, a vector per "
                                 f"token: /v1/embeddings or /v1/multi-vector give its vectors, /rerank and "
                                 f"/similarity its MaxSim scores")
        if self.splade is not None:
            if pooling is not None:
                raise HTTPError(422, f"pooling: {self.model_name} is a SPLADE model, which pools its masked-LM "
                                     f"logits")
            if normalize:
                raise HTTPError(409, f"normalize: {self.model_name} is a SPLADE model, whose weights are compared "
                                     f"as they are (dot product); send \"normalize\": false")
            used = self.layout()
            rows = await self.input_rows(texts, used, cut, side, prompt_name, prompt, max_tokens, add_special_tokens)
            vectors = await self.run_jobs([Job(self.run_splade, row) for row in rows])
            return vectors, sum(len(row["input_ids"]) for row in rows), used
        used = sentence_embedding(encoder_of(self.model), pooling, None, normalize)
        rows = await self.input_rows(texts, used, cut, side, prompt_name, prompt, max_tokens, add_special_tokens)
        left_out = 0 if texts and isinstance(texts[0], list) else \
            prompt_length(self.tokenizer, used, used.prompt(prompt_name, prompt))
        if left_out and not add_special_tokens:  # [CLS] was counted among the first positions left out
            left_out -= 1
        options = {"pooling": used.pooling, "normalize": used.normalize, "left_out": left_out}
        vectors = await self.run_jobs([Job(pooled_vectors, row, options) for row in rows])
        return vectors, sum(len(row["input_ids"]) for row in rows), used

    async def token_states(self, inputs: list[str] | list[list[int]], cut: bool | None = None, side: str = "right",
                           prompt_name: str | None = None, max_tokens: int | None = None,
                           add_special_tokens: bool = True) -> tuple[list[torch.Tensor], int]:
        """Every token's last-layer vector of each input, [CLS] and [SEP] included (texts read as the layout reads
        them), and how many tokens the model read."""
        rows = await self.input_rows(inputs, self.layout(), cut, side, prompt_name, max_tokens=max_tokens,
                                     add_special_tokens=add_special_tokens)
        states = await self.run_jobs([Job(token_vectors, row) for row in rows])
        return states, sum(len(row["input_ids"]) for row in rows)

    def layout(self) -> SentenceEmbedding:
        """The model's sentence-transformers layout (its pooling, prompts, max_seq_length): a SPLADE model's own."""
        return sentence_embedding(self.model if self.splade is not None else encoder_of(self.model))

    async def multi_vectors(self, inputs: list[str] | list[list[int]], role: str, cut: bool | None = None,
                            side: str = "right", prompt_name: str | None = None, dimensions: int | None = None,
                            max_tokens: int | None = None) -> tuple[list[torch.Tensor], int]:
        """A multi-vector model's token vectors of each text (or list of token ids, as it is) as it encodes one of
        this role (MultiVectorEncoder.encode_query / encode_document: the role's prompt and length, a query's
        [MASK]s, a document's skiplist), and how many tokens the model read."""
        colbert = self.colbert
        limit = min(self.max_length, colbert.role_max_length(role), max_tokens or self.max_length)
        cut = True if max_tokens is not None else cut
        if inputs and isinstance(inputs[0], list):
            rows = self.id_rows(inputs, limit, cut, side)
        else:
            prompt = colbert.role_prompt(role, prompt_name)
            rows = await asyncio.to_thread(self.encode_texts, [prompt + text for text in inputs], None, limit, False,
                                           cut, side)
        vectors = await self.run_jobs([Job(self.run_multi_vector[role], row) for row in rows])
        if colbert.truncate_dim is not None:
            vectors = first_token_dimensions(vectors, colbert.truncate_dim)
        if dimensions is not None:
            if dimensions > vectors[0].shape[-1]:
                raise HTTPError(422, f"dimensions: {dimensions} is more than the model's {vectors[0].shape[-1]}")
            vectors = first_token_dimensions(vectors, dimensions)
        return vectors, sum(len(row["input_ids"]) for row in rows)

    async def late_interaction(self, query: str, texts: list[str], cut: bool | None = None, side: str = "right",
                               prompt_name: str | None = None, max_tokens: int | None = None
                               ) -> tuple[list[float], int]:
        """A multi-vector model's score of each text for the query (the query's token vectors against each
        text's as a document's: MaxSim, or MeanMaxSim as its layout says), and how many tokens the model read."""
        (queried, query_tokens), (documents, tokens) = await asyncio.gather(
            self.multi_vectors([query], "query", cut, side, prompt_name, max_tokens=max_tokens),
            self.multi_vectors(texts, "document", cut, side, prompt_name, max_tokens=max_tokens))
        scores = await asyncio.to_thread(self.colbert.similarity, queried, documents)
        return scores[0].tolist(), query_tokens + tokens

    # ------------------------------------------------------------ a task model's answers

    async def task_outputs(self, examples: list, cut: bool | None = None, side: str = "right",
                           max_tokens: int | None = None):
        """(features, outputs per row) of examples, encoded with the task's own `encode` and its settings;
        `max_tokens` (a request's own limit) cuts them shorter."""
        settings = self.run.settings
        if max_tokens is not None:
            settings, cut = dataclasses.replace(settings, max_length=min(max_tokens, settings.max_length)), True
        try:
            features = await asyncio.to_thread(self.encode_examples, examples, settings, side)
        except ConfigError as error:
            if max_tokens is None:
                raise
            raise HTTPError(422, f"truncate_prompt_tokens: {error}") from None  # the task's windows don't fit it
        if features.truncated and not (self.truncate if cut is None else cut):
            raise refused(f"{features.truncated} of the inputs are longer than the model's max_length",
                          self.run.max_length, cut)
        return features, await self.run_jobs([Job(self.run_rows, row) for row in features.rows])

    def encode_examples(self, examples: list, settings: Any, side: str) -> Features:
        """The task's model rows of examples (its own `encode`), counted towards the request's cost."""
        texts = [{field: value for field, value in self.task.inputs(example).items() if field != "id"}
                 for example in examples]
        with tokenizing(texts):
            return self.task.encode(self.tokenizers[side.lower()], examples, settings, self.model.config.id2label)

    async def predict_examples(self, examples: list, cut: bool | None = None, side: str = "right",
                               max_tokens: int | None = None) -> tuple[list[dict[str, Any]], int]:
        """The task's answers for examples, each with its input, exactly as `bertforge predict` gives them, and how
        many tokens the model read."""
        features, outputs = await self.task_outputs(examples, cut, side, max_tokens)
        answers = await asyncio.to_thread(self.task.decode, features, examples, outputs, self.model.config)
        return [{**self.task.inputs(example), **answer} for example, answer in zip(examples, answers)], \
            sum(features.lengths())

    def ranking_refusal(self) -> str | None:
        """Why the model has no relevance of a text to a query to give; None where it has. A fine-tuned model that
        read single texts (its run config names no second column), a multi-label one or another task's has none; a
        sequence classifier from elsewhere may be a cross-encoder."""
        task = self.task
        if task is None:
            return None
        single_texts = self.checkpoint is not None and self.checkpoint.trained_on_pairs is False
        if task.name == "multi_label" or single_texts:
            return (f"wrong task: {self.model_name} was fine-tuned on "
                    f"{'single texts' if single_texts else 'labels to tag a text with'}; reranking needs a pair "
                    f"classifier (trained on text pairs) or an encoder")
        if task.head != "sequence_classification":
            return f"wrong task: {self.model_name} does {task.name}; reranking needs a pair classifier or an encoder"
        return None

    async def relevance(self, query: str, texts: list[str], raw_scores: bool = False, cut: bool | None = None,
                        side: str = "right", max_tokens: int | None = None) -> tuple[list[float], int]:
        """Each text's relevance to the query, and how many tokens the model read: a pair classifier's probability
        of its last label (or the sigmoid of a one-output model's score; raw_scores: the logit or score), or, for
        an encoder, the cosine similarity of the texts' embeddings (a SPLADE model's dot product). `max_tokens`
        cuts each model input (a pair, or a text) shorter."""
        task, config = self.task, self.model.config
        refusal = self.ranking_refusal()
        if refusal is not None:
            raise HTTPError(409, refusal)
        if self.colbert is not None:
            return await self.late_interaction(query, texts, cut, side, max_tokens=max_tokens)
        if task is None:
            vectors, tokens, _ = await self.embed([query, *texts], None, self.compared, cut, side,
                                                  max_tokens=max_tokens)
            return [float(vectors[0] @ vector) for vector in vectors[1:]], tokens
        answers, tokens = await self.predict_examples([task.example(query, text) for text in texts], cut, side,
                                                      max_tokens)
        if "score" in answers[0] and TASK_SCORES[task.name] == "none":  # a regressor's score, as it is
            return [a["score"] if raw_scores else 1 / (1 + math.exp(-a["score"])) for a in answers], tokens
        last = config.id2label[config.num_labels - 1]
        # a reranker answers its output's sigmoid, a classifier each label's probability
        probabilities = [a["score"] if "score" in a else a["probabilities"][last] for a in answers]
        return [math.log(max(p, 1e-12) / max(1 - p, 1e-12)) if raw_scores else p for p in probabilities], tokens


def refused(what: str, limit: int, asked: bool | None) -> HTTPError:
    """413 for input over `limit` tokens; `asked`: the request's own truncate, if it said."""
    why = "the request asked not to truncate" if asked is False else "this server refuses long texts rather than " \
                                                                     "truncating"
    tei_failure("tokenization")  # TEI's count of an input over its max_input_length
    return HTTPError(413, f"{what}; the limit is {limit} ({why})")


def first_dimensions(vectors: list[torch.Tensor], dimensions: int | None, normalized: bool,
                     field: str = "dimensions") -> list:
    """The first `dimensions` of each vector (Matryoshka-style), unit length again when they were; None: all.
    `field`: the request's name for them."""
    if dimensions is None:
        return vectors
    if dimensions > len(vectors[0]):
        raise HTTPError(422, f"{field}: {dimensions} is more than the model's {len(vectors[0])}")
    return [F.normalize(vector[:dimensions], dim=-1) if normalized else vector[:dimensions] for vector in vectors]


def is_one_input(inputs: str | list) -> bool:
    """Whether an API's input (TEI's `inputs`, OpenAI's and Jina's `input`) is one text or one list of token ids,
    not a list of them."""
    return isinstance(inputs, str) or bool(inputs) and isinstance(inputs[0], int)


def input_list(inputs: str | list) -> list:
    """An API's input (a text, texts, token ids, lists of token ids) as a list of texts or of id lists."""
    return [inputs] if is_one_input(inputs) else inputs


def tei_inputs(inputs: str | list) -> list:
    """TEI's `inputs` as a list of texts or of id lists, none of them empty (TEI refuses an empty text)."""
    inputs = input_list(inputs)
    check_not_empty(inputs)
    return inputs


def check_not_empty(texts: list) -> None:
    """text-embeddings-inference answers an empty text 400, error_type Empty: nothing to read."""
    empty = next((index for index, text in enumerate(texts) if text == ""), None)
    if empty is not None:
        raise HTTPError(400, f"inputs cannot be empty: text {empty} is \"\"", kind=EMPTY)
