"""`avion-ds embed` and `avion-ds search` on tiny generated videos with a tiny dual encoder: the three source
kinds, shards written as they complete and resumed, ranks splitting the shards (same embeddings as one
process), the streamed top-k equal to a full scan, text embeddings, bad input in one line (exit 2), and the
--html page opened in a real headless Chromium (skipped where none is installed)."""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch

from avion_ds.cli import embed as embed_cli
from avion_ds.cli import search as search_cli
from avion_ds.embed.index import iter_shards, read_clips, read_meta, shard_path, top_k
from tests.engine.test_zero_shot import save_tiny_weights

MODEL = ["--model", "clip_vit_test_tiny", "--set", "data.num_frames=2", "--set", "data.size=32"]
FAST = ["--workers", "0", "--no-progress", "--set", "data.decoder=pyav"]


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic

    root = tmp_path_factory.mktemp("embed")
    info = make_synthetic_epic(root / "synth", num_videos=2, segments_per_video=6, width=48, height=32, fps=6)
    chunk_videos(info["videos"], root / "chunks", chunk_seconds=4.0, fps=6, progress=False)
    return {
        "root": root,
        "videos": info["videos"],
        "chunks": root / "chunks",
        "val_csv": info["val_csv"],
        "weights": save_tiny_weights(root / "w.safetensors"),
        "other": save_tiny_weights(root / "o.safetensors", 1),
    }


def _embed(videos: dict, source: Path, out: Path, *extra: str) -> int:
    return embed_cli.main(
        [str(source), "--checkpoint", str(videos["weights"]), "--out", str(out), *MODEL, *FAST, *extra]
    )


def _all(out: Path) -> tuple[torch.Tensor, torch.Tensor]:
    parts = list(iter_shards(out, read_meta(out)))
    return torch.cat([r for r, _ in parts]), torch.cat([e for _, e in parts])


def test_folder_index_resume_and_ranks(videos: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "idx"
    assert _embed(videos, videos["videos"], out, "--clip-seconds", "2", "--shard-size", "2") == 0
    meta, clips = read_meta(out), read_clips(out)
    assert meta.num_clips == len(clips) == 12 and meta.num_shards == 6  # 2 videos x 12 s in 2 s clips
    assert clips[0] == ("P01_101.mp4", 0.0, 2.0) and clips[5] == ("P01_101.mp4", 10.0, 12.0)
    rows, emb = _all(out)
    assert rows.tolist() == list(range(12)) and torch.allclose(emb.norm(dim=1), torch.ones(12))
    # resume: only the missing shard is embedded again, to the same values
    kept = shard_path(out, 0).stat().st_mtime_ns
    shard_path(out, 3).unlink()
    assert _embed(videos, videos["videos"], out, "--clip-seconds", "2", "--shard-size", "2") == 0
    assert shard_path(out, 0).stat().st_mtime_ns == kept
    torch.testing.assert_close(_all(out)[1], emb, rtol=0, atol=0)
    # two ranks (no process group): each writes its shards, together the one-process index
    split = tmp_path / "split"
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert _embed(videos, videos["videos"], split, "--clip-seconds", "2", "--shard-size", "2") == 0
        have = sorted(int(p.stem.split("_")[1]) for p in (split / "shards").glob("*.safetensors"))
        assert have == ([1, 3, 5] if rank == 1 else list(range(6)))
    torch.testing.assert_close(_all(split)[1], emb, rtol=0, atol=0)
    # a rerun with other settings into the same directory is refused
    assert _embed(videos, videos["videos"], out, "--clip-seconds", "3", "--shard-size", "2") == 2


def test_chunk_tree_and_dataset_csv_sources(videos: dict, tmp_path: Path) -> None:
    assert _embed(videos, videos["chunks"], tmp_path / "chunks", "--clip-seconds", "4") == 0
    assert [c[0] for c in read_clips(tmp_path / "chunks")] == ["P01_101"] * 3 + ["P02_102"] * 3
    out = tmp_path / "csv"
    assert (
        _embed(videos, videos["val_csv"], out, "--root", str(videos["chunks"]), "--segments", "--clip-seconds", "9")
        == 0
    )
    import csv

    with open(videos["val_csv"], newline="") as f:
        assert len(read_clips(out)) == sum(1 for _ in csv.DictReader(f))  # one clip per short segment


def test_search_top_k_table_and_bad_input(videos: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "idx"
    assert _embed(videos, videos["videos"], out, "--clip-seconds", "1.5", "--shard-size", "5") == 0
    query = "#C C moves the circle up"
    capsys.readouterr()
    assert search_cli.main([query, "--index", str(out), "--top-k", "4"]) == 0
    table = capsys.readouterr().out.splitlines()
    # the streamed top-k over shards equals ranking every clip at once
    from avion_ds.cli.embed import embed_texts
    from avion_ds.embed.model import load_encoder

    enc = load_encoder(str(videos["weights"]), model_name="clip_vit_test_tiny", overrides=MODEL[3::2])
    q = embed_texts(enc.model, [query], torch.device("cpu"))[0]
    rows, emb = _all(out)
    full = torch.topk(emb @ q, 4).indices
    assert [r for r, _ in top_k(out, read_meta(out), q, 4)] == rows[full].tolist()
    clips = read_clips(out)
    first = table[table.index(next(x for x in table if x.split()[:2] == ["rank", "score"])) + 1].split()
    assert first[2] == clips[int(rows[full[0]])][0] and float(first[3]) == pytest.approx(clips[int(rows[full[0]])][1])

    bad = [
        (["  ", "--index", str(out)], "empty query"),
        ([query, "--index", str(tmp_path)], "not an embedding index"),
        ([query, "--index", str(out), "--checkpoint", str(videos["other"]), *MODEL], "embedded by another model"),
    ]
    for argv, message in bad:
        assert search_cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    shard_path(out, 1).unlink()
    assert search_cli.main([query, "--index", str(out)]) == 2
    assert "shards missing" in capsys.readouterr().err


def test_text_embeddings_and_refusals(videos: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from safetensors import safe_open

    out = tmp_path / "q.safetensors"
    ck = ["--checkpoint", str(videos["weights"]), *MODEL]
    assert embed_cli.main(["--text", "cut onion", "--text", "open tap", "--out", str(out), *ck]) == 0
    with safe_open(str(out), "pt") as f:
        assert f.get_tensor("embeddings").shape == (2, 16)
        assert json.loads(f.metadata()["texts"]) == ["cut onion", "open tap"]
    capsys.readouterr()
    video_only = save_tiny_weights(tmp_path / "v.safetensors", text=False)
    cases = [
        (["--text", " ", "--out", str(out), *ck], "empty query"),
        (["--text", "x", "--out", str(out), "--checkpoint", str(video_only), *MODEL], "no trained text tower"),
        ([str(videos["val_csv"]), "--out", str(tmp_path / "i"), *ck], "needs --root"),
        ([str(tmp_path / "nothing"), "--out", str(tmp_path / "i"), *ck], "not a video source"),
    ]
    for argv, message in cases:
        assert embed_cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHECK = (
    "<script>addEventListener('load', () => { const im = [...document.images]; document.body.setAttribute("
    "'data-check', im.length + ':' + im.filter(i => i.complete && i.naturalWidth > 0).length); });</script>"
)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; .ci/install.sh)")
def test_html_page_opens_in_headless_chromium(videos: dict, tmp_path: Path) -> None:
    """The page's thumbnails decode in a real browser: every <img> loaded with a width (data-check = n:n)."""
    out, page = tmp_path / "idx", tmp_path / "hits.html"
    assert _embed(videos, videos["chunks"], out, "--clip-seconds", "2") == 0
    assert (
        search_cli.main(["#C C moves the square down", "--index", str(out), "--top-k", "3", "--html", str(page)]) == 0
    )
    text = page.read_text()
    assert text.count("data:image/jpeg;base64,") == 3 and "#C C moves the square down" in text
    dom = _browser_dom(tmp_path, text.replace("</body>", CHECK + _grab("data-links", "a.open", "href") + "</body>"))
    assert 'data-check="3:3"' in dom, dom[-2000:]
    # as the browser resolves them: one link per hit, each a chunk file under the indexed root, at an offset
    links = _grabbed(dom, "data-links")
    root = videos["chunks"].resolve().as_uri() + "/"
    assert len(links) == 3 and all(u.startswith(root) and "#t=" in u for u in links), links
    assert all(Path(unquote(urlparse(u).path)).is_file() for u in links)


def _browser_dom(tmp_path: Path, page: str) -> str:
    """The DOM headless Chromium holds after loading ``page`` (its scripts run)."""
    probe = tmp_path / "probe.html"
    probe.write_text(page)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom"]
    return subprocess.run([*cmd, probe.as_uri()], capture_output=True, text=True, timeout=120).stdout


def _grab(attr: str, selector: str, prop: str) -> str:
    """A script that, once the page has loaded, stores ``prop`` of every ``selector`` element as JSON in the
    body's ``attr`` (read back from the dumped DOM by ``_grabbed``)."""
    return (
        f"<script>addEventListener('load', () => document.body.setAttribute('{attr}', JSON.stringify("
        f"[...document.querySelectorAll('{selector}')].map(e => e.{prop}))));</script>"
    )


def _grabbed(dom: str, attr: str) -> list:
    return json.loads(html.unescape(dom.split(f'{attr}="', 1)[1].split('"', 1)[0]))


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; .ci/install.sh)")
def test_page_captions_in_headless_chromium(videos: dict, tmp_path: Path) -> None:
    """An index of --segments rows: the page shows each hit's narration (as text, escaped) in a real browser."""
    out, page = tmp_path / "idx", tmp_path / "hits.html"
    argv = [str(videos["val_csv"]), "--root", str(videos["chunks"]), "--segments", "--clip-seconds", "9"]
    assert _embed(videos, argv[0], out, *argv[1:]) == 0
    assert search_cli.main(["moves the square down", "--index", str(out), "--top-k", "3", "--html", str(page)]) == 0
    grab = _grab("data-captions", "q.caption", "textContent")
    captions = _grabbed(_browser_dom(tmp_path, page.read_text().replace("</body>", grab + "</body>")), "data-captions")
    import csv

    with open(videos["val_csv"], newline="") as f:
        narrations = {r["narration"] for r in csv.DictReader(f)}
    assert len(captions) == 3 and set(captions) <= narrations, captions
