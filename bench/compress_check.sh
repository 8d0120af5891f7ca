#!/bin/bash
# bench_compress.py's four models on a many-core machine with a GPU, in one short lease:
#   bash bench/compress_check.sh [DEVICE (default cuda)] [LOG_DIR (default compress_check)]
# Fine-tunes the rows conll2003, sst2, stsb and mrpc of finetune_tasks.py on DEVICE, one after another, and as each
# model is ready runs bench_compress.py on it on the CPU. Each benchmark is pinned to its own THREADS physical
# cores (one logical CPU each), the fine-tuning to the CPUs left over, so the four benchmarks run at once without
# sharing a core (they do share the memory bus and caches: compare rows within a model, not across machines).
# CoNLL-2003 is scored on its first CONLL_EXAMPLES test sentences; SST-2 also times int8 against ONNX Runtime's
# int8 at the batch sizes SST2_BATCH_SIZES (empty: none); FLOAT_LAYERS (e.g. 1,2,8) adds int8 rows keeping that many
# layers in float32. Each step's output goes to LOG_DIR/NAME.log; the tables are printed at the end. Needs bertforge
# and the default model importable, onnxruntime, onnx and onnxscript, and taskset.
set -u
D=${1:-cuda}; LOGS=${2:-compress_check}
THREADS=${THREADS:-2}; REPEATS=${REPEATS:-2}; CONLL_EXAMPLES=${CONLL_EXAMPLES:-600}
SST2_BATCH_SIZES=${SST2_BATCH_SIZES-1,8,16,32}; RUNS_DIR=${RUNS_DIR:-runs}; PY=${PY:-python3}
FLOAT_LAYERS=${FLOAT_LAYERS:-}  # also int8 rows keeping these many layers in float32, e.g. 1,2,8
BENCH_TIMEOUT=${BENCH_TIMEOUT:-0}  # seconds each benchmark may take (0: no limit)
mkdir -p "$LOGS"; export PYTHONUNBUFFERED=1

lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' \
  | grep -x -E 'avx2|avx512f|avx512_vnni|avx512_bf16|avx_vnni|amx_tile|amx_int8|amx_bf16' | tr '\n' ' ')"
$PY -c "import torch, onnxruntime; print('torch', torch.__version__, 'onnxruntime', onnxruntime.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

# One logical CPU of each physical core; THREADS of them per benchmark, the rest (or all) for fine-tuning.
cores=($(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' | awk -F, '!seen[$2 "," $3]++ {print $1}'))
bench_cpus=(); used=","
for i in 0 1 2 3; do
  list=""
  for ((j = 0; j < THREADS; j++)); do
    cpu=${cores[$(((i * THREADS + j) % ${#cores[@]}))]}; list+="${list:+,}$cpu"; used+="$cpu,"
  done
  bench_cpus+=("$list")
done
finetune_cpus=$(lscpu -p=CPU | grep -v '^#' | while read -r cpu; do [[ $used == *",$cpu,"* ]] || echo "$cpu"; done \
  | paste -sd,)
[ -n "$finetune_cpus" ] || finetune_cpus=$(lscpu -p=CPU | grep -v '^#' | paste -sd,)
finetune_threads=$(echo "$finetune_cpus" | tr ',' '\n' | wc -l)
echo "benchmarks on CPUs ${bench_cpus[*]}; fine-tuning on $finetune_cpus"

limit=(); [ "$BENCH_TIMEOUT" -gt 0 ] && limit=(timeout "$BENCH_TIMEOUT")
runs=(conll2003 sst2 stsb mrpc)  # the longest benchmark first
for i in "${!runs[@]}"; do
  run=${runs[$i]}; t0=$EPOCHREALTIME
  taskset -c "$finetune_cpus" $PY bench/finetune_tasks.py "$run" --device "$D" --runs-dir "$RUNS_DIR" \
    --threads "$finetune_threads" > "$LOGS/finetune-$run.log" 2>&1
  echo "finetune $run on $D rc=$? $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}") s: $(tail -1 "$LOGS/finetune-$run.log")"
  extra=()
  [ "$run" = conll2003 ] && extra=(--dev-examples "$CONLL_EXAMPLES")
  [ "$run" = sst2 ] && [ -n "$SST2_BATCH_SIZES" ] && extra=(--batch-sizes "$SST2_BATCH_SIZES")
  [ -n "$FLOAT_LAYERS" ] && extra+=(--float-layers "$FLOAT_LAYERS")
  (t0=$EPOCHREALTIME
   "${limit[@]}" taskset -c "${bench_cpus[$i]}" $PY bench/bench_compress.py --runs "$run" --runs-dir "$RUNS_DIR" \
     --threads "$THREADS" --repeats "$REPEATS" "${extra[@]}" > "$LOGS/compress-$run.log" 2>&1
   echo "bench_compress $run on CPUs ${bench_cpus[$i]} rc=$? $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}") s") &
done
wait
echo; grep -m1 "^model " "$LOGS/compress-${runs[0]}.log"
for run in "${runs[@]}"; do grep -v -E "^model |^WARNING" "$LOGS/compress-$run.log" | tail -n 40; done
