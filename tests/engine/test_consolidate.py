"""Run directories are read without running code from them.

* ``rundir.zero_state_dict`` (our consolidation, files read with ``weights_only``) equals DeepSpeed's
  own ``zero_to_fp32`` result (full unpickling, trusted here) bit for bit: ZeRO 1/2/3 at world sizes
  1 and 2, fp32 and bf16, with frozen params and two param groups; and it carries what ``zero_to_fp32``
  drops (ZeRO-1's frozen params);
* consolidation and export carry every parameter and buffer of the live model, names and values:
  ZeRO 0-3 x world 1-2, the ViT and the dual encoder (a frozen ``logit_scale``, as MIR fine-tuning);
  a checkpoint whose shards lack a tensor of the module refuses in one line;
* a pickled payload (``__reduce__`` -> ``exec`` writing a marker file) in a ZeRO-0 or ZeRO-2 run's
  model states, a ZeRO-2 optimizer shard or a resumed ``client_rank0.pt`` is refused, by the library
  (``UntrustedCheckpoint`` naming file and type) and by the CLIs (exit 2, one line); the marker is
  never written unless the user trusts the checkpoint, and then it loads;
* shard files missing under COMPLETE.json are one line naming the file; an unfinished newer tag that
  export / eval pass over is said in one line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from avion_ds.cli import export as export_cli
from avion_ds.config import ConfigError
from avion_ds.distributed import dist
from avion_ds.storage import run_dir as rundir
from avion_ds.storage.safe_load import UntrustedCheckpoint
from tests.engine.consolidate_script import CLIP_STAGES, FROZEN, HEADS, LIVE, WS2_RUNS, save_run
from tests.helpers import QUICK_DATA, launch, one_rank_vars, run_process, write_recipe

pytestmark = pytest.mark.multiprocess

TAG = "step_00000002"
WS1_RUNS = ((0, "fp32"), (1, "fp32"), (2, "fp32"), (3, "fp32"), (3, "bf16"))
ZERO_RUNS = [(1, f"z{s}_{p}") for s, p in WS1_RUNS if s] + [(2, f"z{s}_{p}") for s, p in WS2_RUNS if s]
ALL_RUNS = [(w, n) for w, runs in ((1, WS1_RUNS), (2, WS2_RUNS)) for n in [f"z{s}_{p}" for s, p in runs]] + [
    (w, f"clip_z{s}") for w in (1, 2) for s in CLIP_STAGES
]


class Payload:
    """Unpickling this runs ``exec``: it writes ``marker`` (what a malicious checkpoint could do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.fixture(scope="module")
def ws1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ZeRO 0/1/2/3 runs saved by one process (this one)."""
    root = tmp_path_factory.mktemp("ws1")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in one_rank_vars().items():
            mp.setenv(key, value)
        dist.init()
        for stage, precision in WS1_RUNS:
            save_run(root / f"z{stage}_{precision}", stage, precision)
        for stage in CLIP_STAGES:
            save_run(root / f"clip_z{stage}", stage, model="clip")
    return root


@pytest.fixture(scope="module")
def ws2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ZeRO 1/2/3 runs saved by 2 ranks: one torchrun launch."""
    root = tmp_path_factory.mktemp("ws2")
    proc = launch(
        [str(root)],
        nprocs=2,
        launcher="torchrun",
        timeout=400,
        script_path=Path(__file__).with_name("consolidate_script.py"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def _poison(run: Path, name: str, marker: Path) -> Path:
    """Re-save ``run``'s file ``name`` (tag ``TAG``) with a payload entry; returns the file."""
    path = rundir.checkpoint_dir(run) / TAG / name
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: trusted here
    state["payload"] = Payload(marker)
    torch.save(state, path)
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# fidelity: our consolidation == DeepSpeed's zero_to_fp32
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("world", "name"), ZERO_RUNS, ids=[f"ws{w}-{n}" for w, n in ZERO_RUNS])
def test_consolidation_equals_zero_to_fp32_bit_for_bit(
    world: int, name: str, ws1: Path, ws2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    run = (ws1 if world == 1 else ws2) / name
    ref = get_fp32_state_dict_from_zero_checkpoint(str(rundir.checkpoint_dir(run)), tag=TAG)  # trusted
    if name[1] in "23":
        assert set(FROZEN) <= set(ref)  # ZeRO >= 2 saves frozen params; ZeRO-1 does not (nor does the reference)
    real_load, modes = torch.load, []
    monkeypatch.setattr(torch, "load", lambda *a, **k: modes.append(k.get("weights_only")) or real_load(*a, **k))
    ours = rundir.zero_state_dict(rundir.checkpoint_dir(run) / TAG)
    assert modes and all(m is True for m in modes)  # nothing unpickled in full
    assert [k for k in ours if k in ref] == list(ref)
    assert set(ours) - set(ref) == (set(FROZEN) if name[1] == "1" else set())  # what zero_to_fp32 drops
    for k, v in ref.items():
        got = ours[k].materialize()
        assert got.dtype == v.dtype and got.shape == v.shape == ours[k].shape, k
        assert torch.equal(got, v), k
    flat = rundir.consolidate(run)
    assert sorted(flat) == sorted(rundir.clean_key(k) for k in ours)
    assert all(torch.equal(flat[rundir.clean_key(k)], v.float()) for k, v in ref.items())


@pytest.mark.parametrize(("world", "name"), ALL_RUNS, ids=[f"ws{w}-{n}" for w, n in ALL_RUNS])
def test_consolidation_and_export_carry_every_live_tensor(
    world: int, name: str, ws1: Path, ws2: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    run = (ws1 if world == 1 else ws2) / name
    live = torch.load(run / LIVE, map_location="cpu", weights_only=True)
    out = tmp_path / "m.safetensors"
    assert export_cli.main(["--checkpoint", str(run), "--out", str(out)]) == 0
    for got in (rundir.consolidate(run), load_file(str(out))):
        assert sorted(got) == sorted(live)  # every parameter and buffer (a frozen logit_scale too)
        for k, v in live.items():
            assert got[k].dtype == (torch.float32 if v.is_floating_point() else v.dtype), k
            assert torch.equal(got[k].to(v.dtype), v), k  # bf16 runs: the fp32 master rounds to the live weight


def test_export_refuses_a_checkpoint_missing_a_tensor(ws2: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _copy(ws2 / "clip_z3", tmp_path / "run")
    for path in sorted((rundir.checkpoint_dir(run) / TAG).glob("*model_states.pt")):
        state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: trusted here
        del state["frozen_param_shapes"]["logit_scale"]
        torch.save(state, path)
    out = tmp_path / "m.safetensors"
    assert export_cli.main(["--checkpoint", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "logit_scale" in err[0] and err[0].startswith("avion-ds export: error:"), err
    assert not out.exists()


def test_stream_export_holds_one_tensor_at_a_time(ws2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file

    from avion_ds.storage.safetensors_stream import SafetensorsWriter

    alive: list[weakref.ref] = []
    peak = [0]
    real_joined, real_write = rundir._joined, SafetensorsWriter.write

    def joined(*a: object) -> torch.Tensor:
        t = real_joined(*a)
        alive.append(weakref.ref(t))
        return t

    def write(self: SafetensorsWriter, name: str, t: torch.Tensor) -> None:
        peak[0] = max(peak[0], sum(r() is not None for r in alive))
        real_write(self, name, t)

    monkeypatch.setattr(rundir, "_joined", joined)
    monkeypatch.setattr(SafetensorsWriter, "write", write)
    out = tmp_path / "m.safetensors"
    assert export_cli.main(["--checkpoint", str(ws2 / "z3_fp32"), "--out", str(out)]) == 0
    assert peak[0] == 1  # the tensor being written: no other gathered tensor alive
    monkeypatch.setattr(rundir, "_joined", real_joined)
    got, want = load_file(str(out)), rundir.consolidate(ws2 / "z3_fp32")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize(
    "missing", ["zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"]
)
def test_missing_shard_is_one_line_naming_it(
    missing: str, ws2: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = _copy(ws2 / ("z2_fp32" if "optim" in missing else "z3_fp32"), tmp_path / "run")
    (rundir.checkpoint_dir(run) / TAG / missing).unlink()
    with pytest.raises(ConfigError, match=f"checkpoint file missing: .*{TAG}/{missing}"):
        rundir.consolidate(run)
    assert export_cli.main(["--checkpoint", str(run), "--out", str(tmp_path / "m.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and missing in err[0] and err[0].startswith("avion-ds export: error:"), err


def test_export_says_it_passes_over_an_unfinished_newer_tag(
    ws1: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = _copy(ws1 / "z2_fp32", tmp_path / "run")
    newer = rundir.checkpoint_dir(run) / "step_00000004"
    shutil.copytree(rundir.checkpoint_dir(run) / TAG, newer)
    (newer / rundir.MARKER).unlink()  # killed mid-save
    assert export_cli.main(["--checkpoint", str(run), "--out", str(tmp_path / "m.safetensors")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [
        (f"note: {newer} has no {rundir.MARKER} (an unfinished save); using the newest complete checkpoint {TAG}")
    ]


# ---------------------------------------------------------------------------------------------
# pickled code in a run directory
# ---------------------------------------------------------------------------------------------
POISONED = [
    ("z0_fp32", "mp_rank_00_model_states.pt"),
    ("z2_fp32", "mp_rank_00_model_states.pt"),
    ("z2_fp32", "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
]


@pytest.mark.parametrize(("name", "victim"), POISONED, ids=[f"{n}-{v.split('_')[-2]}" for n, v in POISONED])
def test_payload_in_run_dir_never_runs_without_trust(
    name: str, victim: str, ws1: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from avion_ds.models import create_model
    from avion_ds.models.weights.loading import load_and_report

    marker = tmp_path / "pwned"
    run = _copy(ws1 / name, tmp_path / "run")
    bad = _poison(run, victim, marker)
    with pytest.raises(UntrustedCheckpoint, match=rf"{bad} pickles .*\(builtins.exec\)") as info:
        rundir.consolidate(run)
    assert "\n" not in str(info.value) and "--trust-checkpoint" in str(info.value)
    with pytest.raises(UntrustedCheckpoint, match=victim):
        create_model("vit_test_tiny", heads=HEADS, pretrained=str(run))
    with pytest.raises(
        ConfigError, match=rf"model.pretrained={run}: checkpoint {bad} pickles"
    ):  # --set model.pretrained=RUN
        load_and_report(
            create_model("vit_test_tiny", heads=HEADS), str(run), strict=True, trust=False, run_dir=None, is_main=False
        )
    out = tmp_path / "m.safetensors"
    assert export_cli.main(["--checkpoint", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "builtins.exec" in err[0] and "--trust-checkpoint" in err[0]
    assert not marker.exists() and not out.exists()
    assert (
        export_cli.main(["--checkpoint", str(run), "--out", str(out), "--trust-checkpoint"]) == 0
    )  # the user trusts it
    assert marker.exists() and out.is_file()


def test_eval_cli_refuses_payload_in_one_line_and_loads_when_trusted(
    ws1: Path, tiny_epic_quick: dict, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    run = _copy(ws1 / "z2_fp32", tmp_path / "run")
    bad = _poison(run, "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    write_recipe(run / "recipe.yaml", tiny_epic_quick, run, data=QUICK_DATA, eval={"batch_size": 4})
    newer = rundir.checkpoint_dir(run) / "step_00000004"
    newer.mkdir()  # an unfinished save: eval passes over it and says so

    def cli(*extra: str) -> subprocess.CompletedProcess:
        return run_process([sys.executable, "-m", "avion_ds.cli", "eval", "--checkpoint", run, *extra])

    proc = cli()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("avion-ds eval: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1 and str(bad) in errors[0] and "builtins.exec" in errors[0], errors
    assert "--trust-checkpoint" in errors[0]
    assert not marker.exists()
    proc = cli("--trust-checkpoint")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert marker.exists()
    assert f"note: {newer} has no {rundir.MARKER}" in proc.stdout


# ---------------------------------------------------------------------------------------------
# resume
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("victim", ["client_rank0.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"])
def test_resume_refuses_payload_before_deepspeed_opens_the_tag(victim: str, one_rank: None, tmp_path: Path) -> None:
    from tests.engine.tiny_trainer import batches, tiny_trainer

    run, marker = tmp_path / "run", tmp_path / "pwned"
    trainer = tiny_trainer("zero2.json", run, accum=1)
    data = batches()
    trainer.train_step(data)
    tag = trainer.save()
    bad = rundir.checkpoint_dir(run) / tag / victim
    state = torch.load(bad, map_location="cpu", weights_only=False)
    state["payload"] = Payload(marker)
    torch.save(state, bad)

    fresh = tiny_trainer("zero2.json", run, accum=1)
    fresh.engine.load_checkpoint = lambda *a, **k: pytest.fail("DeepSpeed opened the tag")
    with pytest.raises(UntrustedCheckpoint, match=rf"{bad} pickles .*\(builtins.exec\)"):
        fresh.resume()
    assert not marker.exists()
    trusted = tiny_trainer("zero2.json", run, "model.trust_checkpoint=true", accum=1)
    assert trusted.resume()  # --trust-checkpoint: DeepSpeed and our client load read it in full
    assert marker.exists() and trusted.state.global_step == 1


def test_elastic_resume_checks_the_tag_before_converting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from avion_ds.distributed.rng import rng_state
    from avion_ds.engine import elastic

    marker = tmp_path / "pwned"
    tag_dir = rundir.checkpoint_dir(tmp_path) / "step_00000004"
    tag_dir.mkdir(parents=True)
    (tag_dir / rundir.MARKER).write_text('{"world_size": 2}')  # written by 2 ranks; this process is 1
    torch.save({"global_step": 4, "rng": rng_state()}, tag_dir / "client_rank0.pt")
    torch.save({"global_step": 4, "payload": Payload(marker)}, tag_dir / "client_rank1.pt")
    calls: list[list[str]] = []
    monkeypatch.setattr(elastic, "convert_to_universal", lambda d: calls.append([str(d)]) or d / "universal")
    with pytest.raises(UntrustedCheckpoint, match="client_rank1.pt pickles .*builtins.exec"):
        elastic.prepare_resume(tmp_path, {})  # ds_to_universal would unpickle it in full
    assert calls == [] and not marker.exists()
    assert elastic.client_for_rank(tag_dir, old_world=2, rank=0)["global_step"] == 4  # numpy RNG state: allowed
    with pytest.raises(UntrustedCheckpoint, match="client_rank1.pt"):
        elastic.client_for_rank(tag_dir, old_world=2, rank=1)
    assert not marker.exists()
    cfg: dict = {}
    assert elastic.prepare_resume(tmp_path, cfg, trust=True) and calls and cfg["checkpoint"]["load_universal"]
    assert elastic.client_for_rank(tag_dir, old_world=2, rank=1, trust=True)["global_step"] == 4
    assert marker.exists()
