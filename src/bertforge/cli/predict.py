"""`bertforge predict`: a fine-tuned model's answers for a file or one input: labels with probabilities (or
scores), entities (ner), or answer spans (qa)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.cli.arguments import (
    STANDARD_INPUT_NAME,
    STANDARD_STREAM,
    check_writable,
    inference_options,
    input_file,
    path_text,
    report,
    write_output,
)
from bertforge.cli.finetune import add_trained_model_arguments
from bertforge.errors import ConfigError, InputError
from bertforge.outputs import to_json

JSON_SUFFIXES = (".jsonl", ".json")  # JSON lines, an object a line; or one array of them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", type=path_text, required=True, help="fine-tuned model directory")
    parser.add_argument("--input", "-i", type=path_text,
                        help="data file (.csv, .tsv, .jsonl, or .txt with one text per line; ner: CoNLL or .txt; qa: "
                             "SQuAD .json or .jsonl of question, context); - for standard input (one text per line "
                             "unless --format says)")
    parser.add_argument("--output", "-o", type=path_text,
                        help="FILE.jsonl: one JSON object per input (required with --input; with --text, instead of "
                             "the printed answer); - for standard output")
    parser.add_argument("--text", help="or one text, predicted and printed")
    parser.add_argument("--text-pair", help="the second text of a pair, with --text")
    parser.add_argument("--question", help="qa: one question, with --context")
    parser.add_argument("--context", help="qa: the passage that holds the answer, with --question")
    add_trained_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint
    from bertforge.tasks.finetuned_model import predict
    from bertforge.tasks.tables import data_format

    if (args.question is None) != (args.context is None):
        raise InputError("--question and --context go together")
    if args.question is not None and (args.text is not None or args.text_pair is not None):
        raise InputError("give --question with --context, or --text, not both")
    if args.text_pair is not None and args.text is None and args.question is None:
        raise InputError("--text-pair goes with --text (a file's pairs are its --text-pair-column)")
    text, text_pair = (args.question, args.context) if args.question is not None else (args.text, args.text_pair)
    for flag, value in (("--text", args.text), ("--text-pair", args.text_pair), ("--question", args.question),
                        ("--context", args.context)):
        if value is not None and not value.strip():  # an unset shell variable: nothing to predict on
            raise InputError(f"{flag} is empty")
    if (args.input is None) == (text is None):
        raise InputError("give either --input FILE (with --output FILE.jsonl), --text, or --question and --context")
    if args.input is not None and args.output is None:
        raise InputError("--input needs --output FILE.jsonl")
    if args.output is not None:
        check_writable(args.output, args.input, args.model)
        if str(args.output) != STANDARD_STREAM and Path(args.output).suffix.lower() not in JSON_SUFFIXES:
            raise InputError("the predictions are JSON lines (an object per input): name the output .jsonl (or "
                             ".json for one JSON array), or - for standard output", args.output)
    if args.question is not None:
        # any other model would read the question and passage as a text pair and answer with a label or a score
        task = inspect_checkpoint(args.model).task_for()
        if task.name != "qa":
            raise ConfigError(f"wrong task: {args.model} does {task.name}, which takes --text (and --text-pair); "
                              "--question and --context are for a question-answering (qa) model")
    if text is not None:
        check_pairing(args.model, text_pair is not None)
        pairs = [text_pair] if text_pair is not None else None
        answers = predict(args.model, texts=[text], text_pairs=pairs, max_length=args.max_length,
                          inference=inference_options(args), decoding=args.decoding,
                          version_2=args.version_2)
        if args.output is None:
            print(format_answer(answers[0]))
            return 0
    else:
        with input_file(args.input, args.format) as path:
            if data_format(path, args.format) == "txt":  # one text a line, the pair model's columns nowhere
                named = STANDARD_INPUT_NAME if str(args.input) == STANDARD_STREAM else args.input
                check_pairing(args.model, False, given=f"{named}, plain text (one text a line),")
            answers = predict(args.model, path, text_column=args.text_column, text_pair_column=args.text_pair_column,
                              batch_size=args.batch_size, max_length=args.max_length,
                              inference=inference_options(args), decoding=args.decoding, format=args.format,
                              version_2=args.version_2)
    if Path(args.output).suffix.lower() == ".json":  # one JSON document, as json.load and SQuAD's scripts read one
        write_output(args.output, to_json(answers, ensure_ascii=False, indent=1) + "\n")
    else:
        write_output(args.output, "".join(to_json(answer, ensure_ascii=False) + "\n" for answer in answers))
    report(args.output, f"wrote {len(answers)} predictions to {args.output}")
    return 0


def check_pairing(model: str, paired: bool, given: str | None = None) -> None:
    """A text pair for a model fine-tuned on single texts, or a text alone for one fine-tuned on pairs, would be
    read as no training example was, and answered with confidence: refused, where the training run is known.
    `given`: what gave the single texts, where not --text (a plain-text file). A reranker always reads a query and a
    document."""
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint

    checkpoint = inspect_checkpoint(model)
    run = checkpoint.run
    if checkpoint.trained_on_pairs is None or checkpoint.trained_on_pairs == paired:
        return
    if paired:
        raise InputError(f"--text-pair: {model} was fine-tuned on single texts (column {run.text_column!r}); give "
                         "--text alone")
    if checkpoint.task == "rerank":
        trained = f"{model} is a reranker, which scores a query and a document"
    else:
        trained = f"{model} was fine-tuned on text pairs (columns {run.text_column!r} and {run.text_pair_column!r})"
    if given is None:
        raise InputError(f"{trained}: give --text-pair too")
    raise InputError(f"{given} holds single texts, and {trained}: give a .tsv, .csv or .jsonl file with both "
                     "columns (a tab-separated .txt file reads with --format tsv)")


def format_answer(answer: dict) -> str:
    """'positive (0.97)  negative 0.03' for a label, 'sports (0.91)  politics (0.62)' for labels over the
    threshold (multi_label), 'score 3.214' for regression, one 'PER  John Smith  0:10
    (0.98)' line per entity (ner; '(no entities)' when none), 'Denver Broncos (score 12.3)' for qa."""
    if "entities" in answer:
        lines = [f"{e['type']}  {e['text']}  {e['start']}:{e['end']}  ({e['score']:.3f})" for e in answer["entities"]]
        return "\n".join(lines) or "(no entities)"
    if "answer" in answer:
        score = "-" if answer["score"] is None else f"{answer['score']:.3f}"
        return f"{answer['answer'] or '(no answer)'}  (score {score})"
    if "score" in answer:
        return f"score {answer['score']:.3f}"
    if "labels" in answer:  # multi_label: every label over the threshold
        return "  ".join(f"{label} ({p:.3f})" for label, p in answer["labels"].items()) or "(no labels)"
    others = "  ".join(f"{label} {p:.3f}" for label, p in answer["probabilities"].items() if label != answer["label"])
    return f"{answer['label']} ({answer['probabilities'][answer['label']]:.3f})  {others}".rstrip()
