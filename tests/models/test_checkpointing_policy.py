"""Checkpoint policies (full / selective): one recompute only, what each op runs per step, same
gradients as plain for every model family, compiled blocks equal to eager."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from avion_ds.models import apply_activation_checkpointing, create_model, remove_activation_checkpointing
from avion_ds.models.activation_checkpointing import checkpoint_policies, compile_blocks
from avion_ds.models.mlp import GeluLinear

SDPA = "_scaled_dot_product_flash_attention_for_cpu"


class OpCounter(TorchDispatchMode):
    """Counts every aten op that runs (forward, recompute and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _step_ops(model: torch.nn.Module, inputs: tuple) -> collections.Counter[str]:
    with OpCounter() as counter:
        out = model(*inputs)
        (out.video.sum() + out.text.sum() if hasattr(out, "video") else out.square().sum()).backward()
    return counter.calls


def _tiny(name: str, **kw):
    torch.manual_seed(0)
    return create_model(name, **kw)


@pytest.mark.parametrize("name", ["vit_test_tiny", "clip_vit_test_tiny"])
def test_checkpointed_block_recomputes_nothing_twice(name: str) -> None:
    """Per block and step: no checkpointing runs GELU twice (the folded MLP recomputes it in backward)
    and attention once; ``full`` re-runs the block once (GELU 2x, attention 2x, q/k/v, output
    projection and fc1 again, never fc2); ``selective`` re-runs GELU but neither attention nor q/k/v."""
    model = _tiny(name, drop_path_rate=0.0)
    blocks = len(model.blocks)  # both towers of the dual encoder
    x = torch.randn(2, 3, model.num_frames, model.img_size, model.img_size)
    inputs = (x, torch.randint(1, 100, (2, model.textual.context_length))) if name.startswith("clip") else (x,)
    plain = _step_ops(model, inputs)
    assert plain["gelu"] == 2 * blocks and plain[SDPA] == blocks
    linears = plain["addmm"]
    for policy, attn, addmm in (("full", 2 * blocks, 3 * blocks), ("selective", blocks, 2 * blocks)):
        apply_activation_checkpointing(model, policy=policy)
        ops = _step_ops(model, inputs)
        assert ops["gelu"] == 2 * blocks, (policy, ops["gelu"])  # forward + ONE recompute
        assert ops[SDPA] == attn, (policy, ops[SDPA])
        assert ops["addmm"] == linears + addmm, (policy, ops["addmm"])
        assert all(not m.fold for b in model.blocks for m in b.modules() if isinstance(m, GeluLinear))
    remove_activation_checkpointing(model)
    assert all(m.fold for m in model.modules() if isinstance(m, GeluLinear))


def _grads(model, inputs, loss_fn, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = loss_fn(model(*inputs))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _family(name: str):
    """(model, inputs, loss) of one tiny model per family, stochastic depth on where it has one."""
    if name == "pretrain_videomae_test_tiny":
        model = _tiny(name, drop_path_rate=0.3)
        x = torch.randn(2, 3, model.encoder.num_frames, model.encoder.img_size, model.encoder.img_size)
        mask = torch.zeros(2, model.num_tokens, dtype=torch.bool)
        mask[:, torch.randperm(model.num_tokens)[: model.num_tokens // 2]] = True
        return model, (x, mask), lambda out: out.loss
    if name == "clip_vit_test_tiny":
        model = _tiny(name, drop_path_rate=0.3)
        x = torch.randn(2, 3, model.num_frames, model.img_size, model.img_size)
        tokens = torch.randint(1, 100, (2, model.textual.context_length))
        return model, (x, tokens), lambda out: (out.video @ out.text.t() * out.logit_scale).square().mean()
    model = _tiny("vit_test_tiny", drop_path_rate=0.3, layer_scale=0.1, attn_backend=name.split(":")[1])
    x = torch.randn(2, 3, model.num_frames, model.img_size, model.img_size)
    return model, (x,), lambda out: out.square().sum()


@pytest.mark.parametrize(
    "name", ["vit:sdpa", "vit:eager", "clip_vit_test_tiny", "pretrain_videomae_test_tiny"], ids=str
)
def test_selective_gradients_equal_plain(name: str) -> None:
    model, inputs, loss_fn = _family(name)
    model.train()
    ref = _grads(model, inputs, loss_fn)
    apply_activation_checkpointing(model, policy="selective")
    assert set(checkpoint_policies(model).values()) == {"torch:selective"}
    got = _grads(model, inputs, loss_fn)
    torch.testing.assert_close(got[0], ref[0])
    assert got[1].keys() == ref[1].keys()
    for n in ref[1]:
        torch.testing.assert_close(got[1][n], ref[1][n], atol=1e-6, rtol=1e-5, msg=n)


def test_selective_needs_torch_impl_and_known_policy() -> None:
    model = _tiny("vit_test_tiny")
    with pytest.raises(ValueError, match="policy 'selective' needs impl 'torch'"):
        apply_activation_checkpointing(model, impl="deepspeed", policy="selective")
    with pytest.raises(ValueError, match="policy expected one of full, selective"):
        apply_activation_checkpointing(model, policy="some")


def test_compiled_selective_blocks_equal_eager() -> None:
    """Regional compilation (inductor) of selectively checkpointed blocks: one step's loss and
    gradients equal eager's (one tiny model: inductor's CPU compile takes tens of seconds)."""
    model, inputs, loss_fn = _family("vit:sdpa")
    model = create_model("vit_test_tiny", depth=1, drop_path_rate=0.0)
    ref = _grads(model, inputs, loss_fn)
    compiled = apply_activation_checkpointing(copy.deepcopy(model), policy="selective")
    assert compile_blocks(compiled) == 1
    got = _grads(compiled, inputs, loss_fn)
    assert abs(got[0].item() - ref[0].item()) <= 1e-5 * max(1.0, abs(ref[0].item()))
    for n in ref[1]:
        torch.testing.assert_close(got[1][n], ref[1][n], atol=1e-5, rtol=1e-4, msg=n)
    assert list(compiled.state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("disabled", [True, False], ids=["dynamo-disabled", "dynamo-on"])
def test_compiled_blocks_state_when_torch_runs_them_eager(
    disabled: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``TORCHDYNAMO_DISABLE=1`` (the suite's subprocesses set it) turns ``torch.compile`` into a no-op: a
    ``model.compile`` run says so in one line instead of training eager as if compiled."""
    if disabled:
        monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    else:
        monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    with caplog.at_level("WARNING", logger="avion_ds.models.activation_checkpointing"):
        assert compile_blocks(create_model("vit_test_tiny", depth=2)) == 2
    said = [r.getMessage() for r in caplog.records if "TORCHDYNAMO_DISABLE" in r.getMessage()]
    assert said == (
        ["model.compile: TORCHDYNAMO_DISABLE=1 is set, so torch runs the blocks eager (not compiled)"]
        if disabled
        else []
    )
