"""The tool's own files in a checkout a contributor controls: reports, port's outputs and work folder.

A link committed where the tool writes (the report folder, the default `./dspark-patch-reports`,
a patch-set folder, `./dspark-patch-port`) must never take a write or a removal outside: the run
is refused with one line and exit 2 before it does anything, and what the link names is as it
was. Report files are made under the user's umask. Real 0.33.0 and 0.32.0 trees, through the CLI.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from dspark_patch.patchset import load_dir
from tests.support import vllm
from tests.support.cli import run

PY = sys.executable
ENVS = "vllm/envs.py"
MATH_SET = Path(__file__).parent / "data" / "patchsets" / "vllm-math-positive-divisor"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outside(tmp_path: Path) -> Path:
    """A folder outside the checkout holding a file a stale-attestation cleanup would delete."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "attestation.intoto.json").write_text("someone else's\n")
    (folder / "audit.json").write_text("someone else's\n")
    return folder


def untouched(folder: Path) -> bool:
    return sorted(p.name for p in folder.iterdir()) == ["attestation.intoto.json", "audit.json"] and all(
        p.read_text() == "someone else's\n" for p in folder.iterdir())


def test_a_report_dir_that_is_a_link_is_refused_before_the_tree_is_patched(vllm033_tree: Path, tmp_path: Path) -> None:
    before = sha(vllm033_tree / ENVS)
    target = outside(tmp_path)
    link = tmp_path / "reports"
    link.symlink_to(target)
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--no-probe", "--report-dir", str(link))
    assert "reports: is a symbolic link" in res.assert_clean_error(2)
    assert untouched(target)
    assert sha(vllm033_tree / ENVS) == before


def test_the_default_report_folder_committed_as_a_link_is_refused(vllm033_tree: Path, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    target = outside(tmp_path)
    (checkout / "dspark-patch-reports").symlink_to(target)
    res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--no-probe", cwd=checkout)
    assert "dspark-patch-reports: is a symbolic link" in res.assert_clean_error(2)
    assert untouched(target)
    # A folder under a link inside the working directory is refused the same way.
    (checkout / "ci").symlink_to(target)
    res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--no-probe", "--report-dir", "ci/reports",
              cwd=checkout)
    assert "ci: is a symbolic link" in res.assert_clean_error(2)
    assert untouched(target)


def test_a_report_file_planted_as_a_link_is_refused_never_written_through(vllm033_tree: Path, tmp_path: Path) -> None:
    target = outside(tmp_path)
    reports = tmp_path / "reports"
    reports.mkdir()
    for name in ("audit.md", "attestation.intoto.json"):
        (reports / name).symlink_to(target / "audit.json")
        res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--no-probe", "--report-dir", str(reports))
        assert f"{name}: is a symbolic link" in res.assert_clean_error(2)
        (reports / name).unlink()
        assert untouched(target) and list(reports.iterdir()) == []


def test_reports_are_made_under_the_users_umask(vllm033_tree: Path, tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--no-probe",
                  "--report-dir", str(tmp_path / "private" / "reports"), "--junit", str(tmp_path / "j" / "junit.xml"))
    finally:
        os.umask(old)
    assert res.returncode == 1, res.stderr  # a pristine tree does not carry the patch
    made = [tmp_path / "private", tmp_path / "private" / "reports", tmp_path / "j",
            *(tmp_path / "private" / "reports").iterdir(), tmp_path / "j" / "junit.xml"]
    assert {p.name for p in made} >= {"audit.json", "audit.md", "junit.xml"}
    assert {oct(stat.S_IMODE(p.stat().st_mode) & 0o077) for p in made} == {"0o0"}, "world or group readable"


# --- port ----------------------------------------------------------------------------------------

@pytest.fixture
def math_set(tmp_path: Path) -> Path:
    dest = tmp_path / "checkout" / "patches" / MATH_SET.name
    shutil.copytree(MATH_SET, dest)
    return dest


def port(math_set: Path, *extra: str, cwd: Path | None = None):
    return run("port", "--patch", str(math_set), "--to", "0.32.0", "--wheel", str(vllm.wheel("0.32.0")),
               "--python", PY, *extra, cwd=cwd)


def test_port_refuses_a_link_in_the_patch_set_named_like_what_it_writes(math_set: Path, tmp_path: Path) -> None:
    target = outside(tmp_path)
    for name in ("vllm-0.32.0.review.md", "census-vllm-0.32.0.json", "vllm-0.32.0.patch", ".patch.toml.before-port"):
        (math_set / name).symlink_to(target / "audit.json")
        res = port(math_set, "--work", str(tmp_path / f"work-{name}"))
        assert f"{name}: is a symbolic link" in res.assert_clean_error(2)
        (math_set / name).unlink()
        assert untouched(target)
        assert [v.name for v in load_dir(math_set).variants] == ["vllm-0.33.0"]
        assert not (tmp_path / f"work-{name}").exists()


def test_port_never_follows_a_committed_work_folder_link(math_set: Path, tmp_path: Path) -> None:
    checkout = math_set.parents[1]
    target = outside(tmp_path)
    (target / "vllm-math-positive-divisor-0.32.0").mkdir()
    (target / "vllm-math-positive-divisor-0.32.0" / "tree").mkdir()
    (target / "vllm-math-positive-divisor-0.32.0" / "tree" / "precious").write_text("keep\n")
    (checkout / "dspark-patch-port").symlink_to(target)
    res = port(math_set, cwd=checkout)
    assert "dspark-patch-port: is a symbolic link" in res.assert_clean_error(2)
    assert (target / "vllm-math-positive-divisor-0.32.0" / "tree" / "precious").read_text() == "keep\n"
    assert [v.name for v in load_dir(math_set).variants] == ["vllm-0.33.0"]


def test_port_removes_only_a_scratch_tree_it_made(math_set: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "tree").mkdir(parents=True)
    (work / "tree" / "notes.txt").write_text("a person's\n")
    res = port(math_set, "--work", str(work))
    assert "a folder port did not make is in the way" in res.assert_clean_error(2)
    assert (work / "tree" / "notes.txt").read_text() == "a person's\n"
    # A work folder holding a link where the scratch tree goes: refused, the link's target kept.
    target = outside(tmp_path)
    shutil.rmtree(work / "tree")
    (work / "tree").symlink_to(target)
    res = port(math_set, "--work", str(work))
    assert "tree: is a symbolic link" in res.assert_clean_error(2)
    assert untouched(target)


def test_a_genuine_port_still_writes_its_variant_and_review_under_the_umask(math_set: Path, tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        res = port(math_set, "--work", str(tmp_path / "work"))
    finally:
        os.umask(old)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert load_dir(math_set).variant_for("0.32.0").review == "unreviewed"
    for made in (math_set / "vllm-0.32.0.patch", math_set / "vllm-0.32.0.review.md", tmp_path / "work" / "REVIEW.md"):
        assert stat.S_IMODE(made.stat().st_mode) & 0o077 == 0, made
    assert not [p for p in math_set.iterdir() if p.name.endswith(".dspark-tmp") or p.name.startswith(".patch.toml")]
