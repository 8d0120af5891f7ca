#!/bin/bash
# bertforge's CUDA paths end to end on one GPU, with the CPU beside it where answers must agree:
#   bash bench/gpu_check.sh [DATA_DIR (default ../shared/data)] [DEVICE (default cuda)]
# Fine-tunes MiniLM on 4,000 SST-2 sentences in bf16 and on 1,500 STS-B pairs; evaluates and predicts on the GPU
# (fp32 and auto = bf16) beside the CPU; `quantize --device` (bf16 on the GPU, int8 refused); distills a 3-layer
# student there; embeds, checks parity with transformers and sentence-transformers on the GPU; pre-trains a tiny
# model in bf16 and fp16; serves /v1/embeddings from the GPU. Then the tasks with windows and spans: NER on 3,000
# CoNLL-2003 sentences and extractive QA on 8 SQuAD articles, fine-tuned and predicted on the GPU beside the CPU; a
# served classifier's /predict and /explain on the GPU; `embed --compile` there. Each step prints its exit status
# and wall-clock.
# Needs bertforge[dev] installed (the default model, transformers, sentence-transformers) and a CUDA GPU.
set -u
DATA=$(cd "${1:-../shared/data}" && pwd); D=${2:-cuda}
PY=${PY:-python3}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=$W/data; mkdir -p $T/sst2 $T/stsb $T/conll $T/squad
head -4001 $DATA/sst2/train.tsv > $T/sst2/train.tsv; cp $DATA/sst2/dev.tsv $T/sst2/
head -1501 $DATA/stsb/train.tsv > $T/stsb/train.tsv; cp $DATA/stsb/dev.tsv $T/stsb/
$PY - "$DATA" "$T" <<'EOF'
import json, sys
from pathlib import Path
data, out = Path(sys.argv[1]), Path(sys.argv[2])
def sentences(name, count):  # the first `count` blank-line-separated sentences of a CoNLL file
    blocks = data.joinpath("conll2003", name).read_text(encoding="utf-8").split("\n\n")
    return "\n\n".join(blocks[:count]).strip() + "\n"
out.joinpath("conll", "train.txt").write_text(sentences("eng.train", 3000), encoding="utf-8")
out.joinpath("conll", "dev.txt").write_text(sentences("eng.testa", 800), encoding="utf-8")
squad = json.loads(data.joinpath("squad", "dev-v1.1.json").read_text(encoding="utf-8"))
for name, articles in (("train", squad["data"][:8]), ("dev", squad["data"][8:10])):
    out.joinpath("squad", f"{name}.json").write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
EOF
export PYTHONUNBUFFERED=1
bf() { $PY -m bertforge "$@"; }
step() { local name=$1; shift; echo; echo "=== $name: $*"; local t0=$EPOCHREALTIME; "$@"; local rc=$?
         echo "=== $name rc=$rc $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}") s"; }
# The served steps' start: bench_serve's server process (a free port, /health awaited, stopped with SIGINT).
SERVED='import json, sys, urllib.request
sys.path.insert(0, "bench")
from bench_serve import ServerProcess, get_json
def post_json(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=60))'

$PY -c "import torch, bertforge.runtime as r; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU', 'bf16 native', r.bf16_supported('$D'.partition(':')[0]))"
step finetune-sst2-bf16 bf finetune --task classification --model default --train $T/sst2/train.tsv --dev $T/sst2/dev.tsv \
  --epochs 1 --batch-size 32 --lr 1e-4 --bf16 --device $D --output $W/sst2 --no-progress
step finetune-stsb bf finetune --task regression --model default --train $T/stsb/train.tsv --dev $T/stsb/dev.tsv \
  --text-column sentence1 --text-pair-column sentence2 --label-column score --epochs 2 --batch-size 32 --lr 1e-4 \
  --device $D --output $W/stsb --no-progress
step evaluate-gpu-fp32 bf evaluate --model $W/sst2 --data $T/sst2/dev.tsv --device $D
step evaluate-gpu-auto bf evaluate --model $W/sst2 --data $T/sst2/dev.tsv --device $D --precision auto
step evaluate-cpu-fp32 bf evaluate --model $W/sst2 --data $T/sst2/dev.tsv --device cpu
step predict-gpu-auto bf predict --model $W/sst2 --input $T/sst2/dev.tsv --output $W/gpu.jsonl --device $D --precision auto
step predict-cpu bf predict --model $W/sst2 --input $T/sst2/dev.tsv --output $W/cpu.jsonl --device cpu
step compare-predictions $PY -c "
import json
a, b = ([json.loads(line) for line in open(f'$W/{name}.jsonl')] for name in ('gpu', 'cpu'))
print('labels agree', sum(x['label'] == y['label'] for x, y in zip(a, b)), 'of', len(a))"
step quantize-auto-gpu bf quantize --model $W/sst2 --dev $T/sst2/dev.tsv --precision auto --device $D --max-drop 1.0 --output $W/sst2-auto
step reload-quantized-cpu bf evaluate --model $W/sst2-auto --data $T/sst2/dev.tsv --device cpu
step quantize-int8-gpu-refused bf quantize --model $W/sst2 --dev $T/sst2/dev.tsv --precision int8 --device $D --output $W/sst2-int8
step quantize-stsb-bf16-gpu bf quantize --model $W/stsb --dev $T/stsb/dev.tsv --precision bf16 --device $D --max-drop 1.0 --output $W/stsb-bf16
step distill-sst2-l3 bf distill --teacher $W/sst2 --train $T/sst2/train.tsv --dev $T/sst2/dev.tsv --student-layers 3 \
  --device $D --max-drop 5 --output $W/sst2-l3 --no-progress
step embed-gpu bf embed --model default --input examples/sentences.txt --output $W/gpu.npy --device $D
step embed-cpu bf embed --model default --input examples/sentences.txt --output $W/cpu.npy --device cpu
step parity $PY - <<EOF
import numpy as np, torch, transformers
from sentence_transformers import SentenceTransformer
from bertforge import BertModel
from bertforge.checkpoint.default_model import default_model_dir
from bertforge.tokenizer import BertTokenizer
gpu, cpu = np.load("$W/gpu.npy"), np.load("$W/cpu.npy")
print("embed $D vs cpu: max abs", float(np.abs(gpu - cpu).max()))
d, device = default_model_dir(), torch.device("$D")
texts = [line.strip() for line in open("examples/sentences.txt") if line.strip()]
batch = {k: v.to(device) for k, v in BertTokenizer.from_pretrained(d)(texts, padding=True, return_tensors="pt").items()}
with torch.no_grad():
    ours = BertModel.from_pretrained(d).to(device).eval()(**batch).last_hidden_state
    theirs = transformers.AutoModel.from_pretrained(str(d)).to(device).eval()(**batch).last_hidden_state
real = batch["attention_mask"].bool()
print("encoder vs transformers on $D, real tokens: max abs", float((ours - theirs)[real].abs().max()))
reference = SentenceTransformer(str(d), device="$D").encode(texts, normalize_embeddings=True)
print("embed vs sentence-transformers on $D: max abs", float(np.abs(reference - gpu).max()))
EOF
step pretrain-prepare bf pretrain prepare --corpus examples/corpus.txt --vocab default --output $W/corpus --max-length 64 --no-progress
for precision in bf16 fp16; do
  step pretrain-$precision bf pretrain train --size tiny --data $W/corpus --output $W/tiny-$precision --steps 30 \
    --batch-size 8 --max-length 64 --$precision --holdout 1 --no-progress
done
step serve-gpu $PY - <<EOF
$SERVED
import numpy as np
server = ServerProcess("default", 4, ["--device", "$D", "--precision", "auto"])
try:
    print("health", get_json(server.port, "/health"))
    texts = [line.strip() for line in open("examples/sentences.txt") if line.strip()]
    served = post_json(server.port, "/v1/embeddings", {"input": texts, "model": "default"})
    vectors = np.array([item["embedding"] for item in sorted(served["data"], key=lambda item: item["index"])])
    print("served", vectors.shape, "min cosine to the CPU's fp32 vectors", float((vectors * np.load("$W/cpu.npy")).sum(1).min()))
finally:
    server.stop()
EOF

step finetune-conll bf finetune --task ner --model default --train $T/conll/train.txt --dev $T/conll/dev.txt \
  --epochs 1 --batch-size 32 --lr 1e-4 --device $D --output $W/conll --no-progress
step finetune-squad bf finetune --task qa --model default --train $T/squad/train.json --dev $T/squad/dev.json \
  --epochs 1 --batch-size 32 --lr 1e-4 --device $D --output $W/squad --no-progress
for task in conll squad; do
  input=$T/$task/dev.txt; [ $task = squad ] && input=$T/$task/dev.json
  for where in $D cpu; do
    step predict-$task-${where%%:*} bf predict --model $W/$task --input $input --output $W/$task-${where%%:*}.jsonl --device $where
  done
  step compare-$task $PY - $W/$task-${D%%:*}.jsonl $W/$task-cpu.jsonl <<'EOF'
import json, sys
a, b = ([json.loads(line) for line in open(path)] for path in sys.argv[1:])
if "entities" in a[0]:
    same = sum([(e["text"], e["type"]) for e in x["entities"]] == [(e["text"], e["type"]) for e in y["entities"]]
               for x, y in zip(a, b))
    print("entities agree in", same, "of", len(a), "sentences; tags", sum(x["tags"] == y["tags"] for x, y in zip(a, b)))
else:
    print("answers agree", sum(x["answer"] == y["answer"] for x, y in zip(a, b)), "of", len(a))
EOF
done
step embed-compile-gpu bf embed --model default --input examples/sentences.txt --output $W/compiled.npy --device $D --compile
step compare-compiled $PY -c "
import numpy as np
print('embed --compile on $D vs cpu: max abs', float(np.abs(np.load('$W/compiled.npy') - np.load('$W/cpu.npy')).max()))"
step serve-task-gpu $PY - <<EOF
$SERVED
server = ServerProcess("$W/sst2", 4, ["--device", "$D"])
try:
    print("health", get_json(server.port, "/health"))
    cpu = [json.loads(line)["label"] for line in open("$W/cpu.jsonl")][:64]
    texts = [line.split("\t")[0] for line in open("$T/sst2/dev.tsv").read().splitlines()[1:65]]
    served = [item["label"] for item in post_json(server.port, "/predict", {"texts": texts})["predictions"]]
    print("served labels agree with the CPU's", sum(x == y for x, y in zip(served, cpu)), "of", len(cpu))
    explained = post_json(server.port, "/explain", {"text": texts[0]})
    print("explain on $D:", json.dumps(explained)[:400])
finally:
    server.stop()
EOF
