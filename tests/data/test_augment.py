"""Device-side augmentation, multi-view aggregation."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from avion_ds.config import DataConfig
from avion_ds.config.normalization import MEAN_STD
from avion_ds.data.augment import DeviceAugment
from avion_ds.data.datasets.views import aggregate_views, split_views

CFG = DataConfig(size=8, hflip=0.0, mixup=0.0, cutmix=0.0, label_smoothing=0.1)


def _frames(b: int = 4, t: int = 2, h: int = 8, w: int = 8) -> torch.Tensor:
    return torch.randint(0, 256, (b, t, h, w, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mean_std", ["imagenet", "clip", "openai"])
def test_normalise_and_layout(mean_std) -> None:
    f = _frames()
    x, y = DeviceAugment(replace(CFG, mean_std=mean_std), 5, train=False)(f, torch.tensor([0, 1, 2, 3]))
    assert x.shape == (4, 3, 2, 8, 8) and x.dtype == torch.float32
    mean, std = MEAN_STD[mean_std]
    want = (f[1, 0, 2, 5, 1].float() / 255 - mean[1]) / std[1]
    assert x[1, 1, 0, 2, 5].item() == pytest.approx(want.item(), abs=1e-5)
    assert y.tolist() == [0, 1, 2, 3]


def test_avion_openai_statistics_on_0_255_pixels() -> None:
    """AVION's --norm-style openai, written as its scripts give it (0-255 pixels)."""
    mean = (108.3272985, 116.7460125, 104.0937362)
    std = (68.5005327, 66.6321579, 70.3231631)
    f = _frames()
    x, _ = DeviceAugment(replace(CFG, mean_std="openai"), 5, train=False)(f, torch.tensor([0, 1, 2, 3]))
    want = (f.permute(0, 4, 1, 2, 3).float() - torch.tensor(mean).view(1, 3, 1, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1, 1
    )
    torch.testing.assert_close(x, want, rtol=0, atol=1e-5)


def test_resize_when_decoder_did_not() -> None:
    x, _ = DeviceAugment(CFG, 5, train=False)(_frames(h=16, w=12), torch.zeros(4, dtype=torch.long))
    assert x.shape == (4, 3, 2, 8, 8)


def test_hflip_on_train_only() -> None:
    f = _frames()
    labels = torch.zeros(4, dtype=torch.long)
    x0, _ = DeviceAugment(CFG, 5, train=False)(f, labels)
    x1, _ = DeviceAugment(replace(CFG, hflip=1.0), 5, train=True)(f, labels)
    assert torch.allclose(x1, x0.flip(-1))
    xe, _ = DeviceAugment(replace(CFG, hflip=1.0), 5, train=False)(f, labels)
    assert torch.equal(xe, x0)


def test_mixup_single_head_soft_targets() -> None:
    aug = DeviceAugment(replace(CFG, mixup=0.8), 5, train=True)
    _, y = aug(_frames(), torch.tensor([0, 1, 2, 3]))
    assert aug.soft_targets and y.shape == (4, 5) and y.dtype == torch.float32
    assert torch.allclose(y.sum(1), torch.ones(4))
    assert y.min() >= 0.1 / 5 - 1e-6  # label smoothing floor


def test_mixup_dict_heads_share_lambda_and_permutation() -> None:
    torch.manual_seed(0)
    import numpy as np

    np.random.seed(1)
    aug = DeviceAugment(replace(CFG, mixup=0.8, cutmix=1.0, label_smoothing=0.0), {"verb": 4, "noun": 6}, train=True)
    labels = {"verb": torch.tensor([0, 1, 2, 3, 1]), "noun": torch.tensor([5, 4, 3, 2, 1])}  # odd batch
    _, y = aug(_frames(b=5), labels)
    assert y["verb"].shape == (5, 4) and y["noun"].shape == (5, 6)
    # weight on the sample's own class and on the flipped partner's class: the same lambda for both heads
    for i, j in ((0, 3), (1, 2)):
        lam_v, lam_n = y["verb"][i, labels["verb"][i]], y["noun"][i, labels["noun"][i]]
        assert lam_v == pytest.approx(lam_n.item())
        assert y["verb"][i, labels["verb"][j]] == pytest.approx(1 - lam_v.item())
    assert y["verb"][4, 1] == 1.0 and y["noun"][4, 1] == 1.0  # the odd one out stays unmixed


def test_cutmix_cuts_the_same_box_in_every_frame() -> None:
    import numpy as np

    np.random.seed(0)
    aug = DeviceAugment(replace(CFG, size=16, cutmix=1.0, label_smoothing=0.0), 3, train=True)
    f = torch.zeros(2, 3, 16, 16, 3, dtype=torch.uint8)
    f[1] = 255
    x, _ = aug(f, torch.tensor([0, 1]))
    changed = (x[0] != x[0, :, :1, :1, :1]).any(0)  # (T, H, W) mask of pasted pixels
    assert changed.any() and torch.equal(changed[0], changed[1]) and torch.equal(changed[0], changed[2])


def test_eval_multi_view_flattens_and_keeps_labels() -> None:
    f = torch.randint(0, 256, (2, 6, 2, 8, 8, 3), dtype=torch.uint8)
    labels = {"verb": torch.tensor([1, 2]), "noun": torch.tensor([0, 1])}
    x, y = DeviceAugment(CFG, {"verb": 3, "noun": 2}, train=False)(f, labels)
    assert x.shape == (12, 3, 2, 8, 8) and torch.equal(y["verb"], labels["verb"])
    single, _ = DeviceAugment(CFG, 3, train=False)(f[1, 4:5], torch.tensor([0]))
    assert torch.equal(x[10], single[0])  # sample-major, view-minor


def test_aggregate_views() -> None:
    logits = torch.tensor([[[10.0, 0.0], [0.0, 10.0], [10.0, 0.0]]])
    p = aggregate_views(logits)
    assert p.shape == (1, 2) and p[0, 0] == pytest.approx(2 / 3, abs=1e-3)
    flat = torch.randn(6, 4)
    assert torch.equal(split_views(flat, 3)[1, 2], flat[5])
    d = aggregate_views({"verb": logits, "noun": logits})
    assert set(d) == {"verb", "noun"}
    with pytest.raises(ValueError, match=r"\(N, V, K\)"):
        aggregate_views(torch.zeros(2, 3))


def test_rejects_float_frames() -> None:
    with pytest.raises(TypeError, match="uint8"):
        DeviceAugment(CFG, 3, train=False)(torch.zeros(1, 2, 8, 8, 3), torch.tensor([0]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runs_on_gpu() -> None:
    f = _frames().cuda()
    x, y = DeviceAugment(replace(CFG, mixup=0.8, hflip=0.5), 5, train=True)(f, torch.tensor([0, 1, 2, 3]))
    assert x.is_cuda and y.is_cuda
