"""The epoch bar counts the epoch's optimizer steps: with ``log_every`` larger than an epoch (a logged row
covering steps of earlier epochs) it never runs past its total (it read ``epoch 6: 20step`` of 3)."""

from __future__ import annotations

from pathlib import Path

from avion_ds.distributed.run_log import RunLogger


def test_bar_counts_each_step_of_its_epoch(tmp_path: Path) -> None:
    log = RunLogger(tmp_path, True, tensorboard=False, progress=True, log_every=10)
    global_step, seen = 0, []
    for epoch in range(7):
        log.start_epoch(epoch, 3)
        for _ in range(3):  # the trainer's order: advance, then a logged row every log_every global steps
            global_step += 1
            log.advance()
            if global_step % 10 == 0:
                log.step(epoch, global_step, {"loss": 1.0}, steps=10)
            seen.append((log.bar.n, log.bar.total))
        log.end_epoch()
    log.close()
    assert all(n <= total for n, total in seen) and seen[-1] == (3, 3), seen
