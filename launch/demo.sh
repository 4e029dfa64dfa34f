#!/usr/bin/env bash
# The README's first command: a complete, small, LEARNABLE fine-tune on 2 CPU ranks (< ~6 min).
#   1. synthesise EPIC-style long videos (shape = noun, motion = verb) + train/val CSVs
#   2. chunk them AVION-style (DST/<video_id>/<start>.mp4 + manifest.jsonl)
#   3. fine-tune vit_test_tiny with ZeRO-2 on 2 CPU ranks through the deepspeed launcher
#   4. evaluate the run (metrics JSON with per-sample scores), export fp32 safetensors
#   5. print verb / noun / action accuracy next to chance
# Usage: bash launch/demo.sh [extra --set key=value ...]   (DEMO_DIR=demo, MASTER_PORT=29500 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}   # CUDA builds of torch on a GPU-less box: force the CPU accelerator
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}    # one thread per rank
PY=${PYTHON:-python3}
OUT=${DEMO_DIR:-demo}

NEEDS="avion_ds deepspeed decord av timm tensorboard"  # found without importing them (importing is ~4 CPU-s)
# shellcheck disable=SC2086
if ! $PY -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" $NEEDS 2>/dev/null; then
  echo "== installing avion_ds and its dependencies (pinned torch; see .ci/install.sh)"
  PYTHON=$PY bash .ci/install.sh
fi

start=$(date +%s)
echo "== 1/5 synthetic EPIC-style videos -> $OUT/synth"
rm -rf "$OUT/synth" "$OUT/chunks" "$OUT/run" "$OUT/model.safetensors"
$PY -m avion_ds.cli synth "$OUT/synth" --num-videos 16 --segments-per-video 24 --seed 0
echo "== 2/5 chunking -> $OUT/chunks"
$PY -m avion_ds.cli chunk "$OUT/synth/videos" "$OUT/chunks" --chunk-seconds 15 --short-side 72 --fps 15 --gop 15 \
  --workers 2 --no-progress
echo "== 3/5 fine-tuning vit_test_tiny, ZeRO-2, 2 CPU ranks (deepspeed launcher)"
deepspeed --num_gpus 2 --master_port "${MASTER_PORT:-29500}" launch/train.py --config launch/recipes/demo_cpu.yaml \
  --deepspeed_config ds_configs/zero2.json \
  --set data.root="$OUT/chunks" --set data.train_csv="$OUT/synth/train.csv" --set data.val_csv="$OUT/synth/val.csv" \
  --set output_dir="$OUT/run" "$@" 2>&1 | grep --line-buffered -v -E "^\[[0-9-]+ [0-9:,]+\] \[(INFO|WARNING)\]|^W[0-9]+ |built successfully|FutureWarning|return func"
echo "== 4/5 evaluating the latest checkpoint, exporting fp32 weights"
QUIET="^\[[0-9-]+ |^W[0-9]+ |built successfully|Processing zero checkpoint|Parsing checkpoint|Loading checkpoint shards|Detected checkpoint|Reconstructed fp32"
$PY -m avion_ds.cli eval --checkpoint "$OUT/run" --out "$OUT/run/eval_metrics.json" 2>&1 | grep --line-buffered -v -E "$QUIET"
$PY -m avion_ds.cli export --checkpoint "$OUT/run" --out "$OUT/model.safetensors" 2>&1 | grep --line-buffered -v -E "$QUIET"
echo "== 5/5 result"
$PY - "$OUT" <<'PYEOF'
import csv, json, sys
from collections import Counter
out = sys.argv[1]
m = json.load(open(f"{out}/run/eval_metrics.json"))["metrics"]
rows = list(csv.DictReader(open(f"{out}/synth/val.csv")))
n = len(rows)
print(f"val clips: {n}")
for head, key in (("verb", "verb_class"), ("noun", "noun_class")):
    k = len({r[key] for r in csv.DictReader(open(f"{out}/synth/train.csv"))})
    major = 100.0 * Counter(r[key] for r in rows).most_common(1)[0][1] / n
    print(f"{head:6s} top-1 {m[f'{head}_top1']:6.2f}%   chance {100.0 / k:5.2f}%   majority class {major:5.2f}%")
pairs = Counter((r["verb_class"], r["noun_class"]) for r in rows)
print(f"action top-1 {m['action_top1']:6.2f}%   majority action {100.0 * pairs.most_common(1)[0][1] / n:5.2f}%")
PYEOF
echo "== done in $(( $(date +%s) - start )) s  (run dir $OUT/run, TensorBoard: tensorboard --logdir $OUT/run/tb)"
