"""Open a trained model for a command that reads one: THE path of eval, export, embed, search and reconstruct.

``open_run`` does every check before a weight is read and before anything is written: the checkpoint
exists; the recipe (``--config``, else the run directory's ``recipe.yaml``) is read; trust is what THIS
command line grants (``engine.trust.command_trust``: a run directory's own recipe never grants it); the
tag is resolved (``--tag``, ``best``, else the newest complete checkpoint) and checked; every file the
load will read passes the safe loader's type check (``preflight.check_weights_source``: pickles, and
TorchScript archives whatever trust says). ``OpenedRun.load_into`` then loads the consolidated weights
(ZeRO shards, the EMA when the recipe evaluates with it) and returns the load report; ``load_line`` is
the one line every command prints about it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from avion_ds.config import ConfigError, Recipe
from avion_ds.engine import preflight as pf
from avion_ds.engine.ema import eval_weights
from avion_ds.engine.export import consolidated
from avion_ds.engine.run_checkpoints import check_tag
from avion_ds.engine.trust import KEY as TRUST_KEY
from avion_ds.engine.trust import command_trust
from avion_ds.storage.run_dir import latest_complete, resolve_tag, skipped_note

if TYPE_CHECKING:
    from avion_ds.models.weights.report import LoadReport

RecipeOf = Callable[[str | Path | None, list[str]], Recipe]


@dataclass(frozen=True)
class OpenedRun:
    """A checked source of trained weights: a run directory's complete checkpoint ``tag``, or a weights file."""

    checkpoint: Path
    recipe: Recipe | None
    run_dir: Path | None
    tag: str | None
    trust: bool
    notes: tuple[str, ...] = ()  # printed by open_run as found

    @property
    def weights(self) -> str:
        """model | ema: what the run's recipe evaluates with (a weights file: its own tensors)."""
        return eval_weights(self.recipe) if self.recipe is not None and self.run_dir is not None else "model"

    def describe(self) -> str:
        """``RUN checkpoint TAG (ema weights)`` or ``weights file FILE``."""
        if self.run_dir is None:
            return f"weights file {self.checkpoint}"
        return f"{self.run_dir} checkpoint {self.tag}" + (" (ema weights)" if self.weights == "ema" else "")

    def state_dict(self, weights: str | None = None) -> dict[str, torch.Tensor]:
        """The run's consolidated fp32 weights (``weights``: model | ema, default ``self.weights``)."""
        if self.run_dir is None:
            raise ConfigError(f"--checkpoint {self.checkpoint}: a weights file, not a run directory")
        return consolidated(self.run_dir, self.tag, self.trust, weights or self.weights)

    def load_into(self, model: nn.Module) -> LoadReport:
        """Load the checkpoint into ``model`` (every key must match: ``strict``) and return the report."""
        from avion_ds.models import load_weights  # lazy: the models take seconds to import (export --help)

        source: str | dict = str(self.checkpoint) if self.run_dir is None else self.state_dict()
        try:
            return load_weights(model, source, strict=True, trust=self.trust)
        except ValueError as e:
            raise ConfigError(f"--checkpoint {self.checkpoint}: {str(e).splitlines()[0]}") from None


def load_line(command: str, opened: OpenedRun, report: LoadReport | None = None) -> str:
    """The one line a command prints about the weights it loaded."""
    return f"{command}: loaded {opened.describe()}" + (f": {report.summary()}" if report is not None else "")


def _run_tag(run_dir: Path, tag: str | None) -> str:
    found = resolve_tag(run_dir, tag) or latest_complete(run_dir)
    if found is None:
        raise ConfigError(f"--checkpoint {run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}")
    check_tag(run_dir, found, flag="--tag")
    return found


def open_run(
    checkpoint: str | Path,
    *,
    tag: str | None = None,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    recipe_of: RecipeOf | None = None,
    run_dir_only: bool = False,
    say: Callable[[str], None] | None = None,
) -> OpenedRun:
    """The checked weights source of a command (module doc). ``recipe_of(config, overrides)`` builds the
    recipe (None: the command needs none, e.g. a safetensors export; trust then comes from ``overrides``
    alone); ``run_dir_only``: a weights file is refused; ``say`` prints each note (default ``print``) as soon as it
    is known, so a refusal that follows comes after it. Raises ConfigError (one line)."""
    say = say or (lambda line: print(line, flush=True))
    overrides = list(overrides or [])
    path = Path(checkpoint)
    if not path.exists():
        raise ConfigError(f"--checkpoint not found: {path}")
    run_dir = path if path.is_dir() else None
    if run_dir_only and run_dir is None:
        raise ConfigError(f"--checkpoint {path}: not a run directory (a training output_dir holding checkpoints/)")
    if config is None and run_dir is not None and (run_dir / "recipe.yaml").is_file():
        config = run_dir / "recipe.yaml"
    notes: list[str] = []
    recipe = None
    if recipe_of is not None:
        recipe = recipe_of(config, overrides)
        note = command_trust(recipe, config, overrides, [run_dir])
        notes += [note] if note else []
        if note:
            say(note)
        trust = recipe.model.trust_checkpoint
    else:
        trust = any(o.replace(" ", "") == f"{TRUST_KEY}=true" for o in overrides)
    if run_dir is not None:
        explicit = tag is not None
        tag = _run_tag(run_dir, tag)
        note = None if explicit else skipped_note(run_dir, tag)
        notes += [note] if note else []
        if note:
            say(note)
    elif tag is not None:
        raise ConfigError(f"--tag {tag}: --checkpoint {checkpoint} is a weights file, not a run directory")
    pf.check_weights_source(str(path), trust, "--checkpoint", tag)
    return OpenedRun(path, recipe, run_dir, tag, trust, tuple(notes))
