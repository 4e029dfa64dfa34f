"""DeepSpeed's conventions as its users type them: ``--deepspeed --deepspeed_config FILE`` (the flag pair of
``deepspeed.add_config_arguments``) and Hugging Face's ZeRO configs with ``"auto"`` bucket sizes, through the
parser and through ``avion-ds train``'s main (a dry run: every start-up check, no process group)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from avion_ds.cli.args import Parser
from avion_ds.cli.parsers import add_deepspeed_arguments, train_args
from avion_ds.distributed.ds_hidden import HIDDEN_SIZE_KEYS
from tests.helpers.data import placeholder_chunks

# the ZeRO-3 section of Hugging Face's published ds_config_zero3.json (Transformers' DeepSpeed docs)
HF_ZERO3 = {
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}


def _deepspeed_parser() -> argparse.ArgumentParser:
    import deepspeed

    return deepspeed.add_config_arguments(argparse.ArgumentParser())


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return parser._option_string_actions[flag]


def test_deepspeed_flag_pair_parses() -> None:
    args = train_args(["--config", "r.yaml", "--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed is True and args.deepspeed_config == "ds.json"
    args = train_args(["--config", "r.yaml", "--deepspeed-config", "ds.json"])
    assert args.deepspeed is False and args.deepspeed_config == "ds.json"


def test_deepspeed_flag_mirrors_add_config_arguments() -> None:
    """``--deepspeed`` is DeepSpeed's boolean store_true flag, and an argv DeepSpeed's own parser reads gives
    the same values here."""
    ours = Parser(allow_abbrev=False)
    add_deepspeed_arguments(ours)
    theirs = _deepspeed_parser()
    for flag in ("--deepspeed", "--deepspeed_config"):
        a, b = _action(ours, flag), _action(theirs, flag)
        assert (type(a), a.dest, a.nargs, a.const, a.type) == (type(b), b.dest, b.nargs, b.const, b.type), flag
    assert _action(ours, "--deepspeed").default is False is _action(theirs, "--deepspeed").default
    argv = ["--deepspeed", "--deepspeed_config", "ds.json"]
    mine = train_args(["--config", "r.yaml", *argv])
    ds = theirs.parse_args(argv)
    assert (mine.deepspeed, mine.deepspeed_config) == (ds.deepspeed, ds.deepspeed_config)


def test_a_prefix_is_not_an_option(capsys: pytest.CaptureFixture) -> None:
    """No abbreviations: ``--deepspeed_conf`` is refused in one line rather than read as another option."""
    with pytest.raises(SystemExit) as e:
        train_args(["--config", "r.yaml", "--deepspeed_conf", "ds.json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "unrecognized arguments: --deepspeed_conf" in err[-1]


def test_hf_formula_is_transformers_own() -> None:
    """Our three formulas give what transformers' own ``HfTrainerDeepSpeedConfig.trainer_config_finalize``
    fills, run on a config object whose dotted-key lookups (accelerate's, not installed here) are stood in."""
    hf = pytest.importorskip("transformers.integrations.deepspeed")

    class Probe(hf.HfTrainerDeepSpeedConfig):
        def __init__(self, config: dict) -> None:  # skips accelerate's and transformers' set-up
            self.config, self.mismatches = config, []

        def find_config_node(self, key: str) -> tuple[dict | None, str]:
            *parents, last = key.split(".")
            node: dict | None = self.config
            for p in parents:
                node = node.get(p) if node is not None else None
            return node, last

        def get_value(self, key: str, default: object = None) -> object:
            node, last = self.find_config_node(key)
            return default if node is None else node.get(last, default)

        def is_zero3(self) -> bool:
            return self.config["zero_optimization"]["stage"] == 3

    class Model:
        config = argparse.Namespace(hidden_size=0)

    for hidden in (64, 768, 1408):
        Model.config.hidden_size = hidden
        probe = Probe(json.loads(json.dumps(HF_ZERO3)))
        probe.trainer_config_finalize(argparse.Namespace(get_warmup_steps=lambda n: 0), Model(), 10)
        want = {k: probe.config["zero_optimization"][k] for k in HIDDEN_SIZE_KEYS}
        assert {k: f(hidden) for k, f in HIDDEN_SIZE_KEYS.items()} == want, hidden
    assert want == {
        "reduce_bucket_size": 1408 * 1408,
        "stage3_prefetch_bucket_size": int(0.9 * 1408 * 1408),
        "stage3_param_persistence_threshold": 14080,
    }


def test_hf_auto_keys_filled_from_the_hidden_size() -> None:
    from avion_ds.config import ConfigError
    from avion_ds.distributed.ds_config import build_ds_config
    from avion_ds.tasks import load_recipe

    recipe = load_recipe(
        None,
        ["data.dataset=kinetics", "model.name=vit_base_patch16_224", "batch.global_batch=8", "batch.micro_batch=4"],
    )
    cfg = build_ds_config(HF_ZERO3, recipe, world_size=2)
    zo = cfg["zero_optimization"]
    assert (zo["reduce_bucket_size"], zo["stage3_prefetch_bucket_size"], zo["stage3_param_persistence_threshold"]) == (
        768 * 768,
        int(0.9 * 768 * 768),
        10 * 768,
    )
    with pytest.raises(ConfigError, match=r'zero_optimization.stage3_max_live_parameters="auto" is not filled'):
        build_ds_config({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": "auto"}}, recipe, 2)


def _dry_run_files(tmp: Path) -> Path:
    """A chunk root of placeholder files, EPIC CSVs and a vit_test_tiny recipe (start-up reads no frame)."""
    root = placeholder_chunks(tmp / "chunks")
    csv = "narration_id,video_id,start_timestamp,stop_timestamp,verb_class,noun_class\n" + "".join(
        f"v0_{i},v0,00:00:0{i}.00,00:00:0{i}.50,{i % 4},{i % 3}\n" for i in range(8)
    )
    for name in ("train.csv", "val.csv"):
        (tmp / name).write_text(csv)
    recipe = {
        "model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}},
        "data": {"dataset": "epic", "root": str(root), "train_csv": str(tmp / "train.csv")}
        | {"val_csv": str(tmp / "val.csv"), "num_frames": 4, "size": 32},
        "batch": {"global_batch": 4, "micro_batch": 4},
        "precision": "fp32",
        "output_dir": str(tmp / "run"),
    }
    (tmp / "r.yaml").write_text(yaml.safe_dump(recipe))
    return tmp / "r.yaml"


def test_train_main_takes_the_flag_pair_and_hf_zero3(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``avion-ds train --deepspeed --deepspeed_config <HF's zero3>`` passes start-up; the summary says the
    filled values (vit_test_tiny: hidden size 64)."""
    from avion_ds.cli import train as train_cli

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = _dry_run_files(tmp_path)
    ds = tmp_path / "hf_zero3.json"
    ds.write_text(json.dumps(HF_ZERO3))
    code = train_cli.main(["--config", str(recipe), "--deepspeed", "--deepspeed_config", str(ds), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith('# deepspeed config "auto"'))
    assert "hidden size 64 of vit_test_tiny" in line
    assert f"reduce_bucket_size={64 * 64} stage3_prefetch_bucket_size={int(0.9 * 64 * 64)}" in line
    assert "stage3_param_persistence_threshold=640" in line
    built = json.loads(out.split("# DeepSpeed config\n", 1)[1])
    assert built["zero_optimization"]["reduce_bucket_size"] == 4096
