"""Malformed invocations on the video-text surfaces (contrastive pretraining, MIR fine-tuning, CLS like AVION,
Lion, EMA, the weight-decay schedule, Ego4D / MIR files, ``chunk --index-only``, ``eval --tag best``), table-
driven: each ends in ONE stderr line naming the key or file, exit code 2, no traceback, before any process
group exists (creating one trips a wire). Every command runs in-process through its ``main``; no video is
opened (the chunk files are empty placeholders the start-up checks only stat)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest
import yaml

from tests.helpers.data import placeholder_chunks

REPO = Path(__file__).resolve().parents[1]
ZERO2 = REPO / "ds_configs" / "zero2.json"
MIR_HEADER = "narration_id,participant_id,video_id,narration_timestamp,start_timestamp,stop_timestamp,narration\n"


def no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating a process group fails the test (the libraries' entry points are patched, not ours)."""
    import deepspeed
    import torch.distributed as tdist

    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process group was about to be created: start-up let the bad input through")

    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(deepspeed, "init_distributed", tripwire)
    monkeypatch.setattr(tdist, "init_process_group", tripwire)


def _mir_files(tmp: Path, split: str, rows: int) -> dict[str, Path]:
    csv = tmp / f"mir_{split}.csv"
    csv.write_text(
        MIR_HEADER
        + "".join(f"m{split}_{i},P01,v0,00:00:0{i}.00,00:00:0{i}.00,00:00:0{i}.50,cut onion {i}\n" for i in range(rows))
    )
    sentences = tmp / f"mir_{split}_sentence.csv"
    sentences.write_text("id,narration\n" + "".join(f"m{split}_{i},cut onion {i}\n" for i in range(rows)))
    relevancy = tmp / f"mir_{split}_relevancy.pkl"
    relevancy.write_bytes(pickle.dumps([[1.0 if i == j else 0.0 for j in range(rows)] for i in range(rows)]))
    return {"csv": csv, "sentences": sentences, "relevancy": relevancy}


@pytest.fixture()
def files(tmp_path: Path) -> Iterator[dict]:
    """A chunk root (one video, two 5 s chunks, empty placeholder files), Ego4D narrations, EPIC MIR files,
    EPIC action CSVs, and one recipe per surface; ``stack`` ends what a case's preparation started (servers)."""
    root = placeholder_chunks(tmp_path / "chunks")
    ego = tmp_path / "ego4d_train.pkl"
    ego.write_bytes(pickle.dumps([("v0", 0.5 * i, 0.5 * i + 1.0, f"#C C cuts onion {i}") for i in range(16)]))
    val, train = _mir_files(tmp_path, "test", 8), _mir_files(tmp_path, "train", 8)
    epic_rows = "".join(f"v0_{i},v0,00:00:0{i}.00,00:00:0{i}.50,{i % 4},{i % 3}\n" for i in range(8))
    for name in ("epic_train.csv", "epic_val.csv"):
        (tmp_path / name).write_text(
            "narration_id,video_id,start_timestamp,stop_timestamp,verb_class,noun_class\n" + epic_rows
        )
    common = {
        "batch": {"global_batch": 8, "micro_batch": 4},
        "precision": "fp32",
        "output_dir": str(tmp_path / "run"),
    }
    video_text = {"num_frames": 2, "size": 32, "fps": 0.0, "decoder": "auto", "root": str(root)}
    contrastive = {
        "task": "contrastive",
        "model": {"name": "clip_vit_test_tiny"},
        "data": video_text | {"train_csv": str(ego), "val_csv": str(val["csv"])},
        "epic_mir": {"val_sentences": str(val["sentences"]), "val_relevancy": str(val["relevancy"])},
        **common,
    }
    mir = {
        "task": "mir",
        "model": {"name": "clip_vit_test_tiny"},
        "data": video_text | {"train_csv": str(train["csv"]), "val_csv": str(val["csv"])},
        "epic_mir": {
            "train_sentences": str(train["sentences"]),
            "train_relevancy": str(train["relevancy"]),
            "val_sentences": str(val["sentences"]),
            "val_relevancy": str(val["relevancy"]),
        },
        **common,
    }
    cls = {  # launch/recipes/lavila_vit_b_epic_cls.yaml in small
        "model": {"name": "vit_clip_test_tiny", "heads": {"action": 8}, "head_init": "avion", "drop_path_rate": 0.1},
        "data": {
            "dataset": "epic",
            "root": str(root),
            "train_csv": str(tmp_path / "epic_train.csv"),
            "val_csv": str(tmp_path / "epic_val.csv"),
            "num_frames": 4,
            "size": 32,
            "mean_std": "openai",
            "mixup": 0.8,
            "cutmix": 1.0,
        },
        "epic": {"label": "action"},
        "optim": {"name": "sgd", "lr": 3e-3, "base_batch": 8, "scale_lr_bounds": True, "min_lr": 1e-5},
        "optim_extra": None,
        "schedule": {"epochs": 2, "warmup_epochs": 1, "warmup_start_lr": 1e-6},
        **common,
    }
    cls.pop("optim_extra")
    recipes = {}
    for name, data in (("contrastive", contrastive), ("mir", mir), ("cls", cls)):
        recipes[name] = tmp_path / f"{name}.yaml"
        recipes[name].write_text(yaml.safe_dump(data))
    with contextlib.ExitStack() as stack:
        yield {
            "tmp": tmp_path,
            "root": root,
            "ego": ego,
            "val": val,
            "train": train,
            "recipes": recipes,
            "stack": stack,
        }


# ---------------------------------------------------------------- file preparations (one per case that needs it)
def _drop_chunks(f: dict) -> None:
    for p in (f["root"] / "v0").glob("*.mp4"):
        p.unlink()


def _chunk_dir(f: dict) -> None:
    for p in (f["root"] / "v0").glob("*.mp4"):
        p.unlink()
        p.mkdir()


def _drop_one_chunk(f: dict) -> None:
    (f["root"] / "v0" / "5.mp4").unlink()


def _bad_train_relevancy(f: dict) -> None:
    f["train"]["relevancy"].write_bytes(pickle.dumps([[1.0, 0.0]] * 2))


def _bad_relevancy_shape(f: dict) -> None:
    f["val"]["relevancy"].write_bytes(pickle.dumps([[1.0, 0.0]] * 3))


def _relevancy_payload(f: dict) -> None:
    f["val"]["relevancy"].write_bytes(b"cos\nsystem\n(S'touch marker'\ntR.")


def _sentences_latin1(f: dict) -> None:
    f["val"]["sentences"].write_bytes("id,narration\nmtest_0,caf\xe9 au lait\n".encode("latin-1"))


def _sentence_unknown_row(f: dict) -> None:
    f["val"]["sentences"].write_text("id,narration\nnope_0,cut onion\n")


def _train_sentences_latin1(f: dict) -> None:
    f["train"]["sentences"].write_bytes("id,narration\nmtrain_0,\xe9\n".encode("latin-1"))


def _ego_not_a_list(f: dict) -> None:
    f["ego"].write_bytes(pickle.dumps({"v0": (0.0, 1.0)}))


def _ego_short_row(f: dict) -> None:
    f["ego"].write_bytes(pickle.dumps([("v0", 0.0, 1.0)]))


def _mir_csv_latin1(f: dict) -> None:
    f["val"]["csv"].write_bytes((MIR_HEADER + "mtest_0,P01,v0,0,0,1,caf\xe9\n").encode("latin-1"))


def _shards_without_index(f: dict) -> None:
    (f["tmp"] / "shards").mkdir()


def _shards_with_pickled_fields(f: dict) -> None:
    (f["tmp"] / "shards").mkdir()
    rows = {"train": [1], "val": [1]}
    chunk = {"filename": "chunk-0-0.bin", "chunk_bytes": 9, "chunk_size": 1, "avion_rows": rows}
    index = {"chunks": [chunk], "config": {"data_format": ["str", "str", "pickle"]}}
    (f["tmp"] / "shards" / "index.json").write_text(json.dumps(index))


def _shards_without_rows(f: dict) -> None:
    (f["tmp"] / "shards").mkdir()
    index = {"chunks": [{"filename": "chunk-0-0.bin", "chunk_size": 1}], "config": {}}
    (f["tmp"] / "shards" / "index.json").write_text(json.dumps(index))


def _shards_packed_for_classes(f: dict) -> None:
    """Shards whose rows were packed for EPIC action classes: no narrations for an Ego4D recipe to draw."""
    (f["tmp"] / "shards").mkdir()
    rows = {"train": [1], "val": [1]}
    chunk = {"filename": "chunk-0-0.bin", "chunk_bytes": 9, "chunk_size": 1, "avion_rows": rows}
    labels = {s: {"dataset": "epic", "kind": "class"} for s in rows}
    index = {"chunks": [chunk], "config": {"data_format": ["str", "str", "bytes"]}, "avion_labels": labels}
    (f["tmp"] / "shards" / "index.json").write_text(json.dumps(index))


def _shards_for_mir(f: dict) -> None:
    """An index.json of MIR rows (the shard itself is not read before the failing check)."""
    (f["tmp"] / "shards").mkdir()
    rows = {"train": [1], "val": [1]}
    chunk = {"filename": "chunk-0-0.bin", "chunk_bytes": 9, "chunk_size": 1, "avion_rows": rows}
    labels = {s: {"dataset": "epic_mir", "kind": "retrieval"} for s in rows}
    config = {"data_format": ["str", "str", "bytes"], "item_loader": "RowItemLoader"}
    index = {"chunks": [chunk], "config": config, "avion_labels": labels}
    (f["tmp"] / "shards" / "index.json").write_text(json.dumps(index))


# a remote shard location: index.json names one 9-byte shard with a train and a val row
REMOTE_INDEX = {
    "chunks": [
        {"filename": "chunk-0-0.bin", "chunk_bytes": 9, "chunk_size": 1, "avion_rows": {"train": [1], "val": [1]}}
    ],
    "config": {"data_format": ["str", "str", "bytes"]},
}


def _s3_server(f: dict) -> str:
    """moto's S3 server (a subprocess, ended after the case) and its endpoint in the environment."""
    pytest.importorskip("moto.server")
    from tests.helpers.s3_server import moto_server, s3_env

    endpoint = f["stack"].enter_context(moto_server())
    f["stack"].enter_context(mock.patch.dict(os.environ, s3_env(endpoint)))
    return endpoint


def _s3_empty_bucket(f: dict) -> None:
    import boto3

    _s3_server(f)
    boto3.client("s3").create_bucket(Bucket="avion-bad")


def _s3_short_shard(f: dict) -> None:
    import boto3

    _s3_empty_bucket(f)
    client = boto3.client("s3")
    client.put_object(Bucket="avion-bad", Key="s/index.json", Body=json.dumps(REMOTE_INDEX).encode())
    client.put_object(Bucket="avion-bad", Key="s/chunk-0-0.bin", Body=b"12345")


def _http_index_only(f: dict) -> None:
    """A loopback HTTP server (a thread, ended after the case) serving index.json but no shard."""
    (f["tmp"] / "served").mkdir()
    (f["tmp"] / "served" / "index.json").write_text(json.dumps(REMOTE_INDEX))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(f["tmp"] / "served"))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    f["stack"].callback(server.server_close)
    f["stack"].callback(server.shutdown)
    f["http"] = f"http://127.0.0.1:{server.server_address[1]}"


def _resume_on_two_ranks(f: dict) -> None:
    """A run dir whose checkpoint 1 rank wrote, resumed by rank 0 of 2 (the launcher's environment)."""
    from avion_ds.storage.run_dir import MARKER, checkpoint_dir

    tag = checkpoint_dir(f["tmp"] / "old_run") / "step_00000002"
    tag.mkdir(parents=True)
    (tag / MARKER).write_text(json.dumps({"tag": tag.name, "global_step": 2, "epoch": 0, "world_size": 1}))
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    f["stack"].enter_context(mock.patch.dict(os.environ, env))


# (id, command, recipe, --set overrides, preparation, extra argv, substrings the line must hold)
Case = tuple[str, str, str, list[str], Callable[[dict], None] | None, list[str], list[str]]
CASES: list[Case] = [
    # contrastive pretraining
    (
        "freeze_both_towers",
        "train",
        "contrastive",
        ["contrastive.freeze_visual=true", "contrastive.freeze_text=true"],
        None,
        [],
        ["contrastive.freeze_visual=true", "contrastive.freeze_text=true"],
    ),
    ("contrastive_mixup", "train", "contrastive", ["data.mixup=0.8"], None, [], ["data.mixup=0.8"]),
    ("contrastive_views", "train", "contrastive", ["eval.temporal_views=2"], None, [], ["eval.temporal_views=2"]),
    ("contrastive_classifier", "train", "contrastive", ["model.name=vit_test_tiny"], None, [], ["model.name"]),
    ("contrastive_dataset", "train", "contrastive", ["data.dataset=kinetics"], None, [], ["data.dataset='kinetics'"]),
    ("contrastive_size", "train", "contrastive", ["data.size=33"], None, [], ["data.size=33"]),
    ("eval_batch_zero", "train", "contrastive", ["eval.batch_size=0"], None, [], ["eval.batch_size=0", "positive"]),
    ("eval_batch_negative", "train", "contrastive", ["eval.batch_size=-4"], None, [], ["eval.batch_size=-4"]),
    ("crop_scale_above_1", "train", "contrastive", ["data.crop_scale=[0.5,1.5]"], None, [], ["data.crop_scale="]),
    ("crop_ratio_reversed", "train", "contrastive", ["data.crop_ratio=[2,1]"], None, [], ["data.crop_ratio="]),
    (
        "warmup_start_above_lr",
        "train",
        "contrastive",
        ["schedule.warmup_start_lr=1e-3"],
        None,
        [],
        ["schedule.warmup_start_lr=0.001", "peak lr 3e-05"],
    ),
    ("min_lr_above_lr", "train", "contrastive", ["optim.min_lr=1e-3"], None, [], ["optim.min_lr=0.001", "peak lr"]),
    # Ego4D narration files and the chunk root
    ("chunks_missing", "train", "contrastive", [], _drop_chunks, [], ["data.root=", "0.mp4: file not found"]),
    ("chunks_are_dirs", "train", "contrastive", [], _chunk_dir, [], ["data.root=", "not a regular file"]),
    (
        "chunk_missing_dry_run",
        "train",
        "contrastive",
        [],
        _drop_chunks,
        ["--dry-run"],
        ["16 of 16 sampled train rows", "file not found"],
    ),
    (
        "one_chunk_missing_on_error_raise",
        "train",
        "contrastive",
        ["data.on_error=raise"],
        _drop_one_chunk,
        [],
        ["data.root=", "of 16 sampled train rows", "5.mp4: file not found"],
    ),
    ("narration_not_a_list", "train", "contrastive", [], _ego_not_a_list, [], ["data.train_csv", "ego4d_train.pkl"]),
    ("narration_short_row", "train", "contrastive", [], _ego_short_row, [], ["ego4d_train.pkl:1", "tuple"]),
    ("aux_missing", "train", "contrastive", ["ego4d.aux_train=[/nope/aux.pkl]"], None, [], ["ego4d.aux_train[0]"]),
    # EPIC MIR files
    (
        "relevancy_shape",
        "train",
        "contrastive",
        [],
        _bad_relevancy_shape,
        [],
        ["epic_mir.val_relevancy:", "mir_test_relevancy.pkl", "(3, 2)"],
    ),
    ("relevancy_payload", "train", "contrastive", [], _relevancy_payload, [], ["epic_mir.val_relevancy:", "os.system"]),
    (
        "sentences_not_utf8",
        "train",
        "contrastive",
        [],
        _sentences_latin1,
        [],
        ["epic_mir.val_sentences:", "mir_test_sentence.csv", "not UTF-8"],
    ),
    (
        "sentence_names_no_row",
        "train",
        "contrastive",
        [],
        _sentence_unknown_row,
        [],
        ["epic_mir.val_sentences:", "nope_0"],
    ),
    (
        "relevancy_without_sentences",
        "train",
        "contrastive",
        ["epic_mir.val_sentences="],
        None,
        [],
        ["epic_mir.val_sentences"],
    ),
    ("mir_csv_not_utf8", "train", "contrastive", [], _mir_csv_latin1, [], ["data.val_csv", "mir_test.csv", "UTF-8"]),
    # MIR fine-tuning
    (
        "mir_train_sentences_not_utf8",
        "train",
        "mir",
        [],
        _train_sentences_latin1,
        [],
        ["epic_mir.train_sentences:", "mir_train_sentence.csv", "not UTF-8"],
    ),
    (
        "mir_train_relevancy_shape",
        "train",
        "mir",
        [],
        _bad_train_relevancy,
        [],
        ["epic_mir.train_relevancy:", "(2, 2)"],
    ),
    ("mir_crop_scale_zero", "train", "mir", ["data.crop_scale=[0,1]"], None, [], ["data.crop_scale=[0.0, 1.0]"]),
    ("mir_temperature", "train", "mir", ["contrastive.freeze_temperature=false"], None, [], ["freeze_temperature"]),
    # CLS like AVION (SGD, action head, mixup / cutmix on clips)
    ("cls_betas_one", "train", "cls", ["optim.betas=[0.9]"], None, [], ["optim.betas=[0.9]", "two numbers"]),
    ("cls_head_size", "train", "cls", ["model.heads={action: 12}"], None, [], ["model.heads.action=12"]),
    ("cls_warmup_above_lr", "train", "cls", ["schedule.warmup_start_lr=1"], None, [], ["schedule.warmup_start_lr=1"]),
    # Lion
    (
        "lion_betas_three",
        "train",
        "contrastive",
        ["optim.name=lion", "optim.betas=[0.9,0.99,0.5]"],
        None,
        [],
        ["optim.betas"],
    ),
    (
        "lion_beta_1",
        "train",
        "contrastive",
        ["optim.name=lion", "optim.betas=[1.0,0.99]"],
        None,
        [],
        ["optim.betas[0]=1.0"],
    ),
    # EMA
    ("ema_decay_negative", "train", "contrastive", ["ema.decay=-0.5"], None, [], ["ema.decay=-0.5"]),
    ("ema_weights", "train", "contrastive", ["ema.weights=best"], None, [], ["ema.weights='best'"]),
    # weight-decay schedule
    ("wd_end_negative", "train", "cls", ["optim.weight_decay_end=-1"], None, [], ["optim.weight_decay_end=-1"]),
    (
        "wd_end_without_wd",
        "train",
        "cls",
        ["optim.weight_decay=0", "optim.weight_decay_end=0.1"],
        None,
        [],
        ["optim.weight_decay > 0"],
    ),
    # token merging: r above a block's tokens, a schedule longer than the depth, flash-attn (takes no bias)
    (
        "merge_r_too_large",
        "train",
        "contrastive",
        ["model.token_merge=40"],
        None,
        [],
        ["model.token_merge=40", "at most"],
    ),
    ("merge_schedule_long", "train", "cls", ["model.token_merge=[1,1,1]"], None, [], ["a schedule of 3 blocks"]),
    (
        "merge_flash",
        "train",
        "cls",
        ["model.token_merge=2", "model.attn_backend=flash"],
        None,
        [],
        ["flash-attn takes none"],
    ),
    ("eval_merge_r_too_large", "eval", "contrastive", ["model.token_merge=40"], None, [], ["model.token_merge=40"]),
    # patch dropout (FLIP): a fraction in [0, 1)
    ("patch_dropout_one", "train", "cls", ["model.patch_dropout=1.0"], None, [], ["model.patch_dropout=1.0"]),
    ("patch_dropout_negative", "train", "contrastive", ["model.patch_dropout=-0.1"], None, [], ["model.patch_dropout"]),
    # run-length tokenization: a threshold in [0, 1), a backend with a packed form, not with token merging
    ("rlt_threshold_one", "train", "cls", ["model.rlt_threshold=1.0"], None, [], ["model.rlt_threshold=1.0", "[0, 1)"]),
    ("rlt_threshold_negative", "train", "contrastive", ["model.rlt_threshold=-0.1"], None, [], ["model.rlt_threshold"]),
    (
        "rlt_eager",
        "train",
        "contrastive",
        ["model.rlt_threshold=0.1", "model.attn_backend=eager"],
        None,
        [],
        ["model.rlt_threshold=0.1", "'eager'"],
    ),
    (
        "rlt_flash_without_flash_attn",
        "train",
        "cls",
        ["model.rlt_threshold=0.1", "model.attn_backend=flash"],
        None,
        [],
        ["model.attn_backend='flash' cannot run here", "allowed here: auto, sdpa"],
    ),
    (
        "rlt_token_merge",
        "train",
        "cls",
        ["model.rlt_threshold=0.1", "model.token_merge=2"],
        None,
        [],
        ["model.rlt_threshold=0.1", "model.token_merge=2"],
    ),
    ("eval_rlt_threshold_one", "eval", "contrastive", ["model.rlt_threshold=1.0"], None, [], ["model.rlt_threshold"]),
    # chunk --index-only
    ("index_only_missing_src", "chunk", "", [], None, ["--index-only", "/nope/tree"], ["/nope/tree"]),
    ("index_only_file_src", "chunk", "", [], None, ["--index-only", "@file"], ["not a directory"]),
    # pack
    ("pack_missing_tree", "pack", "", [], None, ["/nope/tree", "/nope/out"], ["/nope/tree"]),
    ("pack_bad_size", "pack", "", [], None, ["@tree", "/nope/out", "--shard-bytes", "0"], ["--shard-bytes=0"]),
    ("pack_bad_item_size", "pack", "", [], None, ["@tree", "/nope/out", "--item-bytes", "-1"], ["--item-bytes=-1"]),
    # litdata shards (data.shards, avion-ds pack --config)
    ("shards_dir_missing", "train", "cls", ["data.shards=@tmp/shards"], None, [], ["data.shards", "not found"]),
    (
        "shards_without_index",
        "train",
        "cls",
        ["data.shards=@tmp/shards"],
        _shards_without_index,
        [],
        ["data.shards", "no index.json"],
    ),
    (
        "shards_without_rows",
        "train",
        "cls",
        ["data.shards=@tmp/shards"],
        _shards_without_rows,
        [],
        ["data.shards", "index.json", "train/val rows", "--config"],
    ),
    (
        "shards_pickled_fields",
        "train",
        "cls",
        ["data.shards=@tmp/shards"],
        _shards_with_pickled_fields,
        [],
        ["data.shards", "index.json", "data_format=['str', 'str', 'pickle']", "can run code"],
    ),
    (
        "shards_s3_bucket_missing",
        "train",
        "cls",
        ["data.shards=s3://no-such-bucket/shards"],
        _s3_server,
        [],
        ["data.shards", "s3://no-such-bucket/shards/index.json", "no bucket 'no-such-bucket'"],
    ),
    (
        "shards_s3_prefix_missing",
        "train",
        "cls",
        ["data.shards=s3://avion-bad/none"],
        _s3_empty_bucket,
        [],
        ["data.shards", "s3://avion-bad/none/index.json", "no such object"],
    ),
    (
        "shards_s3_shard_short",
        "train",
        "cls",
        ["data.shards=s3://avion-bad/s"],
        _s3_short_shard,
        [],
        ["data.shards", "s3://avion-bad/s/chunk-0-0.bin is 5 bytes, index.json says 9"],
    ),
    (
        "shards_http_shard_missing",
        "train",
        "cls",
        ["data.shards=@http/"],
        _http_index_only,
        [],
        ["data.shards", "/chunk-0-0.bin cannot be read (HTTP 404"],
    ),
    (
        "shards_mir_scoring_without_val_csv",
        "train",
        "mir",
        ["data.shards=@tmp/shards", "data.val_csv="],
        _shards_for_mir,
        [],
        ["epic_mir.val_relevancy: MIR scoring with data.shards", "data.val_csv"],
    ),
    ("check_shards", "check", "", [], None, ["--config", "@file", "--set", "data.shards=s3://b/x"], ["data.shards"]),
    (
        "shards_without_captions",
        "train",
        "contrastive",
        ["data.shards=@tmp/shards"],
        _shards_packed_for_classes,
        [],
        ["data.shards", "train rows packed for data.dataset='epic'", "its narration captions", "--config RECIPE"],
    ),
    # elastic resume: the global batch must stay (set, or kept by micro x accum)
    (
        "elastic_resume_changes_global_batch",
        "train",
        "cls",
        ["batch.global_batch=null", "output_dir=@tmp/old_run"],
        _resume_on_two_ranks,
        [],
        [
            "batch.global_batch: not set",
            "of a 1-rank run on 2 ranks changes the global batch from 4 to 8",
            "set batch.global_batch=4",
        ],
    ),
    # eval --tag best
    ("eval_tag_best_without_best_json", "eval", "contrastive", [], None, ["--tag", "best"], ["best", "best.json"]),
]


def _argv(case: Case, f: dict) -> list[str]:
    _, command, recipe, sets, _, extra, _ = case
    extra = [str(f["recipes"]["contrastive"]) if x == "@file" else x for x in extra]
    extra = [str(placeholder_chunks(f["tmp"] / "tree")) if x == "@tree" else x for x in extra]
    extra = [x.replace("@tmp", str(f["tmp"])) for x in extra]
    if command in ("chunk", "pack", "check"):
        return extra
    argv = [*extra]
    if command == "train":
        argv = ["--config", str(f["recipes"][recipe]), "--deepspeed_config", str(ZERO2), *extra]
    else:  # eval of a run directory with one complete checkpoint and no best.json
        from avion_ds.storage.run_dir import MARKER, checkpoint_dir

        run = f["tmp"] / "run"
        (checkpoint_dir(run) / "step_00000002").mkdir(parents=True)
        (checkpoint_dir(run) / "step_00000002" / MARKER).write_text("{}")
        (run / "recipe.yaml").write_text(f["recipes"][recipe].read_text())
        argv = ["--checkpoint", str(run), *extra]
    for s in sets:
        argv += ["--set", s.replace("@tmp", str(f["tmp"])).replace("@http", f.get("http", "@http"))]
    return argv


def _main(command: str) -> Callable[[list[str]], int]:
    import importlib

    from avion_ds.cli import COMMANDS

    return importlib.import_module(COMMANDS[command][0]).main


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_invocation_is_one_line_exit_2(
    case: Case, files: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, command, _, _, prep, _, expect = case
    no_process_group(monkeypatch)
    if prep is not None:
        prep(files)
    code = _main(command)(_argv(case, files))
    out, err = capsys.readouterr()
    err = err.strip()
    assert code == 2, (name, out[-2000:], err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"avion-ds {command}: error: ") or command == "chunk", err
    for part in expect:
        assert part in err, (part, err)
    assert not (files["tmp"] / "run").exists() or command == "eval"


def test_table_keeps_every_malformed_invocation() -> None:
    """The table keeps all its cases (none dropped by an edit)."""
    assert len(CASES) >= 40, len(CASES)


def test_the_tables_recipes_pass_as_they_are(files: dict, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    """Each base recipe passes every start-up check (so each case fails for its own reason)."""
    no_process_group(monkeypatch)
    from avion_ds.cli import train as train_cli

    for name in ("contrastive", "mir", "cls"):
        code = train_cli.main(["--config", str(files["recipes"][name]), "--deepspeed_config", str(ZERO2), "--dry-run"])
        assert code == 0, (name, capsys.readouterr().err)
        capsys.readouterr()


def test_some_chunks_missing_under_skip_are_counted_in_the_start_up_summary(
    files: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under data.on_error: skip a root where only some sampled rows hit a missing chunk still starts; the
    dry run's summary counts them and names the first file (training skips them, named once, counted)."""
    no_process_group(monkeypatch)
    from avion_ds.cli import train as train_cli

    _drop_one_chunk(files)
    code = train_cli.main(
        ["--config", str(files["recipes"]["contrastive"]), "--deepspeed_config", str(ZERO2), "--dry-run"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("# data train:"))
    assert "of 16 sampled rows read chunk files not as listed" in line and "5.mp4: file not found" in line
