"""Pre-training step throughput: bertforge's BertForPreTraining vs transformers.BertForPreTraining, same weights,
same batch, same optimizer, in one run.

    python bench/bench_pretrain.py [--config base] [--batch-size 8] [--seq-len 128] [--steps 5] [--threads 2] [--bf16]

Work: one optimizer step = forward with masked-LM + next-sentence labels, backward, gradient clipping at 1, AdamW
(lr 1e-4, weight decay 0.01, eps 1e-6, the fused kernel for both). The batch is real text (pretrain_en
documents tokenized with the MiniLM vocabulary, 30,522 tokens), masked by bertforge's masker (15%, 80/10/10) with
random next-sentence labels; both models start from the same random BERT initialisation (bertforge writes the
checkpoint, transformers loads it). bertforge scores the batch as `bertforge pretrain train` does (the objective's
loss: vocabulary logits at the masked positions alone), transformers as its own model does (logits at every
position). The engines alternate, one warm-up step each, then the median of `--steps`.
MFU counts 6 x parameters x tokens per step (forward 2, backward 4 FLOPs per parameter and token; the embedding
tables are included, as the usual MFU convention does) against `--peak-gflops`. On a CUDA machine the same
script measures the GPU (`--device cuda --bf16`), where NVIDIA's published BERT-base pre-training reaches ~45%.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bertforge import BertConfig, BertTokenizer, fast_cpu
from bertforge.pretraining.heads import BertForPreTraining
from bertforge.pretraining.masking import Masker
from bertforge.pretraining.objectives import get_objective
from bertforge.runtime import tune_cpu_allocator
from bertforge.training import build_optimizer

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def real_batch(tokenizer: BertTokenizer, batch_size: int, seq_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """batch_size windows of seq_len real tokens: [CLS] A [SEP] B [SEP] from consecutive text, masked."""
    text = (DATA / "pretrain_en" / "brown.txt").read_text(encoding="utf-8")[:2_000_000]
    ids = tokenizer(text, truncation=False)["input_ids"][1:-1]
    half = (seq_len - 3) // 2
    rows, segments = [], []
    for row in range(batch_size):
        start = row * (seq_len + 50)
        a, b = ids[start:start + half], ids[start + half:start + seq_len - 3]
        rows.append([tokenizer.cls_token_id, *a, tokenizer.sep_token_id, *b, tokenizer.sep_token_id])
        segments.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
    input_ids = torch.tensor(rows)
    generator = torch.Generator().manual_seed(seed)
    masked = Masker(tokenizer.vocab)(input_ids, generator)
    return {"input_ids": masked.input_ids, "token_type_ids": torch.tensor(segments),
            "attention_mask": torch.ones_like(input_ids), "labels": masked.labels,
            "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=generator)}


def train_step(model, optimizer, batch, autocast, loss_of) -> tuple[float, float]:
    start = time.perf_counter()
    with autocast():
        loss = loss_of(model, batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if batch["input_ids"].is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="base", help="BertConfig preset (default: base)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for both")
    parser.add_argument("--peak-gflops", type=float, default=552.0,
                        help="the device's peak GFLOP/s (default: 552, the 2-core reference CPU in fp32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # process-wide: the reference gains from it too
    import transformers

    device = torch.device(args.device)
    tokenizer = BertTokenizer.from_pretrained("default")
    config = BertConfig.preset(args.config, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    ours = BertForPreTraining(config)
    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(folder)
        theirs = transformers.BertForPreTraining.from_pretrained(folder, attn_implementation="sdpa")
    # what `bertforge pretrain train` runs: the CPU fast paths swapped in (after saving, which wants plain modules)
    models = {"bertforge": fast_cpu.accelerate(ours.to(device)).train(), "transformers": theirs.to(device).train()}
    # bertforge's AdamW groups (no decay on biases and LayerNorm) and fused kernel, for both
    optimizers = {name: build_optimizer(model, lr=1e-4, weight_decay=0.01, eps=1e-6) for name, model in models.items()}
    batch = {key: value.to(device) for key, value in real_batch(tokenizer, args.batch_size, args.seq_len).items()}
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.bf16 else \
        (lambda: torch.autocast(device.type, enabled=False))

    # how each engine's own pre-training scores a batch: bertforge's through the objective `pretrain train` runs
    losses = {"bertforge": get_objective("mlm+nsp").loss, "transformers": lambda model, batch: model(**batch)}
    times: dict[str, list[float]] = {name: [] for name in models}
    first_loss = {}
    for step in range(args.steps + 1):  # step 0 warms up
        for name in (list(models) if step % 2 == 0 else list(models)[::-1]):
            seconds, loss = train_step(models[name], optimizers[name], batch, autocast, losses[name])
            first_loss.setdefault(name, loss)
            if step > 0:
                times[name].append(seconds)

    parameters = sum(p.numel() for p in ours.parameters())
    tokens = args.batch_size * args.seq_len
    print(f"{args.config} ({parameters / 1e6:.1f}M parameters), batch {args.batch_size} x {args.seq_len}, "
          f"{'bf16' if args.bf16 else 'fp32'}, {device}, {args.threads} threads, median of {args.steps} steps; "
          f"max RSS of the process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")
    print(f"{'':<14}{'s/step':>10}{'tokens/s':>12}{'MFU':>8}{'first loss':>12}")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, seconds in medians.items():
        mfu = 6 * parameters * tokens / seconds / (args.peak_gflops * 1e9)
        print(f"{name:<14}{seconds:>10.3f}{tokens / seconds:>12.0f}{mfu:>8.1%}{first_loss[name]:>12.5f}")
    print(f"speed ratio (bertforge / transformers): {medians['transformers'] / medians['bertforge']:.2f}x")


if __name__ == "__main__":
    main()
