"""`avion-ds plan` offers ``model.activation_checkpoint_policy: selective``: estimated exactly per policy, ranked
between no checkpointing and ``full``, chosen where it is the fastest fit, and named in the overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from avion_ds.cli import plan as plan_cli
from avion_ds.config import apply_overrides, recipe_from_dict
from avion_ds.memory import plan as plan_mod
from avion_ds.memory.estimate import estimate

# ViT-B 16x224, one GPU, global batch 32: no checkpointing fits only at micro-batch 8 in 6 GiB
ARGS = ["--model", "vit_base_patch16_224", "--gpu-mem", "6GiB", "--gpus", "1", "--global-batch", "32"]


def _plan(argv: list[str]) -> list[plan_mod.Candidate]:
    cands, _ = plan_mod.plan(plan_cli.build_request(plan_cli.parse_args(argv)))
    return cands


def test_selective_is_a_candidate_with_its_exact_estimate() -> None:
    cands = _plan(ARGS)
    shapes = {(c.checkpoint_every, c.checkpoint_policy) for c in cands}
    assert shapes == {(0, "full")} | {(k, p) for k in (1, 2, 4) for p in ("full", "selective")}
    for c in cands:
        if c.checkpoint_every != 1 or c.zero_stage != 0 or c.micro_batch != 16:
            continue
        e = estimate("vit_base_patch16_224", 16, 224, 16, "bf16", 0, False, False, 1, 1, gpus_per_node=1,
                     checkpoint_policy=c.checkpoint_policy)  # fmt: skip
        assert c.peak == e.total and c.estimate["activations"] == e.activations
        assert c.estimate["inputs"]["checkpoint_policy"] == c.checkpoint_policy


def test_selective_ranks_between_none_and_full() -> None:
    by_key = {(c.zero_stage, c.offload, c.offload_device, c.micro_batch, c.checkpoint_every, c.checkpoint_policy): c
              for c in _plan(ARGS)}  # fmt: skip
    checked = 0
    for (stage, off, dev, micro, every, policy), sel in by_key.items():
        if policy != "selective":
            continue
        full = by_key[(stage, off, dev, micro, every, "full")]
        none = by_key[(stage, off, dev, micro, 0, "full")]
        assert full.step_s > sel.step_s > none.step_s
        assert full.estimate["activations"] < sel.estimate["activations"] < none.estimate["activations"]
        checked += 1
    assert checked > 50


def test_selective_is_chosen_where_it_is_the_fastest_fit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plan.json"
    assert plan_cli.main([*ARGS, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    best = next(line for line in printed.splitlines() if line.startswith("best:"))
    assert "ckpt=selective every 1 micro=16" in best, best
    fitting = [c for c in _plan(ARGS) if c.fits]
    assert fitting[0].checkpoint_policy == "selective" and fitting[0].checkpoint_every == 1
    assert fitting[0].clips_per_s > max(c.clips_per_s for c in fitting if c.checkpoint_policy == "full")
    # the emitted overrides name the policy, the run line too, and they build a valid recipe
    overrides = yaml.safe_load(out.with_suffix(".overrides.yaml").read_text())
    assert overrides["model"]["activation_checkpoint_policy"] == "selective"
    assert (
        overrides["model"]["activation_checkpoint_impl"] == "torch"
        and overrides["model"]["activation_checkpointing"] is True
    )
    run = next(line for line in printed.splitlines() if line.startswith("run: deepspeed"))
    assert "--set model.activation_checkpoint_policy=selective" in run
    sets = [part.strip() for part in run.split("--set ")[1:]]
    recipe = recipe_from_dict(apply_overrides({"data": {"dataset": "kinetics"}}, sets))
    assert recipe.model.activation_checkpoint_policy == "selective" and recipe.model.activation_checkpointing


def test_full_and_none_plans_name_their_policy() -> None:
    req = plan_cli.build_request(plan_cli.parse_args(ARGS))
    full = plan_mod.recipe_overrides(plan_mod.Candidate(0, "none", "cpu", 2, 16, 2, "full"), req)
    none = plan_mod.recipe_overrides(plan_mod.Candidate(0, "none", "cpu", 0, 8, 4), req)
    assert "model.activation_checkpoint_policy=full" in full and "model.activation_checkpoint_impl=torch" not in full
    assert "model.activation_checkpoint_policy=full" in none and "model.activation_checkpointing=false" in none
    assert plan_mod.Candidate(0, "none", "cpu", 2, 16, 2, "selective").label.endswith(
        "ckpt=selective every 2 micro=16 accum=2"
    )
