"""Does unmasked-teacher (UMT) distillation help fine-tuning with 10% of the labels, against scratch and against
VideoMAE pretraining given the same pretraining wall time? On `avion-ds synth` data, CPU, per seed (``--seeds``):

1. Synthetic EPIC-style videos (``make_synthetic_epic``, 96 x 72, ``--background smooth``), chunked, with the
   narrations of their training rows (bench/pretrain_learn.py's ``make_data``).
2. Teacher: the contrastive demo recipe (``launch/recipes/contrastive_demo_cpu.yaml``: ``clip_vit_test_tiny``,
   2 frames x 32 px, its lr, weight decay, batch and epochs) trained on those narrations in a one-process
   loop over cached crops (constant lr, the logit scale clamped as AVION does), saved as its state dict.
   Its frames use the bench's normalisation (``data.mean_std: imagenet``), the one the student's clips have.
   The narrations name every training row's verb and noun: the teacher has seen all the labels through
   text (as a CLIP has seen the web's); the fine-tuning below gets 10% of them.
3. Pretraining, side by side on the same unlabelled clips (steps alternating, each arm until its own steps
   took ``--pretrain-seconds`` of wall time, so both get the same time and the same machine load):
   VideoMAE (``pretrain_videomae_test_tiny``, encoder ``vit_test_tiny`` at 8 frames x 64 px, tubelet 1:
   8 x 4 x 4 tokens; tube masking 0.9) and UMT (the ``umt`` task through ``UMTTask.loss``: student
   ``vit_test_tiny`` of the same geometry, the teacher at 32 px, its 8 px patches a 4 x 4 grid as the
   student's; attention masking ``--umt-mask-ratio``, the last ``--umt-layers`` layers).
4. Fine-tuning ``vit_test_tiny`` (verb + noun heads, the same geometry) on 10% of the training rows from
   scratch, from the VideoMAE encoder and from the UMT student: val top-1 (bench/pretrain_learn.py's
   ``finetune``).

    python bench/umt_learn.py --out /tmp/umt_learn          # 2 seeds, ~14 min on 2 cores
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from pretrain_learn import (
    adamw_loop,
    adamw_steps,
    cache,
    encoder_weights,
    finetune,
    learn_parser,
    make_data,
    masked_loss,
    recon_vs_zero,
    unlabelled_clips,
)
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avion_ds.data import DeviceAugment, build_dataset
from avion_ds.data.masking import MaskSpec
from avion_ds.models import create_model
from avion_ds.tasks import build_recipe, load_recipe, task_of

ENCODER_UMT = {"num_frames": 8, "img_size": 64, "tubelet_size": 1}  # vit_test_tiny's 16 px patches: 4 x 4
TEACHER_RESOLUTION = 32  # the teacher's frames: its training size, 8 px patches -> 4 x 4
ARMS = ("scratch", "videomae", "umt")


def load() -> str:
    return "load " + ", ".join(f"{v:.1f}" for v in os.getloadavg())


def train_teacher(args: argparse.Namespace, root: Path, info: dict) -> Path:
    """The contrastive demo recipe's dual encoder on this data's narrations; its state dict's file."""
    c = root / "chunks"
    recipe = load_recipe(
        REPO / "launch/recipes/contrastive_demo_cpu.yaml",
        [
            f"data.root={c}",
            f"data.train_csv={info['ego4d_train_pkl']}",
            f"data.val_csv={info['mir_test_csv']}",
            f"epic_mir.val_sentences={info['mir_test_sentences']}",
            f"epic_mir.val_relevancy={info['mir_test_relevancy']}",
            "data.mean_std=imagenet",
            "data.workers=0",
            f"data.decode_timeout_s={args.decode_timeout_s}",
            f"seed={args.seed}",
        ],
    )
    task = task_of(recipe)
    torch.manual_seed(args.seed)
    model = task.build_model(recipe, pretrained="")
    ds = build_dataset(recipe.data, "train", seed=args.seed, sections=recipe.sections)
    aug = DeviceAugment(recipe.data, 0, train=False)
    views = []
    for epoch in range(args.teacher_views):  # a few random crops / jitters of each narrated clip
        ds.set_epoch(epoch)
        views.append(cache(ds, aug))
    x = torch.cat([v[0] for v in views])
    tokens = torch.stack([lab["tokens"] for v in views for lab in v[1]])
    epochs = args.teacher_epochs if args.teacher_epochs is not None else recipe.schedule.epochs
    steps = epochs * math.ceil(len(ds) / recipe.batch.global_batch)
    acc: list[float] = []

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        with torch.no_grad():  # AVION's clamp after every step (here: before the next forward)
            model.logit_scale.clamp_(0.0, 4.6052)
        idx = torch.randint(len(x), (recipe.batch.global_batch,), generator=gen)
        loss, logged = task.loss(model, x[idx], {"tokens": tokens[idx]}, torch.float32, recipe)
        acc.append(float(logged.get("clip_acc", float("nan"))))
        return loss

    t0 = time.perf_counter()
    o = recipe.optim
    losses = adamw_loop(model, loss_of, steps, o.lr, args.seed, o.weight_decay, tuple(o.betas))
    tail = slice(-min(20, len(losses)), None)
    print(
        f"[teacher] {recipe.model.name} (contrastive demo recipe), {len(ds)} narrated clips x {args.teacher_views} "
        f"crops, {len(losses)} steps ({epochs} epochs) batch {recipe.batch.global_batch} lr {o.lr}: "
        f"last loss {statistics.mean(losses[tail]):.3f}, clip_acc {statistics.mean(acc[tail]):.1f}% "
        f"({time.perf_counter() - t0:.0f} s, not counted in the pretraining time)"
    )
    path = root / "teacher.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def umt_model(args: argparse.Namespace, root: Path, teacher: Path) -> tuple[torch.nn.Module, object]:
    """The ``umt`` task's student (``vit_test_tiny``, 8 x 64 px, tubelet 1) with ``teacher`` attached, and its recipe."""
    recipe = build_recipe(
        {
            "task": "umt",
            "model": {"name": "vit_test_tiny", "tubelet_size": 1, "drop_path_rate": 0.0},
            "data": {"root": str(root / "chunks"), "num_frames": ENCODER_UMT["num_frames"], "size": 64},
            "umt": {
                "teacher": str(teacher),
                "teacher_model": "clip_vit_test_tiny",
                "clip_input_resolution": TEACHER_RESOLUTION,
                "clip_return_layer": args.umt_layers,
                "mask_type": "attention",
                "mask_ratio": args.umt_mask_ratio,
            },
            "precision": "fp32",
            "seed": args.seed,
        }
    )
    torch.manual_seed(args.seed)
    return task_of(recipe).build_model(recipe, pretrained=""), recipe


def umt_loss(model: torch.nn.Module, recipe, clips: torch.Tensor, batch_size: int) -> Callable:
    """``UMTTask.loss`` of a batch of cached clips (the attention mask drawn from the teacher): ``loss_of``."""
    task, tokens = task_of(recipe), model.patch_embed.num_patches

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        idx = torch.randint(len(clips), (batch_size,), generator=gen)
        unused = {"mask": torch.zeros(batch_size, tokens, dtype=torch.bool)}  # replaced by the attention mask
        return task.loss(model, clips[idx], unused, torch.float32, recipe)[0]

    return loss_of


def umt_val(model: torch.nn.Module, recipe, clips: torch.Tensor, seed: int) -> float:
    """The distillation loss over every held-out clip, the same attention masks every call."""
    model.eval()
    torch.manual_seed(seed)
    unused = {"mask": torch.zeros(len(clips), model.patch_embed.num_patches, dtype=torch.bool)}
    with torch.no_grad():
        return float(task_of(recipe).loss(model, clips, unused, torch.float32, recipe)[0])


def side_by_side(
    loops: dict[str, Iterator[float]], seconds: float, max_steps: int
) -> dict[str, tuple[list[float], float]]:
    """Steps of each loop in turn, each until its own steps have taken ``seconds`` of wall time (at least one
    step, at most ``max_steps``): the same pretraining time, and load on a shared machine hits every loop
    alike. {name: (losses, seconds)}."""
    out: dict[str, tuple[list[float], float]] = {k: ([], 0.0) for k in loops}

    def running(k: str) -> bool:
        losses, used = out[k]
        return not losses or (used < seconds and len(losses) < max_steps)

    while any(running(k) for k in loops):
        for k, it in loops.items():
            if running(k):
                t = time.perf_counter()
                out[k][0].append(next(it))
                out[k] = (out[k][0], out[k][1] + time.perf_counter() - t)
    return out


def pretrain_both(args: argparse.Namespace, root: Path, teacher: Path) -> dict[str, dict]:
    """VideoMAE and UMT on the same unlabelled clips, side by side for ``--pretrain-seconds`` each; the
    weights each hands to fine-tuning."""
    mae = create_model("pretrain_videomae_test_tiny", decoder_dim=64, **ENCODER_UMT)
    spec = MaskSpec(mae.arch.encoder.grid, args.mask_type, args.mask_ratio).validate()
    clips = unlabelled_clips(args, root, spec, ENCODER_UMT)
    xt, xv, vmasks = clips["train"], clips["val"], clips["val_masks"]
    student, recipe = umt_model(args, root, teacher)
    before = recon_vs_zero(mae, xv, vmasks), umt_val(student, recipe, xv, args.seed)
    loops = {
        "videomae": adamw_steps(mae, masked_loss(mae, xt, spec, args.batch, args.seed), args.lr, args.seed),
        "umt": adamw_steps(student, umt_loss(student, recipe, xt, args.batch), args.lr, args.seed),
    }
    ran = side_by_side(loops, args.pretrain_seconds, args.steps)
    after = recon_vs_zero(mae, xv, vmasks), umt_val(student, recipe, xv, args.seed)
    print(
        f"[pretrain] side by side, {args.pretrain_seconds:g} s each ({load()}); {len(xt)} train clips "
        f"({clips['videos']} videos), {len(xv)} val clips (held-out video), batch {args.batch} lr {args.lr}:"
    )
    (mae_losses, mae_s), (umt_losses, umt_s) = ran["videomae"], ran["umt"]
    print(
        f"  videomae {args.mask_type} {args.mask_ratio}: {len(mae_losses)} steps in {mae_s:.0f} s; val recon loss "
        f"{before[0][0]:.4f} -> {after[0][0]:.4f}, predict-zero {after[0][1]:.4f} (ratio {after[0][0] / after[0][1]:.3f})"
    )
    u = recipe.umt
    print(
        f"  umt {u.mask_type} {u.mask_ratio}, {u.clip_return_layer} layers of {u.teacher_model} at "
        f"{u.clip_input_resolution} px: {len(umt_losses)} steps in {umt_s:.0f} s; val distillation loss "
        f"(2 - 2 cos) {before[1]:.4f} -> {after[1]:.4f}"
    )
    return {
        "videomae": encoder_weights(mae),
        "umt": {k: v for k, v in student.state_dict().items() if not k.startswith("clip_decoder.")},
    }


def one_seed(args: argparse.Namespace, seed: int) -> dict[str, dict[str, float]]:
    """Every arm of one seed: {arm: {verb, noun}}."""
    args.seed = seed
    root = Path(args.out) / f"seed{seed}"
    info = make_data(root, seed, args.background, width=96, height=72)
    teacher = train_teacher(args, root, info)
    weights = {"scratch": None, **pretrain_both(args, root, teacher)}
    acc = {arm: finetune(args, root, info, weights[arm], ENCODER_UMT) for arm in ARMS}
    a = acc["umt"]
    print(
        f"[finetune] seed {seed}: 10% of the training rows ({a['labelled_rows']} clips x {args.ft_views} crops), "
        f"{args.ft_steps} steps batch {args.batch} lr {args.ft_lr}, val {a['val_rows']} clips:"
    )
    for arm in ARMS:
        print(f"  {arm:9s} verb top-1 {acc[arm]['verb']:5.1f}  noun top-1 {acc[arm]['noun']:5.1f}")
    return acc


def main(argv: list[str] | None = None) -> int:
    p = learn_parser(__doc__.splitlines()[0], "/tmp/avion_umt_learn")
    p.set_defaults(steps=1_000_000)  # the wall-time budget ends pretraining; --steps caps it (smoke runs)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument(
        "--pretrain-seconds", type=float, default=120.0, help="pretraining wall time of each of VideoMAE and UMT"
    )
    p.add_argument("--umt-mask-ratio", type=float, default=0.8)
    p.add_argument("--umt-layers", type=int, default=2, help="umt.clip_return_layer (both tiny models are 2 deep)")
    p.add_argument("--teacher-epochs", type=int, default=None, help="default: the contrastive demo recipe's")
    p.add_argument("--teacher-views", type=int, default=4)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = [one_seed(args, s) for s in args.seeds]
    print(
        f"[summary] val top-1 per seed {args.seeds} (mean); equal pretraining wall time ~{args.pretrain_seconds:g} s:"
    )
    for arm in ARMS:
        cells = [
            f"{h} "
            + " / ".join(f"{r[arm][h]:.1f}" for r in results)
            + f" ({statistics.mean(r[arm][h] for r in results):.1f})"
            for h in ("verb", "noun")
        ]
        print(f"  {arm:9s} " + "   ".join(cells))
    wins = all(r["umt"][h] > r[o][h] for r in results for h in ("verb", "noun") for o in ("scratch", "videomae"))
    print(f"  UMT above scratch AND VideoMAE on verb and noun in every seed: {'yes' if wins else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
