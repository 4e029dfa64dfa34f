"""The `avion-ds train` / `eval` / `models` command lines, parsed before anything heavy is imported.

``avion_ds.cli`` parses with these first (``--help`` and usage errors answer without importing torch,
DeepSpeed or the models); ``train_cli`` / ``eval_cli`` / ``models.listing`` parse with the same functions.
"""

from __future__ import annotations

import argparse

from avion_ds.cli.args import Parser
from avion_ds.cli.plugins import add_plugin_option
from avion_ds.config import add_override_option


def train_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="avion-ds train",
        description="train / fine-tune a video model with DeepSpeed from a YAML recipe",
        epilog="exit codes: 0 done, 1 failure (traceback), 2 bad input (one line), 3 non-finite loss/weights stop",
        allow_abbrev=False,  # a prefix is never an option: --deepspeed is not --deepspeed_config
    )
    p.add_argument("--config", required=True, help="YAML recipe (launch/recipes/*.yaml)")
    add_deepspeed_arguments(p)
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted recipe override, repeatable (e.g. --set optim.lr=1e-3)",
    )
    add_plugin_option(p)
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="allow full unpickling of a weights file that pickles more than tensors (it can run code); "
        "same as --set model.trust_checkpoint=true",
    )
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help="injected by the deepspeed launcher")
    p.add_argument(
        "--exit-after-steps",
        type=int,
        default=None,
        help="stop cleanly after this many optimizer steps in total (preemption drills, tests)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="run every start-up check, print the resolved recipe and DeepSpeed config, exit 0",
    )
    p.add_argument(
        "--resume-from",
        default=None,
        metavar="TAG|none",
        help="resume from this checkpoint tag of output_dir (e.g. step_00000120), or 'none' to start "
        "fresh; default: the newest complete checkpoint (checkpoint.resume)",
    )
    p.add_argument(
        "--finetune-from",
        default=None,
        metavar="FILE",
        help="initialise the model from these weights (any format model.pretrained reads: VideoMAE, "
        "Hugging Face, timm, an avion-ds export); same as --set model.pretrained=FILE",
    )
    args = p.parse_args(argv)
    if args.trust_checkpoint:
        args.overrides.append("model.trust_checkpoint=true")
    return args


def add_deepspeed_arguments(p: argparse.ArgumentParser) -> None:
    """DeepSpeed's flags as ``deepspeed.add_config_arguments`` defines them (``--deepspeed``: a boolean
    store_true helper flag, ``--deepspeed_config FILE``), mirrored so that parsing needs no DeepSpeed import;
    only the config's default (``ds_configs/zero2.json``) is ours. Training always runs on DeepSpeed, so
    ``--deepspeed`` changes nothing: it is accepted because every DeepSpeed example passes it."""
    group = p.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend); always on here",
    )
    group.add_argument(
        "--deepspeed_config",
        "--deepspeed-config",
        default="ds_configs/zero2.json",
        type=str,
        help="DeepSpeed JSON (ds_configs/*.json); 'auto' values are filled from the recipe",
    )


def eval_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="avion-ds eval",
        description="evaluate a run directory or exported weights; writes the task's metrics JSON",
        epilog="exit codes: 0 done, 1 failure (traceback), 2 bad input (one line)",
    )
    p.add_argument("--config", default=None, help="YAML recipe (default: RUN_DIR/recipe.yaml)")
    p.add_argument(
        "--checkpoint",
        required=True,
        help="run directory (latest complete checkpoint) or a weights file (.safetensors/.pt)",
    )
    p.add_argument(
        "--tag",
        default=None,
        help="checkpoint tag of the run directory to evaluate (e.g. step_00000120, or best: the one best.json names); "
        "default: the newest complete one",
    )
    p.add_argument("--out", default=None, help="metrics JSON (default: <run dir or file dir>/eval_metrics.json)")
    add_override_option(p, "eval.temporal_views=2")
    add_plugin_option(p)
    p.add_argument("--split", default="val", choices=("val", "train"), help="annotation file to evaluate on")
    p.add_argument("--no-per-sample", action="store_true", help="omit per-sample scores from the JSON")
    p.add_argument(
        "--offload",
        default="none",
        choices=("none", "cpu", "nvme"),
        help="ZeRO-3 parameter offload for models larger than accelerator memory",
    )
    p.add_argument("--max-live-params", type=float, default=1e9, help="ZeRO-3 stage3_max_live_parameters")
    p.add_argument("--prefetch-bucket", type=float, default=5e7, help="ZeRO-3 stage3_prefetch_bucket_size")
    p.add_argument("--nvme-path", default="/local_nvme", help="directory for --offload nvme")
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "fp32", "bf16", "fp16"),
        help="inference dtype (auto: the recipe's, else bf16 on GPUs and fp32 on CPU)",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="allow full unpickling of checkpoint files (weights file or run directory) that pickle more "
        "than tensors and a few known types (it can run code); "
        "same as --set model.trust_checkpoint=true",
    )
    add_weights_option(p, "same as --set ema.weights=WEIGHTS")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help="injected by the deepspeed launcher")
    args = p.parse_args(argv)
    if args.trust_checkpoint:
        args.overrides.append("model.trust_checkpoint=true")
    if args.weights is not None:
        args.overrides.append(f"ema.weights={args.weights}")
    return args


def add_weights_option(p: argparse.ArgumentParser, more: str) -> None:
    """``--weights model|ema``: which weights of a run directory `eval` and `export` read (the recipe key
    ``ema.weights``: the trained parameters or their weight EMA, runs trained with ``ema.decay`` > 0)."""
    p.add_argument(
        "--weights",
        default=None,
        choices=("model", "ema"),
        help=f"model: the trained parameters; ema: their weight EMA (runs trained with ema.decay > 0); {more}; "
        "default: the run recipe's ema.weights",
    )


def models_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="avion-ds models",
        description="the registered sizes with parameter counts and forward GFLOPs per clip",
        epilog="exit codes: 0 done, 2 bad input (one line)",
    )
    p.add_argument("pattern", nargs="?", default=None, help="only names containing this text")
    p.add_argument("--frames", type=int, default=None, help="clip length for the numbers (default: each model's own)")
    p.add_argument("--size", type=int, default=None, help="input size for the numbers (default: each model's own)")
    p.add_argument("--num-classes", type=int, default=None, help="classifier size (default: each model's own)")
    return p.parse_args(argv)
