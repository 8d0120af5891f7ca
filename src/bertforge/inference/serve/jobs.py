"""What the micro-batcher's worker runs, per kind of job: each function takes the model and a batch of jobs and
gives one answer per job. Only the worker touches the model, so these are the server's only model code."""

from typing import Any

import torch

from bertforge.checkpoint.sentence_transformers import SpladePooling
from bertforge.explain.page import explained
from bertforge.heads import encoder_of
from bertforge.inference.attention_view import attention_vectors
from bertforge.inference.features import after_pooling, pool, pooling_mask
from bertforge.inference.multi_vector_encoder import MultiVectorEncoder
from bertforge.inference.serve.batcher import Job
from bertforge.inference.sparse_encoder import keep_largest, splade_rows
from bertforge.tasks.data import forward_rows


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


def attentions(model: torch.nn.Module, jobs: list[Job]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per job, the (layers, heads, seq, seq) weights and the (layers, heads, seq, head_dim) queries and keys the
    neuron view recomputes them from; one text at a time, as each page shows one text."""
    return [attention_vectors(model, job.row["input_ids"], job.row["token_type_ids"]) for job in jobs]


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
