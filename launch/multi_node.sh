#!/usr/bin/env bash
# Several nodes from a DeepSpeed hostfile (see launch/hostfile.example).
#
# ssh mode (default): run once, on the first node; DeepSpeed starts the others by password-less ssh:
#   HOSTFILE=launch/hostfile bash launch/multi_node.sh RECIPE.yaml [DS_CONFIG.json] [--set key=value ...]
# no-ssh mode: run the SAME command on EVERY node, with that node's rank in NODE_RANK (or SLURM_NODEID,
# as under `srun`, see launch/slurm.sbatch) and the first node's address in MASTER_ADDR:
#   NODE_RANK=1 MASTER_ADDR=node01 HOSTFILE=launch/hostfile bash launch/multi_node.sh RECIPE.yaml ...
# Each node's launcher starts its own ranks (`deepspeed --no_ssh --node_rank N`); nothing needs ssh.
# NUM_NODES limits how many hosts of the file are used; MASTER_PORT defaults to 29500;
# AVION_DS_PG_TIMEOUT_S bounds how long survivors wait for a dead node (default: torch's 30 min).
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:?usage: multi_node.sh RECIPE.yaml [DS_CONFIG.json] [--set k=v ...]}; shift
DS=ds_configs/zero2.json
if [[ $# -gt 0 && $1 == *.json ]]; then DS=$1; shift; fi
HOSTFILE=${HOSTFILE:-launch/hostfile}
[[ -f $HOSTFILE ]] || { echo "multi_node.sh: hostfile not found: $HOSTFILE (copy launch/hostfile.example)" >&2; exit 2; }
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-}}
if [[ -n $NODE_RANK && -z ${MASTER_ADDR:-} ]]; then
  echo "multi_node.sh: no-ssh mode (NODE_RANK=$NODE_RANK) needs MASTER_ADDR = the address of node rank 0" >&2; exit 2
fi
ARGS=(--hostfile "$HOSTFILE" --master_addr "${MASTER_ADDR:-$(hostname -I | awk '{print $1}')}" --master_port "${MASTER_PORT:-29500}")
[[ -n ${NUM_NODES:-} ]] && ARGS+=(--num_nodes "$NUM_NODES")
[[ -n $NODE_RANK ]] && ARGS+=(--no_ssh --node_rank "$NODE_RANK")
exec deepspeed "${ARGS[@]}" launch/train.py --config "$RECIPE" --deepspeed_config "$DS" "$@"
