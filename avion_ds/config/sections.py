"""The core recipe sections: model, data, optim, schedule, batch, eval, ema, checkpoint, logging.

What a task alone reads lives in the task's own section, registered by the task, and what a dataset
alone reads in the dataset's (``avion_ds.config.register_section``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    name: str = "vit_base_patch16_224"
    pretrained: str | None = None  # path to a VideoMAE / HF / timm / avion_ds checkpoint
    pretrained_strict: bool = True  # refuse to train when < 90% of the backbone parameters were loaded
    trust_checkpoint: bool = (
        False  # allow full unpickling of checkpoint files: model.pretrained, resumed and evaluated runs (can run code)
    )
    num_classes: int = 400  # single-head models
    heads: dict[str, int] | None = None  # e.g. {"verb": 97, "noun": 300} (EPIC); overrides num_classes
    tubelet_size: int | None = None  # frames per token; None = the registered size's (2)
    drop_path_rate: float = 0.1
    drop_path_schedule: str | None = None  # None: the model's own (clip_vit_* / vit_clip_*: uniform) | linear | uniform
    head_drop_rate: float = 0.0
    head_init: str = "videomae"  # videomae: trunc-normal(0.02) x 0.001 | avion: N(0, 0.01), zero bias (AVION's fc_cls)
    attn_backend: str = "auto"  # auto | flash | sdpa | eager
    patch_embed: str = "linear"  # linear | conv
    # pool / pos_embed: None = the registered model's own (vit_*: mean, sincos; vit_clip_*: cls, clip)
    pool: str | None = None  # None | mean (+fc_norm) | cls
    pos_embed: str | None = None  # None | sincos | learned | clip
    activation_checkpointing: bool = False
    activation_checkpoint_every: int = 1  # checkpoint every k-th block
    activation_checkpoint_first_n: int | None = None  # only the first n blocks (None = all)
    activation_checkpoint_impl: str = "torch"  # torch | deepspeed
    activation_checkpoint_policy: str = "full"  # full: keeps a block's input | selective: + attention, q/k/v
    compile: bool = False  # torch.compile each transformer block (regional); ZeRO 0-2
    # ToMe token merging in the video transformer: r tokens merged after every block, or a list of r per block; 0 = off
    token_merge: int | list[int] = 0
    plan_may_merge_tokens: bool = False  # avion-ds plan may turn token merging on when nothing fits without it
    # FLIP patch dropout: this fraction of the patch tokens dropped at random in training (evaluation sees all)
    patch_dropout: float = 0.0
    plan_may_drop_patches: bool = False  # avion-ds plan may turn patch dropout on when nothing fits without it
    # run-length tokenization (RLT): patches that repeat the previous tubelet's (mean |difference| of the normalised
    # clip not above this) dropped, in training and evaluation; 0 = off; the paper's default 0.1 (docs/models.md)
    rlt_threshold: float = 0.0
    head_label_map: str = (
        "auto"  # auto: a 710-row (Kinetics-710) head -> Kinetics-400/600/700 rows by VideoMAE V2's map | none
    )


@dataclass
class DataConfig:
    """The keys every dataset reads. A dataset's own keys are its registered section (``epic_mir.val_sentences``,
    declared in its module under ``avion_ds/data/datasets/``)."""

    dataset: str = "epic"  # a registered dataset (avion_ds/data/datasets/registry.py; checked by tasks.build_recipe)
    root: str = ""  # chunk root (holds manifest.jsonl) or root of whole videos
    train_csv: str = ""  # annotations (ego4d: narration pickle / CSV / JSONL)
    val_csv: str = ""
    val_dataset: str = ""  # "" = dataset; e.g. epic_mir to evaluate ego4d pretraining zero-shot on EPIC MIR
    val_root: str = ""  # "" = root; videos of the validation split when they live elsewhere
    fps: float = 0.0  # frame times at this rate (AVION reads Ego4D at 30); 0 = each video's own rate
    chunked: bool = True
    # litdata shards written by `avion-ds pack --config` (local dir | http(s)://... | s3://...): clips are read
    # from them instead of data.root (docs/data.md, Shards); credentials come from the environment only
    shards: str = ""
    num_frames: int = 16
    sampling: str = "segment"  # segment (TSN, EPIC/AVION) | stride (Kinetics/VideoMAE)
    stride: int = 4
    size: int = 224
    decoder: str = "auto"  # auto (probe on the first chunk) | decord | torchcodec | pyav | torchcodec-cuda
    decoder_threads: int = 1
    workers: int = 4
    crop_scale: list[float] = field(default_factory=lambda: [0.5, 1.0])
    crop_ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333])
    # imagenet (VideoMAE) | clip (OpenAI CLIP) | openai (AVION's --norm-style openai): config/normalization.py;
    # the pretrained weights' own is named at load, and a differing value said in one line (docs/models.md)
    mean_std: str = "imagenet"
    hflip: float = 0.5
    mixup: float = 0.0
    cutmix: float = 0.0
    label_smoothing: float = 0.1
    on_error: str = "skip"  # skip | raise
    decode_timeout_s: float = 60.0
    class_list: str = ""  # class names of a labelled dataset (its module says the format; "" = its default file)
    quarantine: str = "auto"  # auto: <root>/quarantine.tsv if present (written by avion-ds check) | none | PATH
    rand_aug: str = ""  # timm RandAugment spec, e.g. rand-m7-n4-mstd0.5-inc1 (same ops for every frame of a clip)
    reprob: float = 0.0  # random erasing: probability per clip, one box on every frame (pixel mode; VideoMAE: 0.25)
    num_sample: int = 1  # repeated augmentation: augmented views per loaded training clip (VideoMAE: 2)
    interpolation: str = "bilinear"  # bilinear | bicubic: crop resize and RandAugment geometric ops


@dataclass
class OptimConfig:
    lr: float = 1.5e-3  # base lr for base_batch; scaled linearly by global_batch / base_batch
    base_batch: int = 256
    scale_lr: bool = True
    scale_lr_bounds: bool = False  # also scale min_lr and schedule.warmup_start_lr by global/base batch (AVION CLS)
    min_lr: float = 1e-6
    layer_decay: float = 0.75  # 1.0 disables layer-wise lr decay
    weight_decay: float = 0.05
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    clip_grad: float = 0.0  # 0 disables clipping (always written explicitly to the DS config)
    no_decay: str = "model"  # model: its no_weight_decay() + 1-d + biases | avion: AVION's rule (1-d, biases, norms)
    name: str = (
        "adamw"  # adamw | lion (DeepSpeed's Lion: sign update, decoupled decay) | sgd (momentum betas[0], AVION CLS)
    )
    weight_decay_end: float | None = (
        None  # cosine weight_decay -> this over the run, decayed groups only; None: constant
    )


@dataclass
class ScheduleConfig:
    epochs: int = 30
    warmup_epochs: float = 2.0
    warmup_start_lr: float | None = None  # None: warmup (step+1)/W x lr; a value: AVION/BEiT's linspace(start, lr, W)
    fix_lr: bool = False  # constant lr = the (scaled) base lr from the first step, no warmup or decay (AVION --fix-lr)
    steps_per_epoch: int | None = None  # cap (for smoke runs); None = full epoch


@dataclass
class BatchConfig:
    global_batch: int | None = 256  # None: micro * accum * world
    micro_batch: int = 8
    grad_accum: int | None = None  # None: derived from global / (micro * world)


@dataclass
class EvalConfig:
    every_epochs: int = 1
    temporal_views: int = 1
    spatial_views: int = 1
    batch_size: int | None = None  # None: micro_batch
    protocol: str = (
        "custom"  # k400 | ssv2 | epic | custom: locks the eval sampling and views (data/datasets/protocols.py)
    )


@dataclass
class EmaConfig:
    """Exponential moving average of the fp32 master weights (VideoMAE / AVION ``--model-ema``)."""

    decay: float = 0.0  # 0: off; VideoMAE / AVION use 0.9999 (ema = decay * ema + (1 - decay) * weights, per update)
    weights: str = "ema"  # ema | model: what validation, `avion-ds eval` of a run directory and `export` use


@dataclass
class CheckpointConfig:
    every_steps: int = 0  # 0: only at epoch end
    keep_last: int = 2
    resume: bool = True  # auto-resume from the latest complete checkpoint in output_dir


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    log_every: int = 10
    progress: bool = True
