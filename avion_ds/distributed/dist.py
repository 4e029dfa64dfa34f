"""Process-group set-up for every launcher (deepspeed, torchrun, plain python) and a clean exit.

Why ``shutdown`` ends with ``os._exit``: two-rank gloo runs with torch 2.14.1 abort at
interpreter exit AFTER finishing (~23 % of runs, "terminate called without an active exception",
SIGABRT) because gloo worker threads still hold work objects while Python tears down. Measured
here: barrier + drop references + gc + destroy_process_group -> 0/20 aborts; that followed by
flushing and ``os._exit`` -> 0/50. (Measured on the project VMs with deepspeed 0.19.8; see the "Clean exit" section of README.md.)
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
import sys
import traceback
import warnings
from collections.abc import Callable

import torch
import torch.distributed as tdist

_WE_INITIALISED = False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_world_size() -> int:
    """World size the launcher announced (1 for a plain ``python`` start)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _fill_single_process_env() -> None:
    """A plain ``python launch/train.py`` gets the env a one-rank launcher would have set."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        return
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def init() -> tuple[int, int, int]:
    """Initialise torch.distributed through DeepSpeed (nccl on GPUs, gloo on the CPU accelerator).

    Returns (rank, world_size, local_rank).
    """
    global _WE_INITIALISED
    _fill_single_process_env()

    import deepspeed  # lazy: deepspeed takes seconds to import
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import
    from deepspeed.utils import logger as ds_logger  # lazy: deepspeed takes seconds to import

    if not os.environ.get("AVION_DS_VERBOSE"):  # DeepSpeed's INFO lines drown the progress line
        ds_logger.setLevel(logging.WARNING)
    warnings.filterwarnings(
        "ignore", message=r".*is deprecated\. Please use `torch\.distributed\.", category=FutureWarning
    )

    if not tdist.is_initialized():
        kw = {}
        if os.environ.get("AVION_DS_PG_TIMEOUT_S"):  # a dead peer otherwise blocks survivors 30 min
            kw["timeout"] = datetime.timedelta(seconds=float(os.environ["AVION_DS_PG_TIMEOUT_S"]))
        deepspeed.init_distributed(
            dist_backend=get_accelerator().communication_backend_name(), auto_mpi_discovery=False, verbose=False, **kw
        )
        _WE_INITIALISED = True
        unlink_shm_buffer()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if get_accelerator().device_name() == "cuda":
        get_accelerator().set_device(local_rank)
    return tdist.get_rank(), tdist.get_world_size(), local_rank


def shm_buffer_path(rank_: int) -> str:
    """Where DeepSpeed's CPU shared-memory all-reduce keeps ``rank_``'s workspace (named by uid, addr, port)."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank_}"


def unlink_shm_buffer() -> None:
    """Remove this rank's name for DeepSpeed's shm all-reduce workspace once every rank has mapped it.

    deepspeed 0.19.8 (ops/csrc/cpu/comm/shm.cpp) creates a 64 MiB file per rank in /dev/shm when all
    ranks are local and never unlinks it, so every multi-rank CPU run leaked 2 x 64 MiB of RAM (202
    files, 13 GiB, after a day of tests here). The mappings stay valid after the unlink, so the
    collective keeps working, and a killed process leaks nothing.
    """
    if not tdist.is_initialized():
        return
    if tdist.get_world_size() > 1:
        tdist.barrier()  # every rank has opened every other rank's file (shm_initialize ran before this)
    path = shm_buffer_path(tdist.get_rank())
    try:  # absent on GPUs or when ranks span hosts: DeepSpeed made no file
        os.unlink(path)
    except FileNotFoundError:
        pass


def is_initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def rank() -> int:
    """This process's rank; before the process group exists, the launcher's ``RANK`` (0 when absent)."""
    if is_initialized():
        return tdist.get_rank()
    value = os.environ.get("RANK", "").strip()
    return int(value) if value.isdigit() else 0


def world_size() -> int:
    return tdist.get_world_size() if is_initialized() else 1


def barrier() -> None:
    if is_initialized():
        tdist.barrier()


def is_main() -> bool:
    return rank() == 0


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In-place SUM across ranks (no-op in one process)."""
    if is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def broadcast_object(obj: object, src: int = 0) -> object:
    if not (is_initialized() and tdist.get_world_size() > 1):
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: object) -> list[object]:
    """Every rank's ``obj`` (a one-element list in one process)."""
    if not (is_initialized() and tdist.get_world_size() > 1):
        return [obj]
    out: list[object] = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def shutdown(code: int = 0, hard_exit: bool = True) -> int:
    """End the process cleanly: barrier (on success), gc, destroy the group, flush, ``os._exit``.

    With ``hard_exit=False`` or when no process group exists, returns ``code`` instead of exiting
    (for in-process callers such as tests). Callers must drop their engine references first.
    """
    if not is_initialized():
        return code
    try:
        if code == 0:
            tdist.barrier()
    except Exception:  # a peer already died: still tear down and exit with our code
        pass
    gc.collect()
    try:
        tdist.destroy_process_group()
    except Exception:
        pass
    if not hard_exit:
        gc.collect()  # in-process callers go on: free what the group held (os._exit below frees it all)
        return code
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_entry(prog: str, fn: Callable[[], int], error_codes: dict[type[BaseException], int]) -> int:
    """Run an entry point's body and always leave through ``shutdown``.

    Exceptions listed in ``error_codes`` are user errors: one line ``<prog>: error: <msg>`` on stderr
    (printed by rank 0 only: every rank meets the same error, checked on the same inputs or exchanged)
    and their exit code on every rank. Anything else prints its traceback and exits 1.

    Only a process group this call created is torn down (``shutdown`` -> ``os._exit``); one that existed
    before (a caller embedding us, a test process) is left alone and the code is returned.
    """
    owns_group = not is_initialized()
    try:
        code = fn()
    except tuple(error_codes) as e:
        if int(os.environ.get("RANK", "0")) == 0:
            print(
                f"{prog}: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr, flush=True
            )
        code = next(c for t, c in error_codes.items() if isinstance(e, t))
    except Exception:
        traceback.print_exc()
        code = 1
    return shutdown(code) if owns_group else code
