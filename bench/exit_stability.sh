#!/usr/bin/env bash
# Clean-exit check: launch N two-rank runs in a row and count non-zero exits (target 0).
#   bash bench/exit_stability.sh [N=20]
# MODE=train (default): the real entry point (launch/train.py, ZeRO-2, tiny synthetic EPIC data,
#                       2 optimizer steps + eval + checkpoint per run) -> exits via dist.shutdown.
# MODE=raw:             a bare DeepSpeed script that just returns at the end (no barrier / destroy /
#                       os._exit): the baseline that shows the interpreter-exit abort being mitigated.
# LAUNCHER=deepspeed (default) | torchrun
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
MODE=${MODE:-train}
LAUNCHER=${LAUNCHER:-deepspeed}
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
export OMP_NUM_THREADS=1
TMP=$(mktemp -d /tmp/avion_exit.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

python3 -m avion_ds.cli synth "$TMP/synth" --num-videos 2 --segments-per-video 10 --segment-seconds 1 \
  --width 64 --height 48 --fps 12 >/dev/null
python3 -m avion_ds.cli chunk "$TMP/synth/videos" "$TMP/chunks" --chunk-seconds 6 --short-side 48 --fps 12 \
  --gop 12 --workers 1 --no-progress >/dev/null

cat > "$TMP/raw.py" <<'PYEOF'
import deepspeed, torch
deepspeed.init_distributed()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}, "zero_optimization": {"stage": 2}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for _ in range(2):
    loss = engine(torch.randn(4, 32)).pow(2).mean()
    engine.backward(loss)
    engine.step()
print("raw run finished")
PYEOF

if [[ $MODE == raw ]]; then
  ENTRY=("$TMP/raw.py")
else
  ENTRY=(launch/train.py --config launch/recipes/demo_cpu.yaml --deepspeed_config ds_configs/zero2.json
         --set data.root="$TMP/chunks" --set data.train_csv="$TMP/synth/train.csv" --set data.val_csv="$TMP/synth/val.csv"
         --set schedule.epochs=1 --set schedule.steps_per_epoch=2 --set batch.global_batch=8 --set batch.micro_batch=4
         --set data.workers=0 --set logging.tensorboard=false)
fi

fails=0; aborts=0; other=0; start=$(date +%s)
for i in $(seq 1 "$N"); do
  port=$(( 29600 + i ))
  if [[ $LAUNCHER == torchrun ]]; then
    cmd=(torchrun --nproc_per_node 2 --master_port "$port")
  else
    cmd=(deepspeed --num_gpus 2 --master_port "$port")
  fi
  [[ $MODE == train ]] && extra=(--set output_dir="$TMP/run_$i") || extra=()
  t0=$(date +%s)
  "${cmd[@]}" "${ENTRY[@]}" "${extra[@]}" >"$TMP/log_$i.txt" 2>&1
  rc=$?
  abort=$(grep -c "terminate called" "$TMP/log_$i.txt" || true)
  [[ $rc -ne 0 ]] && fails=$((fails + 1))
  [[ $abort -gt 0 ]] && aborts=$((aborts + 1))
  [[ $rc -ne 0 && $abort -eq 0 ]] && other=$((other + 1))
  echo "run $i/$N: exit $rc$([[ $abort -gt 0 ]] && echo ' (terminate called: SIGABRT at exit)') $(( $(date +%s) - t0 )) s"
  if [[ $rc -ne 0 && $abort -eq 0 ]]; then tail -5 "$TMP/log_$i.txt"; fi
done
echo "MODE=$MODE LAUNCHER=$LAUNCHER: $fails of $N two-rank runs exited non-zero ($aborts with the exit-time abort) in $(( $(date +%s) - start )) s"
# MODE=raw is the baseline: its exit-time aborts are what it shows, so only a failure of another kind fails it
if [[ $MODE == raw ]]; then [[ $other -eq 0 ]]; else [[ $fails -eq 0 ]]; fi
