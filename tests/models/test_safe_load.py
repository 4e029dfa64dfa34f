"""The one checkpoint reader (``models.safe_load.load_checkpoint_file``): the types our DeepSpeed
checkpoints and official checkpoints pickle load without trust; anything else is refused, one line
naming file and type, before any of it runs (a real payload: ``__reduce__`` -> ``exec``)."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import numpy as np
import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.storage.safe_load import UntrustedCheckpoint, load_checkpoint_file


class Payload:
    """Unpickling this runs ``exec``: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def test_types_of_our_deepspeed_checkpoints_load_without_trust(tmp_path: Path) -> None:
    """What ZeRO 0-3 fp32/bf16 shards, client files and AVION checkpoints pickle beyond tensors."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    scaler = LossScaler(1.0)
    state = {
        "optimizer_state_dict": {
            "zero_stage": ZeroStageEnum.gradients,
            "loss_scaler": scaler,
            "param_slice_mappings": [collections.OrderedDict(w=fragment_address(numel=6, start=2))],
            "single_partition_of_fp32_groups": [torch.arange(8.0)],
        },
        "args": argparse.Namespace(lr=1e-3, scale=np.float64(0.5)),
        "rng": {"numpy": np.random.get_state(), "torch": torch.get_rng_state()},
    }
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save(state, path)
    for mmap in (False, True):
        got = load_checkpoint_file(path, mmap=mmap)
        osd = got["optimizer_state_dict"]
        assert osd["zero_stage"] is ZeroStageEnum.gradients and osd["loss_scaler"].cur_scale == 1.0
        assert osd["param_slice_mappings"][0]["w"] == fragment_address(numel=6, start=2)
        assert torch.equal(osd["single_partition_of_fp32_groups"][0], torch.arange(8.0))
        assert got["args"].scale == 0.5 and np.array_equal(got["rng"]["numpy"][1], np.random.get_state()[1])


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_payload_is_refused_without_running_it(zip_format: bool, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save(
        {"model": {"w": torch.ones(2)}, "payload": Payload(marker)}, path, _use_new_zipfile_serialization=zip_format
    )
    for mmap in (False, True):
        # the legacy format's error names builtins as bare names
        with pytest.raises(
            UntrustedCheckpoint, match=rf"{path} pickles .*\((builtins\.)?exec\).*--trust-checkpoint"
        ) as info:
            load_checkpoint_file(path, mmap=mmap)
        assert "\n" not in str(info.value) and isinstance(info.value, ConfigError)  # the CLIs: exit 2, one line
    assert not marker.exists()
    got = load_checkpoint_file(path, trust=True)  # the user vouches for the file
    assert marker.exists() and torch.equal(got["model"]["w"], torch.ones(2))


def test_payload_pth_as_pretrained_is_refused(tmp_path: Path) -> None:
    from avion_ds.models import create_model, load_weights
    from avion_ds.models.weights.loading import load_and_report

    marker = tmp_path / "pwned"
    src = create_model("vit_test_tiny", num_classes=5)
    path = tmp_path / "evil.pth"
    torch.save({"model": src.state_dict(), "payload": Payload(marker)}, path)
    with pytest.raises(UntrustedCheckpoint, match=rf"{path} pickles .*builtins.exec"):
        create_model("vit_test_tiny", num_classes=5, pretrained=str(path))
    with pytest.raises(ConfigError, match=rf"^model.pretrained={path}: checkpoint {path} pickles .*--trust-checkpoint"):
        load_and_report(
            create_model("vit_test_tiny", num_classes=5),
            str(path),
            strict=True,
            trust=False,
            run_dir=None,
            is_main=False,
        )
    assert not marker.exists()
    dst = create_model("vit_test_tiny", num_classes=5)
    load_weights(dst, path, strict=True, trust=True)
    assert marker.exists()
    assert all(torch.equal(v, src.state_dict()[k]) for k, v in dst.state_dict().items())
