#!/usr/bin/env bash
# N CPU ranks on this machine (DeepSpeed CPU accelerator + gloo). Useful for debugging sharding
# and resume logic without a GPU.
#   NPROC=2 bash launch/cpu_ranks.sh RECIPE.yaml [DS_CONFIG.json] [--set key=value ...]
# LAUNCHER=torchrun uses torchrun instead of the deepspeed launcher.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:?usage: cpu_ranks.sh RECIPE.yaml [DS_CONFIG.json] [--set k=v ...]}; shift
DS=ds_configs/zero2.json
if [[ $# -gt 0 && $1 == *.json ]]; then DS=$1; shift; fi
NPROC=${NPROC:-2}
export DS_ACCELERATOR=cpu                     # torch may be a CUDA build: force DeepSpeed's CPU accelerator
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}
if [[ ${LAUNCHER:-deepspeed} == torchrun ]]; then
  exec torchrun --nproc_per_node "$NPROC" --master_port "${MASTER_PORT:-29500}" launch/train.py \
    --config "$RECIPE" --deepspeed_config "$DS" "$@"
fi
# without --num_gpus the deepspeed launcher starts ONE rank on CPU
exec deepspeed --num_gpus "$NPROC" --master_port "${MASTER_PORT:-29500}" launch/train.py \
  --config "$RECIPE" --deepspeed_config "$DS" "$@"
