"""`launch/train.py` with a NaN loss injected at chosen (rank, micro-batch) pairs — a test harness.

AVION_TEST_NAN="1:4,0:9" makes rank 1's 4th and rank 0's 9th training micro-batch (counted from 1 in
this process) return a NaN loss, as a numerically broken batch would. The injection is a registered
task (fine-tuning with a poisoned loss), the extension point a user's own task would use.
"""

import os
import sys

from avion_ds.cli import train
from avion_ds.tasks import register_task
from avion_ds.tasks.finetune.task import FinetuneTask

TARGETS = {tuple(int(v) for v in x.split(":")) for x in os.environ.get("AVION_TEST_NAN", "").split(",") if x}


@register_task
class NanInjectedFinetune(FinetuneTask):
    """Fine-tuning whose loss is NaN at the TARGETS micro-batches."""

    name = "finetune_nan_injected"

    def __init__(self) -> None:
        self.calls = 0

    def loss(self, *args, **kwargs):
        loss, parts = super().loss(*args, **kwargs)
        self.calls += 1
        if (int(os.environ.get("RANK", "0")), self.calls) in TARGETS:
            loss = loss * float("nan")
        return loss, parts


if __name__ == "__main__":
    sys.exit(train.main([*sys.argv[1:], "--set", f"task={NanInjectedFinetune.name}"]))
