"""The UMT teacher's holding rule (``avion_ds.tasks.umt.teacher``): frozen, eval mode whatever the student's
mode, outside the student's parameters, state dict and optimizer groups, unchanged by optimizer steps; and the
task's model built from a recipe: the student's weights, its decoders, the teacher attached; the teacher file
read once, through the project's weight loading (its report and the normalisation line); and no loader-side
mask drawn for ``attention`` masking (the loss draws it)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from avion_ds.engine.optim import optimizer_groups
from avion_ds.models import create_model
from avion_ds.tasks import build_recipe, task_of
from tests.helpers.data import placeholder_chunks
from tests.helpers.umt import tiny_umt_recipe


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("umt_teacher")
    recipe = build_recipe(tiny_umt_recipe(tmp, drop_path_rate=0.1))
    task = task_of(recipe)
    return recipe, task, task.build_model(recipe, pretrained="")


def test_the_teacher_is_frozen_and_outside_the_trained_module(built: tuple) -> None:
    recipe, _, model = built
    teacher = model.frozen_teacher
    ours = {id(p) for p in model.parameters()}
    assert not any(id(p) in ours for p in teacher.parameters())
    assert all(not p.requires_grad for p in teacher.parameters())
    assert not any("tower" in k or "teacher" in k for k in model.state_dict())
    grouped = {id(p) for g in optimizer_groups(model, recipe) for p in g["params"]}
    assert grouped == {id(p) for p in model.parameters() if p.requires_grad}
    model.train()
    assert not teacher.training and not teacher.tower.training
    assert model.training


def test_steps_train_the_student_and_leave_the_teacher(built: tuple) -> None:
    recipe, task, model = built
    teacher = model.frozen_teacher
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(2):
        batch = task.synthetic_batch(recipe, 2)
        loss, logged = task.loss(model, batch["frames"], batch["label"], torch.float32, recipe)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss) and set(logged) == {"loss_clip"}
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, student_before[k])]
    assert any(k.startswith("clip_decoder.") for k in changed) and any(k.startswith("blocks.") for k in changed)


def test_the_loaded_teacher_is_the_files_tower(built: tuple) -> None:
    """The tower's weights are the dual encoder's video tower (positions resized to the 16 px frames)."""
    _, _, model = built
    teacher = model.frozen_teacher
    torch.manual_seed(0)  # the fixture's dual encoder again
    clip = create_model("clip_vit_test_tiny")
    for name, p in teacher.tower.named_parameters():
        src = dict(clip.visual.named_parameters())[name]
        if name == "pos_embed":
            assert p.shape == (1, 5, 64) and src.shape == (1, 17, 64)
            assert torch.equal(p[:, 0], src[:, 0])  # the class token's entry is kept
        else:
            assert torch.equal(p, src), name


def test_the_teacher_loads_through_the_one_entry_point_once(
    tmp_path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OpenAI-layout teacher goes through ``load_and_report``: its line names the format and CLIP's
    statistics, a recipe on ImageNet's gets the one mismatch line every task gives, and the start-up check
    plus the build read the file once."""
    from avion_ds.models.weights import loading
    from tests.models.test_umt_fidelity import openai_state_dict

    path = tmp_path / "ViT-tiny.safetensors"
    save_file(openai_state_dict(16, 0), str(path))
    recipe = build_recipe(
        {
            "task": "umt",
            "model": {"name": "vit_test_tiny", "tubelet_size": 1},
            "data": {
                "root": str(placeholder_chunks(tmp_path / "chunks")),
                "num_frames": 4,
                "size": 32,
                "mean_std": "imagenet",
            },
            "umt": {"teacher": str(path), "teacher_model": "clip_vit_test_tiny", "clip_input_resolution": 16},
            "precision": "fp32",
        }
    )
    reads: list[str] = []
    real = loading.load_weights
    monkeypatch.setattr(
        loading, "load_weights", lambda model, source, **kw: reads.append(source) or real(model, source, **kw)
    )
    task = task_of(recipe)
    task.check_model(recipe)
    model = task.build_model(recipe, pretrained="")
    out = capsys.readouterr().out
    assert reads == [str(path)], reads
    line = next(x for x in out.splitlines() if x.startswith("umt teacher: pretrained"))
    assert "format dual_encoder, backbone 100.0%" in line and "clip" in line.split("|")[-1].lower(), line
    assert "data.mean_std=imagenet but the pretrained weights were trained with clip" in out, out
    assert model.frozen_teacher.tower.proj.shape == (64, 16)


def test_attention_masking_draws_only_a_seed_loader_side() -> None:
    """The loader's ``mask`` for ``attention`` is an all-visible placeholder of the collate's shape, and
    ``mask_seed`` the one number drawn from the clip's stream (the device draws the mask from it)."""
    import numpy as np

    from avion_ds.tasks.umt.masking import loader_masks

    rng = np.random.default_rng(0)
    expected = int(np.random.default_rng(0).integers(0, 2**62))
    out = loader_masks((4, 2, 2), "attention", 0.8).draw(rng)
    assert set(out) == {"mask", "mask_seed"} and out["mask"].shape == (16,) and out["mask"].dtype == bool
    assert not out["mask"].any() and out["mask_seed"].dtype == np.int64 and int(out["mask_seed"]) == expected
    state = rng.bit_generator.state
    tube = loader_masks((4, 2, 2), "tube", 0.5).draw(rng)["mask"]
    assert tube.shape == (16,) and tube.sum() == 8 and rng.bit_generator.state != state
