"""Where a dataset's videos are: ``video key -> VideoEntry`` from a chunk manifest or by probing whole files."""

from __future__ import annotations

import os
from pathlib import Path

from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import VideoEntry, find_videos, probe_video
from avion_ds.data.prep.manifest_index import load_manifest


class VideoIndex:
    """``video key -> VideoEntry`` from ``root/manifest.jsonl`` (chunked) or by probing whole videos."""

    def __init__(self, root: str | Path, chunked: bool) -> None:
        self.root, self.chunked = Path(root), chunked
        self._probed: dict[str, VideoEntry | DataError] = {}
        self._by_stem: dict[str, Path] | None = None
        if chunked:
            self.videos = load_manifest(self.root)
            if not self.videos:
                raise ValueError(f"chunk manifest under {self.root} lists no decodable chunks")

    def _whole(self, path: Path, key: str) -> VideoEntry:
        if key not in self._probed:
            try:
                self._probed[key] = probe_video(path, key)
            except (OSError, ValueError) as e:
                self._probed[key] = DataError(str(e))
        found = self._probed[key]
        if isinstance(found, DataError):
            raise found
        return found

    def by_id(self, video_id: str) -> VideoEntry:
        """EPIC lookup by video id (a chunk-manifest id, or the stem of a file under root)."""
        if self.chunked:
            if video_id not in self.videos:
                raise DataError(f"unknown video_id {video_id!r} (not in {self.root / 'manifest.jsonl'})")
            return self.videos[video_id]
        if video_id not in self._stems():
            raise DataError(f"unknown video_id {video_id!r} (no video file with that name under {self.root})")
        return self._whole(self._by_stem[video_id], video_id)

    def _stems(self) -> dict[str, Path]:
        if self._by_stem is None:
            self._by_stem = {p.stem: p for p in find_videos(self.root)} if self.root.is_dir() else {}
        return self._by_stem

    def _file(self, rel: str) -> Path:
        return Path(rel) if os.path.isabs(rel) else self.root / rel

    def exists(self, ref: str, by_path: bool = False) -> bool:
        """Cheap presence check, no probing: a manifest id, a file stem under root, or a file path."""
        if self.chunked:
            return (Path(ref).stem if by_path else ref) in self.videos
        return self._file(ref).is_file() if by_path else ref in self._stems()

    def relative_files(self, ref: str, by_path: bool = False) -> list[str]:
        """The files (relative to root) that video ``ref`` reads: its chunks, or the whole video."""
        if self.chunked:
            entry = self.videos[Path(ref).stem if by_path else ref]
            return [os.path.relpath(c.path, self.root) for c in entry.chunks]
        path = self._file(ref) if by_path else self._stems()[ref]
        return [os.path.relpath(path, self.root)]

    def by_path(self, rel: str) -> VideoEntry:
        """Kinetics lookup: chunked -> manifest id = file stem; whole -> the file under root."""
        if self.chunked:
            return self.by_id(Path(rel).stem)
        path = self._file(rel)
        return self._whole(path, str(path))
