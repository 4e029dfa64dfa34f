"""Trust comes only from the person running THIS command: a ``model.trust_checkpoint: true`` read from a run
directory's ``recipe.yaml`` (downloaded, or persisted by an earlier ``--trust-checkpoint`` run) never lets
eval, export, ``model.pretrained=RUN`` or a resume unpickle a file in full. Payloads (run directory,
TorchScript archive) are refused before any process group or run directory exists, in one line; a
truncated TorchScript pickle is one line too. Every payload is real (``__reduce__`` writing a marker)."""

# ruff: noqa: F811 - tests take the imported ``setup`` fixture as a parameter
from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from avion_ds.cli import eval as eval_cli
from avion_ds.cli import export as export_cli
from avion_ds.cli import train
from avion_ds.config import ConfigError, save_recipe
from avion_ds.storage.torchscript import read_torchscript_state_dict
from avion_ds.tasks import load_recipe
from tests.engine.test_tag_layout import Payload
from tests.engine.test_train_errors import REPO, no_process_group, setup  # noqa: F401 - the fixture

TAG = "step_00000002"


def _run_dir(setup: dict, trust_in_recipe: bool = True) -> tuple[Path, Path]:
    """A run directory whose recipe.yaml says ``model.trust_checkpoint: true`` and whose model states carry
    a payload; returns (run dir, marker)."""
    run, marker = setup["tmp"] / "downloaded", setup["tmp"] / "marker.txt"
    tag = run / "checkpoints" / TAG
    tag.mkdir(parents=True)
    (tag / "COMPLETE.json").write_text('{"tag": "step_00000002", "global_step": 2, "world_size": 1}')
    torch.save({"module": {}, "payload": Payload(marker)}, tag / "mp_rank_00_model_states.pt")
    recipe = {**setup["data"], "output_dir": str(run)}
    recipe["model"] = {**recipe["model"], "trust_checkpoint": trust_in_recipe}
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return run, marker


def _one_error(capsys: pytest.CaptureFixture, code: int, prog: str) -> tuple[str, str]:
    out = capsys.readouterr()
    assert code == 2, out.err
    assert len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err, out.err
    assert out.err.startswith(f"avion-ds {prog}: error: "), out.err
    return out.err.strip(), out.out


def test_eval_of_a_run_dir_whose_recipe_says_trust_refuses_its_payload(
    setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_process_group(monkeypatch)
    run, marker = _run_dir(setup)
    err, out = _one_error(capsys, eval_cli.main(["--checkpoint", str(run)]), "eval")
    assert "mp_rank_00_model_states.pt pickles" in err and "--trust-checkpoint" in err
    assert "model.trust_checkpoint: true in" in out and "is ignored" in out  # said, not silently dropped
    assert not marker.exists()
    # the same recipe passed explicitly is still the run directory's own file
    err, _ = _one_error(capsys, eval_cli.main(["--checkpoint", str(run), "--config", str(run / "recipe.yaml")]), "eval")
    assert "pickles" in err and not marker.exists()
    # this command's flag, or the user's own recipe file, does grant it
    assert eval_cli.setup_eval(
        eval_cli.parse_args(["--checkpoint", str(run), "--trust-checkpoint"])
    ).recipe.model.trust_checkpoint
    own = setup["tmp"] / "mine.yaml"
    own.write_text((run / "recipe.yaml").read_text())
    assert eval_cli.setup_eval(
        eval_cli.parse_args(["--checkpoint", str(run), "--config", str(own)])
    ).recipe.model.trust_checkpoint
    assert not marker.exists()


def test_export_trusts_only_its_flag(setup: dict, capsys: pytest.CaptureFixture) -> None:
    run, marker = _run_dir(setup)
    err, _ = _one_error(capsys, export_cli.main([str(run), "--out", str(setup["tmp"] / "m.safetensors")]), "export")
    assert "pickles" in err and not marker.exists()


def test_a_trusted_run_saves_a_recipe_that_trusts_nothing(tmp_path: Path) -> None:
    """An earlier --trust-checkpoint run: a file dropped into its directory later is not trusted through it."""
    recipe = load_recipe(None, ["data.dataset=kinetics", "model.trust_checkpoint=true", f"output_dir={tmp_path}"])
    save_recipe(recipe, tmp_path / "recipe.yaml")
    assert yaml.safe_load((tmp_path / "recipe.yaml").read_text())["model"]["trust_checkpoint"] is False
    assert recipe.model.trust_checkpoint  # this run itself keeps what its command line said


@pytest.mark.parametrize("route", ["pretrained", "resume"])
def test_train_from_a_run_dirs_recipe_refuses_its_payload_before_any_process_group(
    route: str, setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--config RUN/recipe.yaml`` (it says trust) resuming RUN, or with ``model.pretrained=RUN`` into a
    new output_dir: refused at start-up (no process group, nothing written)."""
    no_process_group(monkeypatch)
    run, marker = _run_dir(setup)
    extra = (
        ["--set", f"model.pretrained={run}", "--set", f"output_dir={setup['tmp'] / 'new'}"]
        if route == "pretrained"
        else []
    )
    argv = ["--config", str(run / "recipe.yaml"), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json"), *extra]
    err, _ = _one_error(capsys, train.main(argv), "train")
    assert "mp_rank_00_model_states.pt pickles" in err, err
    assert err.startswith("avion-ds train: error: " + ("model.pretrained" if route == "pretrained" else "resume"))
    assert not marker.exists() and not (setup["tmp"] / "new").exists()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "recipe.yaml"]  # nothing written


def test_resume_of_a_payload_is_refused_before_any_process_group(
    setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's own recipe (no trust) resuming a run directory holding a payload: start-up refusal, not
    one after the engine is built."""
    no_process_group(monkeypatch)
    run, marker = _run_dir(setup, trust_in_recipe=False)
    argv = ["--config", str(setup["recipe"]), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json")]
    err, _ = _one_error(capsys, train.main([*argv, "--set", f"output_dir={run}"]), "train")
    assert err.startswith("avion-ds train: error: resume: checkpoint") and "pickles" in err
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# TorchScript archives
# ---------------------------------------------------------------------------------------------
def _archive(path: Path, data_pkl: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("evil/data.pkl", data_pkl)
        z.writestr("evil/constants.pkl", pickle.dumps(()))
        z.writestr("evil/code/__torch__.py", "")
    return path


def _scripted(path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated; OpenAI's files were made with it
        torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), str(path))
    return path


def _truncated(path: Path) -> Path:
    """A real TorchScript archive whose data.pkl lost its second half."""
    src = _scripted(path.with_name("whole.pt"))
    buf = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(buf, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            zout.writestr(name, data[: len(data) // 2] if name.endswith("/data.pkl") else data)
    path.write_bytes(buf.getvalue())
    return path


def _constants_payload(path: Path, payload: bytes) -> Path:
    """A real TorchScript archive whose constants.pkl is replaced by ``payload`` (data.pkl is clean)."""
    src = _scripted(path.with_name("whole.pt"))
    buf = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(buf, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, payload if name.endswith("/constants.pkl") else zin.read(name))
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("how", ["--finetune-from", "model.pretrained"])
@pytest.mark.parametrize("kind", ["payload", "truncated", "constants"])
def test_torchscript_refused_before_any_process_group_in_one_line(
    how: str, kind: str, setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_process_group(monkeypatch)
    marker = setup["tmp"] / "marker.txt"
    path = setup["tmp"] / "ViT-B-16.pt"
    if kind == "payload":
        _archive(path, pickle.dumps(Payload(marker)))
    elif kind == "constants":
        _constants_payload(path, pickle.dumps(Payload(marker)))
    else:
        _truncated(path)
    flag = ["--finetune-from", str(path)] if how == "--finetune-from" else ["--set", f"model.pretrained={path}"]
    argv = ["--config", str(setup["recipe"]), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json"), *flag]
    err, _ = _one_error(capsys, train.main(argv), "train")
    assert err.startswith("avion-ds train: error: model.pretrained") and str(path) in err, err
    if kind in ("payload", "constants"):
        assert "pathlib" in err and "  " not in err
        assert "load it with torch.jit.load yourself only if you trust the file" in err
    else:
        assert "is truncated or corrupt" in err and "nothing was run" in err
    assert not marker.exists() and not (setup["tmp"] / "run").exists()


def test_torchscript_reader_names_a_truncated_pickle_and_scans_a_good_archive(tmp_path: Path) -> None:
    from avion_ds.engine.preflight import check_weights_source

    with pytest.raises(ConfigError, match=r"TorchScript archive .*bad.pt is truncated or corrupt") as info:
        read_torchscript_state_dict(_truncated(tmp_path / "bad.pt"))
    assert "\n" not in str(info.value)
    good = _scripted(tmp_path / "good.pt")
    check_weights_source(str(good), trust=False)  # the start-up scan reads no tensor and accepts it
    assert set(read_torchscript_state_dict(good)) == {"weight", "bias"}
