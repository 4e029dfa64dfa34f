"""EPIC-100 with ONE action head: the label map and the metrics equal AVION's own functions.

The oracle is AVION's code (zhaoyue-zephyrus/AVION @ 31b00b6, MIT licence), copied below as it is:
``avion/utils/misc.py`` ``generate_label_map`` (paths as arguments), ``avion/utils/evaluation_ek100cls.py``
(``get_marginal_indexes``, ``marginalize``, ``get_mean_accuracy``) and the metric lines of
``scripts/main_lavila_finetune_cls.py`` ``validate`` (588-610). sklearn and pandas are not dependencies: their
two functions and the one DataFrame use are stand-ins written from their documented behaviour
(``confusion_matrix`` without ``labels=``: rows and columns are the sorted union of y_true and y_pred).
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from avion_ds.data.datasets.epic import epic_action_map
from avion_ds.tasks.common.action_head_metrics import AVION_KEYS, action_head_metrics, avion_metrics

EPIC_HEADER = "narration_id participant_id video_id narration_timestamp start_timestamp stop_timestamp"
EPIC_HEADER += " start_frame stop_frame narration verb verb_class noun noun_class all_nouns all_noun_classes"


# ---- stand-ins for sklearn.metrics and pandas (documented behaviour) ---------------------------
def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """sklearn.metrics.confusion_matrix(y_true, y_pred): labels = sorted union, rows true, columns predicted."""
    labels = sorted(set(np.asarray(y_true).tolist()) | set(np.asarray(y_pred).tolist()))
    at = {label: i for i, label in enumerate(labels)}
    cm = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for t, p in zip(np.asarray(y_true).tolist(), np.asarray(y_pred).tolist()):
        cm[at[t], at[p]] += 1
    return cm


def top_k_accuracy_score(y_true: np.ndarray, y_score: np.ndarray, k: int, labels: np.ndarray) -> float:
    """sklearn.metrics.top_k_accuracy_score, multiclass case (sklearn's own ranking: mergesort, reversed)."""
    y_true_encoded = np.searchsorted(labels, y_true)
    sorted_pred = np.argsort(y_score, axis=1, kind="mergesort")[:, ::-1]
    hits = (y_true_encoded == sorted_pred[:, :k].T).any(axis=0)
    return float(np.average(hits))


class _Series:
    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def max(self) -> int:
        return self.values.max()

    def __eq__(self, other: object) -> np.ndarray:  # type: ignore[override]
        return self.values == other


class DataFrame:
    """pandas.DataFrame.from_dict({column: values}) with its RangeIndex: column access, boolean row masks."""

    def __init__(self, columns: dict) -> None:
        self.columns = {k: np.asarray(list(v)) for k, v in columns.items()}

    def __getitem__(self, key: object) -> object:
        if isinstance(key, str):
            return _Series(self.columns[key])
        return SimpleNamespace(index=SimpleNamespace(values=np.flatnonzero(key)))


# ---- AVION's functions, as they are ------------------------------------------------------------
def generate_label_map(files: list[Path]) -> dict[str, int]:
    vn_list = []
    mapping_vn2narration = {}
    for f in files:
        csv_reader = csv.reader(open(f))  # noqa: SIM115 - AVION's line
        _ = next(csv_reader)  # skip the header
        for row in csv_reader:
            vn = "{}:{}".format(int(row[10]), int(row[12]))  # noqa: UP032 - AVION's line
            narration = row[8]
            if vn not in vn_list:
                vn_list.append(vn)
            if vn not in mapping_vn2narration:
                mapping_vn2narration[vn] = [narration]
            else:
                mapping_vn2narration[vn].append(narration)
    vn_list = sorted(vn_list)
    mapping_vn2act = {vn: i for i, vn in enumerate(vn_list)}
    return mapping_vn2act


def get_marginal_indexes(actions, mode):
    vi = []
    for v in range(actions[mode].max() + 1):
        vals = actions[actions[mode] == v].index.values
        if len(vals) > 0:
            vi.append(vals)
        else:
            vi.append(np.array([0]))
    return vi


def marginalize(probs, indexes):
    mprobs = []
    for ilist in indexes:
        mprobs.append(probs[:, ilist].sum(1))
    return np.array(mprobs).T


def get_mean_accuracy(cm):
    list_acc = []
    for i in range(len(cm)):
        acc = 0
        if cm[i, :].sum() > 0:
            acc = cm[i, i] / cm[i, :].sum()
        list_acc.append(acc)

    return 100 * np.mean(list_acc), 100 * np.trace(cm) / np.sum(cm)


def avion_validate(all_preds: np.ndarray, all_targets: np.ndarray, mapping_vn2act: dict[str, int]) -> dict:
    """validate()'s metric lines for ek100_cls (its printed fractions in percent, as the keys report them)."""
    num_classes = len(mapping_vn2act)
    mapping_act2v = {i: int(vn.split(":")[0]) for (vn, i) in mapping_vn2act.items()}
    mapping_act2n = {i: int(vn.split(":")[1]) for (vn, i) in mapping_vn2act.items()}
    actions = DataFrame({"verb": mapping_act2v.values(), "noun": mapping_act2n.values()})
    acc1 = top_k_accuracy_score(all_targets, all_preds, k=1, labels=np.arange(0, num_classes))
    acc5 = top_k_accuracy_score(all_targets, all_preds, k=5, labels=np.arange(0, num_classes))
    cm = confusion_matrix(all_targets, all_preds.argmax(axis=1))
    mean_acc, _ = get_mean_accuracy(cm)
    vi = get_marginal_indexes(actions, "verb")
    ni = get_marginal_indexes(actions, "noun")
    verb_scores = marginalize(all_preds, vi)
    noun_scores = marginalize(all_preds, ni)
    target_to_verb = np.array([mapping_act2v[a] for a in all_targets.tolist()])
    target_to_noun = np.array([mapping_act2n[a] for a in all_targets.tolist()])
    cm = confusion_matrix(target_to_verb, verb_scores.argmax(axis=1))
    _, verb_acc = get_mean_accuracy(cm)
    cm = confusion_matrix(target_to_noun, noun_scores.argmax(axis=1))
    _, noun_acc = get_mean_accuracy(cm)
    return {
        "avion_action_top1": 100 * acc1,
        "avion_action_top5": 100 * acc5,
        "avion_action_mean_class": mean_acc,
        "avion_verb_top1": verb_acc,
        "avion_noun_top1": noun_acc,
    }


# ---- inputs ---------------------------------------------------------------------------------
def write_epic_csv(path: Path, pairs: list[tuple[int, int]], start: int = 0) -> Path:
    """An EPIC-100 CSV (its 15 columns in its order) with one row per (verb, noun)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(EPIC_HEADER.split())
        for i, (v, n) in enumerate(pairs):
            w.writerow([f"P01_01_{start + i}", "P01", "P01_01", "00:00:01.00", "00:00:01.00", "00:00:02.00"]
                       + ["60", "120", f"verb{v} noun{n}", f"verb{v}", v, f"noun{n}", n, "[]", "[]"])  # fmt: skip
    return path


def random_pairs(rng: np.random.Generator, count: int) -> list[tuple[int, int]]:
    """(verb, noun) pairs over 0..14 x 0..24 with verbs 0, 3, 11 and nouns 0, 7, 19 never used: classes below
    the maximum with no action (AVION's marginal gives them action 0's probability, and action 0, the
    string-smallest "10:..", has verb 10)."""
    verbs = [v for v in range(15) if v not in (0, 3, 11)]
    nouns = [n for n in range(25) if n not in (0, 7, 19)]
    return [(int(rng.choice(verbs)), int(rng.choice(nouns))) for _ in range(count)]


@pytest.fixture
def label_map(tmp_path: Path) -> tuple[dict[str, int], object]:
    """AVION's map and ours over a train + a val CSV (repeats, pairs only in val, two-digit classes)."""
    rng = np.random.default_rng(0)
    train = write_epic_csv(tmp_path / "EPIC_100_train.csv", random_pairs(rng, 150))
    val = write_epic_csv(tmp_path / "EPIC_100_validation.csv", random_pairs(rng, 60) + [(14, 24), (10, 1)], 1000)
    return generate_label_map([train, val]), epic_action_map([train, val])


def test_action_ids_are_avions_generate_label_map(label_map: tuple) -> None:
    theirs, ours = label_map
    assert list(ours.keys) == list(theirs)  # string order: "10:2" before "1:3"
    assert {k: ours.id_of(*map(int, k.split(":"))) for k in ours.keys} == theirs
    assert list(ours.keys) != sorted(ours.keys, key=lambda k: tuple(map(int, k.split(":"))))  # not numeric order
    assert ours.verbs == tuple(int(k.split(":")[0]) for k in theirs) and ours.id_of(3, 0) is None


def scores_and_targets(rng: np.random.Generator, n: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax rows (float32) whose targets cover 12 actions only (classes without examples; predictions land
    outside them), plus rows where ties decide: uniform rows aimed at the last action (sklearn ranks the
    higher id first), rows whose target ties with another action for the best score, and one-hot rows on
    action 0 (its verb ties with the verbs no action has, which AVION scores with action 0's probability)."""
    logits = rng.normal(size=(n, classes)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    target = rng.choice(rng.choice(classes, 12, replace=False), n)
    probs[:4], target[:4] = 1.0 / classes, classes - 1
    for i in range(4, 12):
        other = int(rng.choice([c for c in range(classes) if c != target[i]]))
        probs[i, [target[i], other]] = probs[i].max() + 0.1
    probs[12:16], target[12:16] = np.eye(classes)[0], 0
    return (probs / probs.sum(1, keepdims=True)).astype(np.float32), target


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_avion_keys_equal_avions_validate(label_map: tuple, seed: int) -> None:
    theirs, ours = label_map
    probs, target = scores_and_targets(np.random.default_rng(seed), 300, len(ours))
    want = avion_validate(probs, target, theirs)
    got = avion_metrics(probs, target, ours.verbs, ours.nouns)
    assert got == want  # exactly: the same operations in the same order
    assert set(np.unique(probs.argmax(1))) - set(np.unique(target))  # predicted classes no target has
    assert 0 < got["avion_action_mean_class"] < 100


def test_action_head_metrics_keys_and_marginals(label_map: tuple) -> None:
    """The usual EPIC keys come from the summed marginals (0 for a verb no action has), AVION's beside them."""
    _, ours = label_map
    rng = np.random.default_rng(5)
    probs = torch.softmax(torch.from_numpy(rng.normal(size=(64, len(ours))) * 3).float(), dim=1)
    target = torch.from_numpy(rng.choice(len(ours), 64))
    got = action_head_metrics(probs, target, ours)
    usual = {f"{h}_{m}" for h in ("verb", "noun") for m in ("top1", "top5", "mean_class")}
    assert set(got) == usual | {"action_top1", "action_top5"} | set(AVION_KEYS)
    verb_probs = torch.zeros(64, max(ours.verbs) + 1)
    for a, v in enumerate(ours.verbs):
        verb_probs[:, v] += probs[:, a]
    verb_target = torch.tensor(ours.verbs)[target]
    assert got["verb_top1"] == pytest.approx(100 * float((verb_probs.argmax(1) == verb_target).float().mean()))
    assert got["action_top1"] == pytest.approx(100 * float((probs.argmax(1) == target).float().mean()))
    in_top5 = (probs.argsort(1, descending=True)[:, :5] == target[:, None]).any(1)
    assert got["action_top5"] == pytest.approx(100 * float(in_top5.float().mean()))
    assert got == action_head_metrics(probs.double(), target, ours)  # computed in float32 whatever comes in
