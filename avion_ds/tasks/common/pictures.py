"""Pictures of an evaluation, as (H, W, 3) uint8 arrays: rows named on a left margin, nearest upscaling, and a
confusion matrix. TensorBoard shows them (``Task.eval_images``); ``avion-ds reconstruct`` writes its PNG with
the same row labels."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

LABEL_PX = 13  # row label font size
_PAD = 6  # margin around a label, px
_DARK = np.array([8, 48, 107], dtype=np.float32)  # a confusion cell of 1.0 (white is 0)


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)  # scalable (Pillow >= 10.1 with FreeType)
    except (TypeError, ValueError, OSError):
        return ImageFont.load_default()


def label_margin(labels: Sequence[str], size: int = LABEL_PX) -> int:
    """Width in px of the left margin ``label_rows`` adds for ``labels``."""
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    return int(np.ceil(max(draw.textlength(t, font=_font(size)) for t in labels))) + 2 * _PAD


def label_rows(img: np.ndarray, labels: Sequence[str], size: int = LABEL_PX) -> np.ndarray:
    """``img`` (H, W, 3) uint8 with a white left margin naming its ``len(labels)`` equal-height rows (black
    text, each centred on its row): the picture says which row is which."""
    h, w = img.shape[:2]
    margin = label_margin(labels, size)
    canvas = Image.new("RGB", (w + margin, h), "white")
    canvas.paste(Image.fromarray(np.ascontiguousarray(img[..., :3])), (margin, 0))
    draw, font, row = ImageDraw.Draw(canvas), _font(size), h / len(labels)
    for i, text in enumerate(labels):
        draw.text((_PAD, int(row * (i + 0.5))), text, fill="black", font=font, anchor="lm")
    return np.asarray(canvas)


def upscale(img: np.ndarray, min_height: int) -> np.ndarray:
    """``img`` repeated by the smallest integer factor that makes it at least ``min_height`` px tall (nearest:
    a 16 px patch stays a sharp block)."""
    k = max(1, -(-min_height // max(1, img.shape[0])))
    return img if k == 1 else img.repeat(k, axis=0).repeat(k, axis=1)


def confusion_image(labels: np.ndarray, preds: np.ndarray, classes: int, max_classes: int = 128) -> np.ndarray:
    """Row-normalised confusion matrix as a picture: row = true class, column = predicted class, white = 0,
    dark blue = every clip of the row. Above ``max_classes`` classes only the most frequent true classes are
    shown (rows and columns, in class order); cells are square, the picture at least 256 px."""
    labels, preds = np.asarray(labels, dtype=np.int64), np.asarray(preds, dtype=np.int64)
    ok = (labels >= 0) & (labels < classes) & (preds >= 0) & (preds < classes)
    counts = np.zeros((classes, classes), dtype=np.float64)
    np.add.at(counts, (labels[ok], preds[ok]), 1.0)
    if classes > max_classes:
        keep = np.sort(np.argsort(-counts.sum(axis=1), kind="stable")[:max_classes])
        counts = counts[np.ix_(keep, keep)]
    rows = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0).astype(np.float32)
    rgb = 255.0 + share[..., None] * (_DARK - 255.0)
    return upscale(np.round(rgb).astype(np.uint8), 256)
