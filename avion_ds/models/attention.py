"""Multi-head self-attention and THE one place where the attention backend is chosen.

Backends: ``flash`` (flash-attn 2, CUDA fp16/bf16 only), ``sdpa`` (PyTorch
``scaled_dot_product_attention``, which itself dispatches to its flash / memory-efficient /
math kernels) and ``eager`` (the reference ``softmax(Q K^T / sqrt(d)) V``). ``auto`` picks
flash when it can run, else sdpa. Nothing else in avion_ds decides which kernel runs.

Token merging (``token_merge.py``) adds a per-key bias to the logits (proportional attention):
flash-attn takes none, so a model that merges runs sdpa under ``auto`` and refuses ``flash``.

Run-length tokenization (``rlt.py``) packs clips of different token counts end to end
(:func:`packed_attention`): flash-attn's varlen kernel where it can run; under ``sdpa``, PyTorch's own
varlen flash kernel on CUDA fp16/bf16, else SDPA clip by clip; ``eager`` has no packed form and is refused.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "flash", "sdpa", "eager")
NO_BIAS_IN_FLASH = "token merging needs a bias; flash-attn takes none"
NO_PACKED_EAGER = "run-length tokenization packs clips of different lengths; eager attention has no packed form"
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def _flash_fn():
    """Return flash-attn's qkv-packed function, or None when the package is not importable."""
    try:
        from flash_attn import flash_attn_qkvpacked_func  # type: ignore[import-not-found]  # lazy: optional
    except (ImportError, OSError, RuntimeError):  # not installed, or a CUDA build that fails to load
        return None
    return flash_attn_qkvpacked_func


def flash_available() -> bool:
    """True when the flash-attn package imports."""
    return _flash_fn() is not None


@functools.cache
def _flash_varlen_fn():
    """Return flash-attn's varlen qkv-packed function (packed clips), or None when it does not import."""
    try:
        from flash_attn import flash_attn_varlen_qkvpacked_func  # type: ignore[import-not-found]  # lazy: optional
    except (ImportError, OSError, RuntimeError):
        return None
    return flash_attn_varlen_qkvpacked_func


def flash_varlen_available() -> bool:
    """True when flash-attn's varlen kernel imports (what packed clips need of flash)."""
    return _flash_varlen_fn() is not None


def _flash_unsupported_reason(
    device: torch.device, dtype: torch.dtype, head_dim: int, packed: bool = False
) -> str | None:
    """Why flash-attn cannot run for these inputs (``packed``: its varlen kernel), or None when it can."""
    if not flash_available():
        return "flash-attn is not installed (pip install 'avion_ds[gpu]')"
    if packed and not flash_varlen_available():
        return "this flash-attn has no varlen kernel (flash_attn_varlen_qkvpacked_func)"
    if device.type != "cuda":
        return f"inputs are on {device.type}, flash-attn needs CUDA"
    if dtype not in _FLASH_DTYPES:
        return f"dtype is {dtype}, flash-attn needs float16 or bfloat16"
    if head_dim % 8 != 0 or head_dim > 256:
        return f"head_dim={head_dim}, flash-attn needs a multiple of 8 and <= 256"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"GPU compute capability {major}.x, flash-attn 2 needs >= 8.0 (Ampere)"
    return None


@functools.cache
def resolve_cached(
    requested: str, device: torch.device, dtype: torch.dtype, head_dim: int, bias: bool = False, packed: bool = False
) -> str:
    if requested not in BACKENDS:
        raise ValueError(f"attn_backend: expected one of {', '.join(BACKENDS)}, got {requested!r}")
    if packed and requested == "eager":
        raise RuntimeError(f"attn_backend='eager' cannot run: {NO_PACKED_EAGER}; use 'auto', 'sdpa' or 'flash'")
    if requested in ("sdpa", "eager"):
        return requested
    if bias:
        if requested == "flash":
            raise RuntimeError(f"attn_backend='flash' cannot run: {NO_BIAS_IN_FLASH}; use 'auto' or 'sdpa'")
        logger.info(
            "attention backend auto -> sdpa for %s %s head_dim=%d (%s)", device, dtype, head_dim, NO_BIAS_IN_FLASH
        )
        return "sdpa"
    reason = _flash_unsupported_reason(device, dtype, head_dim, packed)
    if requested == "flash":
        if reason is not None:
            raise RuntimeError(f"attn_backend='flash' cannot run: {reason}; use 'auto' or 'sdpa'")
        return "flash"
    chosen = "flash" if reason is None else "sdpa"
    why = "" if reason is None else f" ({reason})"
    logger.info("attention backend auto -> %s for %s %s head_dim=%d%s", chosen, device, dtype, head_dim, why)
    return chosen


@torch.compiler.assume_constant_result  # compiled blocks: decided once at trace time, not traced
def resolve_backend(
    requested: str,
    device: torch.device | str,
    dtype: torch.dtype,
    head_dim: int,
    bias: bool = False,
    packed: bool = False,
) -> str:
    """Map a requested backend to the one that runs for these inputs ("flash" | "sdpa" | "eager").

    ``auto`` -> flash when importable and the inputs are CUDA fp16/bf16 with a supported head dim,
    else sdpa; the choice is logged once per (device, dtype, head_dim). ``bias``: the logits take an
    additive bias (token merging), which flash-attn cannot: ``auto`` -> sdpa. ``packed``: clips of
    different lengths packed end to end (run-length tokenization): flash needs its varlen kernel, eager
    is refused. Explicit ``flash`` where it cannot run raises RuntimeError (never a silent fallback).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return resolve_cached(requested, device, dtype, int(head_dim), bool(bias), bool(packed))


def describe_backend(
    requested: str,
    device: torch.device | str,
    dtype: torch.dtype,
    head_dim: int,
    bias: bool = False,
    packed: bool = False,
) -> str:
    """The backend that runs for these inputs, and why when ``auto`` did not pick flash (for logs);
    ``packed``: on clips packed end to end (run-length tokenization), and how."""
    chosen = resolve_backend(requested, device, dtype, head_dim, bias, packed)
    if packed:
        varlen = torch.device(device).type == "cuda" and dtype in _FLASH_DTYPES and _torch_varlen_fn() is not None
        how = {"flash": "varlen kernel", "sdpa": "torch varlen kernel" if varlen else "clip by clip"}
        return f"{chosen} on packed clips ({how.get(chosen, chosen)}; run-length tokenization)"
    if requested == "auto" and bias:
        return f"{chosen} ({NO_BIAS_IN_FLASH})"
    if requested == "auto" and chosen != "flash":
        return f"{chosen} (auto: {_flash_unsupported_reason(torch.device(device), dtype, int(head_dim))})"
    return chosen if requested == chosen else f"{chosen} (auto)"


def check_backend_request(requested: str, bias: bool = False, packed: bool = False) -> None:
    """Fail early (at model construction) for a backend that can never run in this environment
    (``bias``: the model merges tokens; ``packed``: it packs clips of different lengths)."""
    if requested not in BACKENDS:
        raise ValueError(f"attn_backend: expected one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested == "flash" and bias:
        raise ValueError(f"attn_backend='flash' cannot run: {NO_BIAS_IN_FLASH}; use 'auto', 'sdpa' or 'eager'")
    if requested == "eager" and packed:
        raise ValueError(f"attn_backend='eager' cannot run: {NO_PACKED_EAGER}; use 'auto', 'sdpa' or 'flash'")
    if requested == "flash" and not flash_available():
        raise RuntimeError("attn_backend='flash' cannot run: flash-attn is not installed (pip install 'avion_ds[gpu]')")
    if requested == "flash" and packed and not flash_varlen_available():
        raise RuntimeError(
            "attn_backend='flash' cannot run: this flash-attn has no varlen kernel; use 'auto' or 'sdpa'"
        )


@functools.cache
def _torch_varlen_fn():
    """PyTorch's varlen flash-attention (``torch.nn.attention.varlen.varlen_attn``), or None before it
    (looked up once: :func:`packed_attention` asks in every block)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # lazy: newer torch only
    except ImportError:
        return None
    return varlen_attn


def packed_attention(
    qkv: torch.Tensor, offsets: torch.Tensor, max_len: int, backend: str, lengths: tuple[int, ...]
) -> torch.Tensor:
    """Attention over clips packed end to end, each clip attending only to its own tokens.

    ``qkv`` (total, 3, H, d); ``offsets`` (B+1,) int64 start of each clip (on ``qkv``'s device);
    ``max_len`` >= the longest clip; ``lengths`` the clips' token counts on the host; ``backend`` resolved
    -> (total, H*d). No padding. flash: flash-attn's varlen kernel. sdpa: on CUDA in fp16/bf16, PyTorch's
    own varlen flash kernel where this torch has it; else SDPA on each clip's slice. SDPA on nested jagged
    tensors is not used: on an H200 (ViT-B, bf16, 16 clips) it took 3.5x the clip-by-clip time, and on
    CPU its saved strided nested tensors break activation checkpointing."""
    total, _, H, d = qkv.shape
    if backend == "flash":
        out = _flash_varlen_fn()(qkv, offsets.to(torch.int32), max_len, dropout_p=0.0)  # (total, H, d)
        return out.reshape(total, H * d)
    if backend != "sdpa":
        raise ValueError(f"packed_attention: {NO_PACKED_EAGER}; backend {backend!r}")
    varlen = _torch_varlen_fn() if qkv.device.type == "cuda" and qkv.dtype in _FLASH_DTYPES else None
    if varlen is not None:
        cu = offsets.to(torch.int32)
        q, k, v = qkv.unbind(1)  # (total, H, d) each
        return varlen(q, k, v, cu, cu, max_len, max_len).reshape(total, H * d)
    return sdpa_clip_by_clip(qkv, lengths)


def sdpa_clip_by_clip(qkv: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    """:func:`packed_attention`'s fallback: SDPA on each clip's slice of ``qkv`` -> (total, H*d); the
    lengths are host ints, so no device sync per layer."""
    _, _, H, d = qkv.shape
    clips = qkv.split(list(lengths))  # (n_i, 3, H, d) each
    outs = [F.scaled_dot_product_attention(*c.permute(1, 2, 0, 3).unsqueeze(1).unbind(0)) for c in clips]
    return torch.cat([o[0].transpose(0, 1).reshape(-1, H * d) for o in outs])


def attention(qkv: torch.Tensor, backend: str, causal: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention over packed ``qkv`` (B, N, 3, H, d) with an already resolved backend -> (B, N, H*d).

    ``causal``: token i attends to tokens 0..i only (CLIP's text tower). ``bias``: added to the logits
    (broadcast to (B, H, N, N); token merging's log-sizes), sdpa's ``attn_mask``; flash takes none."""
    B, N, _, H, d = qkv.shape
    if backend == "flash":
        if bias is not None:
            raise ValueError(f"attention: {NO_BIAS_IN_FLASH}")
        out = _flash_fn()(qkv, dropout_p=0.0, causal=causal)  # (B, N, H, d)
        return out.reshape(B, N, H * d)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, N, d)
    if backend == "sdpa":
        if bias is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), is_causal=causal)
    elif backend == "eager":
        attn = torch.matmul(q * d**-0.5, k.transpose(-2, -1))
        if bias is not None:
            attn = attn + bias.to(attn.dtype)
        if causal:
            future = torch.ones(N, N, dtype=torch.bool, device=attn.device).triu_(1)
            attn = attn.masked_fill(future, float("-inf"))
        attn = attn.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(attn, v)
    else:
        raise ValueError(f"attention: backend must be resolved to flash|sdpa|eager, got {backend!r}")
    return out.transpose(1, 2).reshape(B, N, H * d)


class QKVLinear(nn.Linear):
    """The fused q/k/v projection; takes the (VideoMAE-style) bias at call time.

    A module of its own so that ZeRO-3 gathers its weight through the normal forward hooks.
    """

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        return F.linear(x, self.weight, bias if bias is not None else self.bias)


class Attention(nn.Module):
    """Joint space-time multi-head self-attention with VideoMAE qkv bias (q and v bias, no k bias).

    A k bias would add the same q.b_k to every logit of a query row, which softmax cancels, so
    VideoMAE never needs one. CLIP's checkpoints carry all three as one fused ``in_proj_bias``:
    ``k_bias=True`` keeps that layout (one ``qkv.bias``, loaded and saved as is). ``causal``:
    each token attends to itself and the tokens before it (CLIP's text tower).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        backend: str = "auto",
        *,
        k_bias: bool = False,
        causal: bool = False,
        size_bias: bool = False,
        packed: bool = False,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"Attention: expected dim divisible by num_heads, got dim={dim} num_heads={num_heads}")
        check_backend_request(backend, size_bias, packed)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.backend = backend
        self.causal = causal
        self.size_bias = size_bias  # the model merges tokens: logits take a bias, the backend is chosen for it
        self.packed = packed  # run-length tokenization: clips of different lengths packed end to end
        fused = bool(qkv_bias and k_bias)
        self.qkv = QKVLinear(dim, dim * 3, bias=fused)
        if qkv_bias and not fused:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = None
            self.v_bias = None
        self.proj = nn.Linear(dim, dim)

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The packed projection (B, N, 3, H, d)."""
        B, N, _ = x.shape
        bias = None
        if self.q_bias is not None:
            bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias))
        return self.qkv(x, bias).view(B, N, 3, self.num_heads, self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self._qkv(x)
        backend = resolve_backend(self.backend, qkv.device, qkv.dtype, self.head_dim)
        return self.proj(attention(qkv, backend, self.causal))

    def forward_keys(self, x: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention with a logit ``bias`` (token merging's log-sizes, or None) and the keys averaged
        over heads (B, N, d): the similarity token merging matches on."""
        qkv = self._qkv(x)
        backend = resolve_backend(self.backend, qkv.device, qkv.dtype, self.head_dim, self.size_bias)
        return self.proj(attention(qkv, backend, self.causal, bias)), qkv[:, :, 1].mean(dim=2)

    def forward_packed(
        self, x: torch.Tensor, offsets: torch.Tensor, max_len: int, lengths: tuple[int, ...]
    ) -> torch.Tensor:
        """Attention over clips packed end to end: ``x`` (1, total, D), ``offsets`` / ``max_len`` /
        ``lengths`` as :func:`packed_attention` takes them -> (1, total, D)."""
        qkv = self._qkv(x)[0]  # (total, 3, H, d)
        backend = resolve_backend(self.backend, qkv.device, qkv.dtype, self.head_dim, packed=True)
        return self.proj(packed_attention(qkv, offsets, max_len, backend, lengths)).unsqueeze(0)
