"""Evaluation protocols lock the eval settings; dataset recipes carry the published settings and cite them."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from avion_ds.config import ConfigError, load_recipe
from avion_ds.data.protocols import PROTOCOLS, eval_report

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "launch" / "recipes"


@pytest.mark.parametrize("name,protocol", [("vit_b_k400", "k400"), ("vit_l_k400", "k400"), ("vit_b_ssv2", "ssv2"),
                                           ("vit_l_ssv2", "ssv2"), ("vit_b_epic", "epic"), ("vit_l_epic", "epic")])
def test_dataset_recipes_carry_a_protocol_and_cite_sources(name, protocol) -> None:
    path = RECIPES / f"{name}.yaml"
    r = load_recipe(path)
    p = PROTOCOLS[protocol]
    assert r.eval.protocol == protocol and r.data.dataset == p.dataset
    assert (r.eval.temporal_views, r.eval.spatial_views, r.data.num_frames, r.data.size) == (
        p.temporal_views, p.spatial_views, p.num_frames, p.size)
    text = path.read_text()
    assert "# Source:" in text and "# Deviations" in text
    if protocol in ("k400", "ssv2"):  # VideoMAE fine-tuning
        d = r.data
        assert (d.rand_aug, d.reprob, d.num_sample, d.interpolation) == ("rand-m7-n4-mstd0.5-inc1", 0.25, 2, "bicubic")
        assert (r.data.mixup, r.data.cutmix, r.data.label_smoothing, r.optim.layer_decay) == (0.8, 1.0, 0.1, 0.75)
    if protocol == "ssv2":
        assert r.data.hflip == 0.0 and r.model.num_classes == 174 and r.data.sampling == "segment"


def test_protocol_mismatch_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"eval.protocol=k400 needs eval.temporal_views=5 \(recipe has 2; VideoMAE"):
        load_recipe(RECIPES / "vit_b_k400.yaml", ["eval.temporal_views=2"])
    with pytest.raises(ConfigError, match=r"eval.protocol=ssv2 needs data.dataset='ssv2'"):
        load_recipe(RECIPES / "vit_b_k400.yaml", ["eval.protocol=ssv2"])
    with pytest.raises(ConfigError, match=r"eval.protocol='k700' is not one of k400, ssv2, epic, custom"):
        load_recipe(None, ["data.dataset=kinetics", "eval.protocol=k700"])
    r = load_recipe(RECIPES / "vit_b_k400.yaml", ["eval.protocol=custom", "eval.temporal_views=2"])
    assert r.eval.temporal_views == 2


class _Rows:
    missing: ClassVar[list[str]] = ["train.csv:5 (a): video 'a' not found"]
    quarantined: ClassVar[list[str]] = ["train.csv:9 (b): b/0.mp4: zero-byte file"]

    def __len__(self) -> int:
        return 4

    def row_name(self, i: int) -> str:
        return f"clip{i}"


def test_eval_report_lists_missing_quarantined_and_failed() -> None:
    rep = eval_report("k400", 15, _Rows(), [0, 3, 3, 1])  # sample 2 failed; 3 appears twice (its replacement)
    assert rep["protocol"] == "k400" and rep["views"] == 15 and rep["protocol_settings"]["temporal_views"] == 5
    assert (rep["annotation_rows"], rep["samples_evaluated"]) == (6, 3)
    assert (rep["num_missing"], rep["num_quarantined"], rep["num_failed"]) == (1, 1, 1)
    assert rep["failed"] == ["clip2"] and rep["missing"] == _Rows.missing
    assert "protocol_settings" not in eval_report("custom", 1, _Rows(), range(4))


def test_missing_class_list_is_one_line_before_any_work(tmp_path) -> None:
    from avion_ds.engine.train import check_data_paths

    (tmp_path / "train.json").write_text("[]")
    base = [f"data.root={tmp_path}", f"data.train_csv={tmp_path / 'train.json'}",
            f"data.val_csv={tmp_path / 'train.json'}"]
    r = load_recipe(RECIPES / "vit_b_ssv2.yaml", base)
    with pytest.raises(ConfigError, match="no labels.json next to .*train.json: set data.class_list"):
        check_data_paths(r)
    r = load_recipe(RECIPES / "vit_b_k400.yaml", [*base, f"data.class_list={tmp_path / 'nope.txt'}"])
    with pytest.raises(ConfigError, match=r"data.class_list: file not found: .*nope.txt"):
        check_data_paths(r)
    r = load_recipe(RECIPES / "vit_b_k400.yaml", [*base, f"data.quarantine={tmp_path / 'q.tsv'}"])
    with pytest.raises(ConfigError, match=r"data.quarantine: file not found: .*q.tsv \(auto \| none"):
        check_data_paths(r)
