"""The row-table base of the datasets: samples are the rows of an annotation table, one row a sample.

A dataset says how it reads its rows (:meth:`RowTable.read_rows`: sets ``rows`` and ``num_classes``) and
what a row holds (:meth:`RowTable.row_fields`: its file and line, its video reference and a name for
reports); reading and pruning at construction, the length and the accessors the clip base asks (``row_ref``, ``row_where``,
``row_name``: pruning, quarantine, reports) are here, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from avion_ds.config import DataConfig
from avion_ds.data.datasets.video_clips import VideoClipDataset
from avion_ds.data.sampling import jittered_midpoints, segment_indices


class RowFields(NamedTuple):
    """What a row says about itself: where it stands, which video it reads, how reports name it."""

    path: Path  # the annotation file
    line: int  # its line (or entry number) there
    ref: str  # the video: an id, or a path under data.root (by_path)
    by_path: bool
    name: str  # narration id, clip path, ...


class RowTable(VideoClipDataset):
    """A clip dataset over ``self.rows`` (see module doc); rows whose video is absent or quarantined are
    dropped at construction (``VideoClipDataset._prune``)."""

    rows: Any  # a list of the dataset's row tuples (or an index array)

    def load_rows(self, cfg: DataConfig) -> None:
        """The rows of the split, those whose video is absent or quarantined dropped (called by the constructor)."""
        self.read_rows(cfg)
        self._prune()

    def read_rows(self, cfg: DataConfig) -> None:
        """Read ``split``'s annotation rows into ``self.rows`` and set ``self.num_classes``."""
        raise NotImplementedError

    def row_fields(self, i: int) -> RowFields:
        """What row ``i`` holds (cheap: no probing)."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.rows)

    def row_ref(self, i: int) -> tuple[str, bool]:
        f = self.row_fields(i)
        return f.ref, f.by_path

    def row_where(self, i: int) -> tuple[Path, int]:
        f = self.row_fields(i)
        return f.path, f.line

    def row_name(self, i: int) -> str:
        return self.row_fields(i).name


class MidpointRows(RowTable):
    """A row table sampled as AVION's video-text datasets: ``get_frame_ids``' segment midpoints."""

    def clip_indices(self, start: int, end: int, rng: Any, view: int) -> list[int]:
        """Jittered segment midpoints in training, the midpoints at eval."""
        if self.train:
            return jittered_midpoints(start, end, self.cfg.num_frames, rng)
        return segment_indices(start, end, self.cfg.num_frames, train=False, view=view, num_views=self.temporal_views)
