"""Paths and process environments for tests that run DeepSpeed."""

from __future__ import annotations

import os
from pathlib import Path

from avion_ds.distributed.dist import free_port

REPO = Path(__file__).resolve().parents[2]
# one DeepSpeed op cache per checkout, the same one tests/run.sh exports (ops are cached by absolute path)
TORCH_EXTENSIONS = REPO / ".torch_extensions"


def engine_env(**overrides: str | None) -> dict[str, str]:
    """The environment for a DeepSpeed subprocess: the caller's, plus the CPU accelerator and the shared op
    cache (unless set), one OpenMP thread per rank and this checkout first on ``PYTHONPATH``.

    ``torch.compile`` is off (``TORCHDYNAMO_DISABLE=1``, unless set): DeepSpeed's ZeRO optimizer check imports
    its Muon module, whose ``torch.compile`` decorators load inductor, about 1 CPU-s in each of the suite's
    ~100 ranks that build a ZeRO optimizer, for kernels no recipe runs. A test of ``model.compile`` in a
    subprocess passes ``TORCHDYNAMO_DISABLE=None`` (under the variable the run says its blocks run eager:
    ``avion_ds.models.activation_checkpointing.compile_blocks``).

    ``overrides`` are set last; a ``None`` value removes that variable (e.g. one the code must set itself).
    """
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS))
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def one_rank_vars() -> dict[str, str]:
    """What a one-rank launcher sets (on a free port), for a DeepSpeed engine built in the test process."""
    return {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
