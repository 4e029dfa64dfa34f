"""`avion-ds embed` with token merging (``--set model.token_merge=R``) on a tiny dual encoder: r = 0 writes
the embeddings of the model without the option bit for bit; r > 0 runs and writes other, unit-norm ones."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.engine.test_embed_search import _all, _embed, videos  # noqa: F401  (videos: the fixture)


def test_embed_with_token_merging(videos: dict, tmp_path: Path) -> None:  # noqa: F811
    runs = {"plain": (), "off": ("--set", "model.token_merge=0"), "r4": ("--set", "model.token_merge=4")}
    emb = {}
    for name, extra in runs.items():
        out = tmp_path / name
        assert _embed(videos, videos["videos"], out, "--clip-seconds", "4", "--shard-size", "8", *extra) == 0
        emb[name] = _all(out)[1]
    assert torch.equal(emb["off"], emb["plain"])
    assert emb["r4"].shape == emb["plain"].shape and not torch.equal(emb["r4"], emb["plain"])
    torch.testing.assert_close(emb["r4"].norm(dim=1), torch.ones(len(emb["r4"])))


def test_embed_refuses_a_merge_the_tower_cannot_run(videos: dict, tmp_path: Path, capsys) -> None:  # noqa: F811
    for bad, why in (("40", "block 0: r=40"), ("[2,2,2]", "a schedule of 3 blocks")):
        assert _embed(videos, videos["videos"], tmp_path / "x", "--set", f"model.token_merge={bad}") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "model.token_merge=" in err and why in err, err
