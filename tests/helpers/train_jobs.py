"""Run several `avion-ds train` jobs in ONE launcher process (saves a launcher + op load per config).

Usage (under torchrun or the deepspeed launcher): ``train_jobs.py JOBS.json``; JOBS.json is a list of
argv lists for ``avion_ds.cli.train``. Each job goes through the real ``train.run``; the first
failing job's exit code is returned, and the process leaves through ``dist.shutdown``. Rank 0 prints
``job done in`` after each job (``tests.helpers.launch.job_logs`` splits the output there).
A ZeRO-3 job replaces ``torch.nn.functional.linear`` in its process for good (zero.Init's
memory-efficient linear): put the ZeRO-3 jobs last.
"""

from __future__ import annotations

import json
import sys
import time

from avion_ds.cli.train import parse_args, run, setup_run
from avion_ds.config import ConfigError
from avion_ds.distributed import dist


def _all(jobs: list[list[str]]) -> int:
    for argv in jobs:
        t0 = time.perf_counter()
        args = parse_args(argv)
        code = run(setup_run(args), args)
        dist.barrier()
        if code:
            return code
        if dist.is_main():
            print(f"job done in {time.perf_counter() - t0:.1f} s: {' '.join(argv)}", flush=True)  # launch.JOB_DONE
    return 0


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    with open(argv[0]) as f:
        jobs = json.load(f)
    sys.exit(dist.run_entry("pretrain jobs", lambda: _all(jobs), {ConfigError: 2}))
