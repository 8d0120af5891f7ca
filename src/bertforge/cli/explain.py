"""`bertforge explain`: why a model predicted what it did, as attributions to the words of the text (JSON, or an
HTML page with the attention views)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.atomic import write_text_atomic
from bertforge.cli.arguments import (
    STANDARD_STREAM,
    check_writable,
    number_range,
    path_text,
    positive_int,
    report,
    texts_or_standard_input,
    write_output,
)
from bertforge.errors import InputError

OUTPUT_FORMATS = (".html", ".json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertforge.explain.methods import DEFAULT_STEPS, EXACT_SHAPLEY_TOKENS, MAX_STEPS, METHODS
    from bertforge.explain.targets import BASELINES
    from bertforge.inference.attention_view import DEFAULT_MAX_TOKENS
    parser.add_argument("--model", "-m", type=path_text, default="default",
                        help="model directory (a fine-tuned classifier, tagger, QA or masked-LM model, or an "
                             "encoder, whose explained output is the similarity of --text and --pair) or 'default'")
    parser.add_argument("--text", required=True, help="the text (for qa: the question); '-' reads it from standard "
                                                      "input (so can --pair)")
    parser.add_argument("--pair", help="the second text (for qa: the context; for an encoder: the text compared)")
    parser.add_argument("--target", help="what to explain: a label, an entity, answer/start/end, a token at [MASK] "
                                         "(default: the prediction)")
    parser.add_argument("--method", choices=list(METHODS), default="integrated_gradients",
                        help="attribution method")
    parser.add_argument("--baseline", choices=list(BASELINES), default="pad",
                        help="the token a word becomes where the method takes it away (integrated gradients' "
                             "start, occlusion, shapley, lime, the faithfulness report)")
    parser.add_argument("--steps", type=number_range("steps", int, 1, MAX_STEPS), default=DEFAULT_STEPS,
                        help=f"integrated gradients' interpolation steps, the orders shapley samples beyond "
                             f"{EXACT_SHAPLEY_TOKENS} tokens, or the samples of lime and smoothgrad (default "
                             f"{DEFAULT_STEPS})")
    parser.add_argument("--max-length", type=positive_int,
                        help="truncate to this many tokens (default: as `predict` reads: the max_length the model "
                             "was fine-tuned with)")
    parser.add_argument("--attention-max-length", type=positive_int, default=DEFAULT_MAX_TOKENS,
                        help="on the page: tokens its attention views read at most (they grow with the square of "
                             "this; the attributions cover every token explained)")
    parser.add_argument("--output", "-o", type=path_text,
                        help="view.html (the page), explanation.json, or '-' (the JSON on standard output); default: "
                             "print the words")


def run(args: argparse.Namespace) -> int:
    from bertforge.explain import explain
    from bertforge.explain.page import explanation_page
    from bertforge.explain.result import faithfulness_line
    from bertforge.explain.targets import load_explainable
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint

    output = Path(args.output) if args.output else None
    as_json = output is not None and (args.output == STANDARD_STREAM or output.suffix.lower() == ".json")
    if output is not None:
        if not as_json and output.suffix.lower() not in OUTPUT_FORMATS:
            raise InputError(f"the output must be a {' or '.join(OUTPUT_FORMATS)} file, or '-' (JSON on standard "
                             "output)", output)
        check_writable(output, args.model)
    args.text, args.pair = texts_or_standard_input(args.text, args.pair)
    model, tokenizer = load_explainable(args.model)
    # What `predict` reads of the text: the fine-tuned task's max_length (else explain's own default).
    checkpoint = inspect_checkpoint(args.model)
    trained = checkpoint.settings().max_length if checkpoint.task is not None else None
    max_length = args.max_length or trained
    explanation = explain(model, tokenizer, args.text, args.pair, args.target, args.method, args.steps, max_length,
                          args.baseline)
    if output is None:
        print(f"{explanation.target} ({explanation.method})" + (f": {explanation.note}" if explanation.note else ""))
        for word in explanation.words:
            print(f"{word.attribution:+.4f}  {word.word}")
        if explanation.faithfulness is not None:
            print(faithfulness_line(explanation.faithfulness))
    elif as_json:
        write_output(args.output, explanation.to_json() + "\n")
        report(args.output, f"wrote the attributions of {len(explanation.words)} words to {output}")
    else:
        write_text_atomic(output, explanation_page(model, tokenizer, explanation, max_length,
                                                   args.attention_max_length))
        print(f"wrote the explanation of {explanation.target!r} to {output}")
    return 0
