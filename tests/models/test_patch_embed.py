"""Linear tubelet embedding == Conv3d, and Conv3d weights load into it exactly."""

from __future__ import annotations

import pytest
import torch

from avion_ds.models import create_model
from avion_ds.models.patch_embed import PatchEmbed


@pytest.mark.parametrize("tubelet,patch", [(2, 16), (1, 8), (4, 4)])
def test_linear_equals_conv3d(tubelet, patch):
    torch.manual_seed(0)
    conv = PatchEmbed(32, patch, tubelet, 8, 3, 24, mode="conv")
    lin = PatchEmbed(32, patch, tubelet, 8, 3, 24, mode="linear")
    lin.load_state_dict(conv.state_dict())  # 5-D Conv3d weight into the Linear
    x = torch.randn(2, 3, 8, 32, 32)
    out = lin(x)
    assert out.shape == (2, (8 // tubelet) * (32 // patch) ** 2, 24)
    torch.testing.assert_close(out, conv(x), atol=1e-5, rtol=1e-5)


def test_linear_weight_loads_into_conv_and_models_match():
    torch.manual_seed(0)
    lin = create_model("vit_test_tiny", patch_embed="linear")
    conv = create_model("vit_test_tiny", patch_embed="conv")
    conv.load_state_dict(lin.state_dict())  # 2-D Linear weight into the Conv3d
    assert conv.patch_embed.proj.weight.shape == (64, 3, 2, 16, 16)
    x = torch.randn(2, 3, 4, 32, 32)
    torch.testing.assert_close(lin(x), conv(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(conv.patch_embed.proj.weight.reshape(64, -1), lin.patch_embed.proj.weight)


def test_bad_patch_geometry():
    with pytest.raises(ValueError, match="img_size"):
        PatchEmbed(30, 16, 2, 4, 3, 8)
    with pytest.raises(ValueError, match="patch_embed"):
        PatchEmbed(32, 16, 2, 4, 3, 8, mode="fast")
