"""Smaller models on real tasks, in one run: each fine-tuned model at fp32, bertforge int8 (`bertforge quantize`:
static activations, outlier channels folded into the weights of the layers before GELU and in float32 elsewhere;
a row for each more careful recipe `bertforge quantize` falls back to, and one with dynamic activations alone),
torch's per-tensor dynamic int8
(what `--precision int8` was before it became bertforge's), bf16 (where native), and ONNX Runtime's own dynamic
int8 quantization of the same model (per tensor, its default, and per channel), each with the task's metric on its
dev file and the end-to-end predict time (tokenizing, predicting and decoding the whole dev file, as `bertforge
predict` does; scoring is not timed; median of --repeats after a warm-up, the variants taking turns pass by pass).
A line per model says which int8 recipe `bertforge quantize` (--max-drop 0.5, its fallback on) would write, from
these rows. The last lines compare int8 with ONNX Runtime's int8 pass by pass, and the models alone batch by batch:
the two are close, and the machine's own drift from minute to minute can be larger than the gap between their
medians; within a batch it mostly cancels.

    python bench/bench_compress.py [--runs sst2,mrpc,stsb,conll2003] [--runs-dir runs] [--threads 2]
    python bench/bench_compress.py --model DIR --dev FILE [--model DIR --dev FILE ...]
    python bench/bench_compress.py --quick   # fine-tunes a small SST-2 model itself (a few minutes)
    python bench/bench_compress.py ... --batch-sizes 1,8,16,32,128,256   # also int8 against ORT at other sizes
    python bench/bench_compress.py ... --float-layers 1,2,8   # also int8 keeping that many layers in float32

The models of --runs are the ones `bench/finetune_tasks.py` leaves in RUNS_DIR/RUN/bertforge. int8 calibrates on
the first 256 examples of the dev file, as `bertforge quantize` does by default.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from finetune_tasks import DATA, RUNS, data_files  # bench/ is the script's folder, so on sys.path
from torch import nn

from bertforge.compress import QuantizationConfig, int8_linear, quantize
from bertforge.compress.gate import DEFAULT_MAX_DROP, GateReport, measure
from bertforge.compress.quantize import fallback_recipes, recipe_name
from bertforge.heads import ClassifierOutput, every_position
from bertforge.inference import replay
from bertforge.inference.onnx import INPUT_NAMES, export_onnx, onnx_session
from bertforge.runtime import bf16_supported, tune_cpu_allocator
from bertforge.tasks.data import inference_batches
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.tasks.finetuned_model import FinetunedModel
from bertforge.training.trainer import TrainConfig


class OnnxRuntimeModel(nn.Module):
    """An ONNX Runtime session behind the interface the task's predict functions call: model(**batch).logits."""

    def __init__(self, path: Path, config, threads: int):
        super().__init__()
        self.session, self.config = onnx_session(path, threads), config
        self.anchor = nn.Parameter(torch.zeros(0), requires_grad=False)  # where callers look for the device

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> ClassifierOutput:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        inputs = {name: (inputs[name] if inputs[name] is not None else torch.zeros_like(input_ids)).numpy()
                  for name in INPUT_NAMES}
        (logits,) = self.session.run(["logits"], inputs)
        return ClassifierOutput(logits=torch.from_numpy(logits))




class Patched(nn.Module):
    """An int8 model run with some of bertforge's module-level settings changed, in the same run as the model with
    its own: what each setting gains."""

    def __init__(self, model: nn.Module, settings: dict[tuple[Any, str], Any]):
        super().__init__()
        self.model, self.settings = model, settings  # (module, name) -> value

    def forward(self, **batch):
        before = {key: getattr(*key) for key in self.settings}
        for (module, name), value in self.settings.items():
            setattr(module, name, value)
        try:
            return self.model(**batch)
        finally:
            for (module, name), value in before.items():
                setattr(module, name, value)


def eager(model: nn.Module) -> Patched:
    """No batch replayed from a recorded graph (inference/replay.py): every forward eager."""
    return Patched(model, {(replay, "REPLAY_MAX_WORK"): 0})


def onednn_only(model: nn.Module) -> Patched:
    """Eager, and every static product on oneDNN's kernel, none of few rows on fbgemm's (which a CPU without VNNI
    otherwise takes below int8_linear.SMALL_PRODUCT_ROWS rows)."""
    return Patched(model, {(replay, "REPLAY_MAX_WORK"): 0, (int8_linear, "SMALL_PRODUCT_ROWS"): 0})


def onnx_int8(finetuned: FinetunedModel, folder: Path, threads: int, per_channel: bool = False,
              every_token: bool = False) -> FinetunedModel:
    """bertforge's ONNX export of the model, quantized by ONNX Runtime's quantize_dynamic (its defaults: int8
    weights per tensor, activations quantized per call; `per_channel`: a scale per output channel). `every_token`:
    a sequence classifier exported with its last layer computing every token, as other exporters write it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32_path = folder / "model.onnx"
    int8_path = folder / f"model.int8{'.per-channel' * per_channel}{'.every-token' * every_token}.onnx"
    with every_position(finetuned.model) if every_token else nullcontext():
        export_onnx(finetuned.model, finetuned.tokenizer, fp32_path)
    quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=per_channel)
    model = OnnxRuntimeModel(int8_path, finetuned.model.config, threads)
    return FinetunedModel(model, finetuned.tokenizer, finetuned.task, finetuned.run)


def onnx_qdq(finetuned: FinetunedModel, folder: Path, threads: int) -> FinetunedModel:
    """bertforge's int8 model (the int8 row's) exported as QDQ by `export_onnx` and run by ONNX Runtime."""
    path = folder / "model.qdq.onnx"
    export_onnx(finetuned.model, finetuned.tokenizer, path)
    model = OnnxRuntimeModel(path, finetuned.model.config, threads)
    return FinetunedModel(model, finetuned.tokenizer, finetuned.task, finetuned.run)


def calibration_batches(finetuned: FinetunedModel, examples, count: int = 256, batch_size: int = 64):
    features = finetuned.task.encode(finetuned.tokenizer, examples[:count], finetuned.settings,
                                     finetuned.id2label)
    return [batch for _, batch in inference_batches(features, batch_size, finetuned.tokenizer.pad_token_id)]


def torch_per_tensor_int8(finetuned: FinetunedModel) -> FinetunedModel:
    """torch's dynamic int8 of every linear layer (one scale per tensor), what `--precision int8` was before it
    became bertforge's per-channel quantizer: the baseline the per-channel one is measured against."""
    from bertforge.fast_cpu import make_plain

    make_plain(finetuned.model)  # quantize_dynamic matches nn.Linear exactly, not the loader's prepacked subclass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its move to torchao
        torch.ao.quantization.quantize_dynamic(finetuned.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return finetuned


# `bertforge quantize`'s recipes by default, in the order its fallback tries them
GATE_RECIPES = fallback_recipes(QuantizationConfig("int8"))


def gate_choice(passes: dict[str, list], metric: str) -> str | None:
    """The first of GATE_RECIPES that quantize's gate (at its default --max-drop) accepts beside fp32 on the dev set
    (what `bertforge quantize` would write from these measurements), or None."""
    for name in map(recipe_name, GATE_RECIPES):
        if name in passes and GateReport(metric, passes["fp32"][-1], passes[name][-1], DEFAULT_MAX_DROP).accepted:
            return name
    return None


def variants(model_dir: Path, examples, threads: int, folder: Path, float_layers: tuple[int, ...] = ()):
    """name -> a function making that variant of the model (loaded fresh each time); `float_layers`: also int8
    with outliers in float32 and that many layers in float32, for each count."""
    def ours(precision, config=None, **settings):
        def make():
            finetuned = FinetunedModel.load(model_dir)
            batches = calibration_batches(finetuned, examples) if precision == "int8" else None
            quantize(finetuned.model, config or QuantizationConfig(precision, **settings), batches)
            return finetuned
        return make

    table = {"fp32": lambda: FinetunedModel.load(model_dir)}
    table |= {recipe_name(recipe): ours("int8", recipe) for recipe in GATE_RECIPES}
    for count in float_layers:
        recipe = QuantizationConfig("int8", outlier_folding="none", float_layers=count)
        table.setdefault(recipe_name(recipe), ours("int8", recipe))
    table |= {
        "int8 dynamic": ours("int8", activations="dynamic"),
        "int8 torch per-tensor": lambda: torch_per_tensor_int8(FinetunedModel.load(model_dir)),
    }
    if bf16_supported("cpu"):
        table["bf16"] = ours("bf16")
    table["ORT int8"] = lambda: onnx_int8(FinetunedModel.load(model_dir), folder, threads)
    table["ORT int8 per-channel"] = lambda: onnx_int8(FinetunedModel.load(model_dir), folder, threads, True)
    if hasattr(FinetunedModel.load(model_dir).model, "first_token_only"):
        table["ORT int8 every token"] = lambda: onnx_int8(FinetunedModel.load(model_dir), folder, threads,
                                                          every_token=True)
    table["ORT our int8 QDQ"] = lambda: onnx_qdq(ours("int8")(), folder, threads)
    return table


def time_predictions(models: dict[str, FinetunedModel], examples, repeats: int, batch_size: int = 64):
    """name -> the gate's own measurement (a warm-up, then predicting timed and scoring not) of each pass. The
    variants take turns pass by pass, so that a slow spell of a shared machine falls on all of them rather than on
    one, and each pass starts one variant further along, so that none always follows the same one."""
    names = list(models)
    passes = {name: [] for name in names}
    for repeat in range(repeats):
        for name in taking_turns(names, repeat):
            passes[name].append(measure(name, models[name], examples, batch_size))
    return passes


def taking_turns(names: list[str], turn: int) -> list[str]:
    """`names` in the order of the `turn`-th round: each round starts one further along."""
    shift = turn % len(names)
    return names[shift:] + names[:shift]


def model_seconds(models: dict[str, FinetunedModel], examples, passes: int, batch_size: int = 64) -> dict[str, float]:
    """name -> seconds in the model alone over the dev set's batches (no tokenizing or decoding), the models taking
    turns batch by batch (each batch starting one model further along): the drift that reaches a pass-level
    comparison (a few seconds a pass) mostly cancels within a batch's tenths of a second."""
    first = next(iter(models.values()))
    features = first.task.encode(first.tokenizer, examples, first.settings, first.id2label)
    batches = [batch for _, batch in inference_batches(features, batch_size, first.tokenizer.pad_token_id)]
    names, seconds = list(models), dict.fromkeys(models, 0.0)
    with torch.inference_mode():
        for batch in batches[:1]:  # warm-up
            for name in names:
                models[name].model(**batch)
        for turn in range(passes * len(batches)):
            for name in taking_turns(names, turn):
                start = time.perf_counter()
                models[name].model(**batches[turn % len(batches)])
                seconds[name] += time.perf_counter() - start
    return {name: total / passes for name, total in seconds.items()}


def paired_ratios(passes: dict[str, list], variant: str, other: str) -> list[float]:
    """`other`'s time over `variant`'s in each pass: a pass measures both within seconds of each other, so the
    ratios are free of the machine's slower and faster spells that medians taken apart still carry."""
    return [theirs.seconds / ours.seconds for ours, theirs in zip(passes[variant], passes[other])]


def quick_model(folder: Path, sentences: int) -> tuple[Path, Path]:
    """MiniLM fine-tuned on the first `sentences` SST-2 training sentences, one epoch; and the SST-2 dev file."""
    output = folder / "sst2-quick"
    finetune(FinetuneConfig(train=str(DATA / "sst2" / "train.tsv"), output=str(output), max_train_examples=sentences,
                            training=TrainConfig(epochs=1, lr=1e-4, warmup_ratio=0.1, progress=False)))
    return output, DATA / "sst2" / "dev.tsv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="sst2,mrpc,stsb,conll2003", help="rows of finetune_tasks.RUNS")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--model", action="append", default=[], help="fine-tuned model directory (with --dev)")
    parser.add_argument("--dev", action="append", default=[], help="its labelled dev file")
    parser.add_argument("--quick", action="store_true", help="fine-tune a small SST-2 model and measure only it")
    parser.add_argument("--quick-sentences", type=int, default=2000)
    parser.add_argument("--dev-examples", type=int, default=None, help="score only the first N dev examples")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--float-layers", default="",
                        help="also int8 with outliers in float32 and this many layers in float32, e.g. 1,2,8")
    parser.add_argument("--batch-sizes", default="",
                        help="also time the int8 models alone at these batch sizes, e.g. 1,8,16,32,128,256 (batches "
                             "of one take the first 200 examples)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    warnings.simplefilter("ignore")
    if args.model and len(args.model) != len(args.dev):
        parser.error("give one --dev per --model")
    with tempfile.TemporaryDirectory(prefix="bench_compress.") as scratch:  # the models and ONNX files it writes
        compare(args, Path(scratch))


def compare(args: argparse.Namespace, folder: Path) -> None:
    if args.quick:
        models = [(("sst2-quick",) + quick_model(folder, args.quick_sentences))]
    elif args.model:
        models = [(Path(model).name, Path(model), Path(dev)) for model, dev in zip(args.model, args.dev)]
    else:
        models = []
        for name in args.runs.split(","):
            run, run_folder = RUNS[name], Path(args.runs_dir) / name
            if not (run_folder / "bertforge" / "model.safetensors").is_file():
                print(f"{name}: no fine-tuned model in {run_folder / 'bertforge'} "
                      f"(run `python bench/finetune_tasks.py {name}` first)")
                continue
            dev = DATA / run.test if run.test else Path(data_files(run, run_folder)["dev"])  # CoNLL: the test file
            models.append((name, run_folder / "bertforge", dev))

    float_layers = tuple(int(count) for count in args.float_layers.split(",") if count)
    print(f"{'model':<12}{'variant':<48}{'metric':<10}{'value':>8}{'points':>8}{'predict s':>11}{'speed-up':>10}")
    for name, model_dir, dev in models:
        reference = FinetunedModel.load(model_dir)
        examples = reference.read(dev, reference.columns(), labelled=True)[:args.dev_examples]
        metric = reference.task.main_metric
        made = {}
        for variant, make in variants(model_dir, examples, args.threads, folder, float_layers).items():
            try:
                made[variant] = make()
            except Exception as error:  # a reference that fails on this machine's versions: the rest still run
                print(f"{name:<12}{variant:<48}not measured: {type(error).__name__}: "
                      f"{str(error).splitlines()[0][:160] if str(error) else ''}", flush=True)
        passes = time_predictions(made, examples, args.repeats)
        baseline = passes["fp32"][-1].metrics[metric]
        baseline_seconds = statistics.median(run.seconds for run in passes["fp32"])
        for variant, runs in passes.items():
            value, seconds = runs[-1].metrics[metric], statistics.median(run.seconds for run in runs)
            print(f"{name:<12}{variant:<48}{metric:<10}{value:>8.4f}{100 * (value - baseline):>+8.2f}"
                  f"{seconds:>11.2f}{baseline_seconds / seconds:>9.2f}x", flush=True)
        chosen = gate_choice(passes, metric)
        if chosen is None:
            print(f"{name:<12}bertforge quantize (--max-drop {DEFAULT_MAX_DROP}) writes nothing: each of its "
                  f"{len(GATE_RECIPES)} int8 recipes loses more", flush=True)
        else:
            value = passes[chosen][-1].metrics[metric]
            seconds = statistics.median(run.seconds for run in passes[chosen])
            print(f"{name:<12}bertforge quantize (--max-drop {DEFAULT_MAX_DROP}) writes {chosen}: "
                  f"{100 * (value - baseline):+.2f} points, {baseline_seconds / seconds:.2f}x fp32", flush=True)
        others = tuple(other for other in ("ORT int8", "ORT int8 per-channel", "ORT int8 every token")
                       if other in made)
        compared = ["int8"] + ([chosen] if chosen not in (None, "int8") else [])
        for mine in compared:
            for other in others:
                ratios = paired_ratios(passes, mine, other)
                print(f"{name:<12}{mine} against {other}, pass by pass: ORT's time / {mine}'s median "
                      f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}), {mine} faster "
                      f"in {sum(ratio > 1 for ratio in ratios)} of {len(ratios)} passes", flush=True)
            alone = model_seconds({variant: made[variant] for variant in (mine, *others)}, examples, args.repeats)
            print(f"{name:<12}the models alone, batch by batch: {mine} {alone[mine]:.3f} s; ORT's time / "
                  f"{mine}'s: " + ", ".join(f"{other} {alone[other] / alone[mine]:.3f}" for other in others),
                  flush=True)
        int8 = made["int8"]
        patched = {variant: FinetunedModel(patch(int8.model), int8.tokenizer, int8.task, int8.run)
                   for variant, patch in (("int8 eager", eager), ("int8 oneDNN only", onednn_only))}
        for size in (int(size) for size in args.batch_sizes.split(",") if size):
            some = examples[:200] if size == 1 else examples
            timed = {variant: made[variant] for variant in ("int8", *others)} | patched
            alone = model_seconds(timed, some, args.repeats, size)
            print(f"{name:<12}batch {size:>3}, {len(some)} examples, the models alone: int8 {alone['int8']:.3f} s; "
                  + ", ".join(f"{variant} / int8 {alone[variant] / alone['int8']:.3f}" for variant in patched)
                  + "; ORT's time / int8's: "
                  + ", ".join(f"{other} {alone[other] / alone['int8']:.3f}" for other in others), flush=True)

if __name__ == "__main__":
    main()
