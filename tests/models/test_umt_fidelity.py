"""`task: umt` against the reference (OpenGVLab/unmasked_teacher, single_modality), re-implemented HERE from its
code (``models/clip.py``, ``models/modeling_pretrain_umt.py``, ``engines/engine_for_pretraining_umt.py``), not
from ours: the teacher from an OpenAI-layout CLIP state dict (``nn.MultiheadAttention`` weights, class-token
attention from ``need_weights``), the student's encoder on visible tokens, its decoders, the multinomial
attention masking and the three losses. Same weights, same clip, same generator -> the same kept positions
and the same loss within 1e-5 for every loss type; the return-index rule; odd cases (a mask ratio leaving a
fraction of a token, several returned layers with a fractional interval, a teacher at another frame size).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from avion_ds.tasks.umt.losses import per_clip_loss, visible_targets
from avion_ds.tasks.umt.masking import attention_mask
from avion_ds.tasks.umt.model import UMTStudent, student_arch
from avion_ds.tasks.umt.section import UMTConfig
from avion_ds.tasks.umt.task import distill
from avion_ds.tasks.umt.teacher import build_teacher

WIDTH, DEPTH, HEADS, PATCH, PROJ = 64, 2, 2, 8, 16  # the teacher: clip_vit_test_tiny's video tower
S_DEPTH = 3  # the student: vit_test_tiny, 3 blocks deep (another depth than the teacher's)
EPS = 1e-6  # clip_vit_test_tiny's LayerNorm eps (OpenAI's is 1e-5; the reference takes the tower's)


# ------------------------------------------------------------------ the reference, re-implemented
def ref_return_index(depth: int, layers: int, interval: float) -> list[int]:
    """models/clip.py Transformer / modeling_pretrain_umt.py encoder: ``depth - int(i * interval) - 1``."""
    out = []
    for i in range(layers):
        out.append(depth - int(i * interval) - 1)
    return out


def openai_state_dict(resolution: int, seed: int) -> dict[str, torch.Tensor]:
    """A random CLIP visual tower in OpenAI's names (``visual.conv1``, ``transformer.resblocks``, ...)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, std: float = 0.05) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    grid = resolution // PATCH
    sd = {
        "visual.conv1.weight": rnd(WIDTH, 3, PATCH, PATCH),
        "visual.class_embedding": rnd(WIDTH, std=0.5),
        "visual.positional_embedding": rnd(grid * grid + 1, WIDTH, std=0.5),
        "visual.ln_pre.weight": 1 + rnd(WIDTH),
        "visual.ln_pre.bias": rnd(WIDTH),
        "visual.ln_post.weight": 1 + rnd(WIDTH),
        "visual.ln_post.bias": rnd(WIDTH),
        "visual.proj": rnd(WIDTH, PROJ, std=WIDTH**-0.5),
    }
    for i in range(DEPTH):
        p = f"visual.transformer.resblocks.{i}."
        sd |= {
            p + "ln_1.weight": 1 + rnd(WIDTH),
            p + "ln_1.bias": rnd(WIDTH),
            p + "attn.in_proj_weight": rnd(3 * WIDTH, WIDTH, std=0.2),
            p + "attn.in_proj_bias": rnd(3 * WIDTH),
            p + "attn.out_proj.weight": rnd(WIDTH, WIDTH, std=0.1),
            p + "attn.out_proj.bias": rnd(WIDTH),
            p + "ln_2.weight": 1 + rnd(WIDTH),
            p + "ln_2.bias": rnd(WIDTH),
            p + "mlp.c_fc.weight": rnd(4 * WIDTH, WIDTH, std=0.1),
            p + "mlp.c_fc.bias": rnd(4 * WIDTH),
            p + "mlp.c_proj.weight": rnd(WIDTH, 4 * WIDTH, std=0.1),
            p + "mlp.c_proj.bias": rnd(WIDTH),
        }
    return sd


def ref_teacher(sd: dict, videos: torch.Tensor, resolution: int, layers: int, interval: float) -> tuple:
    """clip.py VisionTransformer.forward (mask None, return_attn) + the engine's bicubic resize, batch first
    turned sequence first as the reference runs it; exact-erf GELU (clip_vit_test_tiny's act)."""
    B, C, T, H, W = videos.shape
    if H != resolution:
        videos = F.interpolate(videos.reshape(B, C * T, H, W), size=(resolution, resolution), mode="bicubic")
        videos = videos.view(B, C, T, resolution, resolution)
    v = {k.removeprefix("visual."): t for k, t in sd.items()}
    x = F.conv3d(videos, v["conv1.weight"].unsqueeze(2), stride=(1, PATCH, PATCH))
    N_, C_, T_, H_, W_ = x.shape
    x = x.permute(0, 2, 3, 4, 1).reshape(N_ * T_, H_ * W_, C_)
    x = torch.cat([v["class_embedding"] + torch.zeros(x.shape[0], 1, C_), x], dim=1) + v["positional_embedding"]
    x = F.layer_norm(x, (C_,), v["ln_pre.weight"], v["ln_pre.bias"], EPS).permute(1, 0, 2)  # LND
    index = ref_return_index(DEPTH, layers, interval)
    z, attn = [], None
    for i in range(DEPTH):
        p = f"transformer.resblocks.{i}."
        h = F.layer_norm(x, (C_,), v[p + "ln_1.weight"], v[p + "ln_1.bias"], EPS)
        out, w = F.multi_head_attention_forward(
            h,
            h,
            h,
            C_,
            HEADS,
            v[p + "attn.in_proj_weight"],
            v[p + "attn.in_proj_bias"],
            None,
            None,
            False,
            0.0,
            v[p + "attn.out_proj.weight"],
            v[p + "attn.out_proj.bias"],
            need_weights=(i == DEPTH - 1),
        )
        x = x + out
        h = F.layer_norm(x, (C_,), v[p + "ln_2.weight"], v[p + "ln_2.bias"], EPS)
        x = x + F.linear(F.gelu(F.linear(h, v[p + "mlp.c_fc.weight"], v[p + "mlp.c_fc.bias"])),
                         v[p + "mlp.c_proj.weight"], v[p + "mlp.c_proj.bias"])  # fmt: skip
        attn = w if i == DEPTH - 1 else attn
        if i in index:
            z.append(x)
    x = torch.stack(z)
    K = x.shape[0]
    x = F.layer_norm(x[:, 1:, :, :], (C_,), v["ln_post.weight"], v["ln_post.bias"], EPS)
    x = x.view(K, H_ * W_, N_, T_, C_).permute(0, 2, 3, 1, 4).reshape(K, N_, T_ * H_ * W_, C_)
    x = x @ v["proj"]
    x = x / x.norm(dim=-1, keepdim=True)
    return x, attn[:, 0, 1:]


def ref_attention_mask(attn: torch.Tensor, B: int, mask_ratio: float, g: torch.Generator) -> torch.Tensor:
    """engine_for_pretraining_umt.py, mask_type 'attention' (its multinomial given the generator)."""
    BT, N = attn.shape
    N_vis = N - int(N * mask_ratio)
    importance = torch.multinomial(attn, N, generator=g)
    bool_masked_pos = torch.ones((BT, N))
    pos1 = torch.arange(BT).view(-1, 1).repeat(1, N_vis)
    pos2 = importance[:, :N_vis]
    bool_masked_pos[pos1, pos2] = 0
    return bool_masked_pos.view(B, -1).to(torch.bool)


def sinusoid_table(n_position: int, d_hid: int) -> torch.Tensor:
    """modeling_pretrain_umt.py get_sinusoid_encoding_table."""

    def angle_vec(pos: int) -> list[float]:
        return [pos / np.power(10000, 2 * (j // 2) / d_hid) for j in range(d_hid)]

    table = np.array([angle_vec(p) for p in range(n_position)])
    table[:, 0::2] = np.sin(table[:, 0::2])
    table[:, 1::2] = np.cos(table[:, 1::2])
    return torch.tensor(table, dtype=torch.float, requires_grad=False).unsqueeze(0)


def ref_student(sd: dict, tokens: torch.Tensor, mask: torch.Tensor, layers: int, interval: float) -> torch.Tensor:
    """modeling_pretrain_umt.py PretrainVisionTransformer.forward on the embedded tokens (B, N, D) (patch
    embedding: the same module): sin-cos positions, visible tokens, VideoMAE blocks (q / v bias), norm of the
    returned blocks, the decoders' sin-cos positions, Linear_Decoder (Linear -> LayerNorm -> l2)."""
    B, N, D = tokens.shape
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    x = tokens + sinusoid_table(N, D)
    x_vis = x[~mask].reshape(B, -1, D)
    index, kept = ref_return_index(depth, layers, interval), []
    for i in range(depth):
        p = f"blocks.{i}."
        h = F.layer_norm(x_vis, (D,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], 1e-6)
        bias = torch.cat((sd[p + "attn.q_bias"], torch.zeros_like(sd[p + "attn.v_bias"]), sd[p + "attn.v_bias"]))
        qkv = F.linear(h, sd[p + "attn.qkv.weight"], bias).reshape(B, -1, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * (D // 2) ** -0.5, qkv[1], qkv[2]
        a = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        h = F.linear((a @ v).transpose(1, 2).reshape(B, -1, D), sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"])
        x_vis = x_vis + h
        h = F.layer_norm(x_vis, (D,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], 1e-6)
        h = F.linear(F.gelu(F.linear(h, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])),
                     sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"])  # fmt: skip
        x_vis = x_vis + h
        if i in index:
            kept.append(x_vis)
    x_clip_vis = F.layer_norm(torch.stack(kept), (D,), sd["fc_norm.weight"], sd["fc_norm.bias"], 1e-6)
    K = x_clip_vis.shape[0]
    pos = sinusoid_table(N, D).repeat(B, 1, 1)[~mask].view(B, -1, D).unsqueeze(0).repeat(K, 1, 1, 1)
    x_clip_full = x_clip_vis + pos
    out = []
    for i in range(K):
        p = f"clip_decoder.{i}."
        y = F.linear(x_clip_full[i], sd[p + "head.weight"], sd[p + "head.bias"])
        y = F.layer_norm(y, (y.shape[-1],), sd[p + "norm.weight"], sd[p + "norm.bias"], 1e-6)
        out.append(y / y.norm(dim=-1, keepdim=True))
    return torch.stack(out)


def ref_loss(outputs_clip: torch.Tensor, targets_clip: torch.Tensor, kind: str) -> torch.Tensor:
    """engine_for_pretraining_umt.py: the CLIP loss of each type."""
    if kind == "l2":
        return (2 - 2 * (outputs_clip * targets_clip).sum(dim=-1)).mean()
    loss_func_clip = nn.MSELoss() if kind == "mse" else nn.SmoothL1Loss()
    return loss_func_clip(input=outputs_clip, target=targets_clip)


def ref_targets(norm_clip: torch.Tensor, bool_masked_pos: torch.Tensor) -> torch.Tensor:
    """The engine's targets: the teacher's features at the visible positions."""
    K, B, C_CLIP = norm_clip.shape[0], bool_masked_pos.shape[0], norm_clip.shape[-1]
    clip_bool_masked_pos = bool_masked_pos.unsqueeze(0).repeat(K, 1, 1)
    return norm_clip[~clip_bool_masked_pos].reshape(K, B, -1, C_CLIP)


# ------------------------------------------------------------------ ours, set up alike
def setup(tmp_path, resolution: int, layers: int, interval: float, mask_ratio: float, kind: str) -> SimpleNamespace:
    sd = openai_state_dict(resolution, seed=1)
    path = tmp_path / f"clip_{resolution}.safetensors"
    save_file(sd, str(path))
    cfg = UMTConfig(
        teacher=str(path),
        teacher_model="clip_vit_test_tiny",
        clip_input_resolution=resolution,
        clip_return_layer=layers,
        clip_return_interval=interval,
        clip_student_return_interval=interval,
        clip_loss_type=kind,
        mask_ratio=mask_ratio,
    )
    torch.manual_seed(0)
    grid = {"tubelet_size": 1, "num_frames": 4, "img_size": 32, "patch_size": 32 * PATCH // resolution}
    arch = student_arch("vit_test_tiny", {**grid, "depth": S_DEPTH})  # the teacher's patch grid
    teacher = build_teacher(SimpleNamespace(**{**vars(cfg), "teacher_model": "clip_vit_test_tiny"}), False)
    student = UMTStudent(arch, PROJ, layers, interval)
    student.attach_teacher(teacher)
    with torch.no_grad():  # nonzero biases and norms, so every term of the forward is exercised
        for p in student.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return SimpleNamespace(sd=sd, cfg=cfg, student=student.eval(), teacher=teacher)


@pytest.fixture(
    params=[(16, 2, 1.0), (32, 1, 1.0), (32, 2, 1.5)], ids=["resize32to16_K2", "noresize_K1", "noresize_K2_interval1.5"]
)
def geometry(request: pytest.FixtureRequest) -> tuple:
    return request.param


def test_teacher_features_and_attention_equal_the_reference(tmp_path, geometry) -> None:
    resolution, layers, interval = geometry
    t = setup(tmp_path, resolution, layers, interval, 0.5, "l2")
    videos = torch.randn(2, 3, 4, 32, 32)
    feats, attn = t.teacher(videos)
    ref_feats, ref_attn = ref_teacher(t.sd, videos, resolution, layers, interval)
    assert t.teacher.index == ref_return_index(DEPTH, layers, interval)
    assert feats.shape == ref_feats.shape and attn.shape == ref_attn.shape
    torch.testing.assert_close(feats, ref_feats, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attn, ref_attn, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["l2", "mse", "smooth_l1"])
def test_loss_equals_the_reference(tmp_path, geometry, kind: str) -> None:
    """Whole step: teacher, attention mask from the same generator, student, loss (mask ratio 0.7 of 4
    patches per frame: int(2.8) = 2 hidden, a fraction of a token left)."""
    resolution, layers, interval = geometry
    t = setup(tmp_path, resolution, layers, interval, 0.7, kind)
    videos = torch.randn(3, 3, 4, 32, 32)
    recipe = SimpleNamespace(umt=t.cfg)
    got: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        ours = distill(t.student, videos, None, torch.float32, recipe, torch.Generator().manual_seed(7), got).mean()
        norm_clip, attn = ref_teacher(t.sd, videos, resolution, layers, interval)
        mask = ref_attention_mask(attn, 3, 0.7, torch.Generator().manual_seed(7))
        n = (resolution // PATCH) ** 2  # patches per frame: 4 (2 visible) or 16 (5 visible)
        assert int((~mask).sum()) == 3 * 4 * (n - int(n * 0.7))
        targets = ref_targets(norm_clip, mask)
        sd = {k: v.detach() for k, v in t.student.state_dict().items()}
        outputs = ref_student(sd, t.student.patch_embed(videos), mask, layers, interval)
        ref = ref_loss(outputs, targets, kind)
    assert t.student.return_index == ref_return_index(S_DEPTH, layers, interval)
    torch.testing.assert_close(got["student"], outputs, atol=1e-5, rtol=1e-5)
    assert math.isfinite(float(ref)) and abs(float(ours) - float(ref)) <= 1e-5, (float(ours), float(ref))


def test_attention_masking_draws_the_reference_positions() -> None:
    g = torch.Generator().manual_seed(0)
    attn = torch.rand(6, 49, generator=g).softmax(-1)  # 2 clips x 3 frames, 7x7 patches
    for ratio in (0.8, 0.5, 0.33, 0.9):  # 0.8 * 49 = 39.2, 0.33 * 49 = 16.17: fractions of a token
        ours = attention_mask(attn, 2, ratio, torch.Generator().manual_seed(11))
        ref = ref_attention_mask(attn, 2, ratio, torch.Generator().manual_seed(11))
        assert torch.equal(ours, ref), ratio
        assert int((~ours).view(6, 49).sum(1).unique()) == 49 - int(49 * ratio)


def test_seeded_masks_draw_each_clip_as_the_reference_does_alone() -> None:
    """Per-clip seeds (the loader's ``mask_seed``): each clip's mask is the reference's multinomial draw for
    that clip alone under a generator seeded by its seed, whatever clips share its batch (so a resume on another
    world size draws the same masks)."""
    from avion_ds.tasks.umt.masking import seeded_attention_mask

    g = torch.Generator().manual_seed(1)
    attn = torch.rand(9, 49, generator=g).softmax(-1)  # 3 clips x 3 frames
    seeds = [5, 2**61 + 3, 5]  # two clips with the same seed: the same draw for the same attention rows only
    batch = seeded_attention_mask(attn, seeds, 0.8)
    for b, seed in enumerate(seeds):
        rows = attn[3 * b : 3 * b + 3]
        ref = ref_attention_mask(rows, 1, 0.8, torch.Generator().manual_seed(seed))
        assert torch.equal(batch[b : b + 1], ref), b
        assert torch.equal(seeded_attention_mask(rows, [seed], 0.8), ref), b  # alone or in a batch: the same
    assert not torch.equal(batch[0], batch[1])


@pytest.mark.parametrize(("depth", "layers", "interval"), [(12, 6, 1), (24, 6, 1), (12, 4, 2.5), (3, 3, 1), (12, 1, 1)])
def test_return_index_rule(depth: int, layers: int, interval: float) -> None:
    from avion_ds.tasks.umt.teacher import return_index

    assert return_index(depth, layers, interval) == ref_return_index(depth, layers, interval)


@pytest.mark.parametrize("kind", ["l2", "mse", "smooth_l1"])
def test_loss_formulas_on_random_features(kind: str) -> None:
    g = torch.Generator().manual_seed(3)
    s = F.normalize(torch.randn(2, 3, 10, 16, generator=g), dim=-1)
    feats = F.normalize(torch.randn(2, 3, 20, 16, generator=g), dim=-1)
    mask = torch.zeros(3, 20, dtype=torch.bool)
    for b in range(3):
        mask[b, torch.randperm(20, generator=g)[:10]] = True
    ours = per_clip_loss(s, visible_targets(feats, mask), kind).mean()
    ref = ref_loss(s, ref_targets(feats, mask), kind)
    assert abs(float(ours) - float(ref)) <= 1e-6
