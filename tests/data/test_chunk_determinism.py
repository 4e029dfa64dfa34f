"""Chunking is reproducible: the same sources give byte-identical chunks run after run, with any ``workers``.

The cause of the variation this guards against is x264's AVX-512 code (``avion_ds/data/prep/x264.py``):
on an AVX-512 CPU about one run in six changed some chunk's bytes, so the repeat test runs chunking 30
times in one process (the variation needs no new process). On a CPU without AVX-512 it passes either way;
the option tests cover both answers of the CPU check on any machine.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import pytest

from avion_ds.data.prep import chunk_source, synthetic, x264
from avion_ds.data.prep.chunking import chunk_videos
from avion_ds.data.prep.synthetic import write_video
from avion_ds.data.prep.x264 import cpu_flags, x264_options_for

RUNS = 30


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.mp4"))}


def _chunk(src: Path, out: Path, workers: int = 1) -> dict[str, str]:
    summary = chunk_videos(src, out, chunk_seconds=1.0, short_side=48, fps=15, gop=15, workers=workers, progress=False)
    assert not summary.failed, summary
    return _digests(out)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("chunkdet") / "src"
    for i in range(4):
        write_video(src / f"v{i}.mp4", 45, 96, 72, fps=15, pattern="noise" if i % 2 else "testsrc")
    return src


def test_repeated_runs_byte_identical(sources: Path, tmp_path: Path) -> None:
    first = _chunk(sources, tmp_path / "first")
    assert len(first) == 12
    for k in range(RUNS):
        out = tmp_path / f"run{k % 2}"
        again = _chunk(sources, out)
        assert again == first, f"run {k + 1}: {sorted(n for n in first if again.get(n) != first[n])} differ"
        for p in out.rglob("*"):
            if p.is_file():
                p.unlink()


def test_two_workers_same_bytes_as_one(sources: Path, tmp_path: Path) -> None:
    assert _chunk(sources, tmp_path / "two", workers=2) == _chunk(sources, tmp_path / "one")


def test_sources_byte_identical(tmp_path: Path) -> None:
    for k in range(3):
        write_video(tmp_path / f"{k}.mp4", 20, 64, 48, fps=10, pattern="noise")
    assert len({(tmp_path / f"{k}.mp4").read_bytes() for k in range(3)}) == 1


@pytest.mark.parametrize(
    ("machine", "flags", "avx512_left_out"),
    [
        ("x86_64", frozenset({"sse2", "avx2", "avx512f", "avx512bw"}), True),
        ("x86_64", frozenset({"sse2", "avx2"}), False),
        ("AMD64", frozenset({"avx512f"}), True),
        ("aarch64", frozenset({"asimd", "avx512f"}), False),
    ],
)
def test_x264_asm_choice(machine: str, flags: frozenset[str], avx512_left_out: bool) -> None:
    opts = x264_options_for(machine, flags)
    if not avx512_left_out:
        assert opts == {}
        return
    names = opts["x264-params"].removeprefix("asm=").split(",")
    assert "AVX2" in names and not any(n.upper().startswith("AVX512") for n in names)


def test_cpu_flags_read(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx2", "avx512f"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or "avx2" not in cpu_flags(),
    reason="the forced instruction sets need an x86-64 CPU with AVX2",
)
def test_writers_pass_the_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both H.264 writers hand x264 the machine's options (here a forced AVX2-only set)."""
    forced = x264_options_for("x86_64", frozenset({"avx512f"}))
    monkeypatch.setattr(chunk_source, "x264_options", lambda: forced)
    monkeypatch.setattr(synthetic, "x264_options", lambda: forced)
    seen = []
    real = chunk_source._ChunkWriter.__init__

    def init(self, *a, **k) -> None:
        real(self, *a, **k)
        seen.append(self.s.options.get("x264-params"))

    monkeypatch.setattr(chunk_source._ChunkWriter, "__init__", init)
    with synthetic.VideoWriter(tmp_path / "src" / "a.mp4", 32, 24, fps=10) as w:
        assert w._stream.options.get("x264-params") == forced["x264-params"]
        for _ in range(10):
            w.write(synthetic.np.zeros((24, 32, 3), dtype="uint8"))
    chunk_videos(tmp_path / "src", tmp_path / "out", chunk_seconds=0.5, short_side=24, fps=10, progress=False)
    assert seen and set(seen) == {forced["x264-params"]}


@pytest.mark.parametrize("avx512", [True, False])
def test_chunk_cli_names_the_encoder_setting(
    avx512: bool, sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from avion_ds.cli.chunk import main

    flags = frozenset({"avx2", "avx512f"} if avx512 else {"avx2"})
    monkeypatch.setattr(x264, "x264_options", lambda: x264_options_for("x86_64", flags))
    assert (
        main([str(sources), str(tmp_path / "out"), "--chunk-seconds", "1", "--short-side", "48", "--no-progress"]) == 0
    )
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("encoder: libx264 ")
    assert ("AVX-512 left out" in line) is avx512
