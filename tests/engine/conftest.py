"""Engine-test fixtures: a tiny synthetic EPIC dataset, generated once per session (helpers: tests.helpers)."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_epic_data, val_subset


@pytest.fixture(scope="session")
def tiny_epic(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """3 long synthetic videos -> chunks + CSVs (an odd number of val clips, to exercise padding)."""
    return tiny_epic_data(tmp_path_factory.mktemp("tiny_epic"))


@pytest.fixture(scope="session")
def tiny_epic_quick(tiny_epic: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``tiny_epic`` with a 3-clip validation CSV (still odd: 2 ranks pad) for multi-process tests whose
    assertions are about training, resume or export: every run ends with an eval, and 11 clips of it
    cost seconds per launch. Pair with ``QUICK_DATA`` in the recipe."""
    return val_subset(tiny_epic, 3, tmp_path_factory.mktemp("tiny_epic_quick") / "val3.csv")
