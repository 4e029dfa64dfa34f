"""Peak bytes of the tensors a piece of code allocates, on any device (CPU has no allocator statistics).

A ``TorchDispatchMode`` sees every op's outputs: an output whose storage is not one of the op's inputs'
is a new allocation, counted until the last tensor sharing that storage (views included, which also pass
through the mode) is freed. Tensors that existed before the block (inputs, parameters) are not counted.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LivePeak(TorchDispatchMode):
    """``with LivePeak() as m: ...`` -> ``m.peak``: the most bytes allocated inside the block alive at once;
    ``m.live``: those still alive at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._users: dict[int, list[int]] = {}  # storage pointer -> [bytes, tensors alive that share it]

    def _release(self, key: int) -> None:
        entry = self._users.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._users[key]

    def _track(self, t: torch.Tensor, key: int) -> None:
        self._users[key][1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self._users:  # a view of a tensor allocated in the block
                self._track(t, key)
            elif key not in inputs and storage.nbytes() > 0:  # a new allocation
                self._users[key] = [storage.nbytes(), 0]
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                self._track(t, key)
        return out
