"""Gradient accumulation 2 on 2 CPU ranks (fp32): a non-finite micro-batch skips its whole window on every
rank (ZeRO-0's plain optimizer and ZeRO-2's DeepSpeed-wrapped one), and a run interrupted mid-epoch
after such a skip and resumed reproduces the uninterrupted loss curve and weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, engine_env, launch, losses, write_recipe

pytestmark = pytest.mark.multiprocess
TOL = 1e-5  # fp32 trajectories agree to ~1e-6 across ZeRO stages and after resume (test_multirank)
SCRIPT = Path(__file__).with_name("nan_train.py")
# micro 2 x accum 2 x world 2; 34 train clips -> 17 per rank -> 8 micro-batches -> 4 steps per epoch
BATCH = {"global_batch": 8, "micro_batch": 2}
# rank 1's 4th micro-batch = 2nd half of window 2; rank 0's 9th = 1st half of window 5 (epoch 1)
NAN = "1:4,0:9"


def _train(
    tmp: Path, data: dict, name: str, ds: str, nan: str, *extra: str, pretrained: Path | None = None
) -> tuple[Path, str]:
    run = tmp / name
    model = {"pretrained": str(pretrained)} if pretrained else {}
    recipe = write_recipe(
        tmp / f"{name}.yaml", data, run, batch=BATCH, model=model, checkpoint={"every_steps": 1, "keep_last": 20}
    )
    proc = launch(
        ["--config", str(recipe), "--deepspeed_config", str(REPO / "ds_configs" / f"{ds}.json"), *extra],
        launcher="torchrun",
        script_path=SCRIPT,
        env=engine_env(AVION_TEST_NAN=nan),
    )  # both ranks see it
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return run, log


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    from avion_ds.engine.export import consolidate

    return consolidate(run, f"step_{step:08d}")


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def zero0(tiny_epic: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("accum0")
    # both runs start from the same pretrained weights (also checks that loading and backends are shown)
    from avion_ds.models import create_model

    torch.manual_seed(7)
    weights = tmp / "init.pt"
    torch.save(create_model("vit_test_tiny", heads={"verb": 4, "noun": 3}).state_dict(), weights)
    run, log = _train(tmp, tiny_epic, "zero0", "zero0", NAN, pretrained=weights)
    return {"run": run, "log": log, "losses": losses(run), "weights": weights}


def test_pretrained_load_and_backends_are_shown(zero0: dict) -> None:
    from avion_ds.models.attention import describe_backend

    log, weights = zero0["log"], zero0["weights"]
    assert log.count(f"pretrained {weights}: format avion_ds, backbone 100.0% of parameters matched") == 1  # rank 0
    attn = describe_backend("auto", "cpu", torch.float32, 32)
    assert attn.startswith("sdpa (auto: ")  # no flash on CPU, and the reason is given
    assert f"attention backend {attn} | decoder decord (helper process, timeout 60 s, 1 thread(s) per worker)" in log
    report = json.loads((zero0["run"] / "pretrained_report.json").read_text())
    assert report["backbone_matched_fraction"] == 1.0 and report["missing"] == []


def test_nonfinite_micro_batch_skips_its_whole_window(zero0: dict) -> None:
    run, log = zero0["run"], zero0["log"]
    assert "world 2 | ZeRO-0 | fp32 | global batch 8 = micro 2 x accum 2 x world 2 | 4 steps/epoch" in log
    assert log.count("its whole accumulation window (2 micro-batch(es)) is skipped on every rank") == 2
    # no update in windows 2 and 5 (the earlier half of window 2 was NOT applied either) ...
    assert _same(_weights(run, 1), _weights(run, 2)) and _same(_weights(run, 4), _weights(run, 5))
    # ... and updates in the others: windows never shift, the data position advances per window
    assert not _same(_weights(run, 2), _weights(run, 3)) and not _same(_weights(run, 5), _weights(run, 6))
    rows = {r["step"]: r for r in map(json.loads, (run / "history.jsonl").read_text().splitlines()) if "loss" in r}
    assert sorted(rows) == list(range(1, 9))
    assert [rows[s]["applied_steps"] for s in range(1, 9)] == [1, 1, 2, 3, 3, 4, 5, 6]
    assert rows[2]["grad_norm"] is None and rows[3]["grad_norm"] > 0
    assert rows[8]["skipped_nonfinite"] == 2 and rows[8]["overflow_steps"] == 0
    assert all(torch.isfinite(torch.tensor(v)) for v in zero0["losses"].values())
    client = torch.load(run / "checkpoints" / "step_00000008" / "client_rank0.pt", weights_only=False)
    assert (client["global_step"], client["applied_steps"], client["overflow_steps"]) == (8, 6, 0)
    # the lr schedule follows applied updates (as DeepSpeed does for fp16 overflows)
    assert client["scheduler"]["last_step"] == 6


def test_zero2_resumed_mid_epoch_after_a_skip_matches_uninterrupted(
    zero0: dict, tiny_epic: dict, tmp_path: Path
) -> None:
    run, _ = _train(tmp_path, tiny_epic, "zero2", "zero2", NAN, "--exit-after-steps", "3", pretrained=zero0["weights"])
    assert sorted(losses(run)) == [1, 2, 3]
    # resumed at step 3 of 4 in epoch 0: its micro-batches start at the 7th, so rank 0's 9th is its 3rd
    _, log = _train(tmp_path, tiny_epic, "zero2", "zero2", "0:3", pretrained=zero0["weights"])
    assert "resumed from step_00000003: epoch 0, step 3 in epoch" in log
    got, ref = losses(run), zero0["losses"]
    assert sorted(got) == sorted(ref) == list(range(1, 9))
    for s in ref:
        assert got[s] == pytest.approx(ref[s], abs=TOL), (s, got[s], ref[s])
    assert _same(_weights(run, 1), _weights(run, 2)) and _same(_weights(run, 4), _weights(run, 5))
    mine, base = _weights(run, 8), _weights(zero0["run"], 8)
    for k in base:
        torch.testing.assert_close(mine[k], base[k], rtol=0, atol=1e-5, msg=k)
