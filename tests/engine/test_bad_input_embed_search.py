"""Malformed invocations and damaged or hostile indexes on `avion-ds embed` and `avion-ds search`, table-driven:
each ends in ONE stderr line naming the option, key or file, exit code 2, no traceback, no process group, and
no payload runs. An index is a file from elsewhere: nothing in it grants trust, names a recipe or chooses what
is unpickled; its shards carry checksums; its rows are checked once at load."""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from avion_ds.cli import embed as embed_cli
from avion_ds.cli import search as search_cli
from avion_ds.embed.index import checksum_path, read_clip_table, shard_path, top_k
from tests.engine import test_embed_search
from tests.engine.test_embed_search import FAST, MODEL
from tests.engine.test_tag_layout import Payload
from tests.test_bad_input_table import no_process_group

videos = test_embed_search.videos  # the module fixture: tiny videos, chunks, tiny dual-encoder weights
QUERY = "#C C moves the circle up"
TAG = "step_00000002"


@pytest.fixture(scope="module")
def index(videos: dict) -> Path:
    """A good 12-clip folder index (2 s clips, shards of 5) of the tiny dual encoder."""
    out = videos["root"] / "good_index"
    argv = [str(videos["videos"]), "--checkpoint", str(videos["weights"]), "--out", str(out), *MODEL, *FAST]
    assert embed_cli.main([*argv, "--clip-seconds", "2", "--shard-size", "5"]) == 0
    return out


def _copy(index: Path, tmp: Path) -> Path:
    out = tmp / "idx"
    shutil.copytree(index, out)
    return out


def _rewrite(out: Path, shard: int, rows: torch.Tensor, emb: torch.Tensor) -> None:
    """Shard ``shard`` replaced by these tensors, its checksum updated (a consistent but wrong shard)."""
    save_file({"rows": rows, "embeddings": emb}, str(shard_path(out, shard)))
    import hashlib

    checksum_path(out, shard).write_text(hashlib.sha256(shard_path(out, shard).read_bytes()).hexdigest())


def _edit_json(out: Path, **fields: object) -> None:
    meta = json.loads((out / "index.json").read_text())
    meta.update(fields)
    (out / "index.json").write_text(json.dumps(meta))


def _edit_csv(out: Path, line: int, text: str | None) -> None:
    lines = (out / "clips.csv").read_text().splitlines()
    if text is None:
        del lines[line]
    else:
        lines[line] = text
    (out / "clips.csv").write_text("\n".join(lines) + "\n")


def _truncate(out: Path) -> None:
    data = shard_path(out, 1).read_bytes()
    shard_path(out, 1).write_bytes(data[: len(data) // 2])


def _flip(out: Path) -> None:
    data = bytearray(shard_path(out, 1).read_bytes())
    data[-5] ^= 0x01
    shard_path(out, 1).write_bytes(bytes(data))


def _pickle_shard(out: Path) -> None:
    shard_path(out, 0).write_bytes(pickle.dumps({"rows": [0]}))


def _symlink_shard(out: Path) -> None:
    shard_path(out, 0).unlink()
    shard_path(out, 0).symlink_to("/etc/passwd")


E = 16  # the tiny dual encoder's embedding width
Prep = Callable[[Path], None]
# (id, preparation of a copied good index, extra argv, substrings of the one line)
SEARCH: list[tuple[str, Prep, list[str], list[str]]] = [
    ("truncated_shard", _truncate, [], ["shard_00001", "checksum differs"]),
    ("flipped_byte", _flip, [], ["shard_00001", "checksum differs"]),
    ("pickle_as_shard", _pickle_shard, [], ["shard_00000", "checksum differs"]),
    ("symlink_shard", _symlink_shard, [], ["shard_00000", "not a regular file"]),
    ("checksum_missing", lambda o: checksum_path(o, 2).unlink(), [], ["shard_00002", "interrupted write"]),
    ("wrong_width", lambda o: _rewrite(o, 0, torch.arange(5), torch.ones(5, 8)), [], ["shard_00000", "width 16"]),
    ("rows_out_of_range", lambda o: _rewrite(o, 0, torch.arange(5) + 5, torch.ones(5, E)), [], ["in [0, 5)"]),
    ("negative_rows", lambda o: _rewrite(o, 2, -torch.arange(1, 3), torch.ones(2, E)), [], ["in [10, 12)"]),
    ("duplicate_rows", lambda o: _rewrite(o, 0, torch.zeros(5, dtype=torch.long), torch.ones(5, E)), [], ["unique"]),
    ("rows_vs_embeddings", lambda o: _rewrite(o, 0, torch.arange(4), torch.ones(5, E)), [], ["(4,) rows"]),
    ("nan_embeddings", lambda o: _rewrite(o, 0, torch.arange(5), torch.full((5, E), float("nan"))), [], ["non-finite"]),
    ("clips_not_a_number", lambda o: _edit_csv(o, 3, "2,P01_101.mp4,four,6.000,"), [], ["clips.csv", "line 4"]),
    ("clips_too_short", lambda o: _edit_csv(o, -1, None), [], ["clips.csv", "11 clips", "num_clips=12"]),
    ("clips_missing", lambda o: (o / "clips.csv").unlink(), [], ["clips.csv", "missing"]),
    ("clips_outside_root", lambda o: _edit_csv(o, 1, "0,../../x.mp4,0.000,2.000,"), [], ["'../../x.mp4'", "outside"]),
    ("clips_absolute", lambda o: _edit_csv(o, 1, "0,/etc/x.mp4,0.000,2.000,"), [], ["'/etc/x.mp4'", "outside"]),
    ("num_clips_string", lambda o: _edit_json(o, num_clips="12"), [], ["index.json", "num_clips='12'"]),
    ("index_not_json", lambda o: (o / "index.json").write_text("{"), [], ["index.json", "not JSON"]),
    ("html_is_a_directory", lambda o: None, ["--html", "@dir"], ["--html", "a directory"]),
    ("html_under_a_file", lambda o: None, ["--html", "@file/page.html"], ["--html", "under a file"]),
    ("top_k_zero", lambda o: None, ["--top-k", "0"], ["--top-k=0"]),
]


def _one_line(capsys: pytest.CaptureFixture, code: int, prog: str) -> str:
    out, err = capsys.readouterr()
    assert code == 2, (out[-2000:], err)
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"avion-ds {prog}: error: "), err
    return err


@pytest.mark.parametrize("case", SEARCH, ids=[c[0] for c in SEARCH])
def test_damaged_index_is_one_line_exit_2(
    case: tuple, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, prep, extra, expect = case
    no_process_group(monkeypatch)
    out = _copy(index, tmp_path)
    prep(out)
    (tmp_path / "file").write_text("x")
    extra = [x.replace("@dir", str(tmp_path)).replace("@file", str(tmp_path / "file")) for x in extra]
    err = _one_line(capsys, search_cli.main([QUERY, "--index", str(out), *extra]), "search")
    for part in expect:
        assert part in err, (part, err)


EMBED: list[tuple[str, list[str], list[str]]] = [
    ("clip_seconds_nan", ["--clip-seconds", "nan"], ["--clip-seconds=nan"]),
    ("stride_nan", ["--stride-seconds", "nan"], ["--stride-seconds=nan"]),
    ("stride_tiny", ["--stride-seconds", "1e-9"], ["--stride-seconds=1e-09", ">= 0.01"]),
    ("workers_negative", ["--workers", "-1"], ["--workers=-1"]),
    ("out_is_a_file", ["--out", "@file"], ["--out", "a file, not a directory"]),
]


@pytest.mark.parametrize("case", EMBED, ids=[c[0] for c in EMBED])
def test_malformed_embed_is_one_line_exit_2(
    case: tuple, videos: dict, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, extra, expect = case
    no_process_group(monkeypatch)
    (tmp_path / "file").write_text("x")
    extra = [x.replace("@file", str(tmp_path / "file")) for x in extra]
    out = [] if "--out" in extra else ["--out", str(tmp_path / "idx")]
    argv = [str(videos["videos"]), "--checkpoint", str(videos["weights"]), *out, *MODEL, *FAST, *extra]
    err = _one_line(capsys, embed_cli.main(argv), "embed")
    for part in expect:
        assert part in err, (part, err)


def test_text_out_must_be_a_file_path(videos: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--text", "cut onion", "--checkpoint", str(videos["weights"]), "--out", str(tmp_path), *MODEL]
    assert "a directory" in _one_line(capsys, embed_cli.main(argv), "embed")


def test_backwards_segment_rows_are_named_counted_and_left_out(
    videos: dict,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    csv = tmp_path / "segments.csv"
    csv.write_text(
        "narration_id,video_id,start_timestamp,stop_timestamp,narration\n"
        "a,P01_101,00:00:01.00,00:00:03.00,cut the onion\n"
        "b,P01_101,00:00:05.00,00:00:02.00,backwards\n"
        "c,P02_102,00:00:02.00,00:00:02.00,empty\n"
    )
    out = tmp_path / "idx"
    argv = [str(csv), "--root", str(videos["chunks"]), "--segments", "--checkpoint", str(videos["weights"])]
    assert embed_cli.main([*argv, "--out", str(out), *MODEL, *FAST]) == 0
    printed = capsys.readouterr().out
    assert "2 segment row(s) left out" in printed and "segments.csv:3" in printed, printed
    clips, texts = read_clip_table(out)
    assert clips == [("P01_101", 1.0, 3.0)] and texts == ["cut the onion"]


def test_rerun_re_embeds_a_truncated_shard(index: Path, videos: dict, tmp_path: Path, capsys) -> None:
    out = _copy(index, tmp_path)
    good = shard_path(out, 1).read_bytes()
    _truncate(out)
    argv = [str(videos["videos"]), "--checkpoint", str(videos["weights"]), "--out", str(out), *MODEL, *FAST]
    assert embed_cli.main([*argv, "--clip-seconds", "2", "--shard-size", "5"]) == 0
    printed = capsys.readouterr().out
    assert "1 damaged shard(s) embedded again" in printed and "5 to embed" in printed, printed
    assert shard_path(out, 1).read_bytes() == good


def test_ties_and_table_escape(index: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Equal scores rank by row whatever the shard order; control characters in names print escaped."""
    out = _copy(index, tmp_path)
    for s in range(3):
        rows = torch.arange(s * 5, min(s * 5 + 5, 12))
        _rewrite(out, s, rows, torch.nn.functional.normalize(torch.ones(len(rows), E), dim=1))
    hits = top_k(out, json_meta(out), torch.nn.functional.normalize(torch.ones(E), dim=0), 7)
    assert [r for r, _ in hits] == list(range(7))
    from avion_ds.cli.search import format_table

    table = format_table([{"rank": 1, "score": 1.0, "video": "a\x1b[2J\x1b]0;x\x07.mp4", "start": 0, "end": 1}])
    assert "\x1b" not in table and "\x07" not in table and "\\x1b[2J" in table


def json_meta(out: Path):
    from avion_ds.embed.index import read_meta

    return read_meta(out)


# -- trust: only this command line grants it ---------------------------------------------------------------
def _payload_run(tmp: Path, marker: Path) -> Path:
    """A dual-encoder run directory whose recipe.yaml says trust and whose model states carry a payload."""
    run = tmp / "downloaded"
    tag = run / "checkpoints" / TAG
    tag.mkdir(parents=True)
    (tag / "COMPLETE.json").write_text(json.dumps({"tag": TAG, "global_step": 2, "world_size": 1}))
    torch.save({"module": {}, "payload": Payload(marker)}, tag / "mp_rank_00_model_states.pt")
    recipe = {
        "task": "zeroshot",
        "model": {"name": "clip_vit_test_tiny", "trust_checkpoint": True},
        "data": {"num_frames": 2, "size": 32},
        "output_dir": str(run),
    }
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return run


def test_embed_and_search_ignore_a_run_dirs_trust(
    index: Path,
    videos: dict,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_process_group(monkeypatch)
    marker = tmp_path / "marker.txt"
    run = _payload_run(tmp_path, marker)
    calls = [
        (embed_cli, "embed", [str(videos["videos"]), "--checkpoint", str(run), "--out", str(tmp_path / "i"), *FAST]),
        (embed_cli, "embed", ["--text", "cut onion", "--checkpoint", str(run), "--out", str(tmp_path / "q.st")]),
        (search_cli, "search", [QUERY, "--index", str(index), "--checkpoint", str(run)]),
    ]
    for cli, prog, argv in calls:
        code = cli.main(argv)
        printed = capsys.readouterr()
        assert code == 2 and len(printed.err.strip().splitlines()) == 1, printed.err
        assert "mp_rank_00_model_states.pt pickles" in printed.err and "--trust-checkpoint" in printed.err
        assert "model.trust_checkpoint: true in" in printed.out and "is ignored" in printed.out
        assert not marker.exists(), prog


def test_an_index_grants_no_trust_and_names_no_recipe(
    index: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_process_group(monkeypatch)
    marker = tmp_path / "marker.txt"
    evil = tmp_path / "evil.pt"
    torch.save({"payload": Payload(marker)}, evil)
    trusting = tmp_path / "trusting.yaml"
    trusting.write_text(yaml.safe_dump({"task": "zeroshot", "model": {"name": "clip_vit_test_tiny"}}))
    cases = [
        ({"overrides": ["model.trust_checkpoint=true"]}, ["may not set model.trust_checkpoint"]),
        ({"overrides": ["model.pretrained=/x.pt"]}, ["may not set model.pretrained"]),
        ({"config": str(trusting)}, ["--config", "never names the recipe"]),
        ({"checkpoint": str(evil)}, ["evil.pt", "pickles"]),
    ]
    for fields, expect in cases:
        out = tmp_path / f"idx{len(list(tmp_path.iterdir()))}"
        shutil.copytree(index, out)
        _edit_json(out, **fields)
        err = _one_line(capsys, search_cli.main([QUERY, "--index", str(out)]), "search")
        assert all(e in err for e in expect), (expect, err)
        assert not marker.exists()


def test_page_shows_captions_and_links_inside_the_root(index: Path, videos: dict, tmp_path: Path) -> None:
    from avion_ds.embed.index import read_meta

    out = _copy(index, tmp_path)
    lines = (out / "clips.csv").read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ',"<b>cut</b> the onion"'
    (out / "clips.csv").write_text("\n".join(lines) + "\n")
    page = tmp_path / "hits.html"
    assert search_cli.main([QUERY, "--index", str(out), "--top-k", "12", "--html", str(page)]) == 0
    text = page.read_text()
    assert "&lt;b&gt;cut&lt;/b&gt; the onion" in text and "<b>cut</b>" not in text
    root = Path(read_meta(out).root).resolve()
    links = [t.split('"', 1)[0] for t in text.split('href="')[1:]]
    assert len(links) == 12 and all(link.startswith(root.as_uri() + "/") and "#t=" in link for link in links), links
    assert all(Path(link[len("file://") :].split("#")[0]).is_file() for link in links)
