#!/usr/bin/env bash
# All (or NUM_GPUS) GPUs of this machine through the deepspeed launcher.
#   bash launch/single_node_gpus.sh RECIPE.yaml [DS_CONFIG.json] [--set key=value ...]
# e.g. NUM_GPUS=8 bash launch/single_node_gpus.sh launch/recipes/vit_b_epic.yaml ds_configs/zero2.json
#      INCLUDE=localhost:0,1 bash launch/single_node_gpus.sh ...      (pick devices)
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:?usage: single_node_gpus.sh RECIPE.yaml [DS_CONFIG.json] [--set k=v ...]}; shift
DS=ds_configs/zero2.json
if [[ $# -gt 0 && $1 == *.json ]]; then DS=$1; shift; fi
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
if [[ -n ${INCLUDE:-} ]]; then
  exec deepspeed --include "$INCLUDE" --master_port "${MASTER_PORT:-29500}" launch/train.py --config "$RECIPE" --deepspeed_config "$DS" "$@"
fi
NUM_GPUS=${NUM_GPUS:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
exec deepspeed --num_gpus "$NUM_GPUS" --master_port "${MASTER_PORT:-29500}" launch/train.py \
  --config "$RECIPE" --deepspeed_config "$DS" "$@"
