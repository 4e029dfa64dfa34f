"""CLIP's tokenizer: ``tokenize(texts) -> LongTensor (N, 77)``, ids identical to OpenAI's.

The byte-pair encoding is OpenCLIP's ``SimpleTokenizer`` (open-clip-torch ships OpenAI's
vocabulary in its wheel, so nothing is downloaded): ftfy fixes mojibake, HTML entities are
unescaped, whitespace collapsed, text lower-cased; each row is ``<start> ... <end>`` padded with
0, and a text longer than 77 tokens is cut keeping the end token (whose id is the largest, which
is how the text tower finds it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from avion_ds.config import ConfigError

CONTEXT_LENGTH = 77
EXTRA_HINT = "pip install 'avion_ds[clip]'"


@functools.cache
def _tokenizer() -> Any:
    try:
        from open_clip.tokenizer import SimpleTokenizer  # lazy: open_clip is the optional avion_ds[clip] extra
    except ImportError as e:
        raise ConfigError(f"tokenize needs open-clip-torch and ftfy ({EXTRA_HINT}): {e}") from None
    return SimpleTokenizer(context_length=CONTEXT_LENGTH)


def tokenize(texts: str | list[str], context_length: int = CONTEXT_LENGTH) -> torch.LongTensor:
    """Token ids (N, context_length) int64 of ``texts`` (a string counts as a list of one)."""
    if isinstance(texts, str):
        texts = [texts]
    bad = next((t for t in texts if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"tokenize: expected strings, got {type(bad).__name__} {bad!r}")
    return _tokenizer()(list(texts), context_length=context_length)
