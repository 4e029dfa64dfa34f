#!/usr/bin/env bash
# The test command (README): whole suite on CPU, DeepSpeed ops cached under one dir per checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec python3 -m pytest -q -p no:cacheprovider --timeout 900 "$@"
