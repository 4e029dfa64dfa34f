"""A fresh start (``--resume-from none`` / ``checkpoint.resume: false``) into a directory holding another run
is refused in one line that says how to keep it: the old run's higher steps would win the pruning at once,
and its ``best.json`` would be evaluated as the new run's. Nothing of the old run is touched."""

# ruff: noqa: F811 - tests take the imported ``setup`` fixture as a parameter
from __future__ import annotations

from pathlib import Path

import pytest

from avion_ds.cli import train
from avion_ds.config import ConfigError
from avion_ds.engine import run_checkpoints as ckpt
from avion_ds.tasks import load_recipe
from tests.engine.test_train_errors import REPO, no_process_group, setup  # noqa: F401 - the fixture


def _recipe(run: Path, resume: bool) -> object:
    return load_recipe(None, ["data.dataset=kinetics", f"output_dir={run}", f"checkpoint.resume={str(resume).lower()}"])


@pytest.mark.parametrize("left", ["checkpoints/step_00000040", "best.json", "history.jsonl", "tb"])
def test_fresh_start_into_another_runs_directory_is_refused(left: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / left).parent.mkdir(parents=True, exist_ok=True)
    (run / left).mkdir() if "." not in left else (run / left).write_text("{}")
    with pytest.raises(ConfigError, match=rf"^output_dir {run} holds another run \(") as info:
        ckpt.check_fresh_start(_recipe(run, resume=False))
    text = str(info.value)
    assert "\n" not in text and f"mv {run} {run}.old" in text and "another output_dir" in text
    ckpt.check_fresh_start(_recipe(run, resume=True))  # resuming it is what the directory is for


def test_fresh_start_into_an_empty_or_new_directory_is_fine(tmp_path: Path) -> None:
    ckpt.check_fresh_start(_recipe(tmp_path / "new", resume=False))
    (tmp_path / "empty").mkdir()
    ckpt.check_fresh_start(_recipe(tmp_path / "empty", resume=False))


def test_resume_from_none_into_a_used_run_dir_is_one_line_before_any_process_group(
    setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_process_group(monkeypatch)
    run = setup["tmp"] / "run"
    old = run / "checkpoints" / "step_00000040"
    old.mkdir(parents=True)
    (old / "COMPLETE.json").write_text('{"tag": "step_00000040", "global_step": 40, "world_size": 1}')
    (run / "best.json").write_text('{"metric": "acc", "value": 0.9, "tag": "step_00000040"}\n')
    before = sorted(str(p) for p in run.rglob("*"))
    argv = ["--config", str(setup["recipe"]), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json")]
    code = train.main([*argv, "--resume-from", "none"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"avion-ds train: error: output_dir {run} holds another run") and "best.json" in err
    assert sorted(str(p) for p in run.rglob("*")) == before  # the old run is left as it was
