"""Malformed zero-shot evaluations (``avion-ds eval --set task=zeroshot``), table-driven as
tests/test_bad_input_table.py: each ends in ONE stderr line naming the option, key or file, exit code 2, no
traceback, before any process group or model exists (both trip a wire). Every command runs in-process through
its ``main``. Charades-Ego rows with a bad ``length`` are left out and counted (tests/data/test_charades_lengths.py);
start-up refuses a file none of whose rows is usable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from avion_ds.data.prep.synthetic import make_synthetic_epic
from tests.engine.test_zero_shot import save_tiny_weights
from tests.test_bad_input_table import no_process_group

CHARADES_HEADER = "id,subject,scene,quality,relevance,verified,script,objects,descriptions,actions,length\n"
COMMON = ["data.chunked=false", "data.size=32", "data.num_frames=2", "data.decoder=pyav", "data.workers=0"]


@pytest.fixture(scope="module")
def zs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny synthetic EPIC set with its class files, weights of a tiny dual encoder, a zero-shot recipe."""
    tmp = tmp_path_factory.mktemp("zs_bad")
    info = make_synthetic_epic(tmp / "s", num_videos=1, segments_per_video=6, width=32, height=24, fps=4)
    recipe = tmp / "zs.yaml"
    recipe.write_text("task: zeroshot\nmodel: {name: clip_vit_test_tiny}\nprecision: fp32\n")
    return {"info": info, "weights": save_tiny_weights(tmp / "w.safetensors"), "recipe": recipe}


def _epic(zs: dict, tmp: Path) -> list[str]:
    i = zs["info"]
    return ["data.val_dataset=epic", f"data.root={i['videos']}", f"data.val_csv={i['val_csv']}"]


def _short_verb_file(zs: dict, tmp: Path) -> list[str]:
    short = tmp / "EPIC_100_verb_classes.csv"
    short.write_text("id,key\n0,take\n")
    (tmp / "EPIC_100_noun_classes.csv").write_text(Path(zs["info"]["noun_classes_csv"]).read_text())
    return [*_epic(zs, tmp), f"data.class_list={short}"]


def _charades(length: str) -> Callable[[dict, Path], list[str]]:
    def prep(zs: dict, tmp: Path) -> list[str]:
        (tmp / "videos").mkdir(exist_ok=True)
        (tmp / "Charades_v1_classes.txt").write_text("c000 Holding some clothes\n")
        csv = tmp / "CharadesEgo_v1_test_only1st.csv"
        csv.write_text(CHARADES_HEADER + f'BADEGO,S,K,6,7,Yes,x,a,d,"c000 0.0 1.0",{length}\n')
        return ["data.val_dataset=charades_ego", f"data.root={tmp / 'videos'}", f"data.val_csv={csv}"]

    return prep


# (id, preparation returning the --set overrides, substrings the line must hold; {tmp}: the test's directory)
Case = tuple[str, Callable[[dict, Path], list[str]], list[str]]
CASES: list[Case] = [
    (
        "epic_verb_file_shorter_than_labels",
        _short_verb_file,
        ["{tmp}/EPIC_100_verb_classes.csv", "1 verb classes", "verb_class "],
    ),
    ("charades_length_nan", _charades("nan"), ["CharadesEgo_v1_test_only1st.csv:2 (BADEGO)", "length 'nan'"]),
    ("charades_length_inf", _charades("inf"), ["CharadesEgo_v1_test_only1st.csv:2 (BADEGO)", "length 'inf'"]),
    ("charades_length_negative", _charades("-5"), ["CharadesEgo_v1_test_only1st.csv:2 (BADEGO)", "length '-5'"]),
    (
        "template_without_slot",
        lambda zs, tmp: [*_epic(zs, tmp), "zeroshot.templates=a video"],
        ["zeroshot.templates='a video'"],
    ),
    ("unknown_set", lambda zs, tmp: [*_epic(zs, tmp), "data.val_dataset=ssv2"], ["data.val_dataset='ssv2'"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_zero_shot_eval_is_one_line_exit_2(
    case: Case, zs: dict, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from avion_ds.cli import eval as eval_cli
    from avion_ds.tasks.zero_shot.task import ZeroShotTask

    name, prep, expect = case
    no_process_group(monkeypatch)

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was about to be built: start-up let the bad input through")

    monkeypatch.setattr(ZeroShotTask, "build_model", no_model)
    sets = [*COMMON, *prep(zs, tmp_path)]
    argv = ["--config", str(zs["recipe"]), "--checkpoint", str(zs["weights"]), "--out", str(tmp_path / "e.json")]
    code = eval_cli.main([*argv, *[x for s in sets for x in ("--set", s)]])
    out, err = capsys.readouterr()
    err = err.strip()
    assert code == 2, (name, out[-2000:], err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("avion-ds eval: error: "), err
    for part in expect:
        assert part.format(tmp=tmp_path) in err, (part, err)
    assert not (tmp_path / "e.json").exists()


def test_the_base_evaluation_passes_start_up(zs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's base EPIC evaluation passes every start-up check (so each case fails for its own reason)."""
    from avion_ds.cli import eval as eval_cli
    from avion_ds.cli.parsers import eval_args

    no_process_group(monkeypatch)
    sets = [*COMMON, *_epic(zs, tmp_path)]
    argv = ["--config", str(zs["recipe"]), "--checkpoint", str(zs["weights"]), "--out", str(tmp_path / "e.json")]
    setup = eval_cli.setup_eval(eval_args([*argv, *[x for s in sets for x in ("--set", s)]]))
    assert setup.dataset.zero_shot_report["action_classes_from"] == "train+val"
