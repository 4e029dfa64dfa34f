"""CLIP's tokenizer: ``tokenize(texts) -> LongTensor (N, 77)``, ids identical to OpenAI's.

The byte-pair encoding is OpenCLIP's ``SimpleTokenizer`` (open-clip-torch ships OpenAI's
vocabulary in its wheel, so nothing is downloaded): ftfy fixes mojibake, HTML entities are
unescaped, whitespace collapsed, text lower-cased; each row is ``<start> ... <end>`` padded with
0, and a text longer than 77 tokens is cut keeping the end token (whose id is the largest, which
is how the text tower finds it).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError

CONTEXT_LENGTH = 77
EXTRA_HINT = "pip install 'avion_ds[clip]'"


@functools.cache
def _tokenizer() -> Any:
    try:
        simple_tokenizer = _simple_tokenizer_class()
    except ImportError as e:
        raise ConfigError(f"tokenize needs open-clip-torch and ftfy ({EXTRA_HINT}): {e}") from None
    return simple_tokenizer(context_length=CONTEXT_LENGTH)


def _simple_tokenizer_class() -> type:
    """OpenCLIP's ``SimpleTokenizer``. Its module (BPE, ftfy, regex, its vocabulary beside it; no relative
    import) is run from the installed package's file without the package's ``__init__``, which imports every
    open_clip model and transformers: ~0.8 s of CPU in each process that tokenizes (ranks, eval, embed,
    search). Anything else (another layout of the package) takes the plain import."""
    import importlib.util  # lazy: only where text is tokenized

    try:
        found = importlib.util.find_spec("open_clip")  # locates the package without running it
    except ValueError:  # in sys.modules as None: blocked
        found = None
    if found is None:
        raise ImportError("No module named 'open_clip'")
    where = found.submodule_search_locations or []
    path = next((Path(d) / "tokenizer.py" for d in where if (Path(d) / "tokenizer.py").is_file()), None)
    spec = None if path is None else importlib.util.spec_from_file_location("avion_ds._open_clip_tokenizer", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
            return module.SimpleTokenizer
        except ImportError as e:
            if getattr(e, "name", None) in ("ftfy", "regex"):  # a missing dependency: say so, as the import would
                raise
        except Exception:  # noqa: BLE001, S110 - another layout: the package's own import below
            pass
    from open_clip.tokenizer import SimpleTokenizer  # lazy: open_clip is the optional avion_ds[clip] extra

    return SimpleTokenizer


def tokenize(texts: str | list[str], context_length: int = CONTEXT_LENGTH) -> torch.LongTensor:
    """Token ids (N, context_length) int64 of ``texts`` (a string counts as a list of one)."""
    if isinstance(texts, str):
        texts = [texts]
    bad = next((t for t in texts if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"tokenize: expected strings, got {type(bad).__name__} {bad!r}")
    return _tokenizer()(list(texts), context_length=context_length)
