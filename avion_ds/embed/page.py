"""The HTML page of `avion-ds search --html`: one card per hit with the clip's middle frame as a base64
JPEG, its video, times, score, caption (the ``--segments`` row's narration) and a link that opens the
local file at the hit's start (``file:///...mp4#t=SECONDS``: the chunk holding the start, for a chunk
tree); a single self-contained file. Nothing outside the indexed root is read or linked."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from avion_ds.config import DataConfig
from avion_ds.data.errors import DataError
from avion_ds.embed.clips import WindowDataset
from avion_ds.embed.index import IndexMeta

THUMB_WIDTH = 320


def thumbnail(ds: WindowDataset, row: int) -> str:
    """The middle frame of clip ``row`` as a JPEG data URL (whole frame, at most THUMB_WIDTH wide)."""
    from PIL import Image  # lazy: Pillow is an optional dependency (only --html needs it)

    entry, start, end = ds.frame_span(row)
    frame = ds.read_clip(entry, [(start + end - 1) // 2], None)[0].numpy()
    img = Image.fromarray(frame)
    if img.width > THUMB_WIDTH:
        img = img.resize((THUMB_WIDTH, max(1, round(img.height * THUMB_WIDTH / img.width))))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def video_link(ds: WindowDataset, row: int, root: Path) -> tuple[Path, str] | None:
    """(file, ``file://`` URL with ``#t=`` the hit's start within it) of clip ``row``; None when the file
    lies outside ``root`` (never linked)."""
    entry = ds.entry(row)
    start_s = ds.clips[row][1]
    chunk = entry.chunks[entry.chunk_at(start_s * entry.fps)]
    path = Path(chunk.path).resolve()
    if not path.is_relative_to(root.resolve()):
        return None
    offset = max(0.0, start_s - chunk.start_frame / chunk.fps)
    return path, f"{path.as_uri()}#t={offset:.2f}"


def _card(ds: WindowDataset, i: int, h: dict, root: Path) -> str:
    try:
        picture = f'<img src="{thumbnail(ds, i)}" alt="{html.escape(h["video"])}">'
        link = video_link(ds, i, root)
    except (DataError, OSError, ValueError) as e:
        picture, link = f'<p class="bad">frame not decodable: {html.escape(str(e))}</p>', None
    caption = f'<q class="caption">{html.escape(h["text"])}</q><br>' if h.get("text") else ""
    source = (
        f'<a class="open" href="{html.escape(link[1], quote=True)}">open at {h["start"]:.2f} s</a> '
        f'<span class="path">{html.escape(str(link[0]))}</span>'
        if link is not None
        else ""
    )
    return (
        f'<figure class="hit">{picture}<figcaption>{caption}<b>#{h["rank"]}</b> {html.escape(h["video"])} '
        f"{h['start']:.2f}&ndash;{h['end']:.2f} s &middot; score {h['score']:.4f}<br>{source}</figcaption></figure>"
    )


def write_page(path: Path, query: str, hits: list[dict], data: DataConfig, meta: IndexMeta) -> Path:
    """Write the page; a frame that cannot be decoded is shown as its reason instead of a picture."""
    ds = WindowDataset(data, Path(meta.root), meta.chunked, [(h["video"], h["start"], h["end"]) for h in hits])
    cards = [_card(ds, i, h, Path(meta.root)) for i, h in enumerate(hits)]
    title = html.escape(query)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>avion-ds search: {title}</title>
<style>body{{font-family:sans-serif;margin:1em}} .hits{{display:flex;flex-wrap:wrap;gap:12px}}
figure{{margin:0;width:{THUMB_WIDTH}px}} img{{width:100%;display:block}} .bad{{color:#a00}}
.path{{color:#666;font-size:small;word-break:break-all}}</style></head>
<body><h1>{title}</h1><p>top {len(hits)} of {meta.num_clips} clips, model {html.escape(meta.model)}</p>
<div class="hits">
{chr(10).join(cards)}
</div></body></html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path
