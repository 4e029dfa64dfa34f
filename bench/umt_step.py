"""Per-clip step cost of unmasked-teacher (UMT) distillation vs VideoMAE pretraining vs fine-tuning, one process,
and the pretraining compute each published schedule needs.

Each variant is the recipe as shipped, through its task's ``synthetic_batch`` and ``loss`` (random weights,
float32, batch ``--batch``), one full step: loss, backward, AdamW step:

* ``umt``       ``launch/recipes/umt_vit_b_k710.yaml``: ViT-B/16 student, 8 frames x 224, tubelet 1 (1568
  tokens), attention masking 0.8 (the student sees 40 of 196 tokens per frame, 320 in all), 6 distilled
  layers; the frozen CLIP ViT-B/16 teacher's forward over all 8 frames (8 x 197 tokens) included;
* ``teacher``   that teacher's forward alone (no gradient): the part of the UMT step it takes;
* ``videomae``  ``launch/recipes/pretrain_vit_b_k400.yaml``: ViT-B/16, 16 frames x 224, tubelet 2 (1568
  tokens), tube masking 0.9 (the encoder sees 160), decoder 4 x 384 over all tokens;
* ``finetune``  ``launch/recipes/vit_b_k400.yaml``: ViT-B/16 on all 1568 tokens of 16 x 224, tubelet 2 (the
  8 x 224 tubelet-1 clip UMT fine-tunes on has the same 1568 tokens), 400 classes.

Variants take turns step by step (``--warmup`` rounds first, then ``--iters`` timed rounds; median and best
per variant), so load on a shared machine hits them alike. Then the compute ratio of the published
schedules: VideoMAE-B 1600 epochs of Kinetics-400 (about 240k training clips) vs UMT-B 201 epochs of
Kinetics-710 (0.65M), in measured clip-steps.

    python bench/umt_step.py                      # ViT-B, CPU: ~6 min on 2 cores
    python bench/umt_step.py --tiny               # test-size models (smoke test)
    python bench/umt_step.py --device cuda --dtype bf16 --batch 16   # GPU: bf16 autocast, peak memory per variant
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avion_ds.engine.optim import optimizer_groups
from avion_ds.tasks import load_recipe, task_of

RECIPES = {
    "umt": "launch/recipes/umt_vit_b_k710.yaml",
    "videomae": "launch/recipes/pretrain_vit_b_k400.yaml",
    "finetune": "launch/recipes/vit_b_k400.yaml",
}
# the published schedules: (epochs, training clips per epoch, where the figures come from)
SCHEDULES = {
    "videomae": (
        1600,
        240_000,
        (
            "VideoMAE ViT-B K400 1600 epochs (MCG-NJU/VideoMAE MODEL_ZOO.md: 81.5 top-1); K400 ~240k training "
            "videos (VideoMAE paper, arXiv 2203.12602, Sec. 4)"
        ),
    ),
    "umt": (
        201,
        650_000,
        (
            "UMT-B/16 K710 --epochs 201 (OpenGVLab/unmasked_teacher single_modality/exp/pretraining/"
            "b16_ptk710_f8_res224.sh; 87.4 K400 top-1 after K710 + K400 fine-tuning, MODEL_ZOO.md); K710 0.65M "
            "training videos (OpenGVLab/UniFormerV2 DATASET.md)"
        ),
    ),
}
# test-size overrides (--tiny): the same code paths on tiny models
TINY = {
    "umt": [
        "model.name=vit_test_tiny",
        "data.num_frames=2",
        "data.size=32",
        "umt.teacher_model=clip_vit_test_tiny",
        "umt.clip_input_resolution=16",
        "umt.clip_return_layer=2",
    ],
    "videomae": ["model.name=pretrain_videomae_test_tiny", "data.num_frames=4", "data.size=32"],
    "finetune": ["model.name=vit_test_tiny", "data.num_frames=4", "data.size=32", "eval.protocol=custom"],
}


def recipe_for(kind: str, tiny: bool):
    """The shipped recipe of ``kind``, in float32, no weights files (``--tiny``: test-size models)."""
    over = ["precision=fp32"]
    if kind == "umt":
        over.append("umt.teacher=random")  # never read: the bench builds the teacher with random weights
    return load_recipe(REPO / RECIPES[kind], over + (TINY[kind] if tiny else []))


def build(kind: str, recipe) -> torch.nn.Module:
    """The recipe's model with random weights; UMT's teacher built as the task builds it, weights random."""
    task = task_of(recipe)
    if kind != "umt":
        return task.build_model(recipe, pretrained="")
    from avion_ds.models.vit.model import VideoViT
    from avion_ds.tasks.umt.task import build_student
    from avion_ds.tasks.umt.teacher import ClipTeacher, tower_arch

    u = recipe.umt
    teacher = ClipTeacher(
        VideoViT(tower_arch(u.teacher_model, u.clip_input_resolution)), u.clip_return_layer, u.clip_return_interval
    )
    student = build_student(recipe, teacher.output_dim, None)
    student.attach_teacher(teacher)
    return student


def autocast(device: str, dtype: str):
    """bf16 autocast on CUDA when asked (the engine's mixed precision), else a no-op context."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda") and dtype == "bf16")


def step_of(
    kind: str, recipe, model: torch.nn.Module, batch_size: int, device: str = "cpu", dtype: str = "fp32"
) -> Callable[[], None]:
    """One training step of the task on a fixed synthetic batch: loss, backward, AdamW step."""
    task = task_of(recipe)
    torch.manual_seed(0)
    batch = task.synthetic_batch(recipe, batch_size, device=device)
    opt = torch.optim.AdamW(optimizer_groups(model, recipe), lr=1e-4, betas=tuple(recipe.optim.betas))
    model.train()

    def step() -> None:
        with autocast(device, dtype):
            loss, _ = task.loss(model, batch["frames"], batch["label"], torch.float32, recipe)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def teacher_step(recipe, model: torch.nn.Module, batch_size: int, device: str = "cpu") -> Callable[[], None]:
    """The UMT teacher's forward alone on the same clips (it applies its own autocast where the device has it)."""
    frames = task_of(recipe).synthetic_batch(recipe, batch_size, device=device)["frames"]
    teacher = model.frozen_teacher

    def step() -> None:
        with torch.no_grad():
            teacher(frames)

    return step


def sync(device: str) -> None:
    """Wait for queued CUDA work so wall time covers the step."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved(
    steps: dict[str, Callable[[], None]], iters: int, warmup: int, device: str = "cpu"
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Wall seconds of ``iters`` steps of each variant after ``warmup`` rounds, one step of each in turn, and
    each variant's peak CUDA bytes allocated during its step above what was allocated before it (CUDA only)."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    out: dict[str, list[float]] = {k: [] for k in steps}
    peak: dict[str, int] = {}
    cuda = device.startswith("cuda")
    for _ in range(iters):
        for k, step in steps.items():
            sync(device)
            if cuda:
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            step()
            sync(device)
            out[k].append(time.perf_counter() - t)
            if cuda:
                peak[k] = max(peak.get(k, 0), torch.cuda.max_memory_allocated() - base)
    return out, peak


def describe(recipes: dict, models: dict) -> None:
    """What each step processes: frames, token grid, masking."""
    for kind, r in recipes.items():
        m = models[kind]
        t, h, w = getattr(m, "encoder", m).patch_embed.grid
        line = f"  {kind:9s} {r.model.name}, {r.data.num_frames} frames x {r.data.size} px, grid {t}x{h}x{w} = {t * h * w} tokens"
        if kind == "umt":
            u = r.umt
            line += (
                f", {u.mask_type} mask {u.mask_ratio}, {u.clip_return_layer} layers distilled from "
                f"{u.teacher_model} at {u.clip_input_resolution} px (its forward over every frame)"
            )
        elif kind == "videomae":
            line += f", {r.pretrain.mask_type} mask {r.pretrain.mask_ratio}, decoder over all tokens"
        print(line)


def teacher_peak_vs_planner(recipe, measured: int, batch: int) -> None:
    """The planner's teacher-forward peak (``tasks/umt/memory.py``, an upper estimate) against the measured one;
    the measured figure adds the input clips, which the planner counts and the step found allocated."""
    from avion_ds.tasks.umt.memory import umt_estimate
    from avion_ds.tasks.umt.task import student_geometry

    d = recipe.data
    est = umt_estimate(recipe, student_geometry(recipe), batch, "bf16", 0)
    planned = est.inputs["teacher_forward_peak"]
    measured += batch * 3 * d.num_frames * d.size * d.size * 4
    print(
        f"[teacher peak] planner {planned / 2**30:.3f} GiB, measured {measured / 2**30:.3f} GiB "
        f"(planner / measured x{planned / measured:.2f})"
    )


def compute_ratio(sec: dict[str, float], batch: int) -> None:
    """The published schedules in measured clip-seconds, the arithmetic printed."""
    cost = {}
    for kind in ("videomae", "umt"):
        epochs, clips, source = SCHEDULES[kind]
        per_clip = sec[kind] / batch
        cost[kind] = epochs * clips * per_clip
        print(
            f"  {kind:9s} {epochs} epochs x {clips:,} clips x {per_clip:.3f} s/clip = {cost[kind] / 3600:,.0f} "
            f"CPU-process hours  [{source}]"
        )
    e_m, n_m, _ = SCHEDULES["videomae"]
    e_u, n_u, _ = SCHEDULES["umt"]
    clip_ratio = (e_m * n_m) / (e_u * n_u)
    step_ratio = sec["umt"] / sec["videomae"]
    print(
        f"  videomae / umt = ({e_m} x {n_m:,}) / ({e_u} x {n_u:,}) clip-steps / (umt step / videomae step) = "
        f"{clip_ratio:.2f} / {step_ratio:.2f} = x{clip_ratio / step_ratio:.2f} (UMT needs "
        f"{step_ratio / clip_ratio:.2f} of VideoMAE-B's pretraining compute)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds of every variant first")
    p.add_argument("--iters", type=int, default=3, help="timed rounds")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--tiny", action="store_true", help="test-size models (the smoke test)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast on CUDA")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    recipes = {k: recipe_for(k, args.tiny) for k in RECIPES}
    models = {k: build(k, r).to(args.device) for k, r in recipes.items()}
    steps = {k: step_of(k, recipes[k], models[k], args.batch, args.device, args.dtype) for k in RECIPES}
    steps["teacher"] = teacher_step(recipes["umt"], models["umt"], args.batch, args.device)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(
        f"torch {torch.__version__}, {where}, {args.dtype}, batch {args.batch}, "
        f"{args.warmup} warm-up + {args.iters} timed rounds, variants alternating:"
    )
    describe(recipes, models)
    times, peak = interleaved(steps, args.iters, args.warmup, args.device)
    med = {k: statistics.median(v) for k, v in times.items()}
    head = f"  {'variant':10s}{'median s/step':>15s}{'best s/step':>13s}{'s/clip':>9s}{'vs finetune':>13s}"
    print(head + (f"{'peak GiB':>10s}" if peak else ""))
    for k in ("umt", "teacher", "videomae", "finetune"):
        mem = f"{peak[k] / 2**30:10.2f}" if peak else ""
        print(
            f"  {k:10s}{med[k]:15.4f}{min(times[k]):13.4f}{med[k] / args.batch:9.4f}"
            f"{med[k] / med['finetune']:12.2f}x{mem}"
        )
    print(
        f"  teacher forward = {med['teacher'] / med['umt']:.0%} of the UMT step; UMT step / VideoMAE step "
        f"x{med['umt'] / med['videomae']:.2f}"
    )
    if peak:
        teacher_peak_vs_planner(recipes["umt"], peak["teacher"], args.batch)
    print("[compute] pretraining to the published results, measured step costs (medians):")
    compute_ratio(med, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
