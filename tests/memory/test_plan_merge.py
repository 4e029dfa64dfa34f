"""The planner turns token merging on only when the user allows it (``model.plan_may_merge_tokens`` /
``--may-merge-tokens``) and nothing fits without it; it then takes the mildest r that fits and names it in
its recipe overrides. Off (the default) it never merges; a recipe that merges is planned with its merging."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from avion_ds.cli import plan as plan_cli
from avion_ds.memory.plan import Hardware, Request, merge_choices, plan, plan_merging, recipe_overrides

MODEL, FRAMES, SIZE = "vit_test_tiny", 16, 64  # 128 tokens, depth 2


def _req(gpu_mem: int) -> Request:
    return Request(MODEL, FRAMES, SIZE, gpu_mem, 1, 1, None, None, "fp32", None, 8, Hardware())


@pytest.fixture(scope="module")
def short() -> int:
    """GPU memory between the least the model needs merging 16 tokens per block and without merging."""
    huge = _req(2**50)
    plain = min(c.peak for c in plan(huge)[0])
    merged = min(c.peak for c in plan_merging(huge, token_merge=16)[0])
    assert merged < plain
    return (plain + merged) // 2


def test_merge_choices_are_mildest_first_and_valid() -> None:
    assert merge_choices(_req(2**40)) == [16, 32]  # the last block keeps 3/4, 1/2 (1/4 needs r=48 > 40 in block 1)


def test_planner_merges_only_when_allowed_and_short(short: int) -> None:
    off, _ = plan_merging(_req(short))
    assert not any(c.fits for c in off) and all(c.token_merge == 0 for c in off)
    cands, facts = plan_merging(_req(short), may_merge=True)
    best = cands[0]
    assert best.fits and facts["token_merge"] == 16 and facts["merged_by_planner"]
    assert "model.token_merge=16" in recipe_overrides(best, _req(short)) and "merge=16" in best.label
    roomy, facts = plan_merging(_req(2**40), may_merge=True)  # memory enough: no merging
    assert roomy[0].fits and roomy[0].token_merge == 0 and "token_merge" not in facts
    assert not any(s.startswith("model.token_merge") for s in recipe_overrides(roomy[0], _req(2**40)))


def test_a_recipe_that_merges_is_planned_with_its_merging(short: int) -> None:
    cands, facts = plan_merging(_req(short), token_merge=[16, 16])
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


def test_recipe_key_allows_merging(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    model = {"name": MODEL, "heads": {"verb": 4, "noun": 4}}
    recipe.write_text(yaml.safe_dump({"model": {**model, "token_merge": 2}, "data": {"num_frames": FRAMES}}))
    args = argparse.Namespace(config=str(recipe), may_merge_tokens=False)
    assert plan_cli.merge_settings(args) == (False, 2)
    recipe.write_text(yaml.safe_dump({"model": {**model, "plan_may_merge_tokens": True}}))
    assert plan_cli.merge_settings(args) == (True, 0)
    assert plan_cli.merge_settings(argparse.Namespace(config=None, may_merge_tokens=True)) == (True, 0)
