"""One contrastive (task ``contrastive``: ClipLoss) or MIR fine-tuning (task ``mir``: max-margin ranking loss)
optimizer step through ``Trainer.train_step`` per ZeRO stage, compared with the gradient of ONE process on the
concatenated batch (run under torchrun; rank 0 prints a ``RESULT`` JSON line per case and stage).

The argument: a JSON list of cases, each ``{"name", "stages", "task", "accum", "freeze", "precision", "ckpt"}``
(the name and stages required), run in ONE launch: the ranks start once for all of them. Every case's ZeRO-3
stage runs after every other stage (zero.Init replaces ``torch.nn.functional.linear`` for the process).

Each rank feeds ``accum`` micro-batches of 2 clips; the optimizer is SGD with lr 1 and no decay, so the
weights' change is minus the applied gradient. Dropout and drop path are off, everything fp32 but a case's
``precision``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
MICRO = 2


def global_batch(world: int, accum: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The concatenated batch (frames, tokens) of every rank's micro-batches, in rank-major order."""
    from avion_ds.data.tokenizer import tokenize

    n = world * accum * MICRO
    g = torch.Generator().manual_seed(123)
    frames = torch.randn(n, 3, 2, 32, 32, generator=g)
    words = ["cut", "wash", "open", "close", "take", "put", "stir", "pour"]
    tokens = tokenize([f"#C C {words[i % 8]} the thing {i // 8}" for i in range(n)])
    return frames, tokens


def full_params(engine, stage: int) -> dict[str, torch.Tensor]:
    import deepspeed

    params = dict(engine.module.named_parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(params.values())):
            return {k: p.detach().clone().float() for k, p in params.items()}
    return {k: p.detach().clone().float() for k, p in params.items()}


def avion_clip_loss(image_features, text_features, logit_scale) -> torch.Tensor:
    """AVION's ``ClipLoss`` on one process (``avion/losses/losses.py``, MIT licence)."""
    logits_per_image = logit_scale * image_features @ text_features.T
    logits_per_text = logit_scale * text_features @ image_features.T
    labels = torch.arange(logits_per_image.shape[0])
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2


def avion_max_margin(image_features, text_features, logit_scale, margin: float = 0.2) -> torch.Tensor:
    """AVION's ``MaxMarginRankingLoss(fix_norm=True)`` on one process (``avion/losses/losses.py``, MIT)."""
    a_n, b_n = text_features.norm(dim=1)[:, None], image_features.norm(dim=1)[:, None]
    a_norm = text_features / torch.max(a_n, 1e-8 * torch.ones_like(a_n))
    b_norm = image_features / torch.max(b_n, 1e-8 * torch.ones_like(b_n))
    x = torch.mm(a_norm, b_norm.transpose(0, 1))
    n = x.size()[0]
    x1 = torch.diag(x).unsqueeze(1).expand(n, n).contiguous().view(-1, 1)
    x1 = torch.cat((x1, x1), 0)
    x2 = torch.cat((x.view(-1, 1), x.transpose(0, 1).contiguous().view(-1, 1)), 0)
    keep = torch.ones(x.shape) - torch.eye(x.shape[0])
    keep1, keep2 = keep.view(-1, 1), keep.transpose(0, 1).contiguous().view(-1, 1)
    keep_idx = torch.nonzero(torch.cat((keep1, keep2), 0).flatten()).flatten()
    x1_, x2_ = torch.index_select(x1, dim=0, index=keep_idx), torch.index_select(x2, dim=0, index=keep_idx)
    return F.relu(margin - (x1_ - x2_)).mean()


REFERENCE_LOSS = {"contrastive": avion_clip_loss, "mir": avion_max_margin}


def reference(weights: dict[str, torch.Tensor], frames: torch.Tensor, tokens: torch.Tensor, recipe) -> tuple:
    """Loss and gradients of one process on the whole batch (a plain model, no DeepSpeed), with AVION's
    loss of the recipe's task on one process written out above."""
    from avion_ds.models import create_model
    from avion_ds.tasks.contrastive.task import _encoder_kwargs

    model = create_model(recipe.model.name, **_encoder_kwargs(recipe))
    model.load_state_dict(weights, strict=True)
    model.train()
    image_features, text_features, logit_scale = model(frames, tokens)
    loss = REFERENCE_LOSS[recipe.task](image_features, text_features, logit_scale)
    loss.backward()
    return float(loss.detach()), {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


TASK_SETS = {
    "contrastive": ["task=contrastive"],
    # the MIR files are read by the dataset only: this script feeds its own batches
    "mir": ["task=mir", "data.dataset=epic_mir", "epic_mir.train_sentences=unused", "epic_mir.train_relevancy=unused"],
}


def setup(
    stage: int, accum: int, freeze: list[str], task: str = "contrastive", precision: str = "fp32", ckpt: bool = False
) -> tuple:
    """Recipe and DeepSpeed config, built before the process group as ``avion-ds train`` does."""
    from avion_ds.distributed import dist
    from avion_ds.distributed.ds_config import build_ds_config
    from avion_ds.tasks import load_recipe

    world = dist.env_world_size()
    recipe = load_recipe(
        None,
        [
            *TASK_SETS[task],
            "model.name=clip_vit_test_tiny",
            "data.num_frames=2",
            "data.size=32",
            f"batch.micro_batch={MICRO}",
            f"batch.global_batch={MICRO * accum * world}",
            f"precision={precision}",
            f"model.activation_checkpointing={str(ckpt).lower()}",
            "optim.lr=1.0",
            "optim.weight_decay=0.0",
            "schedule.fix_lr=true",
            "logging.log_every=1000",
            *[f"contrastive.{f}=true" for f in freeze],
            "output_dir=/tmp/unused",
        ],
    )
    cfg = build_ds_config(REPO / "ds_configs" / f"zero{stage}.json", recipe, world, steps_per_epoch=10)
    cfg.pop("optimizer")
    cfg["zero_allow_untested_optimizer"] = True
    return recipe, cfg


def run_stage(stage: int, accum: int, recipe, cfg) -> dict:
    from avion_ds.distributed import dist
    from avion_ds.engine.parallelize import parallelize
    from avion_ds.engine.trainer import Trainer
    from avion_ds.tasks import task_of

    world, rank = dist.world_size(), dist.rank()
    task = task_of(recipe)
    torch.manual_seed(0)
    model = task.build_model(recipe, ds_config=cfg)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    parallel = parallelize(model, recipe, cfg, steps_per_epoch=10, optimizer=opt)
    trainer = Trainer(parallel, recipe, task)
    before = full_params(trainer.engine, stage)
    frames, tokens = global_batch(world, accum)
    mine = range(rank * accum * MICRO, (rank + 1) * accum * MICRO)
    batches = [
        {
            "frames": frames[list(mine)[m * MICRO : (m + 1) * MICRO]],
            "label": {"tokens": tokens[list(mine)[m * MICRO : (m + 1) * MICRO]]},
        }
        for m in range(accum)
    ]
    assert trainer.train_step(iter(batches))
    iv = trainer._interval
    loss = iv.loss / iv.n
    after = full_params(trainer.engine, stage)
    ref_loss, ref_grads = reference(before, frames, tokens, recipe)
    errors = {}
    for k, w in before.items():
        applied = w - after[k]
        expected = ref_grads.get(k, torch.zeros_like(w))
        # relative to the tensor's largest gradient: fp32 sums taken in another order differ by ~1e-7 of it
        errors[k] = float((applied - expected).abs().max()) / max(1.0, float(expected.abs().max()))
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    applied = torch.cat([(before[k] - after[k]).flatten() for k in before])
    expected = torch.cat([ref_grads.get(k, torch.zeros_like(w)).flatten() for k, w in before.items()])
    cosine = float(torch.nn.functional.cosine_similarity(applied, expected, dim=0))
    return {
        "stage": stage,
        "loss": loss,
        "ref_loss": ref_loss,
        "max_error": max(errors.values()),
        "errors": errors,
        "changed": changed,
        "cosine": cosine,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("cases", help="a JSON list of cases (this module's docstring)")
    args = p.parse_args()
    from avion_ds.distributed import dist

    runs = []  # (case name, stage, accum, setup), ZeRO-3 last
    for case in json.loads(args.cases):
        accum = case.get("accum", 2)
        freeze = [f for f in case.get("freeze", "").split(",") if f]
        kind = (case.get("task", "contrastive"), case.get("precision", "fp32"), case.get("ckpt", False))
        for stage in case["stages"]:
            runs.append((case["name"], stage, accum, setup(stage, accum, freeze, *kind)))
    runs.sort(key=lambda r: r[1] == 3)  # stable: the cases' order otherwise
    dist.init()
    for name, stage, accum, (recipe, cfg) in runs:
        out = run_stage(stage, accum, recipe, cfg)
        if dist.is_main():
            print("RESULT " + json.dumps({"case": name, **out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
