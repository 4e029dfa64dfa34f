"""One command-line convention across `avion-ds` subcommands.

* the deepspeed launcher's ``--local_rank=N`` before the subcommand (``--module avion_ds.cli``) is taken;
* every long option is accepted with ``-`` or ``_`` (``--deepspeed_config`` / ``--deepspeed-config``);
* a recipe is ``--config``, a run directory ``--checkpoint`` everywhere; the older positional spellings
  stay accepted with a one-line note; both at once is a usage error;
* the weight EMA is ``--weights ema`` for export and eval alike (the recipe key ``ema.weights``);
* ``--help`` shows defaults and answers before torch is imported (train / eval / models);
* ``avion-ds models`` shows a test-size model's GFLOPs with enough digits (not 0.0).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from avion_ds import cli
from avion_ds.cli.args import respell
from avion_ds.cli.parsers import eval_args, train_args
from tests.helpers import launch


def test_launcher_rank_before_the_subcommand_is_taken(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert cli.main(["--local_rank=1", "models", "vit_test_tiny"]) == 0
    assert "vit_test_tiny" in capsys.readouterr().out
    import os

    assert os.environ["LOCAL_RANK"] == "1"
    assert cli.launcher_rank(["--local-rank", "3", "eval", "--checkpoint", "r"]) == ["eval", "--checkpoint", "r"]


@pytest.mark.multiprocess
def test_deepspeed_launcher_module_cli() -> None:
    """`deepspeed --num_gpus 2 --module avion_ds.cli <command>`: each rank gets ``--local_rank=N`` first."""
    proc = launch(["models", "vit_test_tiny"], nprocs=2, launcher="deepspeed", module="avion_ds.cli", timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "unknown command" not in proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.split()[:1] == ["vit_test_tiny"]]
    assert len(rows) == 2, proc.stdout[-3000:]  # one table per rank


def test_every_option_takes_either_spelling() -> None:
    a = train_args(["--config", "r.yaml", "--deepspeed-config", "z.json", "--dry_run", "--resume_from", "none"])
    b = train_args(["--config=r.yaml", "--deepspeed_config=z.json", "--dry-run", "--resume-from", "none"])
    assert vars(a) == vars(b) and a.deepspeed_config == "z.json" and a.dry_run and a.resume_from == "none"
    e = eval_args(["--checkpoint", "run", "--no_per_sample", "--trust_checkpoint", "--max_live_params", "5"])
    assert e.no_per_sample and e.max_live_params == 5 and "model.trust_checkpoint=true" in e.overrides
    known = {"--dry-run", "--local_rank"}
    assert respell(["--dry_run", "--local-rank=2", "--set", "a_b=--c_d", "--", "--dry_run"], known) == [
        "--dry-run",
        "--local_rank=2",
        "--set",
        "a_b=--c_d",
        "--",
        "--dry_run",
    ]


def test_eval_weights_is_the_export_name() -> None:
    assert eval_args(["--checkpoint", "run", "--weights", "model"]).overrides == ["ema.weights=model"]
    with pytest.raises(SystemExit):
        eval_args(["--checkpoint", "run", "--weights", "average"])


@pytest.mark.parametrize(
    ("command", "flag", "argv"),
    [("export", "--checkpoint", ["--out", "m.safetensors"]), ("bench-loader", "--config", [])],
)
def test_positional_spelling_is_an_alias_with_a_note(
    command: str, flag: str, argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    missing = str(tmp_path / "nope")
    assert cli.main([command, missing, *argv]) == 2  # the positional form reaches the same check ...
    out, err = capsys.readouterr()
    assert f"note: avion-ds {command} {missing} is spelled avion-ds {command} {flag} {missing}" in out
    assert cli.main([command, flag, missing, *argv]) == 2  # ... as the flag, without the note
    out, err2 = capsys.readouterr()
    assert "note:" not in out and err2.strip().splitlines()[-1] == err.strip().splitlines()[-1]
    with pytest.raises(SystemExit) as info:
        cli.main([command, missing, flag, missing, *argv])
    assert info.value.code == 2 and f"give {flag} once" in capsys.readouterr().err


def test_help_shows_defaults_and_imports_nothing_heavy() -> None:
    code = (
        "import sys\nfrom avion_ds import cli\n"
        "for c in ('train', 'eval', 'models'):\n"
        "    try:\n        cli.main([c, '--help'])\n    except SystemExit as e:\n        assert e.code == 0\n"
        "heavy = sorted(m for m in ('torch', 'deepspeed', 'avion_ds.models') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "HEAVY []" in proc.stdout
    text = " ".join(proc.stdout.split())  # help lines wrap at the terminal width
    assert "(default: ds_configs/zero2.json)" in text  # train --deepspeed_config
    assert "(default: val)" in text  # eval --split


def test_models_gflops_of_test_sizes_are_not_zero(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["models", "test_tiny"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[1:]]
    shown = {r[0]: r[-1] for r in rows if r[-1] != "-"}
    assert shown and all(float(v) > 0 for v in shown.values()), shown


def test_eval_offload_says_where_the_parameters_went() -> None:
    from avion_ds.cli.eval import offload_line

    cpu = offload_line(eval_args(["--checkpoint", "r", "--offload", "cpu", "--max-live-params", "1e5"]))
    assert "parameters offloaded to CPU memory" in cpu and "at most 100,000 live parameters" in cpu
    assert "NVMe (/nv)" in offload_line(eval_args(["--checkpoint", "r", "--offload", "nvme", "--nvme-path", "/nv"]))
