"""The one exception type for bad input samples (missing / corrupt files, bad CSV rows, timeouts)."""

from __future__ import annotations


class DataError(RuntimeError):
    """A sample that cannot be produced; the message names the file or CSV row and the reason.

    Datasets catch it and, under ``on_error: skip``, log it once, count it and substitute another
    index; under ``on_error: raise`` it propagates unchanged.
    """


class KeyedInputError(ValueError):
    """An annotation file problem whose message already starts with the recipe key naming that file
    (``epic_mir.val_relevancy: FILE: ...``), so start-up reports it as is instead of under the split's CSV key."""
