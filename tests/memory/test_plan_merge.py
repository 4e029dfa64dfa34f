"""The planner turns token merging or patch dropout on only when the user allows it (``model.plan_may_merge_tokens``
/ ``--may-merge-tokens``, ``model.plan_may_drop_patches`` / ``--may-drop-patches``) and nothing fits without it;
it then takes the mildest setting that fits (merging first) and names it in its recipe overrides. Off (the
default) it never does; a recipe that merges is planned with its merging."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from avion_ds.cli import plan as plan_cli
from avion_ds.memory.plan import Hardware, Request, plan, recipe_overrides
from avion_ds.memory.plan_tokens import merge_choices, plan_fewer_tokens

MODEL, FRAMES, SIZE = "vit_test_tiny", 16, 64  # 128 tokens, depth 2


def _req(gpu_mem: int) -> Request:
    return Request(MODEL, FRAMES, SIZE, gpu_mem, 1, 1, None, None, "fp32", None, 8, Hardware())


@pytest.fixture(scope="module")
def short() -> int:
    """GPU memory between the least the model needs merging 16 tokens per block and without merging."""
    huge = _req(2**50)
    plain = min(c.peak for c in plan(huge)[0])
    merged = min(c.peak for c in plan_fewer_tokens(huge, token_merge=16)[0])
    assert merged < plain
    return (plain + merged) // 2


def test_merge_choices_are_mildest_first_and_valid() -> None:
    assert merge_choices(_req(2**40)) == [16, 32]  # the last block keeps 3/4, 1/2 (1/4 needs r=48 > 40 in block 1)


def test_planner_merges_only_when_allowed_and_short(short: int) -> None:
    off, _ = plan_fewer_tokens(_req(short))
    assert not any(c.fits for c in off) and all(c.token_merge == 0 for c in off)
    cands, facts = plan_fewer_tokens(_req(short), may_merge=True)
    best = cands[0]
    assert best.fits and facts["token_merge"] == 16 and facts["merged_by_planner"]
    assert "model.token_merge=16" in recipe_overrides(best, _req(short)) and "merge=16" in best.label
    roomy, facts = plan_fewer_tokens(_req(2**40), may_merge=True)  # memory enough: no merging
    assert roomy[0].fits and roomy[0].token_merge == 0 and "token_merge" not in facts
    assert not any(s.startswith("model.token_merge") for s in recipe_overrides(roomy[0], _req(2**40)))


def test_a_recipe_that_merges_is_planned_with_its_merging(short: int) -> None:
    cands, facts = plan_fewer_tokens(_req(short), token_merge=[16, 16])
    assert cands[0].fits and facts["token_merge"] == [16, 16] and "merged_by_planner" not in facts
    assert "model.token_merge=[16,16]" in recipe_overrides(cands[0], _req(short))


def test_cli_names_the_merge_in_its_overrides_only_when_allowed(short: int, capsys: pytest.CaptureFixture) -> None:
    argv = ["--model", MODEL, "--frames", str(FRAMES), "--size", str(SIZE), "--dtype", "fp32"]
    argv += ["--gpu-mem", f"{short}B", "--max-micro-batch", "8"]
    assert plan_cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert "token_merge" not in out + err
    assert plan_cli.main([*argv, "--may-merge-tokens"]) == 0
    out = capsys.readouterr().out
    assert "nothing fits without token merging: the plan merges 16 tokens" in out
    assert "recipe overrides:" in out and "model.token_merge=16" in out.split("recipe overrides:")[1]


def test_recipe_keys_allow_merging_and_dropout(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    model = {"name": MODEL, "heads": {"verb": 4, "noun": 4}}
    recipe.write_text(yaml.safe_dump({"model": {**model, "token_merge": 2}, "data": {"num_frames": FRAMES}}))
    args = argparse.Namespace(config=str(recipe), may_merge_tokens=False, may_drop_patches=False)
    base = {"may_merge": False, "may_drop": False, "token_merge": 0, "patch_dropout": 0.0, "rlt": False}
    assert plan_cli.token_settings(args) == {**base, "token_merge": 2}
    recipe.write_text(yaml.safe_dump({"model": {**model, "plan_may_merge_tokens": True, "patch_dropout": 0.5}}))
    assert plan_cli.token_settings(args) == {**base, "may_merge": True, "patch_dropout": 0.5}
    recipe.write_text(yaml.safe_dump({"model": {**model, "plan_may_drop_patches": True}}))
    assert plan_cli.token_settings(args) == {**base, "may_drop": True}
    flags = argparse.Namespace(config=None, may_merge_tokens=True, may_drop_patches=True)
    assert plan_cli.token_settings(flags) == {"may_merge": True, "may_drop": True}


def test_planner_drops_patches_only_when_allowed_and_short(short: int) -> None:
    """Patch dropout (FLIP) as a planner choice: never unasked, the mildest fraction that fits, after merging
    when both are allowed, named in the overrides; the estimate with dropout is the model's with dropout."""
    off, _ = plan_fewer_tokens(_req(short))
    assert not any(c.fits for c in off)
    cands, facts = plan_fewer_tokens(_req(short), may_drop=True)
    best = cands[0]
    assert best.fits and facts["dropped_by_planner"] and facts["patch_dropout"] == 0.25, facts
    assert best.token_merge == 0 and "patch_dropout=0.25" in best.label
    assert "model.patch_dropout=0.25" in recipe_overrides(best, _req(short))
    both, facts = plan_fewer_tokens(_req(short), may_merge=True, may_drop=True)  # merging is tried first
    assert facts.get("merged_by_planner") and both[0].patch_dropout == 0.0
    from avion_ds.memory.estimate import estimate
    from avion_ds.models import create_model

    e = estimate(create_model(MODEL, num_frames=FRAMES, img_size=SIZE, patch_dropout=0.25), FRAMES, SIZE, 1, "fp32", 0)
    planned = plan_fewer_tokens(_req(2**40), patch_dropout=0.25)[0]
    match = [c for c in planned if c.zero_stage == 0 and c.micro_batch == 1 and not c.checkpoint_every]
    assert match and match[0].estimate["allocated_peak"] == e.allocated_peak


def test_cli_names_patch_dropout_only_when_allowed(short: int, capsys: pytest.CaptureFixture) -> None:
    argv = ["--model", MODEL, "--frames", str(FRAMES), "--size", str(SIZE), "--dtype", "fp32"]
    argv += ["--gpu-mem", f"{short}B", "--max-micro-batch", "8"]
    assert plan_cli.main([*argv, "--may-drop-patches"]) == 0
    out = capsys.readouterr().out
    assert "nothing fits without patch dropout: the plan drops 0.25 of the patches" in out
    assert "model.patch_dropout=0.25" in out.split("recipe overrides:")[1]
