"""Zero-shot benchmarks as objects the task asks: which heads it classifies, how a batch's labels become
targets, its metrics and what its eval report adds (one ``results`` call) (LaViLa's ``eval_zeroshot.py``).

A dataset declares the protocol its clips are classified with (``zero_shot_protocol`` of its class,
``DatasetSpec.zero_shot``); this module registers the protocols by kind: ``single_label`` (EGTEA Gaze+:
mean class accuracy, top-1), ``multi_label_map`` (Charades-Ego: mAP) and ``epic_actions`` (EPIC-100: verb,
noun and LaViLa's action head). The evaluated set (``data.val_dataset``, else ``data.dataset``) gets an
instance named after it; a plugin adds a kind with ``@register_zero_shot_benchmark`` on a subclass and a
dataset that names it. Nothing here or in the task names a dataset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from avion_ds.data.datasets.registry import lookup, registered_names
from avion_ds.tasks.common.action_head_metrics import confusion_mean_accuracy_percent
from avion_ds.tasks.zero_shot.classes import (
    ClassSet,
    charades_map,
    check_labels_fit,
    epic_action_classes,
    epic_class_files,
    epic_narration_files,
    read_epic_classes,
)

if TYPE_CHECKING:
    from avion_ds.config import Recipe

Scores = dict[str, torch.Tensor]  # head -> (rows, classes)


class ZeroShotBenchmark:
    """One evaluated set (``name``, the dataset's) under a protocol ``kind``: its class heads, targets,
    metrics and report. The base class is a single-label set whose class names come from the dataset
    (``dataset.class_names``), one head named like the set."""

    kind: str = ""
    metrics_text: str = "top-1 / top-5 / mean class accuracy"

    def __init__(self, name: str) -> None:
        self.name = name

    def adjust_recipe(self, recipe: Recipe) -> None:
        """Recipe fixes this set needs before anything is built (none by default)."""

    def class_sets(self, recipe: Recipe, dataset: Any) -> list[ClassSet]:
        """The heads to classify; ValueError / FileNotFoundError with a reason for an unreadable file."""
        return [ClassSet(self.name, [[c] for c in dataset.class_names], "class file")]

    def targets(self, targets: Any, dataset: Any) -> Any:
        """A batch's labels as the metrics read them (unchanged by default)."""
        return targets

    def results(self, scores: Scores, labels: Any) -> tuple[dict[str, float], dict[str, Any]]:
        """The set's metrics (percent) from the gathered scores and labels, and what the eval JSON adds
        for this set (nothing by default); one call, so a metric and its report share one computation."""
        return head_accuracies({self.name: scores[self.name]}, {self.name: labels.long()}, prefix=False), {}


def ranked_classes(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(rows, min(k, classes)) class ids, best first: LaViLa's ``output.topk(maxk, 1, True, True)``. Top-1 is
    column 0 of the same ranking, so on tied scores a top-1 hit is always a top-5 hit."""
    return scores.float().topk(min(k, scores.shape[1]), dim=1, largest=True, sorted=True).indices


def head_accuracies(scores: Scores, targets: dict[str, torch.Tensor], prefix: bool) -> dict[str, float]:
    """Top-1 and top-5 (LaViLa's ``accuracy``: one ``topk`` ranking) and mean class accuracy (LaViLa's
    ``get_mean_accuracy`` on sklearn's confusion matrix) of its top-1 per head; keys ``{head}_top1`` with
    ``prefix``, else ``top1``."""
    out: dict[str, float] = {}
    for head, s in scores.items():
        t, p = targets[head].long(), f"{head}_" if prefix else ""
        ranked = ranked_classes(s, 5)
        hit = ranked == t[:, None]
        rows = max(1, t.numel())
        out[f"{p}top1"] = 100.0 * float(hit[:, 0].sum()) / rows
        out[f"{p}top5"] = 100.0 * float(hit.any(dim=1).sum()) / rows
        out[f"{p}mean_class"] = confusion_mean_accuracy_percent(t.numpy(), ranked[:, 0].numpy())
    return out


_KINDS: dict[str, type[ZeroShotBenchmark]] = {}


def register_zero_shot_benchmark(cls: type[ZeroShotBenchmark]) -> type[ZeroShotBenchmark]:
    """Class decorator: make ``cls`` the zero-shot protocol of kind ``cls.kind`` (a dataset names it)."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__}: a zero-shot benchmark needs a kind")
    _KINDS[cls.kind] = cls
    return cls


def zero_shot_kinds() -> tuple[str, ...]:
    """The registered protocol kinds, in registration order."""
    return tuple(_KINDS)


def zero_shot_benchmark(name: str) -> ZeroShotBenchmark | None:
    """The benchmark of the dataset registered as ``name`` (its declared kind); None when that set
    declares none, or is not registered. KeyError (naming both) for a kind nobody registered."""
    try:
        kind = lookup(name).zero_shot
    except ValueError:  # not a registered dataset
        return None
    if kind is None:
        return None
    if kind not in _KINDS:
        raise KeyError(f"dataset {name!r}: zero_shot_protocol={kind!r} is not one of {', '.join(_KINDS)}")
    return _KINDS[kind](name)


def zero_shot_benchmarks() -> tuple[str, ...]:
    """Names of the registered sets zero-shot classifies (those that declare a protocol), in registration order."""
    return tuple(n for n in registered_names() if lookup(n).zero_shot is not None)


@register_zero_shot_benchmark
class SingleLabelBenchmark(ZeroShotBenchmark):
    """One head named like the set, its class names from the dataset (EGTEA Gaze+, LaViLa's
    ``get_mean_accuracy``)."""

    kind = "single_label"
    metrics_text = "mean class accuracy and top-1 (LaViLa get_mean_accuracy), top-5"


@register_zero_shot_benchmark
class EpicBenchmark(ZeroShotBenchmark):
    """EPIC-100: verb and noun heads from the class CSVs; LaViLa's action head (the string-sorted
    ``verb:noun`` pairs of the train + validation CSVs, each prompted with its narrations)."""

    kind = "epic_actions"
    metrics_text = "top-1 / top-5 / mean class accuracy (sklearn confusion matrix without labels=) per head"

    def adjust_recipe(self, recipe: Recipe) -> None:
        if not recipe.data.train_csv.endswith(".csv"):
            recipe.data.train_csv = ""  # a pretraining run's narration file: the action classes come from CSVs

    def class_sets(self, recipe: Recipe, dataset: Any) -> list[ClassSet]:
        d = recipe.data
        files = epic_class_files(d.class_list, d.val_csv)
        sets = []
        for head in ("verb", "noun"):
            names = read_epic_classes(files[head], head == "noun")
            check_labels_fit(files[head], head, len(names), d.val_csv)
            sets.append(ClassSet(head, [[c] for c in names], str(files[head])))
        sources = epic_narration_files(d.train_csv, d.val_csv)
        keys, narrations = epic_action_classes(sources)
        both = len(sources) == 2
        note = (
            ""
            if both
            else f"zero-shot: EPIC action classes from {d.val_csv} alone ({len(keys)} verb:noun pairs): no EPIC train "
            "CSV with a narration column (data.train_csv, or EPIC_100_train.csv / train.csv beside it); LaViLa's "
            "are the train + val pairs (preprocess.py): fewer classes here, action accuracy not comparable"
        )
        report = {"action_classes_from": "train+val" if both else "val only"}
        sets.append(ClassSet("action", narrations, " + ".join(map(str, sources)), report, note))
        dataset.zero_shot_action_ids = {k: i for i, k in enumerate(keys)}
        return sets

    def targets(self, targets: Any, dataset: Any) -> dict[str, torch.Tensor]:
        return epic_targets({k: v.cpu() for k, v in targets.items()}, dataset.zero_shot_action_ids)

    def results(self, scores: Scores, labels: Any) -> tuple[dict[str, float], dict[str, Any]]:
        outside = int((labels["action"] < 0).sum())
        return head_accuracies(scores, labels, prefix=True), {"action_rows_outside_classes": outside}


def epic_targets(labels: dict[str, torch.Tensor], action_ids: dict[str, int]) -> dict[str, torch.Tensor]:
    """Verb, noun and LaViLa action class of each row (-1: the pair is not in the action classes)."""
    pairs = zip(labels["verb"].tolist(), labels["noun"].tolist())
    action = torch.tensor([action_ids.get(f"{v}:{n}", -1) for v, n in pairs], dtype=torch.long)
    return {"verb": labels["verb"].long(), "noun": labels["noun"].long(), "action": action}


@register_zero_shot_benchmark
class MultiLabelMapBenchmark(ZeroShotBenchmark):
    """Multi-label, mAP over the classes with positives (Charades-Ego, LaViLa's ``charades_map``)."""

    kind = "multi_label_map"
    metrics_text = "mAP over classes with positives (LaViLa charades_map)"

    def results(self, scores: Scores, labels: Any) -> tuple[dict[str, float], dict[str, Any]]:
        m_ap, absent = charades_map(scores[self.name].numpy(), labels.numpy())
        return {"map": m_ap}, {"classes_without_positives": absent}
