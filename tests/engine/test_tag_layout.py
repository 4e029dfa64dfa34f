"""Every file a resume or load of a checkpoint tag opens goes through the safe loader first, whatever the
layout: symlinks are resolved (one out of the tag is refused, also a linked ``universal/`` or
``universal/zero/`` folder, which ``rglob`` would not even enter), an existing universal folder is
checked like the rest, and a file we do not read is refused in one line. The payloads are real
(``__reduce__`` writing a marker file); a stand-in engine unpickles the tag in full, as DeepSpeed does."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from avion_ds.distributed.rng import rng_state
from avion_ds.engine import elastic
from avion_ds.engine import run_checkpoints as ckpt
from avion_ds.engine.preflight import check_weights_source
from avion_ds.storage import run_dir as rundir
from avion_ds.storage.safe_load import UntrustedCheckpoint
from avion_ds.tasks import load_recipe

TAG = "step_00000004"


class Payload:
    """Unpickling this writes ``marker`` (what a malicious checkpoint could do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.write_text, (self.marker, "ran"))


class FullUnpickler:
    """Stands in for a DeepSpeed engine: ``load_checkpoint`` unpickles every ``*.pt`` of ``load_dir/tag`` in
    full (``weights_only=False``, following symlinks), as DeepSpeed's loaders do."""

    def load_universal_checkpoint(self) -> bool:
        return True

    def load_checkpoint(self, load_dir: str, tag: str, **_: object) -> tuple[str, dict]:
        base = Path(load_dir) / tag
        for f in [*base.glob("*.pt"), *base.glob("*/*.pt"), *base.glob("*/*/*.pt")]:
            torch.load(f, map_location="cpu", weights_only=False)
        return str(base), {}

    optimizer = SimpleNamespace(param_groups=[])


def _tag(run: Path, world: int = 2) -> Path:
    """A complete tag written by ``world`` ranks (this process is one: an elastic resume)."""
    tag = rundir.checkpoint_dir(run) / TAG
    tag.mkdir(parents=True)
    (tag / rundir.MARKER).write_text(json.dumps({"tag": TAG, "global_step": 4, "world_size": world}))
    for r in range(world):
        torch.save({"global_step": 4, "epoch": 0, "step_in_epoch": 4, "rng": rng_state()}, tag / f"client_rank{r}.pt")
    torch.save({"module": {"w": torch.ones(2)}}, tag / "mp_rank_00_model_states.pt")
    return tag


def _universal_link(tag: Path, outside: Path, marker: Path) -> None:
    """(a) ``<tag>/universal`` -> a folder outside the tag: a finished conversion with a payload."""
    outside.mkdir()
    (outside / elastic.DONE).write_text("{}")
    torch.save({"module": {}, "payload": Payload(marker)}, outside / "mp_rank_00_model_states.pt")
    (tag / elastic.UNIVERSAL).symlink_to(outside, target_is_directory=True)


def _zero_link(tag: Path, outside: Path, marker: Path) -> None:
    """(b) a real universal folder whose ``zero/`` links out of the tag; the payload in a ``fp32.pt``."""
    uni = tag / elastic.UNIVERSAL
    uni.mkdir()
    (uni / elastic.DONE).write_text("{}")
    torch.save({"module": {"w": torch.ones(2)}}, uni / "mp_rank_00_model_states.pt")
    (outside / "blocks.0.weight").mkdir(parents=True)
    torch.save({"param": torch.ones(2), "payload": Payload(marker)}, outside / "blocks.0.weight" / "fp32.pt")
    (uni / "zero").symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize("layout", [_universal_link, _zero_link], ids=["universal-symlink", "zero-symlink"])
def test_universal_folder_linked_out_of_the_tag_is_refused(
    layout: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker.txt"
    tag = _tag(run)
    layout(tag, tmp_path / "elsewhere", marker)
    calls: list[Path] = []
    monkeypatch.setattr(elastic, "convert_to_universal", lambda d: calls.append(d) or d / elastic.UNIVERSAL)
    with pytest.raises(UntrustedCheckpoint, match=r"is a symlink to .*elsewhere.*outside the tag") as info:
        elastic.prepare_resume(run, {})
    assert "\n" not in str(info.value) and calls == []
    with pytest.raises(UntrustedCheckpoint, match="outside the tag"):
        ckpt.load_latest(FullUnpickler(), run)  # the resume itself: refused before the engine opens a file
    recipe = load_recipe(None, ["data.dataset=kinetics", f"output_dir={run}"])
    with pytest.raises(UntrustedCheckpoint, match="^resume: checkpoint .*outside the tag"):
        ckpt.check_resume_source(recipe, None)  # start-up, before any process group
    with pytest.raises(UntrustedCheckpoint, match="^model.pretrained: .*outside the tag"):
        check_weights_source(str(run), trust=False)  # model.pretrained=RUN / eval --checkpoint RUN
    assert not marker.exists()
    ckpt.load_latest(FullUnpickler(), run, trust=True)  # the user vouches for it: read in full
    assert marker.exists()


def test_files_inside_the_tag_are_checked_whatever_their_depth_or_link(tmp_path: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker.txt"
    tag = _tag(run, world=1)
    (tag / "universal" / "zero" / "blocks.0.weight").mkdir(parents=True)
    deep = tag / "universal" / "zero" / "blocks.0.weight" / "exp_avg.pt"
    torch.save({"param": torch.ones(2)}, deep)
    (tag / "universal" / "zero_link").symlink_to(tag / "universal" / "zero", target_is_directory=True)
    (tag / "client_rank1.pt").symlink_to(tag / "client_rank0.pt")  # inside the tag: fine
    files = rundir.tag_files(tag)
    assert deep in files and tag / "client_rank1.pt" in files
    assert rundir.check_tag_files(tag) == len(files) == 4  # 2 clients, model states, exp_avg
    torch.save({"param": torch.ones(2), "payload": Payload(marker)}, deep)
    with pytest.raises(UntrustedCheckpoint, match=rf"{deep} pickles .*pathlib"):
        rundir.check_tag_files(tag)
    with pytest.raises(UntrustedCheckpoint, match=rf"resume: checkpoint {deep} pickles"):
        ckpt.check_resume_source(load_recipe(None, ["data.dataset=kinetics", f"output_dir={run}"]), None)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "why"),
    [("extra.pkl", "is not part of a checkpoint avion-ds reads"), ("client_rank7.pt", "is a symlink to")],
)
def test_a_layout_we_do_not_read_is_refused_in_one_line(name: str, why: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    tag = _tag(run, world=1)
    if name.endswith(".pkl"):
        (tag / name).write_bytes(b"\x80\x04N.")
    else:
        outside = tmp_path / "o.pt"
        torch.save({"global_step": 1}, outside)  # harmless content, but not the tag's own file
        (tag / name).symlink_to(outside)
    for call in (
        lambda: rundir.check_tag_files(tag),
        lambda: rundir.consolidate(run),  # eval / export of the run directory
        lambda: ckpt.load_latest(FullUnpickler(), run),
    ):
        with pytest.raises(UntrustedCheckpoint, match=rf"^checkpoint {tag}: {tag / name} {why}") as info:
            call()
        assert "\n" not in str(info.value)


def test_a_killed_conversions_temp_folder_does_not_block_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``universal.tmp`` (ds_to_universal's half output: ``fp32.00`` slices, partial files) is never read
    and is deleted before the next conversion: the walk passes over it."""
    run = tmp_path / "run"
    tag = _tag(run)
    half = tag / rundir.UNIVERSAL_TMP / "tmp" / "blocks.0.weight" / "0"
    half.mkdir(parents=True)
    (half / "fp32.00").write_bytes(b"partial")
    (half.parent / "fp32.pt").write_bytes(b"partial")
    calls: list[Path] = []
    monkeypatch.setattr(elastic, "convert_to_universal", lambda d: calls.append(d) or d / elastic.UNIVERSAL)
    assert elastic.prepare_resume(run, {}) and calls == [tag]
    (tag / "stray").mkdir()
    (tag / "stray" / "fp32.00").write_bytes(b"partial")  # the same elsewhere in the tag is refused
    with pytest.raises(UntrustedCheckpoint, match="fp32.00 is not part of a checkpoint"):
        elastic.prepare_resume(run, {})
