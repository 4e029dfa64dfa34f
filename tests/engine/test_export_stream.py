"""`avion-ds export` of a 2-rank ZeRO-3 run streams into safetensors; the file equals the live
(gathered) weights at save time and loads back through ``create_model(pretrained=...)``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import launch

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(300)
def test_streamed_export_equals_live_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = launch([run], launcher="torchrun", script_path=Path(__file__).with_name("export_script.py"), timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    from safetensors.torch import load_file

    from avion_ds.cli import export as export_cli
    from avion_ds.engine import export
    from avion_ds.models import create_model

    calls = []
    real = export.stream_export
    out = tmp_path / "model.safetensors"
    try:
        export.stream_export = lambda *a, **k: calls.append(1) or real(*a, **k)
        assert export_cli.main(["--checkpoint", str(run), "--out", str(out)]) == 0
    finally:
        export.stream_export = real
    assert calls == [1]  # the ZeRO-3 run took the streaming path
    live = torch.load(run / "live.pt")
    got = load_file(str(out))
    assert sorted(got) == sorted(live)
    for k, v in live.items():
        assert torch.equal(got[k], v), k
    model = create_model("vit_test_tiny", heads={"verb": 4, "noun": 3}, layer_scale=0.1, pretrained=str(out))
    for k, v in model.state_dict().items():
        if k in live:
            assert torch.equal(v, live[k]), k
