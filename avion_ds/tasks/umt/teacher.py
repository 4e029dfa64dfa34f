"""The frozen CLIP teacher of unmasked-teacher distillation: a dual encoder's video tower run frame by frame.

The tower is our ``VideoViT`` in the CLIP layout (the ``vision`` arch of the registered dual encoder
``umt.teacher_model``) at one frame of ``umt.clip_input_resolution`` px, loaded through the video ViT's own
adapter (``prepare_checkpoint``: OpenAI CLIP / OpenCLIP / AVION / LaViLa files, our dual-encoder runs and
exports; read through ``load_and_report``, the one weight-loading entry point, once per process); a file
of any other format is refused. ``ClipTeacher(frames)`` returns, as the official
``models/clip.py`` does, the features of the last ``clip_return_layer`` blocks (every
``clip_return_interval``: block ``depth - int(i * interval) - 1``), each through ``ln_post`` (the tower's
``norm``) on the patch tokens, ``@ proj`` and l2-normalised, as (K, B, T*HW, C) float32, and the class
token's attention over the patches in the last block (heads averaged) as (B*T, HW) float32.

Holding rule: the teacher is frozen (``requires_grad`` False, eval mode) and is NOT a submodule of the
trained model: it is kept in the student's ``__dict__`` (:meth:`UMTStudent.attach_teacher`), so it is in
no state dict, optimizer, checkpoint or ZeRO partition; every rank holds a full replica in float32 under
every ZeRO stage, ZeRO-3 included (the forward runs under autocast on CUDA). Replicated, not partitioned,
because it is frozen and read every step with no gradients: ZeRO-3 would all-gather each block on every
forward to save its parameters' bytes, and there are no gradients or optimizer states to shard. The
memory planner counts it so (``avion_ds.tasks.umt.memory``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.distributed import dist

DUAL_ENCODER = "dual_encoder"  # the video ViT loader's name for a dual encoder's (CLIP's) video tower


def return_index(depth: int, layers: int, interval: float) -> list[int]:
    """The reference's returned blocks: ``depth - int(i * interval) - 1`` for i < ``layers``."""
    return [depth - int(i * interval) - 1 for i in range(layers)]


def tower_arch(teacher_model: str, resolution: int) -> Any:
    """The ``ViTArch`` of ``teacher_model``'s video tower at one frame of ``resolution`` px (no drop path,
    no patch dropout); one-line ConfigError for a name that is not a registered dual encoder."""
    from avion_ds.models import registered_arch  # lazy: heavy (timm, torchvision)

    try:
        arch = registered_arch(teacher_model)
    except ValueError as e:
        raise ConfigError(f"umt.teacher_model={teacher_model!r}: {e}") from None
    vision = getattr(arch, "vision", None)
    if vision is None or vision.proj_dim is None:
        raise ConfigError(f"umt.teacher_model={teacher_model!r} is not a registered dual encoder (clip_*)")
    try:
        return vision.replace(num_frames=1, img_size=resolution, drop_path_rate=0.0, patch_dropout=0.0)
    except ValueError as e:
        raise ConfigError(f"umt.clip_input_resolution={resolution}: {e}") from None


def class_attention(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The class token's attention over the patch tokens in ``block`` for its input ``x`` (B, 1+N, D):
    softmax(q k^T / sqrt(d)) of the class row, heads averaged (``nn.MultiheadAttention``'s weights), (B, N)."""
    attn = block.attn
    qkv = attn._qkv(block.norm1(x)).float()  # (B, 1+N, 3, H, d)
    q, k = qkv[:, 0, 0], qkv[:, :, 1]  # (B, H, d), (B, 1+N, H, d)
    logits = torch.einsum("bhd,bnhd->bhn", q, k) * attn.head_dim**-0.5
    return logits.softmax(dim=-1).mean(dim=1)[:, 1:]


class ClipTeacher(nn.Module):
    """A frozen CLIP video tower returning distillation targets and its class attention (module doc)."""

    def __init__(self, tower: nn.Module, layers: int, interval: float) -> None:
        super().__init__()
        self.tower = tower
        self.resolution = tower.img_size
        self.index = return_index(tower.depth, layers, interval)
        if min(self.index) < 0:
            raise ValueError(f"returning {layers} layers every {interval} needs more than {tower.depth} blocks")
        self.requires_grad_(False)
        self.eval()

    @property
    def output_dim(self) -> int:
        return int(self.tower.proj.shape[1])

    def describe(self) -> str:
        """One start-up line: the tower, its frame size, the returned blocks and what it holds per rank."""
        n = sum(p.numel() for p in self.parameters())
        return (
            f"umt teacher {self.tower.arch.name}: frozen, {self.resolution} px frames, blocks {self.index} -> "
            f"{self.output_dim}-d, {n:,} parameters replicated on every rank (outside the optimizer)"
        )

    def train(self, mode: bool = True) -> ClipTeacher:
        """Always eval mode: the teacher never trains."""
        return super().train(False)

    def _autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """bf16 (fp16 where bf16 is missing) autocast on CUDA, as the reference; none elsewhere."""
        if device.type != "cuda":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast("cuda", dtype=dtype)

    @torch.no_grad()
    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, T, H, W) normalised frames -> features (K, B, T*HW, C) and class attention (B*T, HW)."""
        B, C, T, H, W = frames.shape
        x = frames.permute(0, 2, 1, 3, 4).reshape(B * T, C, 1, H, W)
        if H != self.resolution or W != self.resolution:
            x = F.interpolate(x.flatten(1, 2), size=(self.resolution,) * 2, mode="bicubic", align_corners=False)
            x = x.unsqueeze(2)
        tower = self.tower
        with self._autocast(frames.device):
            x = tower.forward_tokens(x.to(tower.patch_embed.proj.weight.dtype))
            N = x.shape[1] - 1
            feats = x.new_empty(len(self.index), B * T, N, self.output_dim, dtype=torch.float32)
            attn, kept = None, sorted(self.index)
            for i, blk in enumerate(tower.blocks):
                if i == len(tower.blocks) - 1:
                    attn = class_attention(blk, x)
                x = blk(x)
                if i in kept:  # projected as it comes, in block order: the block outputs are not kept alive
                    feats[kept.index(i)] = F.normalize((tower.norm(x[:, 1:]) @ tower.proj.to(x.dtype)).float(), dim=-1)
        K = feats.shape[0]
        return feats.view(K, B, T * N, self.output_dim), attn.float()


def load_tower(tower: nn.Module, source: str | Path, trust: bool, mean_std: str | None = None) -> None:
    """``source`` into ``tower`` through the project's weight loading (``load_and_report``: the video ViT's
    dual-encoder adapter; on rank 0 the load line with the weights' normalisation, and one more line when
    ``mean_std``, the recipe's ``data.mean_std``, differs). One-line ConfigError naming ``umt.teacher`` for
    an unreadable file, a file that is not a CLIP visual tower, or one that leaves tower weights unfilled
    (another size than ``umt.teacher_model``)."""
    from avion_ds.models.weights.loading import load_and_report  # lazy: heavy (timm, torchvision)

    key = f"umt.teacher={source}"
    try:
        report = load_and_report(
            tower,
            str(source),
            strict=False,
            trust=trust,
            run_dir=None,
            is_main=dist.is_main(),
            log=lambda line: print(f"umt teacher: {line}", flush=True),
            mean_std=mean_std,
            key="umt.teacher",
        )
    except ConfigError as e:  # unreadable, or a pickle of objects outside the safe loader's allowlist
        msg = str(e)
        raise ConfigError(msg if msg.startswith(key) else f"{key}: {msg}") from None
    except RuntimeError as e:  # a shape the adapter could not fit
        raise ConfigError(f"{key}: {str(e).strip().splitlines()[-1].strip()}") from None
    if report.format != DUAL_ENCODER:
        raise ConfigError(
            f"{key}: not a CLIP visual tower (format {report.format}; expected CLIP / OpenCLIP / "
            "AVION / LaViLa weights or a dual-encoder run)"
        )
    if report.missing:
        raise ConfigError(
            f"{key}: the file's visual tower lacks {', '.join(report.missing[:4])} (another teacher_model?)"
        )


# teachers built by the start-up checks (``UMTTask.check_model``), handed to ``build_model`` of the same
# process so the file is read once; keyed by everything the build reads
_BUILT: dict[tuple, ClipTeacher] = {}


def _cache_key(cfg: Any, trust: bool, mean_std: str | None) -> tuple:
    path = Path(cfg.teacher)
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    geometry = (cfg.teacher_model, cfg.clip_input_resolution, cfg.clip_return_layer, cfg.clip_return_interval)
    return (str(path.resolve()), stamp, trust, mean_std, geometry)


def build_teacher(cfg: Any, trust: bool, mean_std: str | None = None, *, keep: bool = False) -> ClipTeacher:
    """The recipe's frozen teacher (``cfg``: the ``umt`` section), weights loaded, on the CPU. ``keep``:
    hold it for the next call of this process (the start-up check's build, taken by ``build_model``)."""
    from avion_ds.models.vit.model import VideoViT  # lazy: heavy (timm, torchvision)

    if not cfg.teacher:
        raise ConfigError("umt.teacher is required: the CLIP weights the student distils from")
    key = _cache_key(cfg, trust, mean_std)
    held = _BUILT.pop(key, None)
    if held is not None:
        if keep:
            _BUILT[key] = held
        return held
    tower = VideoViT(tower_arch(cfg.teacher_model, cfg.clip_input_resolution))
    load_tower(tower, cfg.teacher, trust, mean_std)
    try:
        teacher = ClipTeacher(tower, cfg.clip_return_layer, cfg.clip_return_interval)
    except ValueError as e:
        raise ConfigError(f"umt.clip_return_layer={cfg.clip_return_layer}: {e} ({cfg.teacher_model})") from None
    if keep:
        _BUILT.clear()  # one recipe's teacher at a time
        _BUILT[key] = teacher
    return teacher
