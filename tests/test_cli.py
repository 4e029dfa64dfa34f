"""`avion-ds` command line: --version, models, help text on every flag, one exit-code convention."""

from __future__ import annotations

import argparse
import importlib

import pytest

from avion_ds import cli


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_flag_has_help(command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Every subcommand's every option says what it does (recorded as the parser is built)."""
    missing: list[str] = []
    original = argparse.ArgumentParser.add_argument

    def recording(self: argparse.ArgumentParser, *names: str, **kw: object) -> argparse.Action:
        if not kw.get("help") or kw.get("help") == argparse.SUPPRESS:
            missing.append("/".join(names))
        return original(self, *names, **kw)

    monkeypatch.setattr(argparse.ArgumentParser, "add_argument", recording)
    module = importlib.import_module(cli.COMMANDS[command][0])
    with pytest.raises(SystemExit) as info:
        module.main(["--help"])
    assert info.value.code == 0
    assert "usage: avion-ds" in capsys.readouterr().out
    assert not missing, f"avion-ds {command}: options without help text: {missing}"


BAD_INPUT = [
    ("chunk", ["/nope/videos", "{tmp}/out"]),
    ("synth", ["{tmp}/s", "--num-videos", "0"]),
    ("synth", ["{tmp}/s", "--num-videos", "two"]),
    ("eval", ["--checkpoint", "/nope/run"]),
    ("eval", ["--checkpoint", "{tmp}", "--tag", "step_1"]),
    ("export", ["/nope/run", "--out", "{tmp}/m.safetensors"]),
    ("export", ["{tmp}", "--out", "{tmp}/m", "--format", "onnx"]),
    ("plan", ["--model", "vit_bsae_patch16_224", "--gpu-mem", "24GiB"]),
    ("plan", ["--model", "vit_base_patch16_224", "--gpu-mem", "lots"]),
    ("models", ["vit_nothing"]),
    ("models", ["--frames", "5"]),
    ("train", ["--config", "/nope/r.yaml"]),
    ("train", ["--no-such-flag"]),
    ("embed", ["/nope/videos", "--out", "{tmp}/i", "--checkpoint", "/nope/w.safetensors"]),
    ("search", ["  ", "--index", "{tmp}"]),
]


@pytest.mark.parametrize(("command", "argv"), BAD_INPUT, ids=[f"{c}-{i}" for i, (c, _) in enumerate(BAD_INPUT)])
def test_bad_input_exits_2_with_one_line_for_every_subcommand(
    command: str, argv: list[str], tmp_path, capsys: pytest.CaptureFixture
) -> None:
    """One exit-code convention: 2 = bad input, a single stderr line, for every subcommand."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code = cli.main([command, *argv])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err and err[-1].startswith(f"avion-ds {command}: error: "), err
    assert not any("Traceback" in line for line in err), err


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_version_names_every_library(capsys: pytest.CaptureFixture) -> None:
    import torch

    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    for name in ("avion_ds", "torch", "deepspeed", "flash-attn", "decord", "torchcodec", "PyAV", "CUDA"):
        assert any(line.split()[0] == name for line in out.splitlines()), (name, out)
    assert f"torch         {torch.__version__.split('+')[0]}" in out


def test_models_lists_params_and_gflops(capsys: pytest.CaptureFixture) -> None:
    """Parameters from the meta-device build (its weight init skipped) equal a real build's, for each model
    family (ViT, dual encoder, VideoMAE pretraining); ViT-B matches the published 86.5M."""
    from avion_ds.models import create_model, list_models

    assert cli.main(["models"]) == 0
    rows = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == set(list_models())
    for name in ("vit_test_tiny", "vit_test_small", "clip_vit_test_tiny", "pretrain_videomae_test_tiny"):
        real = sum(p.numel() for p in create_model(name).parameters())
        assert rows[name][7] == f"{real / 1e6:.2f}M"
    assert rows["vit_base_patch16_224"][7] == "86.53M"  # VideoMAE ViT-B/16, 400 classes
    assert float(rows["vit_base_patch16_224"][8]) == pytest.approx(360.7, abs=0.1)


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eval/export bars: shown on rank 0 when stderr is a terminal, silent in logs and CI."""
    import sys

    from avion_ds.distributed.run_log import progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert progress(range(3), "eval").disable
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = progress(range(3), "eval")
    assert not bar.disable and list(bar) == [0, 1, 2]
    import torch.distributed as tdist

    monkeypatch.setattr(tdist, "is_initialized", lambda: False)  # no process group (whatever an earlier test left)
    monkeypatch.setenv("RANK", "1")  # a launcher's rank 1: before the process group, dist reads RANK
    assert progress(range(3), "eval").disable


FROZEN = """import gc, runpy, sys
import avion_ds.cli.models as models, avion_ds.cli.train as train
models.main = train.main = lambda rest: print("frozen", gc.get_freeze_count()) or 0
if sys.argv[1] == "script":
    sys.argv = ["launch/train.py", "--config", "x.yaml"]
    runpy.run_path("launch/train.py", run_name="__main__")
else:
    sys.argv = ["avion-ds", "models"]
    from avion_ds.cli import main
    sys.exit(main())
"""


@pytest.mark.parametrize(("entry", "switch"), [("script", "1"), ("avion-ds", "1"), ("script", "0")])
def test_a_command_process_freezes_its_imports(entry: str, switch: str) -> None:
    """`launch/train.py` and the `avion-ds` script hand their imports' objects to the collector's permanent
    generation before the command runs (full collections skip them); ``main(argv)`` in a caller's process
    does not (the caller's garbage would never be collected); ``AVION_DS_GC_FREEZE=0`` leaves the collector
    alone."""
    import gc
    import subprocess
    import sys

    from tests.helpers import REPO, engine_env

    proc = subprocess.run(
        [sys.executable, "-c", FROZEN, entry],
        cwd=REPO,
        env=engine_env(AVION_DS_GC_FREEZE=switch),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    frozen = int(proc.stdout.split("frozen ")[1])
    assert frozen > 100_000 if switch == "1" else frozen == 0, proc.stdout  # torch alone is ~100k objects
    before = gc.get_freeze_count()
    assert cli.main(["models", "vit_test_tiny"]) == 0
    assert gc.get_freeze_count() == before
