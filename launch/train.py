"""Thin entry for `deepspeed launch/train.py ...`, `torchrun launch/train.py ...` or plain python.

All logic lives in avion_ds.cli.train; this file only forwards argv (the deepspeed launcher
appends --local_rank=N, which the package's parser accepts, as it accepts DeepSpeed's own
``--deepspeed --deepspeed_config ds.json`` pair). ``--plugin MODULE`` is imported by every rank
before the recipe is read (a task or dataset of another package).
"""

import sys

from avion_ds.cli import freeze_imports
from avion_ds.cli.train import main

if __name__ == "__main__":
    freeze_imports()  # this process's imports are done: full collections skip them
    sys.exit(main(sys.argv[1:]))
