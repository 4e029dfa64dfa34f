"""The training loop as a small object, in torchtitan's shape.

``TrainState`` (engine/train_state.py, with the step's small helpers) is where training stands;
``Trainer`` holds the engine and runs ``train_step`` (one optimizer step = one gradient-accumulation window),
``maybe_save``, ``evaluate`` and ``fit`` (epochs). ``avion-ds train`` only wires one up;
``avion-ds plan --measure`` and ``bench/engine.py`` time the same ``train_step``.

Host synchronisation. A micro-step that is not an accumulation boundary never waits for the device:
the loss and the per-head losses stay on the device, a non-finite loss poisons its own backward there
(:func:`~avion_ds.engine.accum.poison_nonfinite`), nothing is all-reduced and no timer synchronises.
At the boundary ONE small all-reduce (per-micro-batch losses, bad / fatal input counts) and ONE read
on the host give every rank the same verdict (a micro-batch whose loss summed over ranks is not
finite skips the window: engine/accum.py), count bad samples and stop on ``nonfinite: stop``. The
grad norm, lr, loss scale and memory are read only on logged steps (``logging.log_every``); a logged
row reports the steps since the previous logged one (with ``log_every: 1``, every step).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from avion_ds.config import Recipe
from avion_ds.data.bad_input import BadInputLog, batch_messages
from avion_ds.data.prep.net_retry import download_retries
from avion_ds.distributed import dist
from avion_ds.distributed.rng import set_rng_state
from avion_ds.distributed.run_log import RunLogger, peak_memory_gib
from avion_ds.engine import ema
from avion_ds.engine import run_checkpoints as ckpt
from avion_ds.engine.accum import poison_nonfinite, step_window
from avion_ds.engine.parallelize import Parallelized
from avion_ds.engine.resume_loader import loader_skipping, shard_epoch
from avion_ds.engine.schedule import decayed_weight_decay
from avion_ds.engine.train_state import (
    LogInterval,
    NonFiniteLoss,
    StepWindow,
    TrainData,
    TrainState,
    as_float,
    to_device,
    zero0_grad_norm_tensor,
)
from avion_ds.tasks.base import EvalContext
from avion_ds.tasks.common.predictions import failed_line

if TYPE_CHECKING:
    from avion_ds.tasks.base import Task


class Trainer:
    """The engine, the state, and one optimizer step; ``fit`` runs epochs over a :class:`TrainData`.

    What differs between kinds of training (the loss, the evaluation) is asked of ``task``."""

    def __init__(
        self,
        parallel: Parallelized,
        recipe: Recipe,
        task: Task,
        *,
        log: RunLogger | None = None,
        augment: Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]] | None = None,
        bad_log: BadInputLog | None = None,
    ) -> None:
        self.engine, self.recipe, self.task = parallel.engine, recipe, task
        engine = parallel.engine
        self.state = TrainState()
        self.log = log if log is not None else RunLogger(".", enabled=False, log_every=recipe.logging.log_every)
        self.augment = augment
        self.bad_log = bad_log if bad_log is not None else BadInputLog(self.log.info)
        self.precision, self.dtype = parallel.plan.precision, parallel.plan.dtype
        self.device = torch.device(engine.device)
        self.world = dist.world_size()
        self.stage = parallel.plan.zero_stage
        self.clip = parallel.clip_grad  # > 0: we clip (torch's clip_grad_norm_)
        self.consecutive = 0  # non-finite micro-batches in a row (not saved: a resume starts at 0)
        self._window, self._interval = StepWindow(), LogInterval()
        self._pending_rng: dict[str, Any] | None = None  # restored once the resumed epoch's loader started
        self._shard_loader: Any = None  # data.shards: the training loader, whose position checkpoints keep
        self._shard_position: dict[str, Any] | None = None  # its position in a resumed checkpoint
        self._params = list(engine.module.parameters())  # walking the module tree costs ~1 ms a step
        self.ema = ema.build(engine, recipe)  # None unless ema.decay > 0
        self._first_t0: float | None = None  # model.compile: the first step's time goes into the log
        self._log_first = bool(recipe.model.compile)

    # ------------------------------------------------------------------ one optimizer step
    def train_step(self, batches: Iterator[dict[str, Any]]) -> bool:
        """One optimizer step over the next micro-batches of ``batches`` (up to the accumulation
        boundary); False when ``batches`` ran out first."""
        if self.task.whole_window:
            return self._window_step(batches)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return False
            self._interval.data_s += time.perf_counter() - t0
            if self.micro_step(batch):
                return True

    def micro_step(self, batch: dict[str, Any]) -> bool:
        """Forward + backward of one micro-batch; at the boundary also the update. True at a boundary.

        No host sync unless this is a boundary (then one; more on a logged step)."""
        x, targets = self._on_device(batch)
        loss, parts = self.task.loss(self.engine, x, targets, self.dtype, self.recipe)
        self._remember(loss, parts, batch)
        boundary = self.engine.is_gradient_accumulation_boundary()
        self.engine.backward(poison_nonfinite(loss))
        if not boundary:
            step_window(self.engine, poisoned=False)  # DeepSpeed's micro-step bookkeeping only
            return False
        self._finish_window()
        return True

    def _on_device(self, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """A micro-batch on the device through the training augmentation (its time counts as data time)."""
        t0 = time.perf_counter()
        if self._log_first and self._first_t0 is None:
            self._first_t0 = t0
        frames = batch["frames"].to(self.device, non_blocking=True)
        labels = to_device(batch["label"], self.device)
        out = self.augment(frames, labels) if self.augment is not None else (frames, labels)
        self._interval.data_s += time.perf_counter() - t0
        return out

    def _window_step(self, batches: Iterator[dict[str, Any]]) -> bool:
        """One optimizer step of a ``whole_window`` task: the window's micro-batches are read first, the
        task yields one loss per micro-batch, each backward unscaled (the task's losses already make up
        the window's gradient: DeepSpeed's division by the accumulation steps would shrink it)."""
        window: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        for _ in range(self.engine.gradient_accumulation_steps()):
            try:
                window.append(next(batches))
            except StopIteration:
                return False  # a partial window is dropped, like a partial batch
        self._interval.data_s += time.perf_counter() - t0
        xs, targets = zip(*(self._on_device(batch) for batch in window), strict=True)
        for batch, (loss, parts) in zip(
            window, self.task.window_losses(self.engine, list(xs), list(targets), self.dtype, self.recipe), strict=True
        ):
            self._remember(loss, parts, batch)
            boundary = self.engine.is_gradient_accumulation_boundary()
            self.engine.backward(poison_nonfinite(loss), scale_wrt_gas=False)
            if not boundary:
                step_window(self.engine, poisoned=False)
        self._finish_window()
        return True

    def _remember(self, loss: torch.Tensor, parts: dict[str, torch.Tensor], batch: dict[str, Any]) -> None:
        w = self._window
        w.losses.append(loss.detach().float())
        w.heads.append({h: v.detach().float() for h, v in parts.items()})
        bad, fatal = batch_messages(batch)
        w.bad_msgs += bad
        w.fatal_msgs += fatal
        if "skipped" in batch and (bad or "bad" not in batch):  # deferred errors name every skip
            w.bad_count += int(batch["skipped"].sum())  # a CPU tensor: no device sync

    def _finish_window(self) -> None:
        """The boundary: one reduction + host read decide the window; update; count; log when due."""
        st = self.state
        log_now = (st.global_step + 1) % self.log.log_every == 0
        bad = self._account_window()
        lr = max(g["lr"] for g in self.engine.optimizer.param_groups) if log_now else None  # before step()
        scale = self.loss_scale() if log_now else None
        norm = None
        if not bad and self.clip:  # fp32 ZeRO-0: one norm clips and is logged
            norm = torch.nn.utils.clip_grad_norm_(self._grads_params(), self.clip)
        elif not bad and log_now and self.stage == 0:
            norm = zero0_grad_norm_tensor(self.engine, scale)
        if log_now:
            self._interval.weight_decay = decayed_weight_decay(self.engine.optimizer)
        applied = step_window(self.engine, bad)
        if applied:
            self.task.after_step(self.engine)
        if applied and self.ema is not None:
            self.ema.update()
        if log_now and not bad and self.stage > 0:
            norm = self.engine.get_global_grad_norm()
        st.global_step += 1  # the data position: one window consumed, applied or not
        st.step_in_epoch += 1
        st.applied_steps += applied
        st.overflow_steps += not applied and not bad
        self._interval.steps += 1
        self._interval.timed += 1
        self.log.advance()
        if log_now:
            self._log_interval(lr, None if bad else norm)
        if self._log_first and self._first_t0 is not None:
            self._log_first = False
            self.log.info(
                f"first step {time.perf_counter() - self._first_t0:.1f} s (model.compile: compiles each block)"
            )

    def _grads_params(self) -> list[torch.nn.Parameter]:
        return [p for p in self._params if p.grad is not None]

    def loss_scale(self) -> float | None:
        """fp16's current loss scale (None otherwise); a host read."""
        return as_float(self.engine._get_optimizer_loss_scale()) if self.precision == "fp16" else None

    def _account_window(self) -> bool:
        """All-reduce the window's losses and input counts, read them once; True: skip the window.

        A micro-batch is non-finite when its loss summed over ranks is (the verdict every rank shares)."""
        w, self._window = self._window, StepWindow()
        n = len(w.losses)
        local = torch.stack(w.losses)
        if self.world > 1:
            counts = torch.tensor([float(w.bad_count), float(len(w.fatal_msgs))], device=self.device)
            values = dist.all_reduce_sum(torch.cat([local, counts])).tolist()  # THE host sync of a step
            sums, (bad_count, fatal) = values[:n], values[n:]
        else:
            sums, bad_count, fatal = local.tolist(), w.bad_count, len(w.fatal_msgs)
        flags = [not math.isfinite(v) for v in sums]
        self.state.bad_samples += int(bad_count)
        if bad_count or fatal:  # rare: name new bad files once, stop every rank on a fatal one
            self.bad_log.exchange(w.bad_msgs, w.fatal_msgs)
        for i in range(n):
            if flags[i]:
                self._nonfinite()
                continue
            self.consecutive = 0
            iv = self._interval
            iv.loss += sums[i] / self.world
            iv.n += 1
            for h, v in w.heads[i].items():
                iv.heads[h] = iv.heads[h] + v if h in iv.heads else v
        return any(flags)

    def _nonfinite(self) -> None:
        """One micro-batch whose loss was non-finite on some rank (every rank agrees)."""
        st, r = self.state, self.recipe
        if r.nonfinite == "stop":
            raise NonFiniteLoss(
                f"non-finite loss at global step {st.global_step + 1} (epoch {st.epoch}, "
                f"step {st.step_in_epoch + 1} of the epoch); stopping, nothing saved"
            )
        st.skipped += 1
        self.consecutive += 1
        accum = self.engine.gradient_accumulation_steps()
        self.log.info(
            f"non-finite loss at global step {st.global_step + 1}: its whole accumulation window "
            f"({accum} micro-batch(es)) is skipped on every rank ({st.skipped} so far)"
        )
        if self.consecutive >= r.nonfinite_max_consecutive:
            raise NonFiniteLoss(
                f"{self.consecutive} non-finite micro-batches in a row (nonfinite_max_consecutive="
                f"{r.nonfinite_max_consecutive}) at global step {st.global_step + 1}; "
                "stopping, nothing saved"
            )

    def _log_interval(self, lr: float | None, norm: Any) -> None:
        """Read what a logged row needs (host syncs allowed here) and write it."""
        from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import (CLI start-up)

        iv, self._interval = self._interval, LogInterval()
        st = self.state
        heads = {h: float(v) / max(1, iv.n) for h, v in iv.heads.items()}
        grad_norm = as_float(norm)
        get_accelerator().synchronize()  # the interval's wall time includes its device work
        now = time.perf_counter()
        self._interval.t0 = now
        wall = max(now - iv.t0, 1e-9)
        timed = max(1, iv.timed)
        wait = iv.data_s / timed
        values: dict[str, Any] = {
            "loss": iv.loss / iv.n if iv.n else None,
            "lr": lr,
            "weight_decay": iv.weight_decay,
            "grad_norm": grad_norm,
            "loss_scale": self.loss_scale(),
            "clips_per_s": self.engine.train_batch_size() * timed / wall,
            "data_wait_s": wait,
            "compute_s": max(wall / timed - wait, 0.0),
            "data_wait_frac": min(iv.data_s / wall, 1.0),
            "peak_gib": peak_memory_gib(),
            "skipped_nonfinite": st.skipped,
            "applied_steps": st.applied_steps,  # optimizer updates applied so far (<= global step)
            "overflow_steps": st.overflow_steps,  # fp16 loss-scale overflows (update skipped by DeepSpeed)
            "bad_samples": st.bad_samples,  # unreadable videos / bad rows skipped by the loader so far
        }
        values.update(heads)
        self.log.step(st.epoch, st.global_step, values, steps=iv.steps)

    def restart_interval(self) -> None:
        """Start timing afresh (after evaluation, a checkpoint or an epoch's loader start-up)."""
        iv = self._interval
        iv.t0, iv.data_s, iv.timed = time.perf_counter(), 0.0, 0

    # ------------------------------------------------------------------ checkpoints, evaluation, epochs
    def client_state(self) -> dict[str, Any]:
        """What a checkpoint stores besides DeepSpeed's own state (rng is added by ``ckpt.save``)."""
        client: dict[str, Any] = {**self.state.state_dict(), "model": ckpt.model_identity(self.recipe)}
        if self._shard_loader is not None and self.state.step_in_epoch:  # mid-epoch: litdata's exact position
            client["shard_loader"] = self._shard_loader.state_dict()
        sched = self.engine.lr_scheduler
        if sched is not None and hasattr(sched, "state_dict"):
            client["scheduler"] = sched.state_dict()
        return client

    def save(self) -> str:
        """A checkpoint of the current state (every rank; refuses non-finite weights)."""
        c = self.recipe.checkpoint
        extra = {ema.FILE: self.ema.state_dict()} if self.ema is not None else None
        return ckpt.save(
            self.engine, Path(self.recipe.output_dir), self.state.global_step, self.client_state(), c.keep_last, extra
        )

    def maybe_save(self, steps_per_epoch: int, force: bool = False) -> str | None:
        """Mid-epoch checkpoint every ``checkpoint.every_steps`` (or ``force``: --exit-after-steps);
        none on an epoch's last step, where the epoch-end checkpoint follows evaluation."""
        st, every = self.state, self.recipe.checkpoint.every_steps
        if st.step_in_epoch >= steps_per_epoch:
            return None
        if force or (every and st.global_step % every == 0):
            return self.save()
        return None

    def resume(self, tag: str | None = None) -> bool:
        """Load ``tag`` (default: the newest complete checkpoint) into the engine and the state."""
        client = ckpt.load_latest(
            self.engine, Path(self.recipe.output_dir), tag, trust=self.recipe.model.trust_checkpoint
        )
        if client is None:
            return False
        self.state.load_state_dict(client)
        if self.ema is not None:
            self.ema.load(
                ckpt.checkpoint_dir(self.recipe.output_dir) / client["tag"], self.recipe.model.trust_checkpoint
            )
        self._pending_rng = client["rng"]
        self._shard_position = client.get("shard_loader")
        sched = self.engine.lr_scheduler
        if sched is not None and "scheduler" in client:
            sched.load_state_dict(client["scheduler"])
        st = self.state
        self.log.info(
            f"resumed from {client['tag']}: epoch {st.epoch}, step {st.step_in_epoch} in epoch, "
            f"global step {st.global_step}"
        )
        return True

    def evaluate(self, data: TrainData) -> dict[str, float]:
        """Validation metrics (all ranks, the task's), logged and written to ``metrics.json`` on rank 0."""
        r, st = self.recipe, self.state
        views = r.eval.temporal_views * r.eval.spatial_views
        ctx = EvalContext(
            self.engine, data.val_loader, data.eval_aug, self.device, r, views, self.dtype, bad_log=self.bad_log
        )
        with ema.evaluation_weights(self.ema, r, self.log.info) as weights:
            out = self.task.evaluate(ctx)
            # every rank (the task may run the model), the same weights; rank 0 logs them
            images = self.task.eval_images(ctx, out) if r.logging.tensorboard else {}
        if out.failed:
            self.log.info(failed_line(out.failed))
        self.log.eval(st.epoch, st.global_step, out.metrics)
        self.log.images(st.global_step, images)
        if dist.is_main():
            (Path(r.output_dir) / "metrics.json").write_text(
                json.dumps(
                    {
                        "epoch": st.epoch,
                        "step": st.global_step,
                        **out.metrics,
                        "failed_samples": out.failed,
                        "weights": weights,
                        "eval": out.report,
                    },
                    indent=2,
                )
                + "\n"
            )
        return out.metrics

    def _keep_best(self, metrics: dict[str, float] | None, tag: str, epoch: int) -> None:
        """Record ``tag`` as the best checkpoint when the task's ``best_metric`` improved (rank 0)."""
        name = self.task.best_metric
        if not metrics or name is None or name not in metrics or not dist.is_main():
            return
        keep = self.recipe.checkpoint.keep_last
        if ckpt.record_best(
            self.recipe.output_dir, name, float(metrics[name]), tag, epoch, self.state.global_step, keep
        ):
            self.log.info(f"best checkpoint: {tag} ({name}={metrics[name]:.4f}, epoch {epoch})")

    def train_epoch(self, data: TrainData, exit_after: int | None = None) -> bool:
        """The rest of epoch ``state.epoch``; True when --exit-after-steps stopped it early."""
        st, spe = self.state, data.steps_per_epoch
        for ds in (data.train_set, data.val_set):
            if hasattr(ds, "set_epoch"):
                ds.set_epoch(st.epoch)
        if hasattr(data.train_loader.sampler, "set_epoch"):
            data.train_loader.sampler.set_epoch(st.epoch)
        first = st.step_in_epoch
        skip = first * self.engine.gradient_accumulation_steps() * self.engine.train_micro_batch_size_per_gpu()
        if getattr(data.train_set, "streams_shards", False):
            position, self._shard_position = (self._shard_position if first else None), None
            if first and position is None:
                raise ValueError("data.shards: the checkpoint holds no shard loader position to resume mid-epoch from")
            loader = self._shard_loader = shard_epoch(data.train_loader, st.epoch, position)
        else:
            loader = data.train_loader if first == 0 else loader_skipping(data.train_loader, skip)
        it = iter(loader)
        if self._pending_rng is not None:  # after the iterator drew its worker seeds, as the first run did
            set_rng_state(self._pending_rng)
            self._pending_rng = None
        self.engine.train()
        self.log.start_epoch(st.epoch, spe, initial=first)
        self.restart_interval()
        stop = False
        while st.step_in_epoch < spe and not stop and self.train_step(it):
            stop = exit_after is not None and st.global_step >= exit_after
            self.maybe_save(spe, force=stop)
        self.log.end_epoch()
        del it, loader
        return stop and st.step_in_epoch < spe

    def hparams(self) -> dict[str, Any]:
        """The run's hyperparameters (TensorBoard's HPARAMS tab): the resolved recipe's keys and what DeepSpeed
        resolved (ZeRO stage, world, precision, batch)."""
        e = self.engine
        ds = {"zero_stage": self.stage, "world_size": self.world, "precision": self.precision}
        ds |= {"train_batch_size": e.train_batch_size(), "gradient_accumulation_steps": e.gradient_accumulation_steps()}
        return {**self.recipe.to_dict(), "deepspeed": ds}

    def fit(self, data: TrainData, exit_after: int | None = None) -> TrainState:
        """Epochs from ``state``: train, evaluate every ``eval.every_epochs`` (and last), checkpoint."""
        r, st = self.recipe, self.state
        best = [f"eval/{self.task.best_metric}"] if self.task.best_metric else []
        self.log.run_start(st.global_step, r.to_dict(), self.hparams(), ["train/loss", *best])
        for epoch in range(st.epoch, r.schedule.epochs):
            st.epoch = epoch
            if self.train_epoch(data, exit_after):
                self.log.info(f"stopping after {st.global_step} steps (--exit-after-steps)")
                break
            metrics = None
            if (epoch + 1) % max(1, r.eval.every_epochs) == 0 or epoch + 1 == r.schedule.epochs:
                metrics = self.evaluate(data)
            st.epoch, st.step_in_epoch = epoch + 1, 0
            tag = self.save()
            self._keep_best(metrics, tag, epoch)
            if exit_after is not None and st.global_step >= exit_after:
                self.log.info(f"stopping after {st.global_step} steps (--exit-after-steps)")
                break
        retries = self.download_retries()  # every rank: a collective
        self.log.info(
            f"done: {st.global_step} steps ({st.applied_steps} applied, {st.overflow_steps} fp16 "
            f"overflows), {st.skipped} non-finite micro-batches skipped, {st.bad_samples} bad input "
            f"samples skipped (named in the log above), "
            + (f"{retries} shard download retries since start-up (each named above), " if r.data.shards else "")
            + f"run dir {r.output_dir}"
        )
        return st

    def download_retries(self) -> int:
        """Shard downloads retried in this run (``data.shards`` over http(s):// or s3://), summed over ranks; each
        rank's count includes its DataLoader workers' (a counter in shared memory, :mod:`net_retry`)."""
        if not self.recipe.data.shards:
            return 0
        n = torch.tensor([float(download_retries())], device=self.device)
        return int(dist.all_reduce_sum(n).item()) if self.world > 1 else int(n.item())
