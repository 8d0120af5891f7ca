"""What can be explained, for every kind of model: the output f whose value is attributed to the input.

A Target scores word embeddings: given one (steps, seq, hidden) tensor per input row, it runs the model with those
in place of the embedding lookup and returns f, (steps,). Each model class has one builder in TARGET_BUILDERS:
  classifier: the logit of a class (default: the predicted one; over every window of a long text where the model
    reads it so), or the regression score;
  token classifier: one predicted entity, the sum of its words' logits for their tags (at each first token);
  question answering (text = question, text_pair = context): predict's answer's start + end logits, or either;
  masked LM: the logit of a token at the first [MASK] (default: the predicted one);
  bare encoder: the cosine similarity of the two texts' mean-pooled embeddings (which words make them alike), each
    text's words explained against the other text as given (rows_one_at_a_time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import config_path
from bertforge.config import FINETUNE_KEY, architectures_of
from bertforge.errors import InputError
from bertforge.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    encoder_of,
)
from bertforge.inference.features import after_pooling, pool, sentence_embedding
from bertforge.json_config import read_json_object
from bertforge.model import BertModel
from bertforge.pretraining.heads import BertForMaskedLM
from bertforge.tokenizer import BertTokenizer
from bertforge.validation import readable_length

DEFAULT_MAX_LENGTH = 512


@dataclass
class Row:
    """One tokenized model input, with where each token comes from in the user's texts."""

    input_ids: list[int]
    token_type_ids: list[int]
    texts: list[int | None]  # per token: index into the user's texts (0 text, 1 pair); None for special tokens
    offsets: list[tuple[int, int] | None]  # per token: characters of its text; None for special tokens
    word_ids: list[int | None]  # per token: word index within its text
    baseline_ids: list[int]  # the uninformative input: [PAD] for all but [CLS], [SEP] (and a masked LM's [MASK])

    def tensors(self, copies: int = 1, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.tensor([self.input_ids], device=device).expand(copies, -1),
                torch.tensor([self.token_type_ids], device=device).expand(copies, -1))


def encode_row(tokenizer, text: str, pair: str | None, first_text: int = 0,
               max_length: int = DEFAULT_MAX_LENGTH, keep_mask: bool = False) -> Row:
    """[CLS] text [SEP] (pair [SEP]), truncated to max_length; `first_text` numbers `text` among the user's texts;
    `keep_mask` keeps [MASK] in the baseline (for a masked LM)."""
    encoding = tokenizer(text, text_pair=pair, truncation=True, max_length=max_length,
                         return_offsets_mapping=True, return_word_ids=True)
    types = encoding["token_type_ids"]
    row = _row(tokenizer, encoding["input_ids"], types, [first_text + segment for segment in types],
               encoding["offset_mapping"], encoding["word_ids"], keep_mask)
    for number, value in enumerate((text, pair), first_text):
        if value is not None and number not in row.texts:  # no word of it to explain
            name = ("text", "pair")[number]
            pieces = tokenizer.tokenize(value)
            if not pieces:  # control and zero-width characters tokenize to nothing, as spaces do
                raise InputError(f"the {name} to explain is empty after tokenization (no word piece: only spaces, "
                                 f"control or zero-width characters)")
            if set(pieces) <= set(tokenizer.all_special_tokens):
                raise InputError(f"the {name} to explain holds special tokens alone ({' '.join(pieces[:5])}): no "
                                 "word of it to explain")
            raise InputError(f"max_length {max_length} keeps no word piece of the {name}: give a larger max_length")
    return row


def _row(tokenizer, ids: list[int], types: list[int], texts: list[int | None], offsets: list, words: list,
         keep_mask: bool = False) -> Row:
    """A Row of these tokens, each from the text, characters and word given, but [CLS], [SEP] and [PAD] (a [SEP]
    the user typed too), which are of no text; its baseline is [PAD] but for [CLS] and [SEP] (and with `keep_mask`
    [MASK]: for a masked LM it is the question asked, not evidence for the answer; elsewhere it is text)."""
    structure = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
    own = [token not in structure for token in ids]
    kept = {tokenizer.cls_token_id, tokenizer.sep_token_id} | ({tokenizer.mask_token_id} if keep_mask else set())
    return Row(list(ids), list(types), [text if mine else None for text, mine in zip(texts, own)],
               [tuple(span) if mine else None for span, mine in zip(offsets, own)],
               [word if mine else None for word, mine in zip(words, own)],
               [token if token in kept else tokenizer.pad_token_id for token in ids])


# The token that stands for "no word" where a method takes a word away (integrated gradients' path starts there,
# occlusion and the faithfulness report put words there): [PAD] (Captum's BERT recipe), [MASK] (what BERT was
# pre-trained to read as a missing word), [UNK].
BASELINES = {"pad": "pad_token_id", "mask": "mask_token_id", "unk": "unk_token_id"}


def with_baseline(rows: list[Row], tokenizer, baseline: str) -> None:
    """Put `baseline`'s token in the rows' baselines wherever they hold [PAD] for a word."""
    chosen, pad = getattr(tokenizer, BASELINES[baseline]), tokenizer.pad_token_id
    if chosen is None:
        raise InputError(f"baseline {baseline!r}: the tokenizer has no such token")
    for row in rows:
        row.baseline_ids = [chosen if base == pad and token != pad else base
                            for token, base in zip(row.input_ids, row.baseline_ids)]


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def run_with(model: torch.nn.Module, row: Row, embeddings: torch.Tensor):
    """The model's output for `row`, with word embeddings `embeddings` (steps, seq, hidden), one row per step.

    Given as the model's inputs_embeds (they take the word-embedding lookup's place), not put there by a hook on
    the lookup: the model is shared, and a hook would replace the lookup of every thread's call on it meanwhile.
    """
    _, token_type_ids = row.tensors(embeddings.shape[0], embeddings.device)
    table = encoder_of(model).embeddings.tokens.weight
    return model(inputs_embeds=embeddings.to(table.dtype), token_type_ids=token_type_ids)


@dataclass
class Target:
    name: str  # shown to the user: "positive", "PER: Paris", "answer: Denver Broncos"
    choices: list[str]  # every target the model offers for this input
    rows: list[Row]  # the inputs f reads: one, or two for the similarity of two texts
    score: Callable[[list[torch.Tensor]], torch.Tensor]  # word embeddings per row -> f, (steps,)
    readout: list[torch.Tensor]  # per row, (seq,) weights of the positions whose outputs f reads
    # Integrated gradients moves each row from its baseline on a path of its own, the other rows held at their input
    # (one text against the other), in place of all rows at once: two empty texts look alike to an encoder.
    rows_one_at_a_time: bool = False
    note: str | None = None  # what the user should know of the target (a label the model does not give)


def _pick(choices: list[str], target: str | int | None, default: int, what: str) -> int:
    """The index of the asked-for target: a position in `choices`, one of its names, or the text after "TYPE: "."""
    if target is None:
        return default
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit() and target not in choices):
        index = int(target)
        if 0 <= index < len(choices):
            return index
    else:
        for i, name in enumerate(choices):
            if target in (name, name.split(": ", 1)[-1]):
                return i
    raise InputError(f"unknown {what} {target!r}; choose from: {', '.join(choices) or '(none)'}")


def _one_position(seq: int, *positions: int) -> torch.Tensor:
    readout = torch.zeros(seq)
    for position in positions:
        readout[position] += 1 / len(positions)
    return readout


@torch.no_grad()
def _plain_output(model, row: Row):
    input_ids, token_type_ids = row.tensors(device=device_of(model))
    return model(input_ids, token_type_ids=token_type_ids)


def sequence_target(model, tokenizer, text, pair, target, max_length) -> Target:
    """A class's logit (default: predict's class; a multi-label model's most probable label, with a note where it is
    under the threshold, so that predict gives none), the regression score, or a reranker's relevance logit. A model
    fine-tuned to read a long text as windows (long_text "windows") is explained over them all: f is the mean of its
    windows' logits, as predict's."""
    from bertforge.tasks.checkpoint_contents import recorded_settings
    from bertforge.tasks.classification import TASK_SCORES  # the tasks of a sequence classifier
    from bertforge.tasks.multi_label import MultiLabelSettings

    extra = model.config.extra  # the settings the model was fine-tuned with, read as predict reads them
    task = extra.get("finetuning_task") if extra.get("finetuning_task") in TASK_SCORES else "classification"
    settings = recorded_settings(MultiLabelSettings(), task, extra.get("finetuning_task"), extra.get(FINETUNE_KEY))
    rows = _window_rows(tokenizer, text, pair, max_length) if settings.long_text == "windows" else []
    rows = rows if len(rows) > 1 else [encode_row(tokenizer, text, pair, max_length=max_length)]
    logits = torch.stack([_plain_output(model, row).logits[0].float().cpu() for row in rows]).mean(0)
    note = None
    if model.classifier.is_regression or model.config.num_labels == 1:  # a score, or a reranker's relevance
        choices, index = ["score"], _pick(["score"], target, 0, "target")
    else:
        choices = [model.config.id2label[i] for i in range(len(logits))]
        index = _pick(choices, target, int(logits.argmax()), "label")
        if target is None and model.classifier.problem_type == "multi_label_classification":
            from bertforge.tasks.multi_label import DEFAULT_THRESHOLD, is_predicted
            threshold = settings.threshold if settings.threshold is not None else DEFAULT_THRESHOLD
            probability = torch.sigmoid(logits[index])
            if not is_predicted(probability, threshold):
                note = (f"the most probable label, {probability.item():.2f}, is under the threshold {threshold:g}: "
                        "the model gives no label")

    def score(embeddings):
        return sum(run_with(model, row, values).logits[:, index] for row, values in zip(rows, embeddings)) / len(rows)
    return Target(choices[index], choices, rows, score, [_one_position(len(row.input_ids), 0) for row in rows],
                  note=note)


def _window_rows(tokenizer, text: str, pair: str | None, max_length: int) -> list[Row]:
    """The windows classification.windows reads a long text (or pair) as, each [CLS] window [SEP] (other text
    [SEP]), as Rows: one text windowed, advancing by half a window, the other kept whole beside each."""
    from bertforge.tasks.classification import windows
    from bertforge.tasks.data import TextExample
    from bertforge.windows import half_overlap_starts

    encoded = [tokenizer(value, truncation=False, return_offsets_mapping=True, return_word_ids=True)
               for value in (text, pair) if value is not None]
    parts = [[(token, tuple(span), word) for token, span, word in zip(e["input_ids"][1:-1], e["offset_mapping"][1:-1],
                                                                       e["word_ids"][1:-1])] for e in encoded]
    budget = max_length - len(parts) - 1
    windowed = max(range(len(parts)), key=lambda i: len(parts[i]))
    parts = [tokens if i == windowed else tokens[:budget // 2] for i, tokens in enumerate(parts)]
    size = budget - sum(len(tokens) for i, tokens in enumerate(parts) if i != windowed)
    if size < 2:
        return []  # windows refuses it, as predict does
    rows = []
    for start in half_overlap_starts(len(parts[windowed]), size):
        ids, types, texts, offsets, words = [tokenizer.cls_token_id], [0], [None], [None], [None]
        for source, tokens in enumerate(parts):
            for token, span, word in tokens[start:start + size] if source == windowed else tokens:
                ids.append(token), types.append(source), texts.append(source), offsets.append(span), words.append(word)
            ids.append(tokenizer.sep_token_id), types.append(source), texts.append(None)
            offsets.append(None), words.append(None)
        rows.append(_row(tokenizer, ids, types, texts, offsets, words))
    # the very inputs predict runs
    assert [(row.input_ids, row.token_type_ids) for row in rows] == windows(tokenizer, TextExample(text, pair),
                                                                             max_length)
    return rows


def entity_target(model, tokenizer, text, pair, target, max_length) -> Target:
    """The entities `predict` finds, found as it finds them (the task's words, windows and decoding: its one way);
    each is scored as the tagger reads it: the logit of each word's tag at the word's first token (the others are
    never read, nor trained). An entity beyond the tokens the row keeps (a text longer than max_length) can't be
    explained, and is not offered."""
    from bertforge.tasks.checkpoint_contents import recorded_settings
    from bertforge.tasks.registry import TASKS
    from bertforge.tasks.token_classification import NerSettings, sentence_from_text

    sentence = sentence_from_text(text, pair)
    row = encode_row(tokenizer, text, pair, max_length=max_length)
    extra = model.config.extra  # the settings the model was fine-tuned with, read as predict reads them
    settings = dataclasses.replace(recorded_settings(NerSettings(), "ner", extra.get("finetuning_task"),
                                                     extra.get(FINETUNE_KEY)), max_length=max_length)
    task = TASKS["ner"]
    [answer] = task.predict(model, task.encode(tokenizer, [sentence], settings, model.config.id2label), [sentence])
    label_ids = {label: i for i, label in model.config.id2label.items()}
    word_of = {}  # token -> the word its characters lie in
    for token, span in enumerate(row.offsets):
        if span is not None and span[1] > span[0]:
            word_of[token] = next((w for w, (start, end) in enumerate(sentence.spans) if start <= span[0] < end), None)
    found, choices = [], []
    for entity in answer["entities"]:
        tokens = [i for i, span in enumerate(row.offsets)
                  if word_of.get(i) is not None and entity["start"] <= span[0] < entity["end"]]
        if not tokens or row.offsets[tokens[-1]][1] < entity["end"]:
            continue  # cut off by max_length
        first_tokens: dict[int, int] = {}  # word -> its first token, the one the tagger reads
        for i in tokens:
            first_tokens.setdefault(word_of[i], i)
        tokens = list(first_tokens.values())
        found.append((tokens, [label_ids[answer["tags"][word_of[i]]] for i in tokens]))
        choices.append(f"{entity['type']}: {entity['text']}")
    asked_tag = word_tag(target, label_ids, choices)
    if asked_tag is not None:  # "TAG: word": one word's logit of any tag, O included (why isn't it an entity?)
        tag, asked = asked_tag
        words = [w for w, word in enumerate(sentence.words) if word == asked]
        if not words:
            raise InputError(f"no word {asked!r} in the text (words: {' '.join(sentence.words[:20])})")
        first = next((i for i in sorted(word_of) if word_of[i] == words[0]), None)
        if first is None:
            raise InputError(f"the word {asked!r} lies beyond the first {max_length} tokens explain reads: give a "
                             "larger max_length")
        choices, found, index = choices + [f"{tag}: {asked}"], found + [([first], [label_ids[tag]])], len(choices)
    elif not found:
        tag = "O" if "O" in label_ids else model.config.id2label[0]
        hint = f"; ask for one word's tag, e.g. --target '{tag}: {sentence.words[0]}'"
        raise InputError(("the model finds no entity in the text, so there is none to explain" if not answer["entities"]
                          else f"the model's entities all lie beyond the first {max_length} tokens explain reads: "
                               "give a larger max_length, or the part of the text they are in") + hint)
    else:
        index = _pick(choices, target, 0, "entity (or a word's tag: 'TAG: word')")
    tokens, labels = found[index]

    def score(embeddings):
        logits = run_with(model, row, embeddings[0]).logits  # (steps, seq, labels)
        return logits[:, tokens, labels].sum(-1)
    return Target(choices[index], choices, [row], score, [_one_position(len(row.input_ids), *tokens)])


def word_tag(target, label_ids: dict[str, int], entities: list[str]) -> tuple[str, str] | None:
    """(tag, word) where `target` is "TAG: word" of one of the model's tags and not an entity offered."""
    if not isinstance(target, str) or target in entities or ": " not in target:
        return None
    tag, word = target.split(": ", 1)
    return (tag, word) if tag in label_ids else None


def answer_target(model, tokenizer, text, pair, target, max_length) -> Target:
    """The answer `predict` gives, found as it finds it (the task's windows over a long context, its n-best
    decoding, SQuAD v2's abstention), explained in the window it came from: the start + end logits of its first
    and last tokens (the [CLS] token's for no answer), or either alone."""
    from bertforge.tasks.checkpoint_contents import recorded_settings
    from bertforge.tasks.question_answering import QASettings, example_from_text, span_features
    from bertforge.tasks.registry import TASKS

    if pair is None:
        raise InputError("question answering explains a question (text) and its context (pair): give the pair")
    encode_row(tokenizer, text, pair, max_length=max_length)  # refuses a question or context of no word piece
    extra = model.config.extra  # the settings the model was fine-tuned with, read as predict reads them
    settings = dataclasses.replace(recorded_settings(QASettings(), "qa", extra.get("finetuning_task"),
                                                     extra.get(FINETUNE_KEY)), max_length=max_length)
    if settings.max_length - 3 - settings.max_query_length <= settings.doc_stride:  # a short model's (no run's)
        quarter = max(1, settings.max_length // 4)
        settings = dataclasses.replace(settings, max_query_length=min(settings.max_query_length, quarter),
                                       doc_stride=min(settings.doc_stride, quarter))
    example = example_from_text(text, pair)
    task = TASKS["qa"]
    [answer] = task.predict(model, task.encode(tokenizer, [example], settings), [example])
    windows = span_features([example], tokenizer, settings.max_length, settings.doc_stride, settings.max_query_length)
    found = []  # (start + end logit, row, start position, end position) of each window that can give the answer
    for window in windows:
        if answer["answer"]:
            starts = [i for i, span in enumerate(window.offsets) if span is not None and span[0] == answer["start"]]
            ends = [i for i, span in enumerate(window.offsets) if span is not None and span[1] == answer["end"]]
            if not (starts and ends):
                continue
            positions = (starts[0], ends[-1])
        else:
            positions = (0, 0)  # no answer: the [CLS] token's start and end scores
        row = _window_row(tokenizer, window, text, pair)
        output = _plain_output(model, row)
        score = output.start_logits[0, positions[0]].item() + output.end_logits[0, positions[1]].item()
        # predict keeps a span's best window, and for no answer the lowest [CLS] score over the windows
        found.append(((score if answer["answer"] else -score), row, *positions))
    _, row, start, end = max(found, key=lambda candidate: candidate[0])
    parts = {"answer": ((start, 0), (end, 1)), "start": ((start, 0),), "end": ((end, 1),)}
    shown = answer["answer"] or "(no answer)"
    choices = [f"{name}: {shown}" for name in parts]
    index = _pick(list(parts), target.split(": ", 1)[0] if isinstance(target, str) else target, 0, "target")
    chosen = list(parts.values())[index]

    def score(embeddings):
        output = run_with(model, row, embeddings[0])
        logits = (output.start_logits, output.end_logits)
        return sum(logits[which][:, position] for position, which in chosen)
    readout = _one_position(len(row.input_ids), *(position for position, _ in chosen))
    return Target(choices[index], choices, [row], score, [readout])


def _window_row(tokenizer, window, question: str, context: str) -> Row:
    """One of the task's windows ([CLS] question [SEP] part of the context [SEP]) as a Row: each token's text,
    characters and word, from the tokenizations the window's ids were cut from."""
    asked = tokenizer(question, truncation=False, return_offsets_mapping=True, return_word_ids=True)
    read = tokenizer(context, truncation=False, return_offsets_mapping=True, return_word_ids=True)
    context_words = {tuple(span): word for span, word in zip(read["offset_mapping"][1:-1], read["word_ids"][1:-1])}
    texts, offsets, words = [], [], []
    for position, span in enumerate(window.offsets):
        if span is not None:  # the context's
            texts.append(1), offsets.append(span), words.append(context_words.get(tuple(span)))
        elif position < len(asked["input_ids"]):  # the question's, as [CLS] question [SEP] ([CLS], [SEP]: no text)
            texts.append(0), offsets.append(asked["offset_mapping"][position])
            words.append(asked["word_ids"][position])
        else:  # the last [SEP]
            texts.append(None), offsets.append(None), words.append(None)
    return _row(tokenizer, window.input_ids, window.token_type_ids, texts, offsets, words)


def masked_token_target(model, tokenizer, text, pair, target, max_length) -> Target:
    row = encode_row(tokenizer, text, pair, max_length=max_length, keep_mask=True)
    if tokenizer.mask_token_id not in row.input_ids:
        if tokenizer.mask_token in tokenizer.tokenize(text) + (tokenizer.tokenize(pair) if pair else []):
            raise InputError(f"the [MASK] is beyond the first {max_length} tokens the model reads: move it nearer "
                             "the start, or give a larger max_length")
        raise InputError("a masked-LM model explains its guess at a [MASK]: put [MASK] in the text")
    position = row.input_ids.index(tokenizer.mask_token_id)
    logits = _plain_output(model, row).logits[0, position].cpu()
    choices = tokenizer.convert_ids_to_tokens(logits.topk(5).indices.tolist())
    if isinstance(target, str) and target not in choices and len(tokenizer.tokenize(target)) == 1:
        target = tokenizer.tokenize(target)[0]  # as the tokenizer reads it: 'Paris' is 'paris' in an uncased one
    if target is not None and str(target) not in choices \
            and tokenizer.convert_tokens_to_ids(str(target)) != tokenizer.unk_token_id:
        choices.append(str(target))  # any token of the vocabulary can be asked about
    index = _pick(choices, target, 0, "token")
    token_id = tokenizer.convert_tokens_to_ids(choices[index])

    def score(embeddings):
        return run_with(model, row, embeddings[0]).logits[:, position, token_id]
    return Target(choices[index], choices, [row], score, [_one_position(len(row.input_ids), position)])


def similarity_target(model, tokenizer, text, pair, target, max_length) -> Target:
    if pair is None:
        raise InputError("an encoder explains the similarity of two texts: give the second as the pair")
    _pick(["similarity"], target, 0, "target")
    rows = [encode_row(tokenizer, text, None, 0, max_length), encode_row(tokenizer, pair, None, 1, max_length)]
    # pooled as the model's sentence-transformers layout pools (mean without one), its Dense layers after; the
    # texts as given (no prompt: include_prompt false leaves out a prompt's tokens, and there are none)
    layout = sentence_embedding(model)
    masks = [torch.ones(1, len(row.input_ids)) for row in rows]

    def score(embeddings):
        pooled = [after_pooling(model, pool(run_with(model, row, values).last_hidden_state,
                                            mask.expand(len(values), -1).to(values.device), layout.pooling), False)
                  for row, values, mask in zip(rows, embeddings, masks)]
        return F.cosine_similarity(pooled[0], pooled[1], dim=-1)
    # what attention rollout follows back: the one token cls and lasttoken pooling read, else every token alike
    readouts = [F.one_hot(torch.tensor(0 if layout.pooling == "cls" else len(row.input_ids) - 1),
                          len(row.input_ids)).float() if layout.pooling in ("cls", "lasttoken")
                else torch.full((len(row.input_ids),), 1 / len(row.input_ids)) for row in rows]
    return Target("similarity", ["similarity"], rows, score, readouts, rows_one_at_a_time=True)


def explained_length(model, tokenizer) -> int:
    """The tokens `explain` reads of a text by default: as `predict` reads it (the fine-tuned length), and for a bare
    encoder as its sentence vectors read it (the sentence-transformers layout's max_seq_length, where it has one)."""
    length = readable_length(model, tokenizer)
    layout_length = sentence_embedding(model).max_length if target_builder(model) is similarity_target else None
    return min(length, layout_length) if layout_length else length


# Most specific first: every task model holds a BertModel, but is not one.
TARGET_BUILDERS: dict[type, Callable[..., Target]] = {
    BertForSequenceClassification: sequence_target,
    BertForTokenClassification: entity_target,
    BertForQuestionAnswering: answer_target,
    BertForMaskedLM: masked_token_target,
    BertModel: similarity_target,
}


def target_builder(model) -> Callable[..., Target]:
    for model_class, builder in TARGET_BUILDERS.items():
        if isinstance(model, model_class):
            return builder
    raise InputError(f"can't explain a {type(model).__name__}; explainable: "
                     f"{', '.join(cls.__name__ for cls in TARGET_BUILDERS)}")


def build_target(model, tokenizer, text: str, text_pair: str | None = None, target: str | int | None = None,
                 max_length: int = DEFAULT_MAX_LENGTH) -> Target:
    return target_builder(model)(model, tokenizer, text, text_pair, target, max_length)


def integration_paths(model, text_pair: str | None) -> int:
    """How many paths integrated gradients runs, known before the model runs: an encoder's similarity integrates
    each text against the other (its target's rows_one_at_a_time), every other target one path."""
    return 2 if target_builder(model) is similarity_target and text_pair is not None else 1


def load_explainable(name_or_path: str | Path) -> tuple[torch.nn.Module, BertTokenizer]:
    """The model of a directory (or 'default') as the class its config.json's "architectures" names, when that is
    one TARGET_BUILDERS explains (else the bare encoder), in eval mode, and its tokenizer."""
    directory = resolve_model_dir(name_or_path)
    path = config_path(directory)
    names = architectures_of(read_json_object(path, "model config"), path)
    by_name = {model_class.__name__: model_class for model_class in TARGET_BUILDERS}
    model_class = next((by_name[name] for name in names if name in by_name), BertModel)
    return model_class.from_pretrained(directory).eval(), BertTokenizer.from_pretrained(directory)
