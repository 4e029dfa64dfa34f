"""A recipe-key typo names the key and suggests what was meant, as docs/training.md shows."""

from __future__ import annotations

import pytest

from avion_ds.config import ConfigError
from avion_ds.tasks import load_recipe


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("optim.learning_rate=1e-3", "(did you mean lr?)"),  # the docs' example: initials of the words
        ("optim.weight_decy=0.1", "(did you mean weight_decay, weight_decay_end?)"),
        ("data.frames=4", "(did you mean num_frames?)"),  # a shared word
    ],
)
def test_typo_suggests_the_key(override: str, hint: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as info:
        load_recipe(None, [override])
    assert str(info.value) == f"unknown recipe key {key!r} {hint}"


def test_no_near_key_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown recipe key 'optim.foo' \(known: lr, base_batch"):
        load_recipe(None, ["optim.foo=1"])
