"""Zero-shot classification by text prompts against LaViLa's code (eval_zeroshot.py, lavila/utils/evaluation.py,
evaluation_charades.py, preprocess.py, data/datasets.py), re-implemented here as the reference: the classifier
(templates x names, normalise, mean, normalise), multi-view scores, mean class accuracy on sklearn's
confusion matrix (classes only predicted count), Charades mAP (ties, rows and classes without positives),
frame sampling, and the class files as released; bad layouts and bad templates are one-line errors."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from avion_ds.data.datasets.egocentric import (
    PAD,
    lavila_frame_ids,
    lavila_stride_clips,
    read_charades_classes,
    read_egtea_classes,
)
from avion_ds.tasks.common.action_head_metrics import confusion_mean_accuracy_percent, overall_accuracy
from avion_ds.tasks.zero_shot.classes import (
    ClassSet,
    charades_map,
    epic_action_classes,
    epic_key_name,
    read_epic_classes,
    resolve_templates,
    text_classifier,
    view_logits,
)
from tests.engine.test_action_metrics import confusion_matrix as ref_confusion_matrix
from tests.engine.test_action_metrics import get_mean_accuracy as ref_get_mean_accuracy


# ------------------------------------------------------------------------------- the reference (LaViLa)
def ref_compute_map(submission_array: np.ndarray, gt_array: np.ndarray) -> tuple[float, np.ndarray]:
    m_aps = []
    for oc_i in range(submission_array.shape[1]):
        sorted_idxs = np.argsort(-submission_array[:, oc_i])
        tp = gt_array[:, oc_i][sorted_idxs] == 1
        fp = np.invert(tp)
        n_pos = tp.sum()
        if n_pos < 0.1:
            m_aps.append(float("nan"))
            continue
        prec = np.cumsum(tp) / (np.cumsum(fp) + np.cumsum(tp)).astype(float)
        avg_prec = 0
        for i in range(submission_array.shape[0]):
            if tp[i]:
                avg_prec += prec[i]
        m_aps.append(avg_prec / n_pos.astype(float))
    m_aps = np.array(m_aps)
    return float(np.mean(m_aps)), m_aps


def ref_charades_map(submission_array: np.ndarray, gt_array: np.ndarray) -> tuple[float, np.ndarray]:
    fix = submission_array.copy()
    empty = np.sum(gt_array, axis=1) == 0
    fix[empty, :] = -np.inf
    return ref_compute_map(fix, gt_array)


def ref_get_frame_ids(start_frame: float, end_frame: float, num_segments: int) -> list[int]:
    seg_size = float(end_frame - start_frame - 1) / num_segments
    seq = []
    for i in range(num_segments):
        start = int(np.round(seg_size * i) + start_frame)
        end = int(np.round(seg_size * (i + 1)) + start_frame)
        end = min(end, end_frame)
        seq.append(int((start + end) // 2))
    return seq


def ref_egtea_ids(end_frame: int, clip_length: int, clip_stride: int, num_clips: int) -> list[list[int]]:
    """LaViLa's EGTEA test branch, with -1 where it appends zero frames."""
    if end_frame < clip_length * clip_stride:
        frames = list(np.arange(0, end_frame)) + [-1] * (clip_length * clip_stride - end_frame)
        frames = frames[::clip_stride]
        return [[int(f) for f in frames]] * num_clips
    frame_ids = []
    for start_id in np.linspace(0, end_frame - clip_length * clip_stride, num_clips, dtype=int):
        frame_ids.extend(np.arange(start_id, start_id + clip_length * clip_stride, clip_stride))
    return [[int(f) for f in frame_ids[i * clip_length : (i + 1) * clip_length]] for i in range(num_clips)]


def ref_classifier(encode_text, labels: list, templates: list[str]) -> torch.Tensor:
    from avion_ds.data.tokenizer import tokenize

    text_features = []
    for label in labels:
        if isinstance(label, list):
            texts = [tmpl.format(lbl) for tmpl in templates for lbl in label]
        else:
            texts = [tmpl.format(label) for tmpl in templates]
        class_embeddings = encode_text(tokenize(texts))
        class_embeddings = class_embeddings / class_embeddings.norm(dim=-1, keepdim=True)
        class_embeddings = class_embeddings.mean(dim=0)
        class_embeddings = class_embeddings / class_embeddings.norm(dim=-1, keepdim=True)
        text_features.append(class_embeddings)
    return torch.stack(text_features, dim=0)


def save_tiny_weights(path: Path, seed: int = 0, text: bool = True) -> Path:
    """A clip_vit_test_tiny state dict (seeded init) as safetensors; ``text=False`` leaves the text tower out."""
    from safetensors.torch import save_file

    from avion_ds.models import create_model

    torch.manual_seed(seed)
    state = create_model("clip_vit_test_tiny").state_dict()
    save_file({k: v.contiguous() for k, v in state.items() if text or not k.startswith("textual.")}, str(path))
    return path


# ------------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mean_class_accuracy_equals_lavila_on_sklearn_confusion(seed: int) -> None:
    rng = np.random.default_rng(seed)
    target = rng.integers(0, 6, 40)
    pred = np.where(rng.random(40) < 0.5, target, rng.integers(0, 9, 40))  # classes 6-8 only ever predicted
    pred[0] = 8
    ours = confusion_mean_accuracy_percent(target, pred), overall_accuracy(target, pred)
    ref = ref_get_mean_accuracy(ref_confusion_matrix(target, pred))
    assert ours == pytest.approx(ref, abs=1e-9)


def test_mean_class_accuracy_counts_a_class_only_predicted_as_zero() -> None:
    target, pred = np.array([0, 0, 1, 1]), np.array([0, 0, 1, 5])
    # classes {0, 1, 5}: 1.0, 0.5, 0.0 -> 50 (the mean over target classes alone would be 75)
    assert (confusion_mean_accuracy_percent(target, pred), overall_accuracy(target, pred)) == pytest.approx(
        (50.0, 75.0)
    )


@pytest.mark.parametrize("levels", [0, 3])
def test_charades_map_equals_lavila_with_ties_and_empty_rows(levels: int) -> None:
    rng = np.random.default_rng(levels)
    scores = rng.normal(size=(30, 7))
    if levels:
        scores = np.round(scores * levels) / levels  # many tied scores
    gt = (rng.random((30, 7)) < 0.3).astype(np.float64)
    gt[:, 0] = 0
    gt[0, 0] = 1
    gt[5] = 0  # a video without any action: scored -inf in every class
    ours, absent = charades_map(scores, gt)
    ref, _ = ref_charades_map(scores, gt)
    assert absent == 0 and ours == pytest.approx(100 * ref, abs=1e-9)


def test_charades_map_class_without_positives() -> None:
    """LaViLa's np.mean turns NaN on a class without positives; ours averages the others and counts it."""
    rng = np.random.default_rng(3)
    scores, gt = rng.normal(size=(20, 5)), (rng.random((20, 5)) < 0.4).astype(float)
    gt[:, 2] = 0
    ours, absent = charades_map(scores, gt)
    ref, aps = ref_charades_map(scores, gt)
    assert math.isnan(ref) and absent == 1
    assert ours == pytest.approx(100 * np.nanmean(aps), abs=1e-9)


# ------------------------------------------------------------------------------- classifier and scores
@pytest.fixture(scope="module")
def tiny_clip() -> torch.nn.Module:
    from avion_ds.models import create_model

    torch.manual_seed(0)
    return create_model("clip_vit_test_tiny").eval()


def test_classifier_equals_lavila_validate_zeroshot(tiny_clip: torch.nn.Module) -> None:
    labels = [["open drawer", "open the drawer", "pull drawer"], ["cut onion"], ["wash pan", "rinse pan"]]
    templates = list(resolve_templates("lavila"))
    with torch.no_grad():
        ref = ref_classifier(tiny_clip.encode_text, labels, templates)
        ours = text_classifier(tiny_clip.encode_text, ClassSet("action", labels, "test"), tuple(templates), "cpu", 2)
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)


def test_view_scores_are_lavila_max_then_softmax() -> None:
    torch.manual_seed(0)
    video = torch.nn.functional.normalize(torch.randn(6, 8), dim=-1)  # 2 clips x 3 views
    cls = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    one = view_logits(video, cls, 1)
    torch.testing.assert_close(one, video @ cls.T)  # one view: the cosines (LaViLa's tensor branch)
    stacked = torch.stack([video[v::3] @ cls.T for v in range(3)])  # LaViLa's list of clips
    torch.testing.assert_close(view_logits(video, cls, 3), torch.softmax(stacked.max(0).values, dim=1))


# ------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize(("start", "end", "n"), [(0, 100, 16), (10, 25, 4), (0, 7, 16), (0, 301.5, 16), (3, 4, 4)])
def test_frame_ids_equal_lavila_get_frame_ids(start: float, end: float, n: int) -> None:
    assert lavila_frame_ids(start, end, n) == ref_get_frame_ids(start, end, n)


@pytest.mark.parametrize(("frames", "length", "stride", "clips"), [(100, 16, 2, 10), (31, 16, 2, 10), (32, 16, 2, 3)])
def test_egtea_clips_equal_lavila_with_zero_padding(frames: int, length: int, stride: int, clips: int) -> None:
    assert lavila_stride_clips(frames, length, stride, clips) == ref_egtea_ids(frames, length, stride, clips)
    assert PAD == -1


# ------------------------------------------------------------------------------- class files
def test_epic_class_files_as_released(tmp_path: Path) -> None:
    p = tmp_path / "EPIC_100_noun_classes.csv"
    p.write_text('id,key,instances,category\n1,"pan:dust",3,utensils\n0,tap,10,appliances\n')
    assert read_epic_classes(p, noun=True) == ["tap", "dust pan"]
    assert epic_key_name("turn-on", noun=False) == "turn on"
    bad = tmp_path / "bad.csv"
    bad.write_text("id,name\n0,tap\n")
    with pytest.raises(ValueError, match="missing column"):
        read_epic_classes(bad, noun=True)
    bad.write_text("id,key\n0,tap\n2,pan\n")
    with pytest.raises(ValueError, match="ids 0..1"):
        read_epic_classes(bad, noun=True)


def test_epic_action_classes_equal_lavila_generate_label_map(tmp_path: Path) -> None:
    """LaViLa: ``'{}:{}'.format(int(verb), int(noun))`` keys of train + val, sorted as strings; each with the set
    of its narrations."""
    cols = ["narration_id", "video_id", "start_timestamp", "stop_timestamp", "narration", "verb_class", "noun_class"]
    rows = [("10", "2", "open tap"), ("1", "3", "take cup"), ("10", "2", "turn on tap"), ("2", "0", "wash")]
    files = []
    for name, part in (("train.csv", rows[:3]), ("val.csv", rows[1:])):
        with (tmp_path / name).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            w.writerows([["x", "P01_01", "00:00:01.00", "00:00:02.00", n, v, o] for v, o, n in part])
        files.append(tmp_path / name)
    keys, names = epic_action_classes(files)
    ref_keys = sorted({f"{int(v)}:{int(o)}" for v, o, _ in rows})
    assert keys == ref_keys == ["10:2", "1:3", "2:0"]
    assert [set(n) for n in names] == [{"open tap", "turn on tap"}, {"take cup"}, {"wash"}]


def test_egtea_and_charades_class_files(tmp_path: Path) -> None:
    egtea = tmp_path / "action_idx.txt"
    egtea.write_text("Open_fridge 1\nTake_bowl 2\nOpen_fridge 3\n")
    names, numbers = read_egtea_classes(egtea)
    assert names == ["open fridge", "take bowl", "open fridge"]
    assert numbers == {1: 2, 2: 1, 3: 2}  # LaViLa's {label: i} keeps a repeated name's last position
    charades = tmp_path / "Charades_v1_classes.txt"
    charades.write_text("c000 Holding some clothes\nc001 Putting clothes somewhere, then leaving\n")
    names, codes = read_charades_classes(charades)
    assert names == ["Holding some clothes", "Putting clothes somewhere"] and codes == {"c000": 0, "c001": 1}
    egtea.write_text("Open fridge\n")
    with pytest.raises(ValueError, match="Action_Name NUMBER"):
        read_egtea_classes(egtea)
    charades.write_text("Holding some clothes\n")
    with pytest.raises(ValueError, match="cNNN"):
        read_charades_classes(charades)


def test_templates() -> None:
    assert resolve_templates("lavila") == ("#C C {}", "#C {}")
    assert resolve_templates("plain") == ("{}",)
    assert resolve_templates("a photo of {}| {} happens") == ("a photo of {}", "{} happens")
    for bad in ("no slot", "{} and {}", "{0}"):
        with pytest.raises(ValueError, match="zeroshot.templates"):
            resolve_templates(bad)


def test_eval_refuses_an_unknown_class_file_layout(tmp_path: Path) -> None:
    """`avion-ds eval --set task=zeroshot` with a class file of another layout: one line, exit 2, before any
    model or process group."""
    from avion_ds.data.prep.synthetic import make_synthetic_epic

    info = make_synthetic_epic(tmp_path / "s", num_videos=1, segments_per_video=4, width=32, height=24, fps=4)
    bad = tmp_path / "EPIC_100_verb_classes.csv"
    bad.write_text("verb,count\ntake,3\n")
    recipe = tmp_path / "zs.yaml"
    recipe.write_text("task: zeroshot\nmodel: {name: clip_vit_test_tiny}\n")
    sets = ["data.chunked=false", f"data.root={info['videos']}", f"data.val_csv={info['val_csv']}"]
    sets += [f"data.class_list={bad}", "data.size=32", "data.num_frames=2"]
    weights = save_tiny_weights(tmp_path / "w.safetensors")
    cmd = [sys.executable, "-m", "avion_ds.cli", "eval", "--config", str(recipe), "--checkpoint", str(weights)]
    proc = subprocess.run([*cmd, *[x for s in sets for x in ("--set", s)]], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "avion-ds eval" in x]
    assert len(lines) == 1 and "missing column(s) id, key" in lines[0] and str(bad) in lines[0], proc.stderr


def test_openai_sizes_are_openai_geometry_and_towers_check() -> None:
    """clip_openai_* = the AVION sizes with OpenAI's own choices (what ViT-B-16.pt loads into with its
    projections); a missing text tensor is refused, a fresh temporal embedding (image CLIP) is not."""
    from avion_ds.config import ConfigError
    from avion_ds.models import registered_arch
    from avion_ds.models.weights.report import LoadReport
    from avion_ds.tasks.zero_shot.task import check_towers

    for ours, base in (
        ("clip_openai_vit_base_patch16_224", "clip_vit_base_patch16_224"),
        ("clip_openai_vit_large_patch14_224", "clip_vit_large_patch14_224"),
    ):
        want = registered_arch(base, act="quick_gelu", norm_eps=1e-5, proj_dim=512 if "base" in base else 768)
        got = registered_arch(ours)
        assert (got.vision.replace(name="x"), got.text.replace(name="x")) == (
            want.vision.replace(name="x"),
            want.text.replace(name="x"),
        )
    check_towers(LoadReport("openai", fresh=["visual.temporal_embed"]), "ViT-B-16.pt")
    with pytest.raises(ConfigError, match="no trained text tower"):
        check_towers(LoadReport("x", fresh=["textual.proj"]), "w.pt")
