"""What test folders share: the repo path, the environment and launchers for DeepSpeed subprocesses, a tiny
recipe builder and tiny generated data. Import as ``from tests.helpers import ...`` (tests run from the repo
root: ``bash tests/run.sh``). Fixtures stay in the conftest.py files and call these."""

from tests.helpers import reaper
from tests.helpers.data import tiny_epic_data, val_subset
from tests.helpers.env import REPO, TORCH_EXTENSIONS, engine_env, free_port, one_rank_vars
from tests.helpers.launch import launch, run_process
from tests.helpers.recipes import QUICK_DATA, losses, write_recipe

__all__ = [
    "QUICK_DATA",
    "REPO",
    "TORCH_EXTENSIONS",
    "engine_env",
    "free_port",
    "launch",
    "losses",
    "one_rank_vars",
    "reaper",
    "run_process",
    "tiny_epic_data",
    "val_subset",
    "write_recipe",
]
