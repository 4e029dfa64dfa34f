"""`avion-ds plan`: fits, ranks, writes a config train.py accepts, explains impossible and bad input."""

import json
from pathlib import Path

import pytest
import yaml

from avion_ds.cli import plan as plan_cli
from avion_ds.config import Recipe, apply_overrides, recipe_from_dict
from avion_ds.memory import plan as plan_mod
from avion_ds.memory.units import parse_bytes

REPO = Path(__file__).resolve().parents[2]


def test_plan_writes_a_config_the_engine_builder_accepts(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = plan_cli.main(
        [
            "--model",
            "vit_large_patch16_224",
            "--frames",
            "16",
            "--size",
            "224",
            "--gpu-mem",
            "24GiB",
            "--gpus",
            "8",
            "--cpu-mem",
            "256GiB",
            "--global-batch",
            "256",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    assert "candidates fit" in printed and "peak/GPU" in printed and "rel" in printed
    cfg = json.loads(out.read_text())
    overrides = yaml.safe_load(out.with_suffix(".overrides.yaml").read_text())
    assert cfg["zero_optimization"]["stage"] in (0, 1, 2, 3)
    assert overrides["batch"]["global_batch"] == 256 and overrides["model"]["name"] == "vit_large_patch16_224"
    # the predicted peak of the chosen plan fits the budget (and is not trivially small)
    best_line = next(line for line in printed.splitlines() if line.startswith("best:"))
    peak = parse_bytes(best_line.split("predicted peak ")[1].split("/GPU")[0])
    assert parse_bytes("1GiB") < peak <= parse_bytes("24GiB"), best_line
    # what launch/train.py does: recipe + --set overrides, then the one DeepSpeed-config builder
    from avion_ds.distributed.ds_config import build_ds_config

    run_line = next(line for line in printed.splitlines() if line.startswith("run: deepspeed"))
    sets = [part.strip() for part in run_line.split("--set ")[1:]]
    assert f"--deepspeed_config {out}" in run_line and sets
    data = apply_overrides({"data": {"dataset": "kinetics"}}, sets)
    recipe = recipe_from_dict(data)
    built = build_ds_config(cfg, recipe, world_size=8, steps_per_epoch=10)
    assert built["train_batch_size"] == 256
    assert built["train_micro_batch_size_per_gpu"] * built["gradient_accumulation_steps"] * 8 == 256
    assert built["bf16"]["enabled"] is True
    assert recipe.model.activation_checkpointing == bool(overrides["model"]["activation_checkpointing"])


def test_every_fitting_candidate_is_under_budget_and_ranked():
    args = plan_cli.parse_args(
        ["--model", "vit_base_patch16_224", "--gpu-mem", "16GiB", "--gpus", "2", "--global-batch", "64"]
    )
    req = plan_cli.build_request(args)
    cands, facts = plan_mod.plan(req)
    fitting = [c for c in cands if c.fits]
    assert fitting and facts["params"] > 80e6
    assert all(c.peak <= parse_bytes("16GiB") for c in fitting)
    assert all(c.micro_batch * c.grad_accum * 2 == 64 for c in cands)
    speeds = [c.clips_per_s for c in fitting]
    assert speeds == sorted(speeds, reverse=True) and fitting[0].relative_speed == 1.0
    # the cost model charges recompute: same config with checkpointing is predicted slower
    same = {(c.zero_stage, c.offload, c.micro_batch): c for c in fitting if c.checkpoint_every == 0}
    for c in fitting:
        key = (c.zero_stage, c.offload, c.micro_batch)
        if c.checkpoint_every == 1 and key in same:
            assert c.clips_per_s < same[key].clips_per_s


def test_impossible_request_says_why_and_what_is_closest(tmp_path, capsys):
    rc = plan_cli.main(
        ["--model", "vit_giant_patch14_224", "--gpu-mem", "1GiB", "--gpus", "1", "--out", str(tmp_path / "p.json")]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "nothing fits" in err and "vit_giant_patch14_224" in err and "closest" in err and "--gpu-mem" in err
    assert not (tmp_path / "p.json").exists()


def test_host_memory_limit_rules_out_offload(capsys, tmp_path):
    rc = plan_cli.main(
        [
            "--model",
            "vit_giant_patch14_224",
            "--gpu-mem",
            "4GiB",
            "--cpu-mem",
            "8GiB",
            "--out",
            str(tmp_path / "p.json"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "host" in err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--model", "vit_lrge", "--gpu-mem", "24GiB"], "unknown model 'vit_lrge'"),
        (["--model", "vit_base_patch16_224", "--gpu-mem", "24"], "'24' has no unit"),
        (["--model", "vit_base_patch16_224", "--gpu-mem=-24GiB"], "'-24GiB' is negative"),
        (["--model", "vit_base_patch16_224", "--gpu-mem", "24GiB", "--cpu-mem", "256"], "--cpu-mem='256' has no unit"),
        (["--model", "vit_base_patch16_224", "--gpu-mem", "24GiB", "--frames", "15"], "--frames 15 is not divisible"),
        (
            ["--model", "vit_base_patch16_224", "--gpu-mem", "24GiB", "--gpus", "3", "--global-batch", "256"],
            "--global-batch 256 is not divisible by --gpus 3",
        ),
        (["--model", "vit_base_patch16_224", "--gpu-mem", "24GiB", "--gpus", "0"], "--gpus=0 must be positive"),
        (["--model", "vit_base_patch16_224", "--gpu-mem", "24GiB", "--measure"], "--measure needs a CUDA GPU"),
    ],
)
def test_bad_input_one_line_error(argv, fragment, capsys):
    import torch

    if "--measure" in argv and torch.cuda.is_available():
        pytest.skip("--measure is valid on a GPU machine")
    try:
        rc = plan_cli.main(argv)
    except SystemExit as e:  # argparse-level errors
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert fragment in err and len(err.splitlines()) == 1, err


def test_nvme_candidates_only_with_a_path():
    req = plan_cli.build_request(
        plan_cli.parse_args(
            [
                "--model",
                "vit_test_tiny",
                "--frames",
                "4",
                "--size",
                "32",
                "--gpu-mem",
                "1GiB",
                "--nvme-path",
                "/tmp/nvme",
            ]
        )
    )
    cands, _ = plan_mod.plan(req)
    nvme = [c for c in cands if c.offload_device == "nvme" and c.offload != "none"]
    assert nvme
    cfg = plan_mod.ds_config_for(nvme[0], "/tmp/nvme")
    assert cfg["zero_optimization"]["offload_param"]["nvme_path"] == "/tmp/nvme" and "aio" in cfg


def test_recipe_defaults_are_the_contract():
    # the override keys the planner writes must exist in the recipe dataclasses
    data = apply_overrides(
        {},
        plan_mod.recipe_overrides(
            plan_mod.Candidate(3, "all", "cpu", 2, 4, 8),
            plan_cli.build_request(
                plan_cli.parse_args(
                    ["--model", "vit_base_patch16_224", "--gpu-mem", "8GiB", "--gpus", "2", "--global-batch", "64"]
                )
            ),
        ),
    )
    data["data"]["dataset"] = "kinetics"
    recipe = recipe_from_dict(data)
    assert (
        isinstance(recipe, Recipe) and recipe.model.activation_checkpoint_every == 2 and recipe.batch.micro_batch == 4
    )


def _leaves(node, path=""):
    """{dotted path: value} of every leaf of a nested dict (independent of the package's merge code)."""
    if not isinstance(node, dict):
        return {path: node}
    out = {}
    for k, v in node.items():
        out.update(_leaves(v, f"{path}.{k}" if path else k))
    return out


# (stage, offload, device) -> (the ds_configs/*.json it must match, the knobs the plan sets on top of it)
PLAN_KNOBS = {
    (0, "none", "cpu"): ("zero0", set()),
    (1, "none", "cpu"): ("zero1", set()),
    (2, "none", "cpu"): ("zero2", set()),
    (2, "optimizer", "cpu"): ("zero2_offload", set()),
    (3, "none", "cpu"): ("zero3", set()),
    (3, "optimizer", "cpu"): (
        "zero3",
        {"zero_optimization.offload_optimizer.device", "zero_optimization.offload_optimizer.pin_memory"},
    ),
    (3, "all", "cpu"): ("zero3_offload", set()),
    (3, "all", "nvme"): (
        "zero3_nvme",
        {"zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path"},
    ),
}


@pytest.mark.parametrize("shape", list(PLAN_KNOBS), ids=lambda s: f"zero{s[0]}-{s[1]}-{s[2]}")
def test_planned_config_is_the_reference_json_plus_its_knobs(shape):
    """Built by the one builder, a planned config equals the matching hand-tuned JSON's build except for
    the knobs the plan sets (bucket sizes, prefetch, persistence, live parameters: all the JSON's)."""
    from avion_ds.distributed.ds_config import build_ds_config

    name, knobs = PLAN_KNOBS[shape]
    rec = recipe_from_dict(
        {"data": {"dataset": "kinetics"}, "batch": {"global_batch": 64, "micro_batch": 4}, "precision": "bf16"}
    )
    planned = build_ds_config(plan_mod.ds_config_for(plan_mod.Candidate(*shape, 2, 4, 2), "/scratch/nvme"), rec, 8)
    reference = build_ds_config(REPO / "ds_configs" / f"{name}.json", rec, 8)
    got, ref = _leaves(planned), _leaves(reference)
    differ = {k for k in got.keys() | ref.keys() if got.get(k, "<absent>") != ref.get(k, "<absent>")}
    # an offloaded optimizer is DeepSpeed's CPU Adam: the builder writes torch_adam only without offload (CPU)
    differ.discard("optimizer.params.torch_adam")
    assert differ == knobs, sorted(differ)
    if "nvme" in shape:
        assert got["zero_optimization.offload_param.nvme_path"] == "/scratch/nvme"


def test_every_planned_shape_has_a_reference():
    req = plan_cli.build_request(
        plan_cli.parse_args(
            [
                "--model",
                "vit_test_tiny",
                "--frames",
                "4",
                "--size",
                "32",
                "--gpu-mem",
                "80GiB",
                "--nvme-path",
                "/tmp/nvme",
            ]
        )
    )
    cands, _ = plan_mod.plan(req)
    assert {(c.zero_stage, c.offload, c.offload_device) for c in cands} == set(PLAN_KNOBS)


def test_zero3_estimates_count_the_live_parameters_the_written_config_allows() -> None:
    """The planner's ZeRO-3 estimate counts the ``stage3_max_live_parameters`` + prefetch bucket of the JSON it
    writes (zero3*.json: 1e9 + 5e7, the whole of a ViT-g kept gathered), not ``estimate``'s 1e8 default: on an
    H200 ViT-g with parameter offload peaked at 2.46 GiB allocated, where the default predicted 0.73 GiB."""
    from avion_ds.distributed.ds_config import reference_config
    from avion_ds.memory.estimate import arch_info, estimate
    from avion_ds.memory.plan import Candidate, config_knobs, ds_config_for

    for off_opt, off_param in ((False, False), (True, False), (True, True)):
        offload = "all" if off_param else "optimizer" if off_opt else "none"
        written = ds_config_for(Candidate(3, offload, "cpu", 1, 1, 1))["zero_optimization"]
        assert config_knobs(3, off_opt, off_param) == {
            "prefetch_bucket_size": written["stage3_prefetch_bucket_size"],
            "max_live_parameters": written["stage3_max_live_parameters"],
        }
    assert config_knobs(2, True, False) == {} and reference_config("zero3")["zero_optimization"]
    p = arch_info("vit_giant_patch14_224", 16, 224).params
    e = estimate("vit_giant_patch14_224", 16, 224, 1, "bf16", 3, True, True, 1, 1, **config_knobs(3, True, True))
    assert e.params == 2 * p  # every parameter gathered in bf16 (the 1e9 + 5e7 window covers 1.01e9)
    assert abs(e.allocated_peak / (2.46 * 2**30) - 1) < 0.1  # the H200's measured peak (BENCHMARKS.md, giant)
    small = estimate("vit_giant_patch14_224", 16, 224, 1, "bf16", 3, True, True, 1, 1)
    assert small.params < e.params / 5  # the default window: what the planner counted before
