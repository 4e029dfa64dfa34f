"""Bad input fails before any training work with a one-line error naming the culprit."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from avion_ds.cli import train

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def setup(tmp_path: Path) -> dict:
    (tmp_path / "chunks" / "v0").mkdir(parents=True)
    (tmp_path / "chunks" / "v0" / "0.mp4").write_bytes(b"")  # start-up stats a sample of chunk files
    (tmp_path / "chunks" / "manifest.jsonl").write_text(  # checks never open the video itself
        '{"video_id": "v0", "path": "v0/0.mp4", "start_frame": 0, "frames": 300, "fps": 30, "width": 64, '
        '"height": 48, "job": 1}\n'
    )
    rows = "".join(f"v0_{i},v0,00:00:0{i}.00,00:00:0{i}.50,{i % 4},{i % 3}\n" for i in range(8))
    for name in ("train.csv", "val.csv"):
        (tmp_path / name).write_text(
            "narration_id,video_id,start_timestamp,stop_timestamp,verb_class,noun_class\n" + rows
        )
    recipe = {
        "model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}},
        "data": {
            "dataset": "epic",
            "root": str(tmp_path / "chunks"),
            "train_csv": str(tmp_path / "train.csv"),
            "val_csv": str(tmp_path / "val.csv"),
            "num_frames": 4,
            "size": 32,
        },
        "batch": {"global_batch": 8, "micro_batch": 4},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return {"tmp": tmp_path, "recipe": path, "data": recipe}


def no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make creating a process group fail the test (the libraries' entry points are patched, not ours)."""
    import deepspeed
    import torch.distributed as tdist

    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process group was about to be created: preflight let the bad input through")

    monkeypatch.setattr(tdist, "is_initialized", lambda: False)  # as in a fresh process, whatever ran before
    monkeypatch.setattr(deepspeed, "init_distributed", tripwire)
    monkeypatch.setattr(tdist, "init_process_group", tripwire)


def _run(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    code = train.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def _args(setup: dict, *extra: str) -> list[str]:
    return ["--config", str(setup["recipe"]), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json"), *extra]


def test_missing_data_path(setup: dict, capsys: pytest.CaptureFixture) -> None:
    err = _run(capsys, _args(setup, "--set", f"data.val_csv={setup['tmp'] / 'nope.csv'}"))
    assert "data.val_csv" in err and "nope.csv" in err


def test_recipe_key_typo(setup: dict, capsys: pytest.CaptureFixture) -> None:
    err = _run(capsys, _args(setup, "--set", "optim.learning_rate=1e-3"))
    assert "optim.learning_rate" in err


def test_batch_arithmetic(setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")  # as a 3-rank launcher would announce
    err = _run(capsys, _args(setup))
    assert "global_batch 8 is not divisible by micro 4 x world 3 = 12" in err


def test_ds_config_not_json(setup: dict, capsys: pytest.CaptureFixture) -> None:
    bad = setup["tmp"] / "bad.json"
    bad.write_text("zero_optimization:\n  stage: 2\n")
    err = _run(capsys, ["--config", str(setup["recipe"]), "--deepspeed_config", str(bad)])
    assert str(bad) in err and "not valid JSON" in err


def test_resume_into_different_models_dir(setup: dict, capsys: pytest.CaptureFixture) -> None:
    run = setup["tmp"] / "run"
    run.mkdir()
    (run / "run.json").write_text('{"model": {"name": "vit_test_small"}}')
    err = _run(capsys, _args(setup))
    assert "different model" in err and "vit_test_small" in err


# ---------------------------------------------------------------------------------------------
# malformed invocations, table-driven: each ends in ONE stderr line naming the key
# and value, exit code 2, before any process group exists (creating one trips a wire: no_process_group)
# ---------------------------------------------------------------------------------------------
def _ds_file(setup: dict, patch: Callable[[dict], None]) -> Path:
    cfg = json.loads((REPO / "ds_configs" / "zero2.json").read_text())
    patch(cfg)
    path = setup["tmp"] / "ds.json"
    path.write_text(json.dumps(cfg))
    return path


def _write_recipe(setup: dict, text: str) -> None:
    setup["recipe"].write_text(text)


def _no_manifest(s: dict) -> None:
    (s["tmp"] / "chunks" / "manifest.jsonl").unlink()


def _bad_header(s: dict) -> None:
    (s["tmp"] / "train.csv").write_text("id,video,start,stop,verb,noun\nv0_0,v0,0,1,0,0\n")


def _output_file(s: dict) -> None:
    (s["tmp"] / "run").write_text("not a directory")


def _empty_recipe(s: dict) -> None:
    _write_recipe(s, "# nothing here\n")


def _list_recipe(s: dict) -> None:
    _write_recipe(s, "- model\n- data\n")


def _bad_yaml_recipe(s: dict) -> None:
    _write_recipe(s, "model: {name: [\n")


def _labels_beyond_heads(s: dict) -> None:
    with open(s["tmp"] / "val.csv", "a") as f:
        f.write("v0_9,v0,00:00:09.00,00:00:09.50,7,0\n")


def _empty_manifest(s: dict) -> None:
    (s["tmp"] / "chunks" / "manifest.jsonl").write_text("")


def _other_model_dir(s: dict) -> None:
    (s["tmp"] / "run").mkdir()
    (s["tmp"] / "run" / "run.json").write_text('{"model": {"name": "vit_test_small"}}')


def _no_fp16(s: dict) -> None:
    """An accelerator without fp16 (DeepSpeed's CPU accelerator asks oneDNN; this machine has it)."""
    from deepspeed.accelerator import get_accelerator

    s["monkeypatch"].setattr(type(get_accelerator()), "is_fp16_supported", lambda self: False)


def _stage(v: object) -> Callable[[dict], None]:
    return lambda c: c["zero_optimization"].update(stage=v)


def _top(**kv: object) -> Callable[[dict], None]:
    return lambda c: c.update(kv)


# (id, --set overrides, DeepSpeed JSON patch, file preparation, extra argv, substrings the line must hold)
CASES: list[tuple[str, list[str], Callable | None, Callable | None, list[str], list[str]]] = [
    # once tracebacks
    ("lr_nan", ["optim.lr=nan"], None, None, [], ["optim.lr=nan", "finite"]),
    ("weight_decay_negative", ["optim.weight_decay=-1"], None, None, [], ["optim.weight_decay=-1", ">= 0"]),
    ("workers_negative", ["data.workers=-1"], None, None, [], ["data.workers=-1", ">= 0"]),
    ("root_without_manifest", [], None, _no_manifest, [], ["data.root=", "manifest.jsonl"]),
    ("csv_wrong_header", [], None, _bad_header, [], ["data.train_csv", "train.csv", "missing column", "narration_id"]),
    ("output_dir_is_a_file", [], None, _output_file, [], ["output_dir=", "is a file"]),
    ("unknown_model", ["model.name=vit_tiny_test"], None, None, [], ["model.name='vit_tiny_test'", "vit_test_tiny"]),
    ("frames_vs_tubelet", ["data.num_frames=5"], None, None, [], ["data.num_frames=5", "tubelet size 2"]),
    ("size_vs_patch", ["data.size=40"], None, None, [], ["data.size=40", "patch size 16"]),
    ("flash_on_cpu", ["model.attn_backend=flash"], None, None, [], ["model.attn_backend='flash'", "allowed here"]),
    ("fp16_unsupported", ["precision=fp16"], None, _no_fp16, [], ["precision=fp16", "allowed here: fp32, bf16"]),
    ("set_bad_yaml", ["optim.lr=[1,"], None, None, [], ["--set optim.lr=[1,", "not valid YAML"]),
    ("zero_stage_7", [], _stage(7), None, [], ["zero_optimization.stage=7", "allowed values: 0, 1, 2, 3"]),
    ("zero_stage_two", [], _stage("two"), None, [], ["zero_optimization.stage='two'", "0, 1, 2, 3"]),
    (
        "zero_as_list",
        [],
        _top(zero_optimization=[{"stage": 2}]),
        None,
        [],
        ["zero_optimization", "JSON object", "list"],
    ),
    ("clipping_abc", [], _top(gradient_clipping="abc"), None, [], ["gradient_clipping='abc'", "number"]),
    (
        "optimizer_adamm",
        [],
        lambda c: c["optimizer"].update(type="Adamm"),
        None,
        [],
        ["optimizer.type='Adamm'", "did you mean", "adam"],
    ),
    (
        "zero_bool_field",
        [],
        lambda c: c["zero_optimization"].update(overlap_comm="maybe"),
        None,
        [],
        ["zero_optimization.overlap_comm='maybe'", "boolean"],
    ),
    (
        "zero_unknown_field",
        [],
        lambda c: c["zero_optimization"].update(stage3_max_live_param=1),
        None,
        [],
        ["zero_optimization.stage3_max_live_param=1", "not permitted"],
    ),
    # once silently accepted
    ("lr_inf", ["optim.lr=.inf"], None, None, [], ["optim.lr=inf", "finite"]),
    ("lr_overflows_float32", ["optim.lr=1e39"], None, None, [], ["optim.lr=1e+39", "overflows float32"]),
    (
        "scaled_lr_overflows_float32",
        ["optim.lr=3e38", "optim.base_batch=4"],
        None,
        None,
        [],
        ["optim.lr=3e+38 x global batch 8 / optim.base_batch 4 = 6e+38 overflows float32"],
    ),
    ("ds_batch_is_a_string", [], _top(train_batch_size="8"), None, [], ["train_batch_size='8'", "not an integer"]),
    (
        "ds_accum_is_a_float",
        [],
        _top(gradient_accumulation_steps=1.5),
        None,
        [],
        ["gradient_accumulation_steps=1.5", "not an integer"],
    ),
    ("exit_after_negative", [], None, None, ["--exit-after-steps", "-1"], ["--exit-after-steps -1", ">= 1"]),
    ("warmup_negative", ["schedule.warmup_epochs=-1"], None, None, [], ["schedule.warmup_epochs=-1", ">= 0"]),
    (
        "ds_key_typo",
        [],
        _top(train_batch_sise=8),
        None,
        [],
        ["unknown DeepSpeed key 'train_batch_sise'", "did you mean train_batch_size"],
    ),
    ("empty_recipe", [], None, _empty_recipe, [], ["r.yaml is empty"]),
    # one line from the start
    ("recipe_key_typo", ["optim.learning_rate=1e-3"], None, None, [], ["optim.learning_rate", "did you mean lr?"]),
    ("section_typo", ["optm.lr=1"], None, None, [], ["unknown recipe key 'optm'"]),
    ("bad_int", ["batch.micro_batch=eight"], None, None, [], ["batch.micro_batch", "'eight'"]),
    ("bad_bool", ["checkpoint.resume=maybe"], None, None, [], ["checkpoint.resume", "'maybe'"]),
    ("set_without_equals", ["optim.lr"], None, None, [], ["'optim.lr'", "section.key=value"]),
    ("decoder_choice", ["data.decoder=ffmpeg"], None, None, [], ["data.decoder='ffmpeg'", "decord, torchcodec, pyav"]),
    ("pool_choice", ["model.pool=max"], None, None, [], ["model.pool='max'", "mean, cls"]),
    ("precision_choice", ["precision=fp8"], None, None, [], ["precision='fp8'", "fp32"]),
    ("nonfinite_choice", ["nonfinite=ignore"], None, None, [], ["nonfinite='ignore'", "skip, stop"]),
    ("on_error_choice", ["data.on_error=ignore"], None, None, [], ["data.on_error='ignore'", "skip, raise"]),
    ("dataset_choice", ["data.dataset=ucf101"], None, None, [], ["data.dataset='ucf101'", "epic, kinetics"]),
    ("backend_choice", ["model.attn_backend=magic"], None, None, [], ["model.attn_backend='magic'", "sdpa"]),
    ("frames_zero", ["data.num_frames=0"], None, None, [], ["data.num_frames=0", "positive"]),
    ("micro_zero", ["batch.micro_batch=0"], None, None, [], ["batch.micro_batch=0", "positive"]),
    ("epochs_zero", ["schedule.epochs=0"], None, None, [], ["schedule.epochs=0", "positive"]),
    ("layer_decay_2", ["optim.layer_decay=2"], None, None, [], ["optim.layer_decay=2", "(0, 1]"]),
    ("spatial_views_2", ["eval.spatial_views=2"], None, None, [], ["eval.spatial_views=2", "1 or 3"]),
    (
        "crop_scale_reversed",
        ["data.crop_scale=[1.0,0.5]"],
        None,
        None,
        [],
        ["data.crop_scale=[1.0, 0.5]", "low <= high"],
    ),
    ("head_zero", ["model.heads={verb: 0, noun: 3}"], None, None, [], ["model.heads.verb=0", "positive"]),
    ("tubelet_3", ["model.tubelet_size=3"], None, None, [], ["data.num_frames=4", "model.tubelet_size=3"]),
    ("epic_without_heads", ["model.heads=null"], None, None, [], ["model.heads", "epic"]),
    ("kinetics_with_heads", ["data.dataset=kinetics"], None, None, [], ["model.heads=", "kinetics", "num_classes"]),
    ("heads_vs_dataset", ["model.heads={action: 4}"], None, None, [], ["model.heads={'action': 4}", "verb, noun"]),
    (
        "labels_beyond_heads",
        [],
        None,
        _labels_beyond_heads,
        [],
        ["data.val_csv", "verb labels up to 7", "model.heads.verb=4"],
    ),
    ("dropout_1", ["model.drop_path_rate=1.0"], None, None, [], ["model.drop_path_rate=1.0", "[0, 1)"]),
    ("keep_last_0", ["checkpoint.keep_last=0"], None, None, [], ["checkpoint.keep_last=0", ">= 1"]),
    ("missing_val_csv", ["data.val_csv=/nope/val.csv"], None, None, [], ["data.val_csv", "/nope/val.csv"]),
    ("empty_root", ["data.root="], None, None, [], ["data.root is empty"]),
    ("empty_manifest", [], None, _empty_manifest, [], ["data.root=", "no decodable chunks"]),
    ("recipe_missing", [], None, lambda s: s["recipe"].unlink(), [], ["recipe file not found", "r.yaml"]),
    ("recipe_not_yaml", [], None, _bad_yaml_recipe, [], ["r.yaml:2:1 is not valid YAML", "found '<stream end>'"]),
    ("recipe_is_a_list", [], None, _list_recipe, [], ["r.yaml", "top level must be a mapping", "list"]),
    ("batch_not_divisible", ["batch.global_batch=6"], None, None, [], ["batch.global_batch 6", "micro 4"]),
    (
        "ds_micro_conflict",
        [],
        _top(train_micro_batch_size_per_gpu=2),
        None,
        [],
        ["train_micro_batch_size_per_gpu=2", "recipe value 4"],
    ),
    ("ds_bf16_and_fp16", [], _top(bf16={"enabled": True}, fp16={"enabled": True}), None, [], ["both bf16 and fp16"]),
    (
        "ds_precision_conflict",
        ["precision=fp32"],
        _top(bf16={"enabled": True}),
        None,
        [],
        ["precision='fp32'", "bf16.enabled=true"],
    ),
    (
        "ds_lr_conflict",
        [],
        lambda c: c["optimizer"]["params"].update(lr=0.5),
        None,
        [],
        ["optimizer.params.lr=0.5", "conflicts"],
    ),
    (
        "ds_zero_auto",
        [],
        lambda c: c["zero_optimization"].update(stage3_max_live_parameters="auto"),
        None,
        [],
        ["zero_optimization.stage3_max_live_parameters", "auto"],
    ),
    ("ds_top_level_list", [], None, None, ["--deepspeed_config", "@list"], ["top level must be a JSON object"]),
    (
        "ds_missing",
        [],
        None,
        None,
        ["--deepspeed_config", "/nope/ds.json"],
        ["deepspeed config not found", "/nope/ds.json"],
    ),
    ("other_model_in_output_dir", [], None, _other_model_dir, [], ["different model", "vit_test_small"]),
    (
        "resume_from_unknown_tag",
        [],
        None,
        None,
        ["--resume-from", "step_00000009"],
        ["--resume-from 'step_00000009'", "complete: none"],
    ),
    (
        "finetune_from_missing",
        [],
        None,
        None,
        ["--finetune-from", "/nope/w.pth"],
        ["--finetune-from /nope/w.pth", "not found"],
    ),
    # training options: Lion, weight EMA, weight-decay schedule, K710 head map
    ("optim_name_choice", ["optim.name=adam"], None, None, [], ["optim.name='adam'", "adamw, lion, sgd"]),
    (
        "sgd_with_betas",
        ["optim.name=sgd"],
        lambda c: c["optimizer"]["params"].update(betas=[0.9, 0.99]),
        None,
        [],
        ["optimizer.params.betas=[0.9, 0.99]", "SGD has no betas"],
    ),
    # EPIC's one action head (AVION's verb:noun ids over train + val: 8 pairs in the fixture's CSVs)
    ("epic_label_choice", ["epic.label=actions"], None, None, [], ["epic.label='actions'", "verb_noun"]),
    (
        "action_head_size",
        ["epic.label=action", "model.heads={action: 12}"],
        None,
        None,
        [],
        ["model.heads.action=12", "make 8 actions", "model.heads.action=8"],
    ),
    ("ema_decay_1", ["ema.decay=1"], None, None, [], ["ema.decay=1.0", "[0, 1)"]),
    ("ema_weights_choice", ["ema.weights=best"], None, None, [], ["ema.weights='best'", "ema, model"]),
    ("head_map_choice", ["model.head_label_map=k710"], None, None, [], ["model.head_label_map='k710'", "auto, none"]),
    ("wd_end_negative", ["optim.weight_decay_end=-0.1"], None, None, [], ["optim.weight_decay_end=-0.1", ">= 0"]),
    (
        "wd_end_without_wd",
        ["optim.weight_decay=0", "optim.weight_decay_end=0.1"],
        None,
        None,
        [],
        ["optim.weight_decay_end=0.1", "optim.weight_decay > 0"],
    ),
    (
        "wd_end_with_ds_scheduler",
        ["optim.weight_decay_end=0.1", "optim.layer_decay=1.0"],
        _top(scheduler={"type": "WarmupLR", "params": {}}),
        None,
        [],
        ["'scheduler' (WarmupLR)", "optim.weight_decay_end=0.1"],
    ),
    (
        "lion_vs_json_adamw",
        ["optim.name=lion"],
        lambda c: c["optimizer"].update(type="AdamW"),
        None,
        [],
        ["optimizer.type='AdamW'", "optim.name='lion'"],
    ),
    (
        "json_lion_vs_recipe_adamw",
        [],
        lambda c: c["optimizer"].update(type="Lion"),
        None,
        [],
        ["optimizer.type='Lion'", "optim.name='adamw'"],
    ),
    (
        "lion_with_eps",
        ["optim.name=lion"],
        lambda c: c["optimizer"]["params"].update(eps=1e-8),
        None,
        [],
        ["optimizer.params.eps=1e-08", "Lion has no eps"],
    ),
    ("ema_with_zero3", ["ema.decay=0.9999"], _stage(3), None, [], ["ema.decay=0.9999", "ZeRO-3"]),
    ("compile_with_zero3", ["model.compile=true"], _stage(3), None, [], ["model.compile=true", "ZeRO-3"]),
    (
        "selective_with_deepspeed_impl",
        ["model.activation_checkpoint_policy=selective", "model.activation_checkpoint_impl=deepspeed"],
        None,
        None,
        [],
        ["model.activation_checkpoint_policy='selective'", "model.activation_checkpoint_impl='torch'"],
    ),
    (
        "unknown_checkpoint_policy",
        ["model.activation_checkpoint_policy=some"],
        None,
        None,
        [],
        ["model.activation_checkpoint_policy='some'"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_invocation_is_one_line_exit_2(
    case: tuple, setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _name, sets, ds_patch, prep, extra, expect = case

    no_process_group(monkeypatch)
    setup["monkeypatch"] = monkeypatch
    if prep is not None:
        prep(setup)
    ds = str(_ds_file(setup, ds_patch) if ds_patch is not None else REPO / "ds_configs" / "zero2.json")
    if extra[:2] == ["--deepspeed_config", "@list"]:
        (setup["tmp"] / "list.json").write_text("[1, 2]")
        extra = ["--deepspeed_config", str(setup["tmp"] / "list.json")]
    argv = ["--config", str(setup["recipe"]), "--deepspeed_config", ds, *extra]
    for s in sets:
        argv += ["--set", s]
    err = _run(capsys, argv)
    assert err.startswith("avion-ds train: error: "), err
    for part in expect:
        assert part in err, (part, err)


def test_table_keeps_every_malformed_invocation(setup: dict) -> None:
    """The table of malformed invocations keeps all its cases (none dropped by an edit)."""
    assert len(CASES) >= 65, len(CASES)


def test_dry_run_prints_resolved_recipe_and_ds_config(
    setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dry-run: every check, the resolved recipe + DeepSpeed config, exit 0, no process group."""
    no_process_group(monkeypatch)
    weights = setup["tmp"] / "w.safetensors"
    from safetensors.torch import save_file

    from avion_ds.models import create_model

    sd = create_model("vit_test_tiny", heads={"verb": 4, "noun": 3}).state_dict()
    save_file(
        {k: v.contiguous() for k, v in sd.items()}, str(weights)
    )  # its header is read before the run, nothing more
    code = train.main(
        _args(setup, "--dry-run", "--set", "optim.lr=2e-3", "--finetune-from", str(weights), "--resume-from", "none")
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    recipe_text = out.split("# resolved recipe\n")[1].split("# DeepSpeed config\n")[0]
    ds = json.loads(out.split("# DeepSpeed config\n")[1])
    resolved = yaml.safe_load(recipe_text)
    assert resolved["optim"]["lr"] == 2e-3 and resolved["model"]["pretrained"] == str(weights)
    assert resolved["checkpoint"]["resume"] is False
    assert ds["train_batch_size"] == 8 and ds["optimizer"]["params"]["lr"] == pytest.approx(2e-3 * 8 / 256)
    assert ds["zero_optimization"]["stage"] == 2
    assert "all checks passed | vit_test_tiny 0.20M params" in out
    assert not (setup["tmp"] / "run").exists()


def test_supported_precision_is_not_refused(setup: dict, capsys: pytest.CaptureFixture) -> None:
    """The precision check asks DeepSpeed's accelerator: fp16/bf16 train on this CPU, so they pass."""
    from deepspeed.accelerator import get_accelerator

    for precision, ok in (
        ("fp16", get_accelerator().is_fp16_supported()),
        ("bf16", get_accelerator().is_bf16_supported()),
    ):
        code = train.main(_args(setup, "--dry-run", "--set", f"precision={precision}"))
        assert code == (0 if ok else 2), capsys.readouterr().err
        capsys.readouterr()


class _Payload:
    """Unpickling this runs code (writes the marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.write_text, (self.marker, "ran"))


@pytest.mark.parametrize("kind", ["payload", "not_a_checkpoint", "missing"])
def test_refused_pretrained_leaves_nothing_behind(
    kind: str, setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weights file the loader refuses is refused at start-up: one line, exit 2, no process group, and
    no recipe.yaml / ds_config.json / run.json left in output_dir (the run never started)."""
    import torch

    no_process_group(monkeypatch)
    marker, weights = setup["tmp"] / "marker.txt", setup["tmp"] / "w.pth"
    if kind == "payload":
        torch.save({"model": {}, "evil": _Payload(marker)}, weights)
    elif kind == "not_a_checkpoint":
        weights.write_text("narration_id,video_id\n")
    err = _run(capsys, _args(setup, "--set", f"model.pretrained={weights}"))
    assert err.startswith("avion-ds train: error: model.pretrained") and str(weights) in err, err
    assert {"payload": "pathlib.Path", "not_a_checkpoint": "cannot be read", "missing": "not found"}[kind] in err
    assert not marker.exists() and not (setup["tmp"] / "run").exists()
