"""`dspark-patch new`: a patch set made from an edited real vLLM 0.33.0 tree (fast tier), diffed
against the published wheel, the DSpark set already applied there recorded as `requires`; the
set it writes applies as a series on a pristine tree and gives exactly the edited files, also
where the edit sits inside DSpark's hunks; a known set without the tree's release is left out
with a note; a file name that is not UTF-8 is one line; a failed write leaves no file."""

from __future__ import annotations

import errno
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from dspark_patch.errors import EnvironmentProblem
from dspark_patch.patching.diff import Hunk, parse_diff
from dspark_patch.patching.place import split_lines
from dspark_patch.pipeline.new_found import hunk_in
from dspark_patch.pipeline.new_set import NewRequest, make
from tests.support.cli import Result, run
from tests.support.team_sets import DSPARK, team_edit, write_set
from tests.support.trees import snapshot, udiff
from tests.support.vllm import replace_file, tree_copy, wheel

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


def _new_on_dspark(name: str, tree: Path, out: Path) -> Result:
    """`new NAME` on `tree` (the 0.33.0 wheel with DSpark and an edit on top): a set that requires DSpark."""
    made = run("new", name, "--root", str(tree), "--wheel", str(wheel("0.33.0")), "--out", str(out), "--json")
    assert made.returncode == 0, made.stderr
    assert made.json["requires"] == [DSPARK]
    return made


def test_new_makes_a_set_that_requires_dspark_and_applies_as_a_series(patched033_tree: Path, vllm033_tree: Path,
                                                                     tmp_path: Path) -> None:
    wanted = _edit(patched033_tree)
    out = tmp_path / "team-patches"
    made = _new_on_dspark("team-envs", patched033_tree, out)
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


def _beside_dspark(tree: Path) -> dict[str, bytes]:
    """A team's flag added where a person adds one: right under DSpark's own flag in vllm/envs.py
    (both in the typed declarations and in the dict), so no DSpark hunk keeps all its context;
    and a line in vllm/logger.py."""
    envs = (tree / "vllm/envs.py").read_bytes()
    declared = b"    VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER: bool = False\n"
    entry = b'"VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER", "0", ["0", "1"])()\n        == "1"\n    ),\n'
    assert envs.count(declared) == 1 and envs.count(entry) == 1
    envs = envs.replace(declared, declared + b"    VLLM_TEAM_FLAG: bool = False\n")
    envs = envs.replace(entry, entry + b'    "VLLM_TEAM_FLAG": lambda: bool(int(os.getenv("VLLM_TEAM_FLAG", "0"))),\n')
    logger = (tree / "vllm/logger.py").read_bytes() + b"\n# team: a note in the logger\n"
    wanted = {"vllm/envs.py": envs, "vllm/logger.py": logger}
    for path, data in wanted.items():
        replace_file(tree / path, data)
    return wanted


def test_an_edit_inside_dsparks_hunks_is_a_set_on_top_of_dspark(patched033_tree: Path, vllm033_tree: Path,
                                                                tmp_path: Path) -> None:
    wanted = _beside_dspark(patched033_tree)
    out = tmp_path / "team-patches"
    made = _new_on_dspark("team-flag", patched033_tree, out)
    assert made.json["files"] == [{"path": "vllm/envs.py", "action": "modify"},
                                  {"path": "vllm/logger.py", "action": "modify"}]
    toml = tomllib.loads((out / "team-flag" / "patch.toml").read_text())
    dspark = tomllib.loads((Path(__file__).parents[1] / "patches" / DSPARK / "patch.toml").read_text())
    dspark_envs = next(v for v in dspark["variants"] if v["name"] == "vllm-0.33.0")["files"]["vllm/envs.py"]
    assert toml["variants"][0]["files"]["vllm/envs.py"]["pre_sha256"] == dspark_envs["post_sha256"]

    _reviewed(out / "team-flag")
    env = {"DSPARK_PATCH_PATH": str(out)}
    series = ("--patch", DSPARK, "--patch", "team-flag")
    applied = run("apply", "--root", str(vllm033_tree), "--python", PY, *series, "--no-probe",
                  "--report-dir", str(tmp_path / "apply"), "--json", env=env)
    assert applied.returncode == 0, applied.stderr
    assert applied.json["status"] == "applied" and [m["id"] for m in applied.json["series"]] == [DSPARK, "team-flag"]
    for path, data in wanted.items():
        assert (vllm033_tree / path).read_bytes() == data
    model = "vllm/models/deepseek_v4/nvidia/model.py"
    assert (vllm033_tree / model).read_bytes() == (patched033_tree / model).read_bytes()
    verified = run("verify", "--root", str(vllm033_tree), "--python", PY, *series, "--no-probe",
                   "--report-dir", str(tmp_path / "verify"), env=env)
    assert verified.returncode == 0, verified.stderr


def test_a_file_name_that_is_not_utf8_is_one_line_and_nothing_written(vllm033_tree: Path, tmp_path: Path) -> None:
    (vllm033_tree / "vllm").joinpath(os.fsdecode(b"caf\xe9.py")).write_bytes(b"X = 1\n")
    res = run("new", "team-name", "--root", str(vllm033_tree), "--wheel", str(wheel("0.33.0")),
              "--out", str(tmp_path / "out"))
    line = res.assert_clean_error(2)
    assert "vllm/caf\\xe9.py" in line and "UTF-8" in line
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*"))  # no .patch, no patch.toml


def test_a_known_set_with_no_variant_for_the_release_is_left_out_with_a_note(tmp_path: Path) -> None:
    tree = tree_copy("0.32.0", tmp_path / "site-packages")
    theirs = tmp_path / "team-patches"
    logger = (tree / "vllm/logger.py").read_bytes()
    write_set(theirs, "team-033-only", {"vllm/logger.py": (logger, logger + b"# 0.33.0 only\n")}, release="0.33.0")
    replace_file(tree / "vllm/envs.py", (tree / "vllm/envs.py").read_bytes() + b"\n# team: ours on 0.32.0\n")
    made = run("new", "team-032", "--root", str(tree), "--wheel", str(wheel("0.32.0")), "--out", str(tmp_path / "out"),
               "--json", env={"DSPARK_PATCH_PATH": str(theirs)})
    assert made.returncode == 0, made.stderr
    assert made.json["files"] == [{"path": "vllm/envs.py", "action": "modify"}] and made.json["requires"] == []
    assert any("team-033-only" in n and "no variant for vllm 0.32.0" in n for n in made.json["notes"])
    assert (tmp_path / "out" / "team-032" / "patch.toml").is_file()
    shown = run("new", "team-032b", "--root", str(tree), "--wheel", str(wheel("0.32.0")), "--out", str(tmp_path / "out"),
                env={"DSPARK_PATCH_PATH": str(theirs)})
    assert shown.returncode == 0, shown.stderr
    assert "team-033-only" in shown.stdout and "left out" in shown.stdout


def test_a_write_that_fails_half_way_leaves_neither_file(vllm033_tree: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The diff is renamed into place, then the disk refuses patch.toml: the folder goes again."""
    replace_file(vllm033_tree / "vllm/logger.py", (vllm033_tree / "vllm/logger.py").read_bytes() + b"# ours\n")
    real = os.replace

    def full_disk(src: str, dst: str, **kw: object) -> None:
        if dst == "patch.toml":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(EnvironmentProblem) as raised:
        make(NewRequest(id="team-full", root=str(vllm033_tree), wheel=str(wheel("0.33.0")), out=str(tmp_path / "out")))
    assert raised.value.exit_code == 3 and "No space left on device" in str(raised.value)
    assert list((tmp_path / "out").iterdir()) == []


def _one_hunk(before: bytes, after: bytes) -> Hunk:
    return parse_diff(udiff(before, after, "vllm/x.py"), strip=1).files[0].hunks[0]


def test_a_hunk_is_found_with_its_context_whole_on_one_side() -> None:
    base = b"".join(b"line %d\n" % i for i in range(20))
    ours = base.replace(b"line 10\n", b"line 10\nDSPARK\n")
    hunk = _one_hunk(base, ours)
    lines = split_lines(ours)
    assert hunk_in(lines, hunk)
    after = split_lines(ours.replace(b"DSPARK\n", b"DSPARK\nTEAM\n"))      # an edit right under it
    assert hunk_in(after, hunk)
    before = split_lines(ours.replace(b"DSPARK\n", b"TEAM\nDSPARK\n"))     # right above it
    assert hunk_in(before, hunk)
    both = split_lines(ours.replace(b"line 9\n", b"line 9!\n").replace(b"line 12\n", b"line 12!\n"))
    assert not hunk_in(both, hunk)                                      # its context gone on both sides
    assert not hunk_in(split_lines(base), hunk)                         # not applied
    assert not hunk_in(split_lines(ours.replace(b"DSPARK\n", b"DSPARK, edited\n")), hunk)
    removal = _one_hunk(base, base.replace(b"line 10\n", b""))
    assert hunk_in(split_lines(base.replace(b"line 10\n", b"")), removal)
    assert not hunk_in(split_lines(base.replace(b"line 10\n", b"TEAM\n")), removal)
