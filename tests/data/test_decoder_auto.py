"""``data.decoder: auto``: a short probe on the first chunk picks the backend; the run dir keeps it."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

import avion_ds.data.decode.select as decoders
from avion_ds.data import build_dataset
from avion_ds.data.decode.select import available_backends, pick_decoder


def _fake_probe(times: dict[str, float], calls: list):
    def probe(path, frames, h, w, size, names, timeout_s=0.0, repeats=3, exact=False):
        calls.append(path)
        return {n: times[n] for n in names}

    return probe


def test_auto_picks_the_fastest_records_it_and_a_resume_keeps_it(epic_cfg, tmp_path, monkeypatch, caplog) -> None:
    cfg = replace(epic_cfg, decoder="auto")
    calls: list = []
    monkeypatch.setattr(decoders, "_PROBED", {})
    monkeypatch.setattr(decoders, "probe_backends", _fake_probe({"decord": 3.0, "torchcodec": 1.0, "pyav": 2.0}, calls))
    with caplog.at_level(logging.INFO, logger="avion_ds.data.decode.select"):
        name, msg = pick_decoder(cfg, tmp_path)
    assert name == "torchcodec" and "auto -> torchcodec" in msg and "auto -> torchcodec" in caplog.text
    assert calls and calls[0].endswith("/0.mp4")  # the first chunk of the first video
    rec = json.loads((tmp_path / "decoder.json").read_text())
    assert rec["decoder"] == "torchcodec" and set(rec["probe_s"]) == set(available_backends())

    monkeypatch.setattr(decoders, "_PROBED", {})  # now pyav would win a fresh probe
    monkeypatch.setattr(decoders, "probe_backends", _fake_probe({"decord": 3.0, "torchcodec": 2.0, "pyav": 1.0}, calls))
    name, msg = pick_decoder(cfg, tmp_path)  # resume: the recorded choice, no probe
    assert name == "torchcodec" and "recorded in" in msg and len(calls) == 1
    assert pick_decoder(cfg, tmp_path, resume=False)[0] == "pyav"  # a fresh run probes again
    assert json.loads((tmp_path / "decoder.json").read_text())["decoder"] == "pyav"
    assert pick_decoder(replace(cfg, decoder="decord"), tmp_path)[0] == "decord"  # an explicit choice wins


def test_recorded_backend_missing_here_is_probed_again(epic_cfg, tmp_path, monkeypatch, caplog) -> None:
    (tmp_path / "decoder.json").write_text(json.dumps({"decoder": "nvdec-from-another-machine"}))
    monkeypatch.setattr(decoders, "_PROBED", {})
    monkeypatch.setattr(decoders, "probe_backends", _fake_probe({"decord": 1.0, "torchcodec": 2.0, "pyav": 3.0}, []))
    name, _ = pick_decoder(replace(epic_cfg, decoder="auto"), tmp_path)
    assert name == "decord" and "not available here; probing again" in caplog.text


def test_real_probe_and_dataset(epic_cfg, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(decoders, "_PROBED", {})
    cfg = replace(epic_cfg, decoder="auto")
    name, msg = pick_decoder(cfg, tmp_path)
    rec = json.loads((tmp_path / "decoder.json").read_text())
    assert name in available_backends() and all(v > 0 for v in rec["probe_s"].values())
    assert all(f"{n} " in msg for n in available_backends())
    ds = build_dataset(cfg, "val")
    assert ds.decoder_name == name  # the dataset's own resolution hits the same probe (once per process)
    assert ds[0]["frames"].shape == (cfg.num_frames, cfg.size, cfg.size, 3)


def test_cuda_backend_skips_cleanly_without_a_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: bench/gpu_suite.sh measures torchcodec-cuda")
    with pytest.raises(decoders.DecoderUnavailable, match="'torchcodec-cuda' is not available .no CUDA device here"):
        decoders.get_decoder("torchcodec-cuda")
    assert "torchcodec-cuda" not in available_backends(cuda=True)


def test_probe_clips_cover_the_chunk_like_training_clips() -> None:
    clips = decoders.probe_clips(450)
    assert len(clips) == 3 and all(len(c) == 16 for c in clips)
    assert clips[0][0] == 0 and clips[-1][-1] >= 450 - 96 // 16 - 1  # the opening AND the end of the chunk
    assert clips[1][0] == (450 - 96) // 2  # and its middle
    for c in clips:
        assert c == sorted(c) and c[-1] - c[0] >= 80  # spread over ~96 frames, like a 1-4 s training segment
    short = decoders.probe_clips(10)  # a chunk shorter than a clip: one clip of every frame, none past the end
    assert short == [list(range(10))]
