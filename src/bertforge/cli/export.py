"""`bertforge export onnx|hf`: an ONNX graph checked against PyTorch, or the ecosystem's checkpoint directory.

    bertforge export onnx --model DIR --output model.onnx [--task question-answering|multiple-choice|...]
    bertforge export hf --model DIR --output DIR [--onnx]
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Collection
from pathlib import Path

from bertforge.cli.arguments import add_model_argument, check_writable, path_text, positive_int
from bertforge.errors import CheckpointError, InputError
from bertforge.inference.onnx import ONNX_TASKS, export_onnx, model_class_of
from bertforge.inference.onnx_backend import ONNX_FILE
from bertforge.outputs import check_output_dir, finish_staging, release_staging, start_staging
from bertforge.tasks.registry import OTHER_MODELS


def load_for_task(args: argparse.Namespace, keep_heads: Collection[str] = ()):
    """The model of --model, with the head it holds (or the one --task names), and its tokenizer. A task head
    the checkpoint never trained is refused; its encoder alone (feature-extraction) always exports. A model whose
    head no task runs (config.json's architectures: one of the registry's OTHER_MODELS, such as BertForPreTraining
    or BertForMultipleChoice) keeps its heads if it is among `keep_heads` (what the format can hold), unless --task
    names another model."""
    from bertforge import BertTokenizer
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint
    from bertforge.tasks.registry import HEADS

    checkpoint = inspect_checkpoint(args.model)
    if args.task is None and checkpoint.head == "encoder":
        for name in checkpoint.architectures:
            if name in keep_heads:
                model = OTHER_MODELS[name].from_pretrained(checkpoint.directory, require_heads=True)
                return model, BertTokenizer.from_pretrained(checkpoint.directory)
    model_class = checkpoint.model_class if args.task is None else model_class_of(args.task)
    trained = model_class.__name__ in OTHER_MODELS and model_class.__name__ in checkpoint.architectures
    if model_class not in (checkpoint.model_class, HEADS["encoder"].model_class) and not trained:
        raise CheckpointError(f"{checkpoint.directory}: --task {args.task} needs a trained "
                              f"{model_class.__name__} head; the model holds a "
                              f"{next(iter(checkpoint.architectures), checkpoint.model_class.__name__)}")
    model = model_class.from_pretrained(checkpoint.directory, **({"require_heads": True} if trained else {}))
    return model, BertTokenizer.from_pretrained(checkpoint.directory)


def add_onnx_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--opset", type=positive_int, default=None, help="ONNX opset (default: the exporter's)")


def run_onnx(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if output.suffix != ".onnx":
        raise InputError("the output must be a .onnx file", output)
    check_writable(output, args.model, getattr(args, "adapter", None))
    # the models outside the task registry that an ONNX task exports (BertForMultipleChoice)
    model, tokenizer = load_for_task(args, {spec.other_model for spec in ONNX_TASKS.values() if spec.other_model})
    report = export_onnx(model, tokenizer, output, task=args.task, opset=args.opset)
    shapes = ", ".join("x".join(map(str, shape)) for shape in report.checked_shapes)
    print(f"max difference from PyTorch: {report.max_difference:.2e} at real tokens "
          f"(batches {shapes}; tolerance {report.tolerance:.0e})")
    print(f"wrote {report.task} graph (opset {report.opset}, outputs {', '.join(report.output_names)}) to {output}")
    return 0


def add_hf_arguments(parser: argparse.ArgumentParser) -> None:
    """Beyond --model, --output and --task: whether to replace a model, and an adapter to merge in."""
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model already in --output (otherwise that is an error)")
    parser.add_argument("--adapter", type=path_text, metavar="DIR", default=None,
                        help="a LoRA adapter trained on --model (PEFT's adapter_config.json and "
                             "adapter_model.safetensors), merged into the weights written (default: none)")
    parser.add_argument("--onnx", action="store_true",
                        help=f"also write the model's ONNX graph, checked against PyTorch in ONNX Runtime, as "
                             f"{ONNX_FILE}, where sentence-transformers' ONNX backend and Transformers.js read "
                             f"it: one folder for transformers and for ONNX runtimes")


def run_hf(args: argparse.Namespace) -> int:
    output = check_output_dir(args.output, args.overwrite, inputs=(args.adapter,), models=(args.model,))
    if args.adapter is not None:
        from bertforge import BertTokenizer
        from bertforge.checkpoint.adapters import load_adapted
        from bertforge.tasks.registry import HEADS

        head = next((name for name, row in HEADS.items() if row.onnx_task == args.task), None)
        model = load_adapted(args.model, args.adapter, head)
        tokenizer = BertTokenizer.from_pretrained(args.model)
    else:
        model, tokenizer = load_for_task(args, keep_heads=OTHER_MODELS)
    quantization = getattr(model, "quantization", None)
    if quantization is not None and quantization.precision == "int8":
        raise InputError("is quantized to int8, whose layers (int8 weights with their scales and outlier "
                         "channels) transformers can't run and would read as float weights; export the fp32 model "
                         "it was quantized from, or `export onnx` (int8 as ONNX Runtime runs it)", args.model)
    if quantization is not None and args.onnx:
        raise InputError(f"is quantized to {quantization.precision}; --onnx writes an fp32 model's graph: give the "
                         f"model it was quantized from", args.model)
    if quantization is not None:  # bf16: an ordinary checkpoint of bf16 weights, as transformers loads one
        import torch

        del model.quantization
        model.to(torch.bfloat16)
    staging = start_staging(output)  # a failed export leaves the model in --output as it was
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        report = export_onnx(model, tokenizer, staging / ONNX_FILE, task=args.task) if args.onnx else None
    except BaseException as error:  # half an export is of no use (only a training run resumes): nothing is written
        shutil.rmtree(staging, ignore_errors=True)
        release_staging(output)
        if isinstance(error, OSError):  # a full disk
            raise InputError(f"can't write the model: {error.strerror or error}", output) from None
        raise  # the ONNX graph failed its check, or the export was interrupted
    written = sorted(str(path.relative_to(staging)) for path in staging.rglob("*") if path.is_file())
    finish_staging(output)
    print(f"wrote {', '.join(written)} to {output}")
    if report is not None:
        print(f"{ONNX_FILE}: max difference from PyTorch {report.max_difference:.2e} at real tokens "
              f"(tolerance {report.tolerance:.0e})")
    return 0


# name -> (extra arguments, run, help)
FORMATS = {
    "onnx": (add_onnx_arguments, run_onnx, "an ONNX graph with dynamic batch and sequence axes, checked with "
                                           "ONNX Runtime against PyTorch"),
    "hf": (add_hf_arguments, run_hf, "the ecosystem's checkpoint directory (config.json, model.safetensors, "
                                     "vocab.txt, tokenizer_config.json), loadable by transformers"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")
    for name, (add_format_arguments, _, help_text) in FORMATS.items():
        subparser = formats.add_parser(name, help=help_text, description=help_text)
        add_model_argument(subparser)
        subparser.add_argument("--output", "-o", type=path_text, required=True,
                               help="FILE.onnx" if name == "onnx" else "model directory to write")
        subparser.add_argument("--task", choices=list(ONNX_TASKS), default=None,
                               help="which model to export: the encoder alone (feature-extraction) or a task "
                                    "model (default: the one the checkpoint holds, its fine-tuned head included)")
        add_format_arguments(subparser)


def run(args: argparse.Namespace) -> int:
    _, run_format, _ = FORMATS[args.format]
    return run_format(args)
