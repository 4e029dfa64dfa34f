"""Video-text pretraining end to end through the CLI, at test scale: synth (narrations + MIR files) ->
chunk -> contrastive pretraining on 2 CPU ranks (docs/video_text.md's block as written, run once for the doc
test and this flow: the deepspeed launcher, ZeRO-2, feature-cache accumulation)
-> zero-shot EPIC-style MIR every 10 epochs, best checkpoint by avg mAP -> `avion-ds eval --tag best` on
1 and on 2 ranks (an odd row count: the sampler pads) give identical metrics; then, from that run, the
EPIC-100 fine-tunings AVION reports, as the doc's next blocks run them (each once for the doc test and this
flow): action recognition with one action head on the video tower (AVION's CLS recipe), and MIR fine-tuning
(`task: mir`).

Learns: on the 48 held-out clips (12 narrations), text -> video R-precision on exact narration matches
reaches at least 3x chance (the share of clips sharing a query's narration)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import CONTRASTIVE, DocRuns, doc_block
from tests.helpers import launch, losses, run_process

pytestmark = [pytest.mark.multiprocess, pytest.mark.doc_run(*CONTRASTIVE)]  # the documented run it reads
CLI = [sys.executable, "-m", "avion_ds.cli"]


def _ok(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args[:6]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _odd_mir_split(mir: Path, out: Path) -> tuple[Path, Path]:
    """The MIR test CSV minus one row that no sentence names (47 rows: 2 ranks pad the last batch)."""
    import csv

    import numpy as np

    with open(mir / "EPIC_100_retrieval_test.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(mir / "EPIC_100_retrieval_test_sentence.csv", newline="") as f:
        named = {r["narration_id"] for r in csv.DictReader(f)}
    drop = next(i for i in range(len(rows) - 1, -1, -1) if rows[i]["narration_id"] not in named)
    with open(out / "test47.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(r for i, r in enumerate(rows) if i != drop)
    with open(mir / "relevancy" / "caption_relevancy_EPIC_100_retrieval_test.pkl", "rb") as f:
        rel = pickle.load(f)
    with open(out / "rel47.pkl", "wb") as f:
        pickle.dump(np.delete(rel, drop, axis=0), f)
    return out / "test47.csv", out / "rel47.pkl"


@pytest.fixture(scope="module")
def contrastive_run(doc_runs: DocRuns, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """docs/video_text.md's block, run once for the doc test and this flow: synth -> chunk -> contrastive
    pretraining on 2 CPU ranks (the deepspeed launcher, the recipe of the CPU demo) -> eval; paths and the log.
    The run's recipe names its data relative to its run group's scratch directory (``docs``): its commands run there."""
    block = doc_block(*CONTRASTIVE)
    log = _ok(doc_runs.run(block))
    demo = doc_runs.dir(block) / "demo"
    synth = demo / "synth_text"
    tmp = tmp_path_factory.mktemp("contrastive_flow")  # this flow's own outputs
    return {
        "tmp": tmp,
        "doc_runs": doc_runs,
        "docs": doc_runs.dir(block),
        "synth": synth,
        "chunks": demo / "chunks_text",
        "mir": synth / "retrieval_annotations",
        "run": demo / "contrastive",
        "log": log,
    }


def test_pretraining_logs_and_keeps_the_best(contrastive_run: dict) -> None:
    run, log = contrastive_run["run"], contrastive_run["log"]
    assert "global batch 16 = micro 4 x accum 2 x world 2" in log
    best = json.loads((run / "best.json").read_text())
    assert best["metric"] == "avg_map" and f"best checkpoint: {best['tag']}" in log
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert any("clip_acc" in h and "t2v_acc" in h and "logit_scale" in h for h in history), history[-1]
    evals = [h["eval"]["avg_map"] for h in history if "eval" in h]
    assert best["value"] == max(evals), (best, evals)


def test_zero_shot_mir_same_on_one_and_two_ranks_and_learns(contrastive_run: dict) -> None:
    """`avion-ds eval --tag best` on 1 and 2 ranks, 47 rows (the DistributedSampler pads): identical; on the
    48 held-out clips, text -> video R-precision at least 3x chance."""
    tmp, run, mir = contrastive_run["tmp"], contrastive_run["run"], contrastive_run["mir"]
    docs = contrastive_run["docs"]
    best = json.loads((run / "best.json").read_text())
    csv47, rel47 = _odd_mir_split(mir, tmp)
    # one clip per forward on both: every embedding comes from the same kernels, whatever the batching
    odd = ["--set", f"data.val_csv={csv47}", "--set", f"epic_mir.val_relevancy={rel47}", "--set", "eval.batch_size=1"]
    one, two = tmp / "eval1.json", tmp / "eval2.json"
    _ok(run_process([*CLI, "eval", "--checkpoint", run, "--tag", "best", "--out", one, *odd], cwd=docs))
    evaluate = ["eval", "--checkpoint", run, "--tag", "best", "--out", two, *odd]
    _ok(launch(evaluate, launcher="torchrun", module="avion_ds.cli", cwd=docs))
    e1, e2 = json.loads(one.read_text()), json.loads(two.read_text())
    assert e1["tag"] == best["tag"] and e1["rows"] == 47
    assert e1["metrics"] == e2["metrics"]
    assert set(e1["metrics"]) == {"vis_map", "txt_map", "avg_map", "vis_ndcg", "txt_ndcg", "avg_ndcg"}

    scores = tmp / "eval_full.json"
    _ok(run_process([*CLI, "eval", "--checkpoint", run, "--tag", "best", "--out", scores], cwd=docs))
    full = json.loads(scores.read_text())
    print(f"t2v R-precision {full['t2v_rprecision']:.1f} vs chance {full['t2v_rprecision_chance']:.1f}")
    assert full["rows"] >= 48 and full["columns"] >= 8
    assert full["t2v_rprecision"] >= 3 * full["t2v_rprecision_chance"], full


USUAL = {f"{h}_{m}" for h in ("verb", "noun") for m in ("top1", "top5", "mean_class")} | {"action_top1", "action_top5"}
AVION = {"avion_action_top1", "avion_action_top5", "avion_action_mean_class", "avion_verb_top1", "avion_noun_top1"}


def _csv_pairs(path: Path) -> list[tuple[int, int]]:
    import csv

    with open(path, newline="") as f:
        return [(int(r["verb_class"]), int(r["noun_class"])) for r in csv.DictReader(f)]


def test_avion_cls_from_the_video_tower(contrastive_run: dict) -> None:
    """EPIC-100 action recognition as AVION runs it, from the run's video tower: docs/video_text.md's block
    (launch/recipes/lavila_vit_b_epic_cls.yaml: SGD, one action head over AVION's verb:noun ids, mixup +
    cutmix, at tiny size on 2 CPU ranks -> `avion-ds eval`): the usual EPIC keys and AVION's, per-sample
    action probabilities, labels numbered as AVION's generate_label_map (re-implemented in
    tests/engine/test_action_metrics.py)."""
    from tests.engine.test_action_metrics import generate_label_map

    synth = contrastive_run["synth"]
    _ok(contrastive_run["doc_runs"].run(doc_block("video_text.md", "lavila_vit_b_epic_cls.yaml")))
    run = contrastive_run["docs"] / "demo" / "cls"
    actions = generate_label_map([synth / "train.csv", synth / "val.csv"])
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recipe["model"]["pretrained"] == "demo/contrastive" and recipe["model"]["heads"] == {"action": len(actions)}
    ds = json.loads((run / "ds_config.json").read_text())
    assert ds["optimizer"]["type"] == "SGD" and ds["optimizer"]["params"]["momentum"] == 0.9
    assert ds["optimizer"]["params"]["nesterov"] is False and ds["zero_allow_untested_optimizer"] is True
    report = json.loads((run / "pretrained_report.json").read_text())
    assert report["backbone_matched_fraction"] == 1.0, report  # the whole video tower
    assert sorted(report["fresh"]) == ["heads.action.bias", "heads.action.weight"], report
    assert any(k.startswith("textual.") for k in report["dropped"]), report
    assert set(json.loads((run / "metrics.json").read_text())) >= USUAL | AVION

    result = json.loads((run / "eval_metrics.json").read_text())  # the block's `avion-ds eval --checkpoint`
    assert set(result["metrics"]) == USUAL | AVION
    assert result["action_label_map"]["num_actions"] == len(actions)
    rows, pairs = result["per_sample"], _csv_pairs(synth / "val.csv")
    assert len(rows) == len(pairs) == result["num_samples"]
    for row in rows:
        assert row["action_label"] == actions["{}:{}".format(*pairs[row["index"]])]
        assert len(row["action_scores"]) == len(actions) and sum(row["action_scores"]) == pytest.approx(1, abs=1e-4)
    right = 100 * sum(r["action_pred"] == r["action_label"] for r in rows) / len(rows)
    assert result["metrics"]["action_top1"] == pytest.approx(right)
    assert result["metrics"]["avion_action_top1"] == pytest.approx(right)


def test_mir_finetuning_from_the_run(contrastive_run: dict) -> None:
    """`task: mir` from the contrastive run directory (its newest checkpoint), docs/video_text.md's block
    (launch/recipes/mir_demo_cpu.yaml, 10 epochs, 2 CPU ranks): captions drawn by relevancy, max-margin loss,
    temperature frozen, evaluation every 5 epochs, best checkpoint by avg mAP."""
    from avion_ds.storage.run_dir import consolidate

    start = contrastive_run["run"]
    log = _ok(contrastive_run["doc_runs"].run(doc_block("video_text.md", "mir_demo_cpu.yaml")))
    run = contrastive_run["docs"] / "demo" / "mir"
    assert yaml.safe_load((run / "recipe.yaml").read_text())["model"]["pretrained"] == "demo/contrastive"
    assert "global batch 16 = micro 4 x accum 2 x world 2" in log

    report = json.loads((run / "pretrained_report.json").read_text())
    assert "visual.temporal_embed" in report["resized"] and not report["missing"], report
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert all("clip_acc" in h and "t2v_acc" in h for h in history if "loss" in h), history[-1]
    evals = [h for h in history if "eval" in h]
    assert [h["epoch"] for h in evals] == [4, 9], evals  # every 5 epochs (0-based epochs 4 and 9)
    best = json.loads((run / "best.json").read_text())
    assert best["metric"] == "avg_map" and best["value"] == max(h["eval"]["avg_map"] for h in evals), best
    assert f"best checkpoint: {best['tag']}" in log
    steps = losses(run)
    assert steps and all(0.0 <= v < 1.0 for v in steps.values()), steps  # hinge terms with margin 0.2 on cosines
    pretrained = consolidate(start)["logit_scale"].detach().reshape(())
    assert float(consolidate(run)["logit_scale"].detach().reshape(())) == float(pretrained)  # frozen


def test_zero_shot_classification_of_the_synthetic_classes(contrastive_run: dict) -> None:
    """`avion-ds eval --set task=zeroshot` on the held-out EPIC-style CSV, class names = the synthetic verbs and
    nouns (EPIC_100_{verb,noun}_classes.csv written by synth), LaViLa's templates and action classes: the
    action head well above chance, the noun head above it."""
    tmp, synth, run = contrastive_run["tmp"], contrastive_run["synth"], contrastive_run["run"]
    out = tmp / "zero_shot.json"
    sets = ["task=zeroshot", "data.val_dataset=epic", f"data.val_csv={synth / 'val.csv'}"]
    _ok(
        run_process(
            [*CLI, "eval", "--checkpoint", run, "--tag", "best", "--out", out, *_sets(sets)],
            cwd=contrastive_run["docs"],
        )
    )
    result = json.loads(out.read_text())
    m, chance = result["metrics"], result["chance_top1"]
    shown = [f"{h} {m[h + '_top1']:.1f} (chance {chance[h]:.1f})" for h in chance]
    print("zero-shot top-1: " + ", ".join(shown))
    assert result["classes"] == {"verb": 4, "noun": 3, "action": 12} and result["rows"] == 48
    assert result["templates"] == ["#C C {}", "#C {}"]
    assert m["action_top1"] >= 2 * chance["action"], result
    assert m["noun_top1"] >= 1.4 * chance["noun"], result


def _sets(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def _clip_narrations(synth: Path, clips: list[tuple[str, float, float]]) -> list[str | None]:
    """The synthetic narration of the segment under each clip's midpoint (None between segments)."""
    import csv

    from avion_ds.data.prep.synthetic_text import narration
    from avion_ds.data.sampling import parse_timestamp

    rows = []
    for name in ("train.csv", "val.csv"):
        with open(synth / name, newline="") as f:
            rows += list(csv.DictReader(f))
    spans = [
        (r["video_id"], parse_timestamp(r["start_timestamp"]) - 0.1, parse_timestamp(r["stop_timestamp"]) + 0.1, r)
        for r in rows
    ]
    out = []
    for video, start, end in clips:
        mid = (start + end) / 2
        hit = next((r for v, a, b, r in spans if v == video and a <= mid <= b), None)
        out.append(None if hit is None else narration(int(hit["verb_class"]), int(hit["noun_class"])))
    return out


def test_embed_and_search_the_synthetic_videos(contrastive_run: dict) -> None:
    """`avion-ds embed` of the chunk tree (1 s clips, one per synthetic segment) on 2 ranks, then text search:
    for each narration, the share of its R best clips that show it (R = the clips that do) is several times
    the share of such clips; `avion-ds search` prints the table."""
    import torch

    from avion_ds.cli.embed import embed_texts
    from avion_ds.embed.index import read_clips, read_meta, top_k
    from avion_ds.embed.model import load_encoder

    tmp, synth, chunks, run = (contrastive_run[k] for k in ("tmp", "synth", "chunks", "run"))
    index = tmp / "index"
    embed = ["embed", chunks, "--checkpoint", run, "--tag", "best", "--out", index, "--clip-seconds", "1"]
    _ok(launch([*embed, "--shard-size", "16", "--workers", "0"], launcher="torchrun", module="avion_ds.cli"))
    meta, clips = read_meta(index), read_clips(index)
    assert meta.num_clips == len(clips) == 96 and len(list((index / "shards").glob("*.safetensors"))) == 6
    labels = _clip_narrations(synth, clips)
    model = load_encoder(str(run), "best").model
    precision, chance = [], []
    for query in sorted({x for x in labels if x}):
        r = labels.count(query)
        hits = top_k(index, meta, embed_texts(model, [query], torch.device("cpu"))[0], r)
        precision.append(sum(labels[row] == query for row, _ in hits) / r)
        chance.append(r / len(labels))
    mean_p, mean_chance = sum(precision) / len(precision), sum(chance) / len(chance)
    print(f"text -> clip R-precision {100 * mean_p:.1f} vs chance {100 * mean_chance:.1f}")
    assert mean_p >= 3 * mean_chance, (precision, chance)
    out = _ok(run_process([*CLI, "search", "#C C moves the circle up", "--index", index, "--top-k", "5"]))
    assert "rank   score  video" in out and len([x for x in out.splitlines() if x.strip().startswith("5 ")]) == 1
