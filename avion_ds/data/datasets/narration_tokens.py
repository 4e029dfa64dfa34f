"""Caption tokens for the video-text datasets (``ego4d``, ``epic_mir``): CLIP's tokenizer.

open_clip (the optional ``avion_ds[clip]`` extra) is imported by :mod:`avion_ds.data.tokenizer` on first
use, so the other datasets and the data tools start without it.
"""

from __future__ import annotations

import torch

from avion_ds.data.errors import DataError
from avion_ds.data.tokenizer import tokenize

CONTEXT_LENGTH = 77  # CLIP's context (avion_ds.data.tokenizer.CONTEXT_LENGTH)


def check_tokenizer() -> None:
    """Load the tokenizer now: a missing ``avion_ds[clip]`` extra is a one-line ConfigError at construction."""
    tokenize("")


def text_tokens(text: str, where: str) -> torch.Tensor:
    """CLIP token ids (77,) int64 of ``text``; DataError naming ``where`` when it cannot be tokenised."""
    try:
        return tokenize(text, CONTEXT_LENGTH)[0]
    except (TypeError, ValueError, UnicodeError) as e:
        raise DataError(f"{where}: text cannot be tokenised ({e})") from None


def empty_tokens() -> torch.Tensor:
    """The tokens of a placeholder item (all padding)."""
    return torch.zeros(CONTEXT_LENGTH, dtype=torch.long)
