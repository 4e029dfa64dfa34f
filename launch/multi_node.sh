#!/usr/bin/env bash
# Several nodes from a DeepSpeed hostfile (see launch/hostfile.example). Run on the first node:
#   HOSTFILE=launch/hostfile bash launch/multi_node.sh RECIPE.yaml [DS_CONFIG.json] [--set key=value ...]
# NUM_NODES limits how many hosts of the file are used; MASTER_ADDR defaults to this host.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:?usage: multi_node.sh RECIPE.yaml [DS_CONFIG.json] [--set k=v ...]}; shift
DS=ds_configs/zero2.json
if [[ $# -gt 0 && $1 == *.json ]]; then DS=$1; shift; fi
HOSTFILE=${HOSTFILE:-launch/hostfile}
[[ -f $HOSTFILE ]] || { echo "multi_node.sh: hostfile not found: $HOSTFILE (copy launch/hostfile.example)" >&2; exit 2; }
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
ARGS=(--hostfile "$HOSTFILE" --master_addr "${MASTER_ADDR:-$(hostname -I | awk '{print $1}')}" --master_port "${MASTER_PORT:-29500}")
[[ -n ${NUM_NODES:-} ]] && ARGS+=(--num_nodes "$NUM_NODES")
exec deepspeed "${ARGS[@]}" launch/train.py --config "$RECIPE" --deepspeed_config "$DS" "$@"
