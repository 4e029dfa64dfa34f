"""The annotation index cache is keyed on the content of its inputs (a manifest edited with its size and mtime
restored is rebuilt, never served stale), and says in ONE true line when no cache location is writable."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from avion_ds.data import index_cache as ic
from avion_ds.data.prep.manifest_index import load_manifest


def _manifest(root: Path, fps: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    row = {"video_id": "v0", "path": "v0/0.mp4", "start_frame": 0, "frames": 150, "fps": fps, "width": 64}
    path = root / "manifest.jsonl"
    path.write_text(json.dumps(row | {"height": 48, "job": 1}) + "\n")
    return path


def test_edit_with_size_and_mtime_restored_is_rebuilt(tmp_path: Path) -> None:
    path = _manifest(tmp_path / "chunks", 30)
    assert load_manifest(tmp_path / "chunks")["v0"].fps == 30
    st = path.stat()
    _manifest(tmp_path / "chunks", 60)  # same length: "30" -> "60"
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert load_manifest(tmp_path / "chunks")["v0"].fps == 60


def test_key_is_size_and_content_digest(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * (2 * ic._HASH_BLOCK + 5))
    b.write_bytes(b"x" * (2 * ic._HASH_BLOCK + 4) + b"y")
    ka, kb = ic.source_key([a]), ic.source_key([b])
    assert ka[0][1] == kb[0][1] and ka[0][2] != kb[0][2]
    os.utime(a, ns=(1, 1))
    assert ic.source_key([a]) == ka  # a touch alone changes nothing


def test_no_writable_location_is_one_true_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither the data directory nor the XDG cache is writable (tests run as root: the checks are patched)."""
    _manifest(tmp_path / "chunks", 30)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    def refuse(self: object, path: Path) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(ic._Lock, "__init__", refuse)
    monkeypatch.setattr(ic.os, "access", lambda p, mode: False)
    with caplog.at_level(logging.INFO, logger="avion_ds.data.index_cache"):
        videos = load_manifest(tmp_path / "chunks")
    lines = [r.getMessage() for r in caplog.records if r.name == "avion_ds.data.index_cache"]
    assert videos["v0"].fps == 30 and videos.index.path is None
    assert len(lines) == 1, lines
    assert "keeping" in lines[0] and "in memory" in lines[0], lines
    assert str(tmp_path / "chunks") in lines[0] and str(tmp_path / "xdg") in lines[0], lines
    assert "caching the chunks index in" not in lines[0]
