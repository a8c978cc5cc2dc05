"""A backport recognised once upstream ships it (fast tier), on a real change between vLLM 0.32.0
and 0.33.0 (vllm/assets/audio.py gained the "azacinto_foscolo" asset): the backport made with
`new` on 0.32.0 applies there, and on 0.33.0 it is `upstream` in status, apply and verify."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.team_sets import DSPARK
from tests.support.trees import snapshot
from tests.support.vllm import replace_file, tree_copy, wheel

PY = sys.executable
AUDIO = "vllm/assets/audio.py"
OLD = b'AudioAssetName = Literal["winning_call", "mary_had_lamb"]\n'
NEW = b'AudioAssetName = Literal["winning_call", "mary_had_lamb", "azacinto_foscolo"]\n'


@pytest.fixture(scope="module")
def backport(tmp_path_factory) -> dict[str, str]:
    """`new` on a 0.32.0 tree edited the way 0.33.0 has it; reviewed by the person who made it."""
    where = tmp_path_factory.mktemp("backport")
    tree = tree_copy("0.32.0", where / "tree" / "site-packages")
    source = (tree / AUDIO).read_bytes()
    assert source.count(OLD) == 1 and NEW in tree_copy("0.33.0", where / "new" / "site-packages").joinpath(AUDIO).read_bytes()
    replace_file(tree / AUDIO, source.replace(OLD, NEW))
    made = run("new", "backport-audio-asset", "--root", str(tree), "--wheel", str(wheel("0.32.0")),
               "--out", str(where / "patches"))
    assert made.returncode == 0, made.stderr
    toml = where / "patches" / "backport-audio-asset" / "patch.toml"
    toml.write_text(toml.read_text().replace('review = "unreviewed"', 'review = "reviewed"'))
    return {"DSPARK_PATCH_PATH": str(where / "patches")}


def test_the_backport_applies_to_the_release_it_was_made_for(backport: dict[str, str], tmp_path: Path) -> None:
    tree = tree_copy("0.32.0", tmp_path / "site-packages")
    res = run("apply", "--root", str(tree), "--python", PY, "--patch", "backport-audio-asset", "--json",
              "--report-dir", str(tmp_path / "r"), env=backport)
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "applied"
    assert NEW in (tree / AUDIO).read_bytes()


def test_status_calls_it_upstream_on_the_release_that_ships_it(backport: dict[str, str], vllm033_tree: Path,
                                                              tmp_path: Path) -> None:
    old = tree_copy("0.32.0", tmp_path / "old" / "site-packages")
    res = run("status", "--root", str(vllm033_tree), "--root", str(old), "--json", env=backport)
    assert res.returncode == 0, res.stderr
    states = {Path(r["ref"]): dict(r["patch_sets"]) for r in res.json["images"]}
    assert states[vllm033_tree]["backport-audio-asset"] == "upstream"
    assert states[old]["backport-audio-asset"] == "absent"


def test_apply_and_verify_skip_it_with_a_note_naming_the_release(backport: dict[str, str], vllm033_tree: Path,
                                                                tmp_path: Path) -> None:
    before = snapshot(vllm033_tree)
    alone = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", "backport-audio-asset", "--json",
                "--report-dir", str(tmp_path / "alone"), env=backport)
    assert alone.returncode == 0, alone.stderr
    assert alone.json["status"] == "already-applied"
    assert any("backport-audio-asset is upstream in vllm 0.33.0" in n for n in alone.json["notes"])
    assert snapshot(vllm033_tree) == before

    checked = run("verify", "--root", str(vllm033_tree), "--python", PY, "--patch", "backport-audio-asset", "--json",
                  "--report-dir", str(tmp_path / "verify"), env=backport)
    assert checked.returncode == 0, checked.stderr
    assert any("is upstream in vllm 0.33.0" in n for n in checked.json["notes"])

    series = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch",
                 "backport-audio-asset", "--no-probe", "--json", "--report-dir", str(tmp_path / "series"), env=backport)
    assert series.returncode == 0, series.stderr
    assert series.json["status"] == "applied" and series.json["patch"]["id"] == DSPARK
    assert any("backport-audio-asset is upstream in vllm 0.33.0" in n for n in series.json["notes"])


def test_a_set_whose_change_is_not_there_is_still_no_variant_for_the_release(backport: dict[str, str],
                                                                           vllm033_tree: Path, tmp_path: Path) -> None:
    """Take the change back out of 0.33.0: the backport neither fits as a variant nor is upstream."""
    replace_file(vllm033_tree / AUDIO, (vllm033_tree / AUDIO).read_bytes().replace(NEW, OLD))
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", "backport-audio-asset",
              "--report-dir", str(tmp_path / "r"), env=backport)
    assert "has no variant for vllm 0.33.0" in res.assert_clean_error(2)
