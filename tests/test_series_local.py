"""`apply` and `verify` of a series on a real vLLM 0.33.0 tree, from the command line (fast tier):
the DSpark set and a team's own set that requires it, given as two `--patch` or a series file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.team_sets import DSPARK, sha, team_edit, write_set
from tests.support.trees import snapshot
from tests.support.vllm import replace_file, tree_copy

PY = sys.executable


@pytest.fixture
def team(tmp_path: Path, patched033_tree: Path) -> dict[str, str]:
    """DSPARK_PATCH_PATH with `team-envs`: made on a tree carrying the DSpark set, it requires it."""
    folder = tmp_path / "team-patches"
    write_set(folder, "team-envs", team_edit(patched033_tree), requires=(DSPARK,))
    return {"DSPARK_PATCH_PATH": str(folder)}


def _expected(patched033_tree: Path) -> dict[str, bytes | None]:
    return {path: after for path, (_before, after) in team_edit(patched033_tree).items()}


def test_a_series_applies_in_order_and_verifies_as_a_series(vllm033_tree: Path, patched033_tree: Path,
                                                            team: dict[str, str], tmp_path: Path) -> None:
    applied = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-envs",
                  "--report-dir", str(tmp_path / "apply"), "--json", env=team)
    assert applied.returncode == 0, applied.stderr
    report = applied.json
    assert report["status"] == "applied"
    assert [m["id"] for m in report["series"]] == [DSPARK, "team-envs"]
    assert report["patch"]["id"] == f"{DSPARK}+team-envs"
    assert report["probe"]["ran"] and report["probe"]["ok"]  # the DSpark set's probe, on the series' result
    for path, after in _expected(patched033_tree).items():
        assert (vllm033_tree / path).read_bytes() == after
    model = "vllm/models/deepseek_v4/nvidia/model.py"
    assert sha((vllm033_tree / model).read_bytes()) == sha((patched033_tree / model).read_bytes())

    verified = run("verify", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-envs",
                   "--no-probe", "--report-dir", str(tmp_path / "verify"), env=team)
    assert verified.returncode == 0, verified.stderr

    alone = run("verify", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--no-probe",
                "--report-dir", str(tmp_path / "alone"), env=team)
    line = alone.assert_clean_error(1)
    assert "vllm/envs.py is changed" in line and "vllm/logger.py" in line

    again = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-envs",
                "--report-dir", str(tmp_path / "again"), "--json", env=team)
    assert again.returncode == 0, again.stderr
    assert again.json["status"] == "already-applied"


def test_a_series_file_names_the_same_series(vllm033_tree: Path, team: dict[str, str], tmp_path: Path) -> None:
    listed = tmp_path / "series"
    listed.write_text(f"# in order\n{DSPARK}\nteam-envs  # ours\n")
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--series", str(listed), "--no-probe",
              "--report-dir", str(tmp_path / "r"), "--json", env=team)
    assert res.returncode == 0, res.stderr
    assert [m["id"] for m in res.json["series"]] == [DSPARK, "team-envs"]
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert audit["series"] == res.json["series"]


def test_a_tree_that_carries_the_first_set_gets_the_rest(patched033_tree: Path, team: dict[str, str],
                                                         tmp_path: Path) -> None:
    expected = _expected(patched033_tree)
    res = run("apply", "--root", str(patched033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-envs",
              "--no-probe", "--report-dir", str(tmp_path / "r"), "--json", env=team)
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "applied"
    assert any(f"already carries {DSPARK}" in n for n in res.json["notes"])
    assert {f["path"] for f in res.json["files"]} == set(expected)
    for path, after in expected.items():
        assert (patched033_tree / path).read_bytes() == after


@pytest.mark.parametrize(("order", "says"), [
    (["team-envs"], "team-envs requires dspark-skip-mtp-buffer, which is not in the series"),
    (["team-envs", DSPARK], "team-envs requires dspark-skip-mtp-buffer, which comes after it in the series"),
    ([DSPARK, DSPARK], "the series lists dspark-skip-mtp-buffer twice"),
])
def test_a_series_out_of_order_is_one_line_and_writes_nothing(vllm033_tree: Path, team: dict[str, str],
                                                              tmp_path: Path, order: list[str], says: str) -> None:
    before = snapshot(vllm033_tree)
    args = [a for name in order for a in ("--patch", name)]
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, *args, "--report-dir", str(tmp_path / "r"), env=team)
    assert says in res.assert_clean_error(2)
    assert snapshot(vllm033_tree) == before


def test_a_set_reviewed_on_another_tree_stops_the_series_before_any_write(vllm033_tree: Path, tmp_path: Path) -> None:
    """A set that requires DSpark but whose envs.py pre-image is the pristine file: exit 1 naming
    the set, and the tree as it was."""
    folder = tmp_path / "team-patches"
    envs = (vllm033_tree / "vllm/envs.py").read_bytes()
    write_set(folder, "team-stale", {"vllm/envs.py": (envs, envs + b"# team\n")}, requires=(DSPARK,))
    before = snapshot(vllm033_tree)
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-stale",
              "--report-dir", str(tmp_path / "r"), env={"DSPARK_PATCH_PATH": str(folder)})
    line = res.assert_clean_error(1)
    assert "team-stale" in line
    assert snapshot(vllm033_tree) == before


def test_status_tells_each_set_of_a_series_apart_and_finds_nothing_unexplained(
        vllm033_tree: Path, patched033_tree: Path, team: dict[str, str], tmp_path: Path) -> None:
    """The pristine tree: both absent (the team set's envs.py pre-image is the DSpark set's result,
    so the pristine file is absent for it too); the DSpark tree: applied, absent; the series:
    both applied (DSpark's envs.py is under the team set's change). Exit 0, nothing unexplained."""
    series = vllm033_tree
    patched_copy = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", DSPARK, "--patch", "team-envs",
                       "--no-probe", "--report-dir", str(tmp_path / "a"), env=team)
    assert patched_copy.returncode == 0, patched_copy.stderr
    pristine = tree_copy("0.33.0", tmp_path / "pristine" / "site-packages")
    res = run("status", "--root", str(pristine), "--root", str(patched033_tree), "--root", str(series), "--json",
              env=team)
    assert res.returncode == 0, res.stderr
    rows = {Path(r["ref"]): r for r in res.json["images"]}
    states = {where: dict(rows[where]["patch_sets"]) for where in (pristine, patched033_tree, series)}
    assert states[pristine] == {DSPARK: "absent", "team-envs": "absent"}
    assert states[patched033_tree] == {DSPARK: "applied", "team-envs": "absent"}
    assert states[series] == {DSPARK: "applied", "team-envs": "applied"}
    assert all(not r["unexplained"] and not r["missing"] and not r["added"] for r in rows.values())


def test_status_calls_a_series_with_one_file_put_back_partial(patched033_tree: Path, vllm033_tree: Path,
                                                             team: dict[str, str], tmp_path: Path) -> None:
    """envs.py carries the whole series but model.py is the pristine file: DSpark is partial."""
    model = "vllm/models/deepseek_v4/nvidia/model.py"
    replace_file(patched033_tree / "vllm/envs.py", _expected(patched033_tree)["vllm/envs.py"] or b"")
    replace_file(patched033_tree / model, (vllm033_tree / model).read_bytes())
    res = run("status", "--root", str(patched033_tree), "--json", env=team)
    assert res.returncode == 1, res.stderr
    assert dict(res.json["images"][0]["patch_sets"])[DSPARK] == "partial"
