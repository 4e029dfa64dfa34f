"""Evaluation protocols lock the eval settings; dataset recipes carry the published settings and cite them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest

from avion_ds.config import ConfigError
from avion_ds.data.datasets.protocols import eval_report, protocols
from avion_ds.tasks import load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "launch" / "recipes"


@pytest.mark.parametrize(
    "name,protocol",
    [
        ("vit_b_k400", "k400"),
        ("vit_l_k400", "k400"),
        ("vit_b_ssv2", "ssv2"),
        ("vit_l_ssv2", "ssv2"),
        ("vit_b_epic", "epic"),
        ("vit_l_epic", "epic"),
    ],
)
def test_dataset_recipes_carry_a_protocol_and_cite_sources(name, protocol) -> None:
    path = RECIPES / f"{name}.yaml"
    r = load_recipe(path)
    p = protocols()[protocol]
    assert r.eval.protocol == protocol and r.data.dataset == p.dataset
    assert (r.eval.temporal_views, r.eval.spatial_views, r.data.num_frames, r.data.size) == (
        p.temporal_views,
        p.spatial_views,
        p.num_frames,
        p.size,
    )
    text = path.read_text()
    assert "# Source:" in text and "# Deviations" in text
    if protocol in ("k400", "ssv2"):  # VideoMAE fine-tuning
        d = r.data
        assert (d.rand_aug, d.reprob, d.num_sample, d.interpolation) == ("rand-m7-n4-mstd0.5-inc1", 0.25, 2, "bicubic")
        assert (r.data.mixup, r.data.cutmix, r.data.label_smoothing, r.optim.layer_decay) == (0.8, 1.0, 0.1, 0.75)
    if protocol == "ssv2":
        assert r.data.hflip == 0.0 and r.model.num_classes == 174 and r.data.sampling == "segment"


def test_protocol_mismatch_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"eval.protocol=k400 needs eval.temporal_views=5 \(recipe has 2; VideoMAE"):
        load_recipe(RECIPES / "vit_b_k400.yaml", ["eval.temporal_views=2"])
    with pytest.raises(ConfigError, match=r"eval.protocol=ssv2 needs data.dataset='ssv2'"):
        load_recipe(RECIPES / "vit_b_k400.yaml", ["eval.protocol=ssv2"])
    with pytest.raises(ConfigError, match=r"eval.protocol='k700' is not one of epic, k400, ssv2, custom"):
        load_recipe(None, ["data.dataset=kinetics", "eval.protocol=k700"])
    r = load_recipe(RECIPES / "vit_b_k400.yaml", ["eval.protocol=custom", "eval.temporal_views=2"])
    assert r.eval.temporal_views == 2


class _Rows:
    missing: ClassVar[list[str]] = ["train.csv:5 (a): video 'a' not found"]
    quarantined: ClassVar[list[str]] = ["train.csv:9 (b): b/0.mp4: zero-byte file"]

    def __len__(self) -> int:
        return 4

    def row_name(self, i: int) -> str:
        return f"clip{i}"


def test_eval_report_lists_missing_quarantined_and_failed() -> None:
    rep = eval_report("k400", 15, _Rows(), [0, 3, 3, 1])  # sample 2 failed; 3 appears twice (its replacement)
    assert rep["protocol"] == "k400" and rep["views"] == 15 and rep["protocol_settings"]["temporal_views"] == 5
    assert (rep["annotation_rows"], rep["samples_evaluated"]) == (6, 3)
    assert (rep["num_missing"], rep["num_quarantined"], rep["num_failed"]) == (1, 1, 1)
    assert rep["failed"] == ["clip2"] and rep["missing"] == _Rows.missing
    assert "protocol_settings" not in eval_report("custom", 1, _Rows(), range(4))


def test_missing_class_list_is_one_line_before_any_work(tmp_path) -> None:
    from avion_ds.engine.preflight import check_data_paths

    (tmp_path / "train.json").write_text("[]")
    base = [
        f"data.root={tmp_path}",
        f"data.train_csv={tmp_path / 'train.json'}",
        f"data.val_csv={tmp_path / 'train.json'}",
    ]
    r = load_recipe(RECIPES / "vit_b_ssv2.yaml", base)
    with pytest.raises(ConfigError, match="no labels.json next to .*train.json: set data.class_list"):
        check_data_paths(r)
    r = load_recipe(RECIPES / "vit_b_k400.yaml", [*base, f"data.class_list={tmp_path / 'nope.txt'}"])
    with pytest.raises(ConfigError, match=r"data.class_list: file not found: .*nope.txt"):
        check_data_paths(r)
    r = load_recipe(RECIPES / "vit_b_k400.yaml", [*base, f"data.quarantine={tmp_path / 'q.tsv'}"])
    with pytest.raises(ConfigError, match=r"data.quarantine: file not found: .*q.tsv \(auto \| none"):
        check_data_paths(r)


# -- every locked protocol's eval frame indices, against the reference code's procedure ----------------
def _videomae_k400_test(n: int, clip_len: int, rate: int, chunk_nb: int, test_num_segment: int) -> list[int]:
    """VideoMAE kinetics.py, test mode: every ``rate``-th frame, padded with the last one to clip_len;
    view chunk_nb starts at int(chunk_nb * max((len - clip_len) / (test_num_segment - 1), 0))."""
    index = list(range(0, n, rate))
    while len(index) < clip_len:
        index.append(index[-1])
    step = max(1.0 * (len(index) - clip_len) / (test_num_segment - 1), 0)
    first = int(chunk_nb * step)
    return index[first : first + clip_len]


def _videomae_ssv2_test(n: int, num_segment: int, chunk_nb: int, test_num_segment: int) -> list[int]:
    """VideoMAE ssv2.py, test mode: int(tick / 2 + tick * x) and int(tick * x) joined, padded with the
    last entry to num_segment * test_num_segment, sorted; view chunk_nb takes every second entry from it."""
    tick = n / float(num_segment)
    index = [int(tick / 2.0 + tick * x) for x in range(num_segment)] + [int(tick * x) for x in range(num_segment)]
    while len(index) < num_segment * test_num_segment:
        index.append(index[-1])
    return [int(i) for i in np.sort(np.array(index))[chunk_nb::2]]


def _avion_epic_test(
    start_s: float, end_s: float, fps: float, chunks: dict[int, int], clip_length: int, chunk_len: int = 15
) -> list[int]:
    """AVION clip_dataset.video_loader (chunked) + get_frame_ids(jitter=False): the stop time is capped at
    the last frame of the chunk holding it (walking back to the last existing chunk), both times rounded
    to frames, then the means of neighbouring linspace(start, end, clip_length + 1) values, truncated."""
    chunk_end = int(end_s) // chunk_len * chunk_len
    while chunk_end not in chunks:
        chunk_end -= chunk_len
    end_s = min(end_s, (chunks[chunk_end] - 1) / fps + chunk_end)
    start, end = int(np.round(start_s * fps)), int(np.round(end_s * fps))
    ids = np.convolve(np.linspace(start, end, clip_length + 1), [0.5, 0.5], mode="valid")
    return ids.astype(int).tolist()


def _eval_clip(protocol: str, start: int, end: int, view: int) -> list[int]:
    """The frames a dataset built for ``protocol`` evaluates: VideoClipDataset.clip_indices itself."""
    from avion_ds.config import DataConfig
    from avion_ds.data.datasets.video_clips import VideoClipDataset

    p = protocols()[protocol]
    cfg = DataConfig(dataset=p.dataset, sampling=p.sampling, num_frames=p.num_frames, stride=p.stride or 4)
    ds = SimpleNamespace(cfg=cfg, train=False, temporal_views=p.temporal_views)
    return VideoClipDataset.clip_indices(ds, start, end, None, view)


def test_every_locked_protocol_has_a_reference_test() -> None:
    assert set(protocols()) == {"k400", "ssv2", "epic"}  # a new protocol needs its reference test below


def test_k400_views_are_videomae_kinetics_test_clips() -> None:
    p = protocols()["k400"]
    for n in [*range(1, 130), 250, 299, 300, 301, 317, 450, 1000]:  # padded (< 16 read frames), tight, long
        for v in range(p.temporal_views):
            want = _videomae_k400_test(n, p.num_frames, p.stride, v, p.temporal_views)
            assert _eval_clip("k400", 0, n, v) == want, (n, v)


def test_ssv2_views_are_videomae_ssv2_test_clips() -> None:
    p = protocols()["ssv2"]
    # tick < 1, 1 <= tick < 2, longer (SSv2 videos: ~30-70 frames at 12 fps)
    for n in [*range(1, 100), 117, 200, 333, 1000]:
        for v in range(p.temporal_views):
            assert _eval_clip("ssv2", 0, n, v) == _videomae_ssv2_test(n, p.num_frames, v, p.temporal_views), (n, v)
    assert _eval_clip("ssv2", 0, 48, 1)[:4] == [1, 4, 7, 10]  # offset 1/2 of a 3-frame segment, floored


def test_epic_view_is_avion_get_frame_ids_on_chunks() -> None:
    """EPIC: AVION's chunked loader (15 s chunks at 30 fps; the middle chunk decodes 449 of 450 frames)."""
    from avion_ds.data.datasets.epic import EpicDataset
    from avion_ds.data.prep.manifest import Chunk, VideoEntry

    p = protocols()["epic"]
    fps, chunks = 30.0, {0: 450, 15: 449, 30: 200}
    entry = VideoEntry("P01_01", [Chunk(f"P01_01/{s}.mp4", int(s * fps), f, fps, 320, 240) for s, f in chunks.items()])
    spans = []
    for start_s in (0.0, 1.23, 5.3, 14.5, 14.9, 29.2, 33.0, 36.4):
        for length in (0.1, 0.4, 0.7, 0.9, 1.5, 3.33, 14.0, 20.0):  # tick < 1, 1 <= tick < 2, longer (16 frames)
            spans.append((start_s, start_s + length))
    spans = [(a, b) for a, b in spans if b <= 37.6]  # stop at most 1 s past the video's 36.67 s (below)
    spans += [(14.0, 14.99), (14.0, 14.984), (28.0, 29.99), (29.0, 30.0), (35.0, 37.5), (36.5, 37.6)]
    for start_s, stop_s in spans:
        row = {
            "narration_id": "P01_01_0",
            "video_id": "P01_01",
            "start_timestamp": f"{start_s}",
            "stop_timestamp": f"{stop_s}",
            "verb_class": "0",
            "noun_class": "0",
        }
        ds = SimpleNamespace(
            csv="EPIC_100_validation.csv",
            rows=[(2, row)],
            index=SimpleNamespace(by_id=lambda _: entry),
            action_map=None,
        )
        _, start, end, _ = EpicDataset.sample_span(ds, 0)
        want = _avion_epic_test(start_s, stop_s, fps, chunks, p.num_frames)
        assert _eval_clip("epic", start, end, 0) == want, (start_s, stop_s)
    # deviation: a stop time more than 1 s past the video is a bad sample here (AVION squeezes the clip)
    row = dict(row, start_timestamp="35.0", stop_timestamp="40.0")
    assert (
        EpicDataset.sample_span(SimpleNamespace(csv="x.csv", rows=[(2, row)], index=ds.index, action_map=None), 0)[2]
        == 1200
    )
