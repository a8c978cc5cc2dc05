"""`dspark-patch new`: a patch set made from an edited real vLLM 0.33.0 tree (fast tier), diffed
against the published wheel, the DSpark set already applied there recorded as `requires`; the
set it writes applies as a series on a pristine tree and gives exactly the edited files."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.team_sets import DSPARK, team_edit
from tests.support.trees import snapshot
from tests.support.vllm import replace_file, wheel

PY = sys.executable
EXTRA = "vllm/team_extra.py"


def _edit(tree: Path) -> dict[str, bytes]:
    """The team's edit on a tree carrying the DSpark set, and one added module."""
    wanted = {path: after for path, (_before, after) in team_edit(tree).items() if after is not None}
    for path, data in wanted.items():
        replace_file(tree / path, data)
    (tree / EXTRA).write_bytes(b"TEAM = 1\n")
    wanted[EXTRA] = b"TEAM = 1\n"
    return wanted


def _reviewed(folder: Path) -> None:
    """What the person who read the diff does."""
    toml = folder / "patch.toml"
    toml.write_text(toml.read_text().replace('review = "unreviewed"', 'review = "reviewed"'))


def test_new_makes_a_set_that_requires_dspark_and_applies_as_a_series(patched033_tree: Path, vllm033_tree: Path,
                                                                     tmp_path: Path) -> None:
    wanted = _edit(patched033_tree)
    out = tmp_path / "team-patches"
    made = run("new", "team-envs", "--root", str(patched033_tree), "--wheel", str(wheel("0.33.0")), "--out", str(out),
               "--json")
    assert made.returncode == 0, made.stderr
    assert made.json["requires"] == [DSPARK]
    assert made.json["files"] == [{"path": "vllm/envs.py", "action": "modify"},
                                  {"path": "vllm/logger.py", "action": "modify"},
                                  {"path": EXTRA, "action": "add"}]
    toml = tomllib.loads((out / "team-envs" / "patch.toml").read_text())
    assert toml["requires"] == [DSPARK] and toml["variants"][0]["review"] == "unreviewed"

    env = {"DSPARK_PATCH_PATH": str(out)}
    refused = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-envs",
                  "--no-probe", "--report-dir", str(tmp_path / "r0"), env=env)
    assert "unreviewed" in refused.assert_clean_error(2)
    _reviewed(out / "team-envs")
    applied = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-envs",
                  "--no-probe", "--report-dir", str(tmp_path / "r1"), env=env)
    assert applied.returncode == 0, applied.stderr
    for path, data in wanted.items():
        assert (vllm033_tree / path).read_bytes() == data
    model = "vllm/models/deepseek_v4/nvidia/model.py"
    assert (vllm033_tree / model).read_bytes() == (patched033_tree / model).read_bytes()


def test_new_on_a_tree_with_no_change_of_its_own_makes_nothing(patched033_tree: Path, tmp_path: Path) -> None:
    res = run("new", "team-envs", "--root", str(patched033_tree), "--wheel", str(wheel("0.33.0")),
              "--out", str(tmp_path / "out"))
    line = res.assert_clean_error(2)
    assert "no change beyond the published wheel" in line and f"plus {DSPARK}" in line
    assert not (tmp_path / "out" / "team-envs").exists()


def test_a_binary_change_is_refused_and_nothing_written(vllm033_tree: Path, tmp_path: Path) -> None:
    replace_file(vllm033_tree / "vllm/logger.py", b"\x00\x01binary\n")
    res = run("new", "team-bin", "--root", str(vllm033_tree), "--wheel", str(wheel("0.33.0")),
              "--out", str(tmp_path / "out"))
    assert "vllm/logger.py is a binary file" in res.assert_clean_error(2)
    assert not (tmp_path / "out" / "team-bin").exists()


def test_a_wheel_that_is_not_the_published_one_is_refused(vllm033_tree: Path, tmp_path: Path) -> None:
    replace_file(vllm033_tree / "vllm/logger.py", (vllm033_tree / "vllm/logger.py").read_bytes() + b"# ours\n")
    res = run("new", "team-x", "--root", str(vllm033_tree), "--wheel", str(wheel("0.32.0")),
              "--out", str(tmp_path / "out"))
    assert "is not the published vllm-0.33.0" in res.assert_clean_error(2)
    assert not (tmp_path / "out" / "team-x").exists()


@pytest.mark.parametrize(("pid", "says"), [("Bad Id", "is not a patch-set id"), ("taken", "exists already")])
def test_a_bad_or_taken_id_is_refused(vllm033_tree: Path, tmp_path: Path, pid: str, says: str) -> None:
    (tmp_path / "out" / "taken").mkdir(parents=True)
    before = snapshot(tmp_path / "out")
    res = run("new", pid, "--root", str(vllm033_tree), "--wheel", str(wheel("0.33.0")), "--out", str(tmp_path / "out"))
    assert says in res.assert_clean_error(2)
    assert snapshot(tmp_path / "out") == before


def test_a_deleted_file_is_a_deletion_in_the_set(vllm033_tree: Path, tmp_path: Path) -> None:
    gone = "vllm/collect_env.py"
    (vllm033_tree / gone).unlink()
    res = run("new", "team-drop", "--root", str(vllm033_tree), "--wheel", str(wheel("0.33.0")),
              "--out", str(tmp_path / "out"), "--json")
    assert res.returncode == 0, res.stderr
    assert res.json["files"] == [{"path": gone, "action": "delete"}]
    shown = run("show", str(tmp_path / "out" / "team-drop"), "--json")
    assert json.loads(shown.stdout)["variants"][0]["files"][gone]["post_sha256"] is None
