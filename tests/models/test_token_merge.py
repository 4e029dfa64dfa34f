"""Token merging (ToMe): bipartite soft matching, size-weighted merge, proportional attention and the
model option, checked against a plain re-implementation of the paper's algorithm on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.models import attention as attn_mod
from avion_ds.models import create_model
from avion_ds.models.attention import attention, describe_backend, resolve_backend
from avion_ds.models.token_merge import max_merge, merge_tokens, size_bias, weighted_mean
from avion_ds.tasks import load_recipe


# ---------------------------------------------------------------------------------------------- reference
def reference_merge(
    x: torch.Tensor, size: torch.Tensor, keys: torch.Tensor, r: int, class_token: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's bipartite soft matching for one clip, in loops: x (N, D), size (N,), keys (N, C)."""
    n = x.shape[0]
    set_a, set_b = list(range(0, n, 2)), list(range(1, n, 2))
    unit = [keys[i] / keys[i].norm() for i in range(n)]
    best: dict[int, tuple[float, int]] = {}
    for a in set_a:
        if class_token and a == 0:
            best[a] = (-math.inf, set_b[0])  # the class token is never merged
            continue
        sims = [float(unit[a] @ unit[b]) for b in set_b]
        j = max(range(len(set_b)), key=lambda i: sims[i])  # first of equal maxima
        best[a] = (sims[j], set_b[j])
    merged = sorted(set_a, key=lambda a: -best[a][0])[:r]  # stable: equal scores keep index order
    total = {b: x[b] * size[b] for b in set_b}
    count = {b: size[b].clone() for b in set_b}
    for a in merged:
        b = best[a][1]
        total[b] = total[b] + x[a] * size[a]
        count[b] = count[b] + size[a]
    kept = [a for a in set_a if a not in merged]
    out = [x[a] for a in kept] + [total[b] / count[b] for b in set_b]
    sizes = [size[a] for a in kept] + [count[b] for b in set_b]
    return torch.stack(out), torch.stack(sizes)


def reference_proportional_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, size: torch.Tensor
) -> torch.Tensor:
    """softmax with each key counted ``size`` times, in loops: q, k, v (N, d), size (N,) -> (N, d)."""
    n, d = q.shape
    out = torch.zeros_like(v)
    for i in range(n):
        w = [float(size[j]) * math.exp(float(q[i] @ k[j]) / math.sqrt(d)) for j in range(n)]
        total = sum(w)
        out[i] = sum(w[j] / total * v[j] for j in range(n))
    return out


def _ours(x, size, keys, r, cls):
    out, sizes = merge_tokens(x[None], size[None, :, None], keys[None], r, cls)
    return out[0], sizes[0, :, 0]


# ---------------------------------------------------------------------------------------------- matching
@pytest.mark.parametrize("n", [7, 8, 9, 12])
@pytest.mark.parametrize("cls", [False, True])
def test_merge_matches_reference_for_every_r(n: int, cls: bool) -> None:
    """Odd and even token counts, r from 0 to the most allowed, random sizes from earlier merges."""
    g = torch.Generator().manual_seed(n + 100 * cls)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    keys = torch.randn(n, 4, generator=g, dtype=torch.float64)
    size = torch.randint(1, 4, (n,), generator=g).double()
    for r in range(max_merge(n, cls) + 1):
        got_x, got_s = _ours(x, size, keys, r, cls)
        want_x, want_s = reference_merge(x, size, keys, r, cls)
        assert got_x.shape == (n - r, 5)
        torch.testing.assert_close(got_x, want_x, msg=f"r={r}")
        torch.testing.assert_close(got_s, want_s, msg=f"r={r}")
        assert float(got_s.sum()) == pytest.approx(float(size.sum()))


def test_r_zero_keeps_every_token_and_r_max_is_the_limit() -> None:
    x, keys = torch.randn(9, 3, dtype=torch.float64), torch.randn(9, 4, dtype=torch.float64)
    size = torch.ones(9, dtype=torch.float64)
    out, sizes = _ours(x, size, keys, 0, False)
    order = list(range(0, 9, 2)) + list(range(1, 9, 2))  # A then B, nothing merged
    torch.testing.assert_close(out, x[order])
    assert sizes.tolist() == [1.0] * 9
    assert max_merge(9, False) == 5 and max_merge(9, True) == 4 and max_merge(8, True) == 3
    assert max_merge(1, False) == 0


def test_ties_go_to_the_lowest_index() -> None:
    """Keys that are exactly equal: every A token ties with every B token, and all edges tie."""
    n = 8
    keys = torch.zeros(n, 2, dtype=torch.float64)
    keys[:, 0] = 1.0
    keys[5, :] = torch.tensor([0.0, 1.0])  # one B token orthogonal to all
    x = torch.arange(n * 3, dtype=torch.float64).view(n, 3)
    size = torch.ones(n, dtype=torch.float64)
    for r in range(max_merge(n, False) + 1):
        got_x, got_s = _ours(x, size, keys, r, False)
        want_x, want_s = reference_merge(x, size, keys, r, False)
        torch.testing.assert_close(got_x, want_x, msg=f"r={r}")
        torch.testing.assert_close(got_s, want_s, msg=f"r={r}")
    _, sizes = _ours(x, size, keys, 2, False)
    assert sizes.tolist() == [1.0, 1.0, 3.0, 1.0, 1.0, 1.0]  # A 0 and 2 go to B 1: the first of the equal ones


def test_class_token_is_never_merged() -> None:
    """The class token's key equals a B token's (the most similar pair), yet it stays first, unchanged."""
    n = 9
    x = torch.randn(n, 4, dtype=torch.float64)
    keys = torch.randn(n, 3, dtype=torch.float64)
    keys[0] = keys[1]
    size = torch.ones(n, dtype=torch.float64)
    for r in range(max_merge(n, True) + 1):
        out, sizes = _ours(x, size, keys, r, True)
        assert torch.equal(out[0], x[0]) and float(sizes[0]) == 1.0
    out, _ = _ours(x, size, keys, 1, False)
    assert not torch.equal(out[0], x[0])  # without the class token rule it is the first to merge


def test_batched_merge_treats_each_clip_alone() -> None:
    torch.manual_seed(0)
    x, keys, size = torch.randn(3, 11, 4), torch.randn(3, 11, 6), torch.randint(1, 5, (3, 11, 1)).float()
    out, sizes = merge_tokens(x, size, keys, 4, True)
    for b in range(3):
        want_x, want_s = reference_merge(x[b], size[b, :, 0], keys[b], 4, True)
        torch.testing.assert_close(out[b], want_x)
        torch.testing.assert_close(sizes[b, :, 0], want_s)


# ---------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_proportional_attention_matches_reference(backend: str) -> None:
    torch.manual_seed(0)
    n, heads, d = 7, 2, 4
    qkv = torch.randn(2, n, 3, heads, d, dtype=torch.float64)
    size = torch.randint(1, 6, (2, n, 1)).double()
    out = attention(qkv, backend, bias=size_bias(size, qkv.dtype)).view(2, n, heads, d)
    for b in range(2):
        for h in range(heads):
            q, k, v = (qkv[b, :, i, h] for i in range(3))
            torch.testing.assert_close(out[b, :, h], reference_proportional_attention(q, k, v, size[b, :, 0]))


def test_proportional_attention_equals_attention_over_the_copies() -> None:
    """A key of size 2 weighs as two equal keys."""
    torch.manual_seed(0)
    qkv = torch.randn(1, 5, 3, 2, 4, dtype=torch.float64)
    copies = torch.cat((qkv, qkv[:, 2:3]), dim=1)  # token 2 twice
    size = torch.tensor([1.0, 1.0, 2.0, 1.0, 1.0], dtype=torch.float64).view(1, 5, 1)
    merged = attention(qkv, "sdpa", bias=size_bias(size, qkv.dtype))
    torch.testing.assert_close(merged, attention(copies, "sdpa")[:, :5])


def test_weighted_mean_counts_each_token_size_times() -> None:
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    size = torch.randint(1, 4, (2, 5, 1)).double()
    want = torch.stack([sum(x[b, i] * size[b, i] for i in range(5)) / size[b].sum() for b in range(2)])
    torch.testing.assert_close(weighted_mean(x, size), want)


def test_backend_is_sdpa_when_merging_and_flash_is_refused() -> None:
    assert resolve_backend("auto", "cpu", torch.float32, 16, bias=True) == "sdpa"
    assert describe_backend("auto", "cpu", torch.float32, 16, True) == (
        "sdpa (token merging needs a bias; flash-attn takes none)"
    )
    assert resolve_backend("eager", "cpu", torch.float32, 16, bias=True) == "eager"
    with pytest.raises(ValueError, match="flash-attn takes none"):
        create_model("vit_test_tiny", token_merge=2, attn_backend="flash")
    with pytest.raises(ValueError, match="flash-attn takes none"):
        attention(torch.randn(1, 3, 3, 1, 8), "flash", bias=torch.zeros(1, 1, 1, 3))


def test_auto_takes_sdpa_for_a_bias_even_where_flash_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attn_mod, "_flash_unsupported_reason", lambda *a: None)  # as if flash could run
    attn_mod.resolve_cached.cache_clear()
    try:
        assert resolve_backend("auto", "cpu", torch.bfloat16, 16) == "flash"
        assert resolve_backend("auto", "cpu", torch.bfloat16, 16, bias=True) == "sdpa"
        with pytest.raises(RuntimeError, match="flash-attn takes none"):
            resolve_backend("flash", "cpu", torch.bfloat16, 16, bias=True)
    finally:
        attn_mod.resolve_cached.cache_clear()


# ---------------------------------------------------------------------------------------------- the model
def test_later_blocks_attend_with_the_log_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block 0 attends plainly; block 1 gets log(size) of the tokens block 0 left."""
    biases: list = []

    def recording(qkv, backend, causal=False, bias=None):
        biases.append(bias)
        return attention(qkv, backend, causal, bias)

    torch.manual_seed(0)
    m = create_model("vit_test_tiny", token_merge=[3, 1])
    monkeypatch.setattr(attn_mod, "attention", recording)
    _, (_, sizes), _ = _block_outputs(m, m.blocks, _clip(m))
    assert biases[0] is None
    torch.testing.assert_close(biases[1], sizes.log().transpose(1, 2).unsqueeze(1))
    assert float(biases[1].max()) > 0  # some token stands for more than one


def _clip(model: torch.nn.Module) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, 3, model.num_frames, model.img_size, model.img_size)


@pytest.mark.parametrize("name", ["vit_test_tiny", "clip_vit_test_tiny"])
def test_r_zero_equals_no_merging_bit_for_bit(name: str) -> None:
    torch.manual_seed(0)
    plain = create_model(name)
    for off in (0, [0, 0]):
        m = create_model(name, token_merge=off)
        m.load_state_dict(plain.state_dict())
        assert not any(getattr(a, "size_bias", False) for a in m.modules())
        x = _clip(m)
        if name.startswith("clip"):
            assert torch.equal(m.encode_video(x), plain.encode_video(x))
        else:
            assert torch.equal(m(x), plain(x))


def _block_outputs(model: torch.nn.Module, blocks: torch.nn.ModuleList, x: torch.Tensor) -> list:
    seen: list = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: seen.append(out)) for b in blocks]
    try:
        y = model(x)
    finally:
        for h in hooks:
            h.remove()
    return [y, *seen]


@pytest.mark.parametrize(("pool", "schedule"), [("mean", [4, 2]), ("mean", 2), ("cls", [4, 2]), ("cls", 2)])
def test_tiny_vit_merges_forward_and_backward(pool: str, schedule: int | list[int]) -> None:
    """The token count shrinks by sum(r) (r = the most allowed included), sizes add up, every parameter
    gets a finite gradient; the class token keeps size 1."""
    torch.manual_seed(0)
    m = create_model("vit_test_tiny", token_merge=schedule, pool=pool, head_init_scale=1.0)
    x = _clip(m)
    y, *outs = _block_outputs(m, m.blocks, x)
    n = m.arch.num_patches + (pool == "cls")
    rs = schedule if isinstance(schedule, list) else [schedule] * m.depth
    for i, (tokens, sizes) in enumerate(outs):
        assert tokens.shape[1] == n - sum(rs[: i + 1]) == sizes.shape[1]
        assert float(sizes[0].sum()) == n
        if pool == "cls":
            assert bool((sizes[:, 0] == 1).all())
    y.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and bool(p.grad.isfinite().all()), name


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_checkpointed_blocks_merge_as_plain_ones(policy: str) -> None:
    from avion_ds.models.activation_checkpointing import apply_activation_checkpointing

    torch.manual_seed(0)
    plain = create_model("vit_test_tiny", token_merge=[3, 2], head_init_scale=1.0)
    ckpt = create_model("vit_test_tiny", token_merge=[3, 2], head_init_scale=1.0)
    ckpt.load_state_dict(plain.state_dict())
    apply_activation_checkpointing(ckpt, 1, None, impl="torch", policy=policy)
    x = _clip(plain)
    y, yc = plain(x), ckpt(x)
    assert torch.equal(y, yc)
    y.square().sum().backward()
    yc.square().sum().backward()
    for (name, p), pc in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, pc.grad, msg=name)


def test_bf16_model_merges_with_exact_float32_sizes() -> None:
    """Sizes stay float32 (bf16 counts integers exactly only to 256) and a bf16 model runs."""
    torch.manual_seed(0)
    x = torch.randn(1, 16, 8, dtype=torch.bfloat16)
    tokens, sizes = merge_tokens(x, torch.full((1, 16, 1), 257.0), torch.randn(1, 16, 4), 8, False)
    assert tokens.dtype == torch.bfloat16 and sizes.dtype == torch.float32
    assert float(sizes.sum()) == 16 * 257 and sizes.shape[1] == 8
    assert {float(s) for s in sizes.flatten()} <= {257.0 * k for k in range(1, 10)}
    _, sizes = merge_tokens(torch.randn(1, 600, 8, dtype=torch.bfloat16), None, torch.ones(1, 600, 4), 300, False)
    assert sizes.dtype == torch.float32 and float(sizes.max()) == 301  # every tie goes to B's first token
    m = create_model("vit_test_tiny", token_merge=[4, 2], pool="cls").to(torch.bfloat16)
    assert bool(m(_clip(m).to(torch.bfloat16)).isfinite().all())


def test_mean_pooling_is_size_weighted_and_eager_equals_sdpa() -> None:
    torch.manual_seed(0)
    kw = {"token_merge": [3, 2], "num_classes": 0}
    m = create_model("vit_test_tiny", attn_backend="sdpa", **kw).double()
    e = create_model("vit_test_tiny", attn_backend="eager", **kw).double()
    e.load_state_dict(m.state_dict())
    x = _clip(m).double()
    feats, _, (tokens, sizes) = _block_outputs(m, m.blocks, x)
    torch.testing.assert_close(feats, m.fc_norm(weighted_mean(tokens, sizes)))
    assert not torch.allclose(feats, m.fc_norm(tokens.mean(dim=1)))
    torch.testing.assert_close(e(x), feats)


def test_dual_encoder_video_tower_merges() -> None:
    torch.manual_seed(0)
    m = create_model("clip_vit_test_tiny", token_merge=[16, 8])  # the most allowed: 33 -> 17 -> 9 tokens
    assert m.visual.arch.token_merge == [16, 8] and m.textual.blocks[0].token_merge is None
    x = _clip(m)
    _, *outs = _block_outputs(m.visual, m.visual.blocks, x)
    assert [t.shape[1] for t, _ in outs] == [17, 9] and m.visual.arch.num_patches == 32
    m.encode_video(x).sum().backward()
    assert m.visual.blocks[0].attn.qkv.weight.grad is not None


def test_pretraining_model_refuses_merging() -> None:
    with pytest.raises(ValueError, match="the pretraining encoder does not merge tokens"):
        create_model("pretrain_videomae_test_tiny", token_merge=1)
    with pytest.raises(ConfigError, match=r"^model.token_merge=2: token merging is a fine-tuning"):
        load_recipe(None, ["task=pretrain", "model.name=pretrain_videomae_test_tiny", "model.token_merge=2"])


# ---------------------------------------------------------------------------------------------- the recipe
_FINETUNE = [
    "model.name=vit_test_tiny",
    "data.dataset=kinetics",
    "model.num_classes=5",
    "data.num_frames=4",
    "data.size=32",
]


def test_recipe_key_reaches_the_model() -> None:
    from avion_ds.tasks.contrastive.task import _encoder_kwargs
    from avion_ds.tasks.finetune.task import model_kwargs

    assert "token_merge" not in model_kwargs(load_recipe(None, _FINETUNE))  # off: the registered model exactly
    assert model_kwargs(load_recipe(None, [*_FINETUNE, "model.token_merge=[2,1]"]))["token_merge"] == [2, 1]
    clip = ["task=contrastive", "model.name=clip_vit_test_tiny", "model.token_merge=8"]
    assert _encoder_kwargs(load_recipe(None, clip))["token_merge"] == 8


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-1", "must be >= 0"),
        ("[2,-1]", "must be >= 0"),
        ("[1]", "a schedule of 1 blocks, the model has depth 2"),
        ("[1,1,1]", "a schedule of 3 blocks, the model has depth 2"),
        ("5", "block 0: r=5 but it can merge at most 4 of its 8 tokens"),
        ("[4,3]", "block 1: r=3 but it can merge at most 2 of its 4 tokens"),
        ("2 model.attn_backend=flash", "flash-attn takes none"),
    ],
)
def test_bad_recipes_are_one_line(value: str, why: str) -> None:
    from avion_ds.tasks.finetune.task import FinetuneTask

    value, *extra = value.split()
    with pytest.raises(ConfigError) as e:
        FinetuneTask().check_model(load_recipe(None, [*_FINETUNE, f"model.token_merge={value}", *extra]))
    msg = str(e.value)
    assert msg.startswith(f"model.token_merge={value.replace(',', ', ')}") and why in msg and "\n" not in msg
