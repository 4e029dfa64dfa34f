#!/usr/bin/env bash
# The test command (README): whole suite on CPU, DeepSpeed ops cached under one dir per checkout.
# Prints the run's wall time at the end, and the quick loop (no DeepSpeed runs) to use while editing.
# Two pytest-xdist workers (TEST_WORKERS=0: one process), one thread each: most tests are bound by one
# Python thread (imports, start-up, tiny models), so two of them fill the 2 cores a CI machine has; tests
# that share a run or a module fixture stay on one worker (tests/conftest.py: worker_group).
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
workers=${TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then
  parallel=(-n "$workers" --dist loadgroup)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
fi
start=$SECONDS
# this checkout's bytecode, written once up front: each of the suite's few hundred processes (ranks, CLIs,
# helpers) then reads it instead of compiling ~170 modules again (none writes it where PYTHONDONTWRITEBYTECODE=1)
python3 -m compileall -q -j 0 avion_ds tests bench launch > /dev/null
python3 -m pytest -q -p no:cacheprovider --timeout 900 "${parallel[@]}" "$@"
rc=$?
wall=$((SECONDS - start))
printf 'tests/run.sh: wall time %d min %02d s (exit %d; targets on 2 idle cores: whole suite <= 15 min, quick loop <= 3 min)\n' \
  $((wall / 60)) $((wall % 60)) "$rc"
echo 'quick loop (skips the DeepSpeed runs): bash tests/run.sh -m "not multiprocess"'
exit $rc
