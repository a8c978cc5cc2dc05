"""Transactional writes: all files or none, modes kept, never through a link out of the tree."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from dspark_patch.errors import EnvironmentProblem, HashMismatch, UnsafePatch
from dspark_patch.patching import parse_diff, plan_patch
from dspark_patch.targets import fs
from dspark_patch.targets.fs import read_inside, resolve_inside, restore_plan, write_plan
from tests.support.trees import BASE, edit, make_tree, snapshot, udiff

NEW = edit(BASE, {20: b"changed\n"})


def plan_for(root: Path, diff: bytes):
    return plan_patch(parse_diff(diff), lambda rel: read_inside(root, rel))


def leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.endswith(".dspark-tmp")]


def test_failure_on_the_third_file_rolls_back_the_first_two(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {"pkg/a.py": BASE, "pkg/b.py": BASE, "pkg/c.py": BASE},
        modes={"pkg/a.py": 0o755},
    )
    added = b"--- /dev/null\n+++ b/pkg/new/dir/added.py\n@@ -0,0 +1 @@\n+x = 1\n"
    diff = added + udiff(BASE, NEW, "pkg/a.py") + udiff(BASE, NEW, "pkg/b.py") + udiff(BASE, NEW, "pkg/c.py")
    plan = plan_for(tmp_path, diff)
    before = snapshot(tmp_path)
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # the added file, a.py, b.py went in; c.py's replace fails (disk full)
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    with mock.patch.object(fs.os, "replace", failing_replace):
        with pytest.raises(EnvironmentProblem) as caught:
            write_plan(tmp_path, plan)
    assert "could not write pkg/c.py: No space left on device" in caught.value.message
    assert "restored" in caught.value.message
    after = snapshot(tmp_path)
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
    assert not (tmp_path / "pkg/new").exists()  # the directories made for the added file are gone
    assert (tmp_path / "pkg/a.py").stat().st_mode & 0o777 == 0o755
    assert leftovers(tmp_path) == []


def test_write_keeps_modes_and_leaves_no_temp_files(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/a.py": BASE, "pkg/b.py": BASE}, modes={"pkg/a.py": 0o750, "pkg/b.py": 0o604})
    write_plan(tmp_path, plan_for(tmp_path, udiff(BASE, NEW, "pkg/a.py") + udiff(BASE, NEW, "pkg/b.py")))
    assert (tmp_path / "pkg/a.py").read_bytes() == NEW
    assert (tmp_path / "pkg/a.py").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "pkg/b.py").stat().st_mode & 0o777 == 0o604
    assert leftovers(tmp_path) == []


def test_write_replaces_the_name_so_hard_links_keep_the_old_content(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/a.py": BASE})
    os.link(tmp_path / "pkg/a.py", tmp_path / "cache-copy.py")
    write_plan(tmp_path, plan_for(tmp_path, udiff(BASE, NEW, "pkg/a.py")))
    assert (tmp_path / "pkg/a.py").read_bytes() == NEW
    assert (tmp_path / "cache-copy.py").read_bytes() == BASE


def test_symlinked_directory_pointing_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_tree(outside, {"a.py": BASE})
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "pkg")
    with pytest.raises(UnsafePatch, match="outside the tree"):
        plan_for(root, udiff(BASE, NEW, "pkg/a.py"))
    # Even with a plan made elsewhere, writing refuses before touching anything.
    other = tmp_path / "other"
    make_tree(other, {"pkg/a.py": BASE})
    plan = plan_for(other, udiff(BASE, NEW, "pkg/a.py"))
    with pytest.raises(UnsafePatch, match="outside the tree"):
        write_plan(root, plan)
    assert (outside / "a.py").read_bytes() == BASE
    assert leftovers(outside) == []


def test_relative_symlink_escaping_with_dotdot_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_tree(root, {"pkg/a.py": BASE})
    os.symlink("../../", root / "pkg" / "up")
    with pytest.raises(UnsafePatch, match="outside the tree"):
        resolve_inside(root, "pkg/up/x.py")


def test_symlink_inside_the_tree_is_followed_for_directories(tmp_path: Path) -> None:
    make_tree(tmp_path, {"real/a.py": BASE})
    os.symlink("real", tmp_path / "pkg")
    assert resolve_inside(tmp_path, "pkg/a.py") == (tmp_path / "real/a.py").resolve()
    write_plan(tmp_path, plan_for(tmp_path, udiff(BASE, NEW, "pkg/a.py")))
    assert (tmp_path / "real/a.py").read_bytes() == NEW
    assert (tmp_path / "pkg").is_symlink()


def test_writing_to_a_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/real.py": BASE})
    os.symlink("real.py", tmp_path / "pkg/a.py")
    plan = plan_for(tmp_path, udiff(BASE, NEW, "pkg/a.py"))
    with pytest.raises(UnsafePatch, match="is a symbolic link"):
        write_plan(tmp_path, plan)
    assert (tmp_path / "pkg/real.py").read_bytes() == BASE
    assert (tmp_path / "pkg/a.py").is_symlink()


def test_file_changed_after_planning_is_refused_before_any_write(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/a.py": BASE, "pkg/b.py": BASE})
    plan = plan_for(tmp_path, udiff(BASE, NEW, "pkg/a.py") + udiff(BASE, NEW, "pkg/b.py"))
    (tmp_path / "pkg/b.py").write_bytes(BASE + b"# edited meanwhile\n")
    with pytest.raises(HashMismatch, match="pkg/b.py: changed since the plan was made"):
        write_plan(tmp_path, plan)
    assert (tmp_path / "pkg/a.py").read_bytes() == BASE


def test_restore_plan_puts_every_pre_image_back(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/a.py": BASE, "pkg/gone.py": b"a = 1\n"}, modes={"pkg/a.py": 0o700})
    diff = (
        udiff(BASE, NEW, "pkg/a.py")
        + b"--- a/pkg/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a = 1\n"
        + b"--- /dev/null\n+++ b/pkg/added.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    before = snapshot(tmp_path)
    plan = plan_for(tmp_path, diff)
    write_plan(tmp_path, plan)
    assert not (tmp_path / "pkg/gone.py").exists() and (tmp_path / "pkg/added.py").exists()
    restore_plan(tmp_path, plan)
    assert {k: v[0] for k, v in snapshot(tmp_path).items()} == {k: v[0] for k, v in before.items()}
    assert (tmp_path / "pkg/a.py").stat().st_mode & 0o777 == 0o700


def test_already_applied_plan_writes_nothing(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/a.py": NEW})
    plan = plan_for(tmp_path, udiff(BASE, NEW, "pkg/a.py"))
    assert plan.status == "already-applied"
    with mock.patch.object(fs.os, "replace", side_effect=AssertionError("nothing may be written")):
        write_plan(tmp_path, plan)
    assert (tmp_path / "pkg/a.py").read_bytes() == NEW
