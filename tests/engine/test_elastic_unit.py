"""Elastic-resume pieces without DeepSpeed runs: the universal conversion is atomic (a conversion
killed half-way leaves no ``universal`` folder and is redone), and client files map old -> new ranks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from avion_ds.distributed.rng import rng_state
from avion_ds.engine import elastic


def _fake_converter(monkeypatch: pytest.MonkeyPatch, returncode: int) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        out = Path(cmd[cmd.index("--output_folder") + 1])
        (out / "zero" / "blocks.0.attn.qkv.weight").mkdir(parents=True)
        (out / "zero" / "blocks.0.attn.qkv.weight" / "fp32.pt").write_bytes(b"partial")
        return subprocess.CompletedProcess(cmd, returncode, "", "Killed" if returncode else "")

    monkeypatch.setattr(elastic.subprocess, "run", run)
    return calls


def test_killed_conversion_leaves_no_universal_folder_and_is_redone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = tmp_path / "step_00000004"
    tag.mkdir()
    _fake_converter(monkeypatch, -9)
    with pytest.raises(RuntimeError, match="ds_to_universal failed"):
        elastic.convert_to_universal(tag)
    assert not (tag / "universal").exists()  # only the temp folder holds the half conversion
    calls = _fake_converter(monkeypatch, 0)
    out = elastic.convert_to_universal(tag)
    assert out == tag / "universal" and (out / elastic.DONE).is_file()
    assert not (tag / "universal.tmp").exists()
    assert "--inject_missing_state" in calls[0]
    assert elastic.convert_to_universal(tag) == out and len(calls) == 1  # converted once


def test_client_files_map_old_to_new_ranks(tmp_path: Path) -> None:
    torch.manual_seed(5)
    state = {"epoch": 0, "step_in_epoch": 3, "global_step": 3, "rng": rng_state()}
    torch.save(state, tmp_path / "client_rank0.pt")
    own = elastic.client_for_rank(tmp_path, old_world=1, rank=0)
    assert torch.equal(own["rng"]["torch"], state["rng"]["torch"])
    before = torch.get_rng_state()
    new = elastic.client_for_rank(tmp_path, old_world=1, rank=1)  # a rank the old run did not have
    assert torch.equal(torch.get_rng_state(), before)  # current streams untouched
    assert new["global_step"] == 3 and not torch.equal(new["rng"]["torch"], state["rng"]["torch"])
    again = elastic.client_for_rank(tmp_path, old_world=1, rank=1)
    assert torch.equal(again["rng"]["torch"], new["rng"]["torch"])  # deterministic
    other = elastic.client_for_rank(tmp_path, old_world=1, rank=2)
    assert not torch.equal(other["rng"]["torch"], new["rng"]["torch"])  # no two ranks share a stream


def test_global_batch_kept_across_an_elastic_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``batch.global_batch``, a resume on another world size is refused (one line naming the key and
    both global batches) unless micro x accum was changed to keep the global batch the run dir's previous start
    used; with ``batch.global_batch`` set, or on the same world size, it passes."""
    import json

    from avion_ds.config import ConfigError
    from avion_ds.storage.run_dir import MARKER, checkpoint_dir
    from avion_ds.tasks import load_recipe

    tag = checkpoint_dir(tmp_path) / "step_00000002"
    tag.mkdir(parents=True)
    (tag / MARKER).write_text(json.dumps({"world_size": 1}))
    monkeypatch.setenv("WORLD_SIZE", "2")

    def check(*sets: str) -> None:
        recipe = load_recipe(None, ["data.dataset=kinetics", f"output_dir={tmp_path}", *sets])
        elastic.check_global_batch_kept(recipe, tag.name)

    with pytest.raises(ConfigError, match=r"^batch\.global_batch: not set, .* from 2 to 4 .*=2$"):
        check("batch.global_batch=null", "batch.micro_batch=2")
    check("batch.global_batch=4", "batch.micro_batch=2")  # set: accumulation absorbs the world
    (tmp_path / "ds_config.json").write_text(json.dumps({"train_batch_size": 4}))
    check("batch.global_batch=null", "batch.micro_batch=2")  # the previous start used 4 as well
    with pytest.raises(ConfigError, match="from 4 to 8"):
        check("batch.global_batch=null", "batch.micro_batch=4")
    monkeypatch.setenv("WORLD_SIZE", "1")
    check("batch.global_batch=null", "batch.micro_batch=4")  # the same world size
