"""Who may trust a checkpoint (full unpickling, which can run code): the person running THIS command.

Trust is granted by this command's ``--trust-checkpoint`` / ``--set model.trust_checkpoint=true``, or by
a recipe file the user passes with ``--config`` that says ``model.trust_checkpoint: true``, unless that
file belongs to a run directory (a folder holding ``run.json`` or ``checkpoints/``, or one the command
reads weights from): a run directory's own ``recipe.yaml`` is what the run (or whoever made the
download) wrote, so a value in it never grants trust. Training writes ``trust_checkpoint: false``
into the ``recipe.yaml`` it saves: an earlier ``--trust-checkpoint`` run never trusts files dropped
into its directory later.
"""

from __future__ import annotations

from pathlib import Path

from avion_ds.config import Recipe

KEY = "model.trust_checkpoint"


def set_on_command_line(overrides: list[str]) -> bool:
    """True when a ``--set`` override (or the ``--trust-checkpoint`` flag, which adds one) names the key."""
    return any(item.split("=", 1)[0].strip() == KEY for item in overrides)


def _in_run_dir(config: Path, read_dirs: list[str | Path | None]) -> bool:
    """``config`` lies in a run directory: its folder holds ``run.json`` / ``checkpoints/``, or it is under a
    folder this command reads weights from or writes its run into."""
    folder = config.resolve().parent
    if (folder / "run.json").is_file() or (folder / "checkpoints").is_dir():
        return True
    dirs = [Path(d).resolve() for d in read_dirs if d and str(d).strip() and Path(d).is_dir()]
    return any(folder.is_relative_to(d) for d in dirs)


def command_trust(
    recipe: Recipe, config: str | Path | None, overrides: list[str], read_dirs: list[str | Path | None]
) -> str | None:
    """Set ``recipe.model.trust_checkpoint`` to what this command line grants (module doc); ``read_dirs``:
    the folders (run directories, weights) the command reads or writes. Returns a note line when the
    recipe file's ``true`` was not honoured, else None."""
    m = recipe.model
    if not m.trust_checkpoint or set_on_command_line(overrides) or config is None:
        return None
    if not _in_run_dir(Path(config), read_dirs):
        return None  # the user's own recipe file, passed on this command line
    m.trust_checkpoint = False
    return (
        f"note: {KEY}: true in {config} is ignored (a run directory's own recipe never grants trust); "
        "pass --trust-checkpoint on this command line only if you trust its files"
    )
