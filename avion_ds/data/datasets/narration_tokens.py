"""Caption tokens for the video-text datasets (``ego4d``, ``epic_mir``): CLIP's tokenizer, loaded lazily.

``avion_ds.models`` (and the timm / torchvision stack behind it) is imported only when a text
dataset is built, so the other datasets and the data tools start without it.
"""

from __future__ import annotations

import torch

from avion_ds.data.errors import DataError

CONTEXT_LENGTH = 77  # CLIP's context (avion_ds.data.tokenizer.CONTEXT_LENGTH)


def check_tokenizer() -> None:
    """Load the tokenizer now: a missing ``avion_ds[clip]`` extra is a one-line ConfigError at construction."""
    from avion_ds.data.tokenizer import tokenize

    tokenize("")


def text_tokens(text: str, where: str) -> torch.Tensor:
    """CLIP token ids (77,) int64 of ``text``; DataError naming ``where`` when it cannot be tokenised."""
    from avion_ds.data.tokenizer import tokenize

    try:
        return tokenize(text, CONTEXT_LENGTH)[0]
    except (TypeError, ValueError, UnicodeError) as e:
        raise DataError(f"{where}: text cannot be tokenised ({e})") from None


def empty_tokens() -> torch.Tensor:
    """The tokens of a placeholder item (all padding)."""
    return torch.zeros(CONTEXT_LENGTH, dtype=torch.long)
