"""Feature extraction: which hidden states to use (the BERT paper's recipes) and how to pool them.

Shapes: batch, seq, hidden; `states` is the tuple of the embeddings output and every layer's output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.batching import MODEL_INPUTS, collate, length_sorted_batches
from bertforge.checkpoint.sentence_transformers import SentenceEmbedding
from bertforge.errors import BertforgeError, ConfigError, InputError, check_choice
from bertforge.progress import progress_bar
from bertforge.validation import (
    check_counts,
    check_number,
    check_within_positions,
    listed_inputs,
    readable_length,
)
from bertforge.windows import half_overlap_starts

# The feature-based recipes of the BERT paper's NER study (section 5.3), by name.
LAYER_COMBINATIONS: dict[str, Callable[[Sequence[torch.Tensor]], torch.Tensor]] = {
    "last": lambda states: states[-1],
    "second_to_last": lambda states: states[-2],
    "sum_last_four": lambda states: torch.stack(states[-4:]).sum(0),
    "concat_last_four": lambda states: torch.cat(states[-4:], dim=-1),
    # What an untrained ScalarMix computes (uniform weights); pass a trained one to token_features.
    "weighted_sum_all": lambda states: torch.stack(states).mean(0),
    "embeddings": lambda states: states[0],
}


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(w)_j * h_j over every hidden state: a learned layer weighting (Peters et al., 2018).

    Starts uniform (w = 0, gamma = 1), where it equals the "weighted_sum_all" recipe; train it with a task head.
    """

    def __init__(self, num_states: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_states))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(states) != len(self.weights):
            raise BertforgeError(f"this ScalarMix weighs {len(self.weights)} hidden states, got {len(states)}")
        weights = self.weights.softmax(0)
        return self.gamma * torch.einsum("l,l...->...", weights, torch.stack(states))


def _masked(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask[:, :, None].to(like.dtype)  # (batch, seq, 1)


def _at(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Each row's vector at its position: (batch, seq, ...), (batch,) -> (batch, ...)."""
    return hidden[torch.arange(len(hidden), device=hidden.device), positions]


def _weighted_mean(hidden: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_t w_t h_t / sum_t w_t per row, with (batch, seq) weights (0 at padding)."""
    weights = _masked(weights, hidden)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def _last(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last pooled position (with right padding, its [SEP]); the last position of a row with none."""
    return mask.shape[1] - 1 - mask.flip(1).int().argmax(1)


# How a text's token vectors become one, by sentence-transformers' names. `mask` (batch, seq) is 1 at the tokens
# pooled: the real ones, less [CLS] and a prompt's where the layout leaves those out (see `pooling_mask`).
POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cls": lambda hidden, mask: _at(hidden, mask.int().argmax(1)),  # the first pooled token: [CLS] unless left out
    "mean": lambda hidden, mask: _weighted_mean(hidden, mask),
    "max": lambda hidden, mask: hidden.masked_fill(mask[:, :, None] == 0, torch.finfo(hidden.dtype).min).max(1).values,
    # the sum over the square root of the count (sentence-transformers' early models)
    "mean_sqrt_len_tokens": lambda hidden, mask: (hidden * _masked(mask, hidden)).sum(1) / _masked(
        mask, hidden).sum(1).clamp(min=1e-9).sqrt(),
    # position t (from 1) weighs t: the later tokens of a model that reads left to right know more (SGPT)
    "weightedmean": lambda hidden, mask: _weighted_mean(hidden, mask * torch.arange(
        1, mask.shape[1] + 1, device=mask.device)),
    "lasttoken": lambda hidden, mask: _at(hidden, _last(mask)) * _at(_masked(mask, hidden), _last(mask)),
}


def token_features(model, input_ids, attention_mask, token_type_ids=None, layers: str = "last",
                   scalar_mix: ScalarMix | None = None, first_token_only: bool = False) -> torch.Tensor:
    """Per-token vectors (batch, seq, hidden or 4*hidden) from the chosen layer recipe.

    `scalar_mix`: trained weights for "weighted_sum_all" (uniform when not given). `first_token_only`: only the
    first position ([CLS]) is read, (batch, 1, hidden) when the model can give it alone (layers "last").
    """
    check_choice(layers, LAYER_COMBINATIONS, "layer recipe")
    if scalar_mix is not None and layers != "weighted_sum_all":
        raise BertforgeError(f"a scalar mix applies to layers='weighted_sum_all', not {layers!r}")
    if layers == "last" and first_token_only:
        return model(input_ids, attention_mask, token_type_ids, first_token_only=True).last_hidden_state
    output = model(input_ids, attention_mask, token_type_ids, output_hidden_states=layers != "last")
    if layers == "last":
        return output.last_hidden_state
    if scalar_mix is not None:
        return scalar_mix(output.hidden_states)
    return LAYER_COMBINATIONS[layers](output.hidden_states)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str = "mean") -> torch.Tensor:
    """(batch, seq, hidden) -> (batch, hidden), over the tokens `attention_mask` marks (real tokens only)."""
    check_choice(pooling, POOLINGS, "pooling")
    return POOLINGS[pooling](hidden, attention_mask)


# The activations of sentence-transformers' Dense, by the class name its config.json gives (torch's modules only, as
# sentence-transformers itself loads without trusting the folder's code); absent: Tanh, its default.
DENSE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.ReLU": F.relu,
    "torch.nn.modules.activation.GELU": F.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
    "torch.nn.modules.activation.SiLU": F.silu,
}
DEFAULT_DENSE_ACTIVATION = "torch.nn.modules.activation.Tanh"


class Dense(nn.Module):
    """sentence-transformers' Dense after pooling: activation(W v + b), plus v (or a projection of it: `residual`)
    with use_residual. LaBSE projects its [CLS] vector so before normalising.

    Its tensors belong to the sentence-transformers layout (its own folder, 2_Dense/, in sentence-transformers'
    names: linear.weight, ...), not to the BERT checkpoint: save_pretrained writes them with the layout
    (checkpoint/sentence_transformers.py), and a BERT state dict loaded into the encoder leaves them as they are."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: str = DEFAULT_DENSE_ACTIVATION, use_residual: bool = False):
        super().__init__()
        check_choice(activation, DENSE_ACTIVATIONS, "Dense activation_function")
        self.activation, self.use_residual = activation, use_residual
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        # a residual between widths goes through a projection of its own, without bias
        self.residual = nn.Parameter(torch.empty(out_features, in_features)) \
            if use_residual and in_features != out_features else None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def get_embedding_dimension(self) -> int:  # sentence-transformers' name (get_sentence_embedding_dimension: 5's)
        return self.out_features

    get_sentence_embedding_dimension = get_embedding_dimension

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        """(texts, in_features) -> (texts, out_features)."""
        vectors = vectors.to(self.weight)
        out = DENSE_ACTIVATIONS[self.activation](F.linear(vectors, self.weight, self.bias))
        if self.use_residual:
            out = out + (vectors if self.residual is None else F.linear(vectors, self.residual))
        return out

    def tensors(self) -> dict[str, torch.Tensor]:
        """Its tensors in sentence-transformers' names."""
        return {"linear.weight": self.weight} | ({} if self.bias is None else {"linear.bias": self.bias}) | (
            {} if self.residual is None else {"residual.weight": self.residual})


def after_pooling(model: nn.Module, vectors: torch.Tensor, normalize: bool) -> torch.Tensor:
    """What the model's layout does to pooled vectors: its Dense layers (`model.sentence_dense`, from
    sentence-transformers' Dense modules), then unit length where `normalize`; on the vectors' own device."""
    for dense in getattr(model, "sentence_dense", None) or ():
        vectors = dense(vectors).to(vectors.device)
    return F.normalize(vectors, dim=-1) if normalize else vectors


def pooling_mask(attention_mask: torch.Tensor, left_out: int | Sequence[int]) -> torch.Tensor:
    """The attention mask with each row's first `left_out` positions 0 (one count, or one per row): [CLS] and a
    prompt's tokens, which a layout with include_prompt false doesn't pool (see `prompt_length`)."""
    left_out = torch.as_tensor(left_out, device=attention_mask.device).expand(len(attention_mask))
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return attention_mask.masked_fill(positions[None, :] < left_out[:, None], 0)


@dataclass
class TokenVectors:
    """Per-token (or per-word) vectors of one text, with where each came from in the text."""

    tokens: list[str]  # word pieces, or whole words (pieces joined) at word level
    offsets: list[tuple[int, int]]  # character span in the text
    vectors: torch.Tensor  # (tokens, hidden)


def _row_batches(model, rows: Sequence[dict[str, list[int]]], pad_token_id: int, layers: str, batch_size: int,
                 progress: bool, first_token_only: bool = False):
    """Yield (row indices, token features (batch, seq, hidden), attention mask) per length-sorted batch of rows of
    model inputs (input_ids, and token_type_ids unless all 0); (batch, 1, hidden) where `first_token_only` allows."""
    check_choice(layers, LAYER_COMBINATIONS, "layer recipe")
    check_counts(batch_size=batch_size)
    batches = length_sorted_batches([len(row["input_ids"]) for row in rows], batch_size)
    batches = progress_bar(batches, desc="embedding", unit="batch", enabled=progress)
    device = next(model.parameters()).device  # the batches go where the model is (--device); features come back
    for indices in batches:
        batch = collate([rows[i] for i in indices], pad_token_id)
        batch = {key: tensor.to(device) for key, tensor in batch.items()}
        hidden = token_features(model, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                                layers, first_token_only=first_token_only)
        yield indices, hidden.cpu(), batch["attention_mask"].cpu()


def _encoded_batches(model, tokenizer, texts: Sequence[str], layers: str, batch_size: int, max_length: int | None,
                     progress: bool):
    """Yield (text indices, token features (batch, seq, hidden), attention mask, encoding) per length-sorted batch,
    each text truncated to max_length tokens."""
    encoded = tokenizer(list(texts), truncation=True,
                        max_length=readable_length(model, tokenizer) if max_length is None else max_length,
                        return_offsets_mapping=True, return_word_ids=True)
    rows = [{key: encoded[key][i] for key in MODEL_INPUTS} for i in range(len(texts))]
    for indices, hidden, mask in _row_batches(model, rows, tokenizer.pad_token_id, layers, batch_size, progress):
        yield indices, hidden, mask, encoded


def sentence_embedding(model, pooling: str | None = None, max_length: int | None = None,
                       normalize: bool | None = None) -> SentenceEmbedding:
    """The settings for sentence vectors: those given, else the checkpoint's sentence-transformers layout
    (model.sentence_embedding, read by from_pretrained), else mean pooling of untruncated, unnormalised vectors."""
    saved = getattr(model, "sentence_embedding", None) or SentenceEmbedding()
    return dataclasses.replace(saved, pooling=pooling or saved.pooling,
                               max_length=saved.max_length if max_length is None else max_length,
                               normalize=saved.normalize if normalize is None else normalize)


def embedding_texts(texts: Sequence[str], settings: SentenceEmbedding, prompt: str = "") -> list[str]:
    """The texts as the model's sentence-transformers pipeline tokenizes them: after `prompt` (see
    SentenceEmbedding.prompt), lower-cased when it says so."""
    texts = [prompt + text for text in texts]
    return [text.lower() for text in texts] if settings.lowercase else texts


def input_list(texts: Any, name: str = "texts") -> list:
    """The inputs of a call as a list: a string is one text, else validation.listed_inputs' batch."""
    return [texts] if isinstance(texts, str) else listed_inputs(texts, name)


def check_prompt(prompt: Any) -> None:
    """InputError for a prompt that is not text; None (not given) passes."""
    if prompt is not None and not isinstance(prompt, str):
        raise InputError(f"prompt must be a text, got {prompt!r}")


def check_model_and_tokenizer(model: Any, tokenizer: Any) -> None:
    """A one-line error where `model` or `tokenizer` is not one (None, or the two given the other way round)."""
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise InputError(f"model must be a bertforge model such as BertModel.from_pretrained(...), got "
                         f"{type(model).__name__}"
                         + (" (model and tokenizer swapped?)" if hasattr(model, "model_max_length") else ""))
    if isinstance(tokenizer, nn.Module) or not callable(tokenizer) or not hasattr(tokenizer, "model_max_length"):
        raise InputError(f"tokenizer must be a tokenizer such as BertTokenizer.from_pretrained(...), got "
                         f"{type(tokenizer).__name__}")


# A text, or a (text, pair) read together as one input ([CLS] text [SEP] pair [SEP]), as sentence-transformers'
# encode takes either.
TextOrPair = str | tuple[str, str]


def text_and_pair(item: TextOrPair) -> tuple[str, str | None]:
    """(text, pair) of an input, the pair None for a single text; a pair is a tuple or list of two texts."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, tuple | list) and len(item) == 2 and all(isinstance(text, str) for text in item):
        return item[0], item[1]
    held = f" of ({', '.join(type(part).__name__ for part in item)})" if isinstance(item, tuple | list) else ""
    raise InputError(f"an input is a text or a (text, pair) of two texts, got a {type(item).__name__}{held}")


def model_rows(tokenizer, items: Sequence[TextOrPair], settings: SentenceEmbedding, prompt: str = "",
               max_length: int | None = None) -> list[dict[str, list[int]]]:
    """Per input, its input_ids and token_type_ids as the model reads them: the prompt before the text (a pair's
    first), lower-cased where the layout says so, cut to max_length tokens (a pair longest first, as
    sentence-transformers cuts it; None: not cut)."""
    texts, pairs = zip(*map(text_and_pair, items)) if items else ((), ())
    rows: list[dict[str, list[int]]] = [{}] * len(items)
    cut = {"truncation": max_length is not None, "max_length": max_length}
    singles = [i for i, pair in enumerate(pairs) if pair is None]
    paired = [i for i, pair in enumerate(pairs) if pair is not None]
    for indices, columns in ((singles, [texts]), (paired, [texts, pairs])):
        if indices:
            encoded = tokenizer(*[embedding_texts([column[i] for i in indices], settings, prompt if first else "")
                                  for first, column in zip((True, False), columns)], **cut)
            for position, i in enumerate(indices):
                rows[i] = {name: encoded[name][position] for name in ("input_ids", "token_type_ids")}
    return rows


def prompt_length(tokenizer, settings: SentenceEmbedding, prompt: str) -> int:
    """How many first positions of a text after `prompt` pooling leaves out: none, or where the layout says so
    (include_prompt false) [CLS] and the prompt's word pieces, counted as sentence-transformers counts them (the
    prompt tokenized alone, less its [SEP])."""
    return 0 if settings.include_prompt or not prompt else prompt_tokens(tokenizer, settings, prompt)


def prompt_tokens(tokenizer, settings: SentenceEmbedding, prompt: str) -> int:
    """[CLS] and the word pieces of `prompt`: the prompt tokenized alone, less its [SEP] (sentence-transformers'
    prompt_length)."""
    return len(tokenizer(embedding_texts([prompt], settings)[0], truncation=False)["input_ids"]) - 1


# What becomes of a text longer than max_length: name -> (its token ids without [CLS] and [SEP], tokens a window
# holds between them) -> the parts the model reads, each as [CLS] part [SEP].
LONG_TEXT: dict[str, Callable[[list[int], int], list[list[int]]]] = {
    # The tokenizer's own truncation: the first tokens.
    "truncate": lambda ids, budget: [ids[:budget]],
    # Overlapping windows advancing by half a window, over the whole text.
    "windows": lambda ids, budget: [ids[start:start + budget] for start in half_overlap_starts(len(ids), budget)],
}


@torch.inference_mode()
def extract_features(model, tokenizer, texts: Sequence[TextOrPair], layers: str = "last", pooling: str | None = None,
                     batch_size: int = 32, max_length: int | None = None, normalize: bool | None = None,
                     progress: bool = False, long_text: str = "truncate", prompt_name: str | None = None,
                     prompt: str | None = None) -> torch.Tensor:
    """One vector per text: (len(texts), hidden), in the order of `texts` (a single string is one text; a
    (text, pair) tuple is read as one input, [CLS] text [SEP] pair [SEP], as sentence-transformers' encode reads it).

    pooling, max_length and normalize default to the checkpoint's sentence-transformers settings (modules.json)
    when it has them, so that the default model gives sentence-transformers' vectors; else mean, the tokenizer's
    model_max_length and no normalisation. `prompt_name` picks one of its prompts to put before each text (by
    default its default_prompt_name, if any); `prompt` gives the text of one, as sentence-transformers' encode.

    A text longer than max_length is truncated, or with long_text="windows" read as overlapping windows of
    max_length tokens (advancing by half a window): its vector is the mean of the windows' pooled vectors, each
    weighted by its tokens ([CLS] and [SEP] included, as pooling counts them; a token in two windows counts in
    both), normalised afterwards when normalize is set. With mean pooling that is the mean of every token vector
    of every window. A pair is always cut, the longer side first.

    >>> extract_features(model, tokenizer, ["A cat.", "A dog."], pooling="mean", normalize=True).shape
    torch.Size([2, 384])
    """
    check_model_and_tokenizer(model, tokenizer)
    texts = input_list(texts)
    check_number("max_length", max_length, integer=True, optional=True)
    check_counts(batch_size=batch_size)
    check_prompt(prompt)
    settings = sentence_embedding(model, pooling, max_length, normalize)
    if settings.multi_vector and pooling is None:
        raise ConfigError("this checkpoint is a multi-vector (ColBERT) model: one vector per token, which "
                          "MultiVectorEncoder gives; name a pooling to pool its encoder's token vectors instead")
    if settings.splade is not None and pooling is None:  # a pooling asked for reads the encoder's token vectors
        raise ConfigError("this checkpoint is a sparse (SPLADE) encoder: its vectors come from the masked-LM head, "
                          "which SparseEncoder (and `bertforge serve`'s /embed_sparse) reads")
    pooling, max_length, normalize = settings.pooling, settings.max_length, settings.normalize
    check_choice(pooling, POOLINGS, "pooling")
    check_choice(long_text, LONG_TEXT, "long_text")
    # [CLS] and [SEP] around each part
    # a tokenizer without a model_max_length of its own says 512: a model of fewer positions reads fewer
    budget = (readable_length(model, tokenizer) if max_length is None else max_length) - 2
    if budget < 1:
        raise BertforgeError(f"max_length={max_length} leaves no room for text between [CLS] and [SEP]")
    check_choice(layers, LAYER_COMBINATIONS, "layer recipe")
    check_within_positions(max_length, model.config.max_position_embeddings)
    if not texts:  # as wide as the recipe makes a vector (concat_last_four: 4 x hidden)
        config = model.config
        empty = LAYER_COMBINATIONS[layers]([torch.empty(0, config.hidden_size)] * (config.num_hidden_layers + 1))
        return after_pooling(model, empty, False) if layers == "last" else empty
    rows, text_index, left_out = [], [], []
    prompt = settings.prompt(prompt_name, prompt)
    skipped = prompt_length(tokenizer, settings, prompt)
    # a pair is one input, cut as the tokenizer cuts pairs; a text is read whole, then cut or windowed
    pairs = [index for index, text in enumerate(texts) if text_and_pair(text)[1] is not None]
    singles = sorted(set(range(len(texts))) - set(pairs))
    cut_pairs = dict(zip(pairs, model_rows(tokenizer, [texts[i] for i in pairs], settings, prompt, budget + 2)))
    whole_texts = dict(zip(singles, model_rows(tokenizer, [texts[i] for i in singles], settings, prompt)))
    for index in range(len(texts)):
        if index in cut_pairs:
            rows.append(cut_pairs[index])
            text_index.append(index)
            left_out.append(skipped)
            continue
        for window, part in enumerate(LONG_TEXT[long_text](whole_texts[index]["input_ids"][1:-1], budget)):
            ids = [tokenizer.cls_token_id, *part, tokenizer.sep_token_id]
            rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids)})  # one key set for every row
            text_index.append(index)
            left_out.append(skipped if window == 0 else 0)  # the prompt opens a text's first window
    pooled: list[torch.Tensor | None] = [None] * len(rows)
    batches = _row_batches(model, rows, tokenizer.pad_token_id, layers, batch_size, progress,
                           first_token_only=pooling == "cls" and not skipped)  # [CLS] pooling reads nothing else
    for indices, hidden, mask in batches:
        mask = pooling_mask(mask, [left_out[i] for i in indices]) if skipped else mask
        for i, vector in zip(indices, pool(hidden, mask, pooling)):
            pooled[i] = vector
    # each window weighs what its pooling read: the first one's prompt, left out of the pooling, is left out here
    vectors = combine_windows(pooled, [len(row["input_ids"]) - left for row, left in zip(rows, left_out)],
                              text_index, len(texts))
    if layers != "last":  # the layout's Dense layers read its own token vectors pooled, no other recipe's
        return F.normalize(vectors, dim=-1) if normalize else vectors
    return after_pooling(model, vectors, normalize)


def combine_windows(pooled: Sequence[torch.Tensor], weights: Sequence[int], text_index: Sequence[int],
                    num_texts: int) -> torch.Tensor:
    """(texts, hidden): per text, the weighted mean of its windows' vectors; a text of one window keeps its
    vector as it is (no rounding from multiplying and dividing by its weight)."""
    groups: list[list[int]] = [[] for _ in range(num_texts)]
    for row, index in enumerate(text_index):
        groups[index].append(row)
    vectors = []
    for group in groups:
        if len(group) == 1:
            vectors.append(pooled[group[0]])
            continue
        weight = torch.tensor([float(weights[row]) for row in group])  # (windows,)
        stacked = torch.stack([pooled[row].float() for row in group])  # (windows, hidden)
        vectors.append(((weight[:, None] * stacked).sum(0) / weight.sum()).to(pooled[group[0]].dtype))
    return torch.stack(vectors)


TOKEN_LEVELS = ("token", "word")


@torch.inference_mode()
def extract_token_features(model, tokenizer, texts: Sequence[str], layers: str = "last", level: str = "token",
                           batch_size: int = 32, max_length: int | None = None,
                           progress: bool = False) -> list[TokenVectors]:
    """Vectors for every word piece (level="token") or every word, its pieces averaged (level="word").

    Special tokens are left out. "Unaffable!" at word level -> tokens ["unaffable", "!"], offsets [(0, 9), (9, 10)].
    Texts are cut at max_length tokens: by default the checkpoint's sentence-transformers max_seq_length (what
    its token embeddings read there), else the tokenizer's model_max_length.
    """
    check_model_and_tokenizer(model, tokenizer)
    texts = input_list(texts)
    check_choice(level, TOKEN_LEVELS, "level", error=BertforgeError)
    max_length = sentence_embedding(model).max_length if max_length is None else max_length
    results: list[TokenVectors | None] = [None] * len(texts)
    for indices, hidden, _, encoded in _encoded_batches(model, tokenizer, texts, layers, batch_size, max_length,
                                                         progress):
        for row, i in enumerate(indices):
            text, offsets, words = texts[i], encoded["offset_mapping"][i], encoded["word_ids"][i]
            real = [position for position, word in enumerate(words) if word is not None]
            if level == "token":
                pieces = tokenizer.convert_ids_to_tokens([encoded["input_ids"][i][p] for p in real])
                results[i] = TokenVectors(pieces, [tuple(offsets[p]) for p in real], hidden[row, real])
                continue
            groups: dict[int, list[int]] = {}
            for position in real:
                groups.setdefault(words[position], []).append(position)
            spans = [(offsets[group[0]][0], offsets[group[-1]][1]) for group in groups.values()]
            vectors = [hidden[row, group].mean(0) for group in groups.values()]
            results[i] = TokenVectors([text[start:end] for start, end in spans], spans,
                                      torch.stack(vectors) if vectors else hidden.new_zeros(0, hidden.shape[-1]))
    return results
