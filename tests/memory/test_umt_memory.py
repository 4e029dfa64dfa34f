"""The memory planner counts a UMT step (``avion_ds.tasks.umt.memory``): the student's visible-token
activations equal the exact saved-tensor count on CPU (every checkpoint policy, both dtypes, drop path), the
teacher saves nothing for backward and its float32 parameters are what every rank holds, and `avion-ds plan
--config` of a umt recipe adds them to the student's states. Activation checkpointing applies to the
student: the checkpointed student's loss and gradients are the plain one's."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from avion_ds.memory.activations import SavedTensorTracker, measure_activation_bytes
from avion_ds.models import apply_activation_checkpointing
from avion_ds.models.vit.model import VideoViT
from avion_ds.tasks import build_recipe, task_of
from avion_ds.tasks.umt.losses import per_clip_loss, visible_targets
from avion_ds.tasks.umt.masking import attention_mask
from avion_ds.tasks.umt.memory import (
    arch_info_of_tower,
    student_activation_bytes,
    teacher_forward_peak,
    teacher_held_bytes,
    teacher_parameter_bytes,
    umt_estimate,
    visible_tokens,
)
from avion_ds.tasks.umt.model import UMTStudent, student_arch
from avion_ds.tasks.umt.task import student_geometry
from avion_ds.tasks.umt.teacher import ClipTeacher, tower_arch
from tests.helpers.live_memory import LivePeak
from tests.helpers.umt import tiny_umt_recipe

GRID = (4, 2, 2)  # vit_test_tiny, tubelet 1, 4 frames of 32 px


def _recipe_dict(tmp: Path) -> dict:
    return tiny_umt_recipe(tmp, drop_path_rate=0.0)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("umt_memory")
    recipe = build_recipe(_recipe_dict(tmp))
    task = task_of(recipe)
    return recipe, task, task.build_model(recipe, pretrained=""), tmp


def _student(drop_path: float, depth: int = 3) -> UMTStudent:
    arch = student_arch("vit_test_tiny", {"num_frames": 4, "img_size": 32, "tubelet_size": 1, "depth": depth})
    arch = arch.replace(drop_path_rate=drop_path)
    torch.manual_seed(0)
    return UMTStudent(arch, 16, 2, 1.0)


def _mask(batch: int) -> torch.Tensor:
    attn = torch.rand(batch * GRID[0], GRID[1] * GRID[2])
    return attention_mask(attn, batch, 0.5, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("drop_path", [0.0, 0.1])
def test_student_activations_equal_the_saved_tensor_count(dtype: torch.dtype, drop_path: float) -> None:
    student = _student(drop_path).to(dtype)
    batch = 2
    mask = _mask(batch)
    target = visible_targets(torch.randn(2, batch, 16, 16), mask)

    def forward(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return per_clip_loss(net(x, mask), target, "l2").mean()

    visible = visible_tokens(GRID, "attention", 0.5)
    x = torch.randn(batch, 3, 4, 32, 32)
    cases = ((False, "full", None), (True, "full", None), (2, "full", None), (True, "selective", None))
    for ckpt, policy, first_n in (*cases, (True, "full", 1)):
        measured = measure_activation_bytes(
            student, x, checkpointing=ckpt, first_n=first_n, policy=policy, forward=forward
        )
        predicted = batch * student_activation_bytes(student, visible, 16, dtype, ckpt, policy, first_n)
        assert measured == predicted, (dtype, drop_path, ckpt, policy, first_n, measured, predicted)


def test_the_teacher_saves_nothing_and_its_parameters_are_counted(built: tuple) -> None:
    _, _, model, _ = built
    teacher = model.frozen_teacher
    x = torch.randn(2, 3, 4, 32, 32)
    with torch.enable_grad(), SavedTensorTracker(exclude=teacher) as tracker:
        feats, attn = teacher(x)
    assert tracker.stats.bytes == 0 and tracker.stats.num_saves == 0
    assert feats.nbytes + attn.nbytes == 2 * teacher_held_bytes(2, 16, GRID)
    params = sum(p.numel() * p.element_size() for p in teacher.parameters())
    assert params == teacher_parameter_bytes("clip_vit_test_tiny", 16)
    assert all(p.dtype == torch.float32 for p in teacher.parameters())


@pytest.mark.parametrize(("frames", "size", "layers", "batch"), [(4, 16, 2, 2), (2, 32, 1, 3), (3, 24, 2, 1)])
def test_teacher_forward_peak_equals_the_live_bytes_on_cpu(frames: int, size: int, layers: int, batch: int) -> None:
    """The planner's teacher-forward peak (float32, no autocast: CPU) equals the most bytes the forward holds
    at once, counted op by op, with the clip it reads; the features come back in block order whatever the
    layer count."""
    torch.manual_seed(0)
    arch = tower_arch("clip_vit_test_tiny", size)
    teacher = ClipTeacher(VideoViT(arch), layers, 1.0)
    x = torch.randn(batch, 3, frames, size, size)
    with LivePeak() as live:
        feats, _ = teacher(x)
    per_clip = teacher_forward_peak(arch_info_of_tower(arch), frames, size, size, layers, teacher.output_dim, 4)
    assert live.peak + x.nbytes == batch * per_clip, (live.peak + x.nbytes, batch * per_clip)
    assert feats.shape[0] == layers


def test_the_step_estimate_holds_the_measured_activations_and_the_teacher(built: tuple) -> None:
    """The whole loss (teacher forward, mask, student, loss) saves the estimate's student activations; the
    step's activations are those plus the teacher's outputs (alive beside them until the loss returns), or
    the teacher forward's peak where that is higher."""
    recipe, task, model, _ = built
    batch = 2
    x = torch.randn(batch, 3, 4, 32, 32)
    with torch.enable_grad(), SavedTensorTracker(exclude=model) as tracker:
        _loss, _ = task.loss(model, x, {"mask": None}, torch.float32, recipe)
    e = task.memory_estimator(recipe)(batch, "fp32", 0)
    held = batch * teacher_held_bytes(2, 16, GRID)
    assert tracker.stats.bytes == e.inputs["student_activations"], (tracker.stats.bytes, e.inputs)
    assert e.inputs["teacher_held"] == held
    assert e.activations == max(tracker.stats.bytes + held, e.inputs["teacher_forward_peak"])
    assert e.inputs["teacher_bytes"] == teacher_parameter_bytes("clip_vit_test_tiny", 16)
    arch = student_geometry(recipe)
    for stage in (0, 3):  # the teacher is replicated: its bytes do not shrink with the world size
        one, eight = (
            umt_estimate(recipe, arch, 1, "bf16", stage),
            umt_estimate(recipe, arch, 1, "bf16", stage, world_size=8),
        )
        assert one.inputs["teacher_bytes"] == eight.inputs["teacher_bytes"]
        assert eight.params >= eight.inputs["teacher_bytes"]


def test_checkpointed_student_loss_and_grads_equal_the_plain_one() -> None:
    plain = _student(0.0)
    mask = _mask(2)
    target = visible_targets(torch.randn(2, 2, 16, 16), mask)
    x = torch.randn(2, 3, 4, 32, 32)
    for every, policy in ((1, "full"), (2, "full"), (1, "selective")):
        ckpt = apply_activation_checkpointing(copy.deepcopy(plain), every=every, policy=policy)
        results = []
        for net in (plain, ckpt):
            net.zero_grad()
            loss = per_clip_loss(net(x, mask), target, "l2").mean()
            loss.backward()
            results.append((loss.detach(), {n: p.grad.clone() for n, p in net.named_parameters()}))
        (l0, g0), (l1, g1) = results
        assert torch.equal(l0, l1), (every, policy)
        assert g0.keys() == g1.keys()
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=0, atol=1e-6), (every, policy, n)


def test_plan_with_a_umt_recipe_counts_the_teacher(built: tuple, capsys: pytest.CaptureFixture) -> None:
    from avion_ds.cli import plan as plan_cli
    from avion_ds.memory.plan import plan

    tmp = built[3] / "plan"
    tmp.mkdir()
    path = tmp / "umt.yaml"
    path.write_text(yaml.safe_dump(_recipe_dict(tmp)))
    argv = ["--config", str(path), "--gpu-mem", "1GiB", "--dtype", "fp32", "--top", "3"]
    req = plan_cli.build_request(plan_cli.parse_args(argv))
    assert (req.model, req.frames, req.size) == ("vit_test_tiny", 4, 32) and req.estimator is not None
    cands, _ = plan(req)
    teacher = teacher_parameter_bytes("clip_vit_test_tiny", 16)
    for c in cands:
        assert c.estimate["inputs"]["teacher_bytes"] == teacher and c.estimate["params"] >= teacher, c.label
    assert plan_cli.main(argv) == 0
    assert "best: " in capsys.readouterr().out
