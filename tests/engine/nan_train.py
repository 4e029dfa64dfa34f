"""`launch/train.py` with a NaN loss injected at chosen (rank, micro-batch) pairs — a test harness.

AVION_TEST_NAN="1:4,0:9" makes rank 1's 4th and rank 0's 9th training micro-batch (counted from 1 in
this process) return a NaN loss, as a numerically broken batch would.
"""

import os
import sys

from avion_ds.engine import train

TARGETS = {tuple(int(v) for v in x.split(":")) for x in os.environ.get("AVION_TEST_NAN", "").split(",") if x}
_real_loss = train.total_loss
_calls = [0]


def _total_loss(out, targets, smoothing):
    loss, parts = _real_loss(out, targets, smoothing)
    _calls[0] += 1
    if (int(os.environ.get("RANK", "0")), _calls[0]) in TARGETS:
        loss = loss * float("nan")
    return loss, parts


train.total_loss = _total_loss

if __name__ == "__main__":
    sys.exit(train.main(sys.argv[1:]))
