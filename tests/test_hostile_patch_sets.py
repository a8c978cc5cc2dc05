"""Malformed patch sets and diffs, as a pull request could bring them: one line and exit 2, no
traceback, nothing written, on a real vLLM 0.33.0 tree through the CLI."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.cli import run

PY = sys.executable
MATH_SET = Path(__file__).parent / "data" / "patchsets" / "vllm-math-positive-divisor"
MATH = "vllm/utils/math_utils.py"


def fingerprint(tree: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(tree.rglob("*")):
        h.update(str(path.relative_to(tree)).encode())
    h.update((tree / MATH).read_bytes())
    return h.hexdigest()


def apply(tree: Path, patch: Path, tmp_path: Path):
    return run("apply", "--root", str(tree), "--patch", str(patch), "--python", PY, "--no-probe",
               "--report-dir", str(tmp_path / "reports"))


def added(path: str, line: bytes = b"x = 1\n") -> bytes:
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+".encode() + line


@pytest.mark.parametrize(("diff_path", "says"), [
    ("vllm/envs.py/evil.py", "not a usable path in the tree (Not a directory)"),
    ("vllm/" + "a" * 300 + ".py", "File name too long"),
    ("vllm/" + "d/" * 3000 + "x.py", "too long"),
], ids=["through-a-regular-file", "300-character-name", "3000-deep"])
def test_a_diff_path_the_tree_cannot_hold_is_one_line(vllm033_tree: Path, tmp_path: Path, diff_path: str,
                                                    says: str) -> None:
    before = fingerprint(vllm033_tree)
    diff = tmp_path / "evil.diff"
    diff.write_bytes(added(diff_path))
    assert says in apply(vllm033_tree, diff, tmp_path).assert_clean_error(2)
    assert fingerprint(vllm033_tree) == before


def _set(tmp_path: Path) -> Path:
    dest = tmp_path / MATH_SET.name
    shutil.copytree(MATH_SET, dest)
    return dest


def _folder_toml(s: Path) -> None:
    (s / "patch.toml").unlink()
    (s / "patch.toml").mkdir()


def _folder_diff(s: Path) -> None:
    (s / "vllm-0.33.0.patch").unlink()
    (s / "vllm-0.33.0.patch").mkdir()


def _latin1_probe(s: Path) -> None:
    (s / "probe.py").write_bytes((s / "probe.py").read_bytes() + b"# caf\xe9\n")


def _nested_toml(s: Path) -> None:
    (s / "patch.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")


def _toml_to_dev_zero(s: Path) -> None:
    (s / "patch.toml").unlink()
    (s / "patch.toml").symlink_to("/dev/zero")


def _fifo_diff(s: Path) -> None:
    (s / "vllm-0.33.0.patch").unlink()
    os.mkfifo(s / "vllm-0.33.0.patch")


def _huge_diff(s: Path) -> None:
    with open(s / "vllm-0.33.0.patch", "ab") as fh:
        fh.truncate(9 << 20)


@pytest.mark.parametrize(("spoil", "says"), [
    (_folder_toml, "patch.toml"),
    (_folder_diff, "is not a regular file"),
    (_latin1_probe, "probe file probe.py is not UTF-8 text"),
    (_nested_toml, "nested too deeply"),
    (_toml_to_dev_zero, "must be a file inside"),
    (_fifo_diff, "is not a regular file"),
    (_huge_diff, "more than the 8388608"),
], ids=["toml-folder", "diff-folder", "probe-not-utf8", "toml-nested", "toml-dev-zero", "diff-fifo", "diff-9mib"])
def test_a_malformed_patch_set_is_one_line(vllm033_tree: Path, tmp_path: Path, spoil, says: str) -> None:
    before = fingerprint(vllm033_tree)
    patch_set = _set(tmp_path)
    spoil(patch_set)
    assert says in apply(vllm033_tree, patch_set, tmp_path).assert_clean_error(2)
    assert fingerprint(vllm033_tree) == before


def test_the_genuine_patch_set_still_applies_and_verifies(vllm033_tree: Path, tmp_path: Path) -> None:
    res = apply(vllm033_tree, _set(tmp_path), tmp_path)
    assert res.returncode == 0, res.stderr
    res = run("verify", "--root", str(vllm033_tree), "--patch", str(tmp_path / MATH_SET.name), "--python", PY,
              "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 0, res.stderr


# --- a diff changes only what the distribution owns, and what was written is what was planned ---
def _append_diff(path: str, old: bytes, line: bytes) -> bytes:
    """A diff entry for `path` that appends `line` to `old` (its last three lines as context)."""
    lines = old.splitlines(keepends=True)
    start = len(lines) - 2
    context = b"".join(b" " + l for l in lines[-3:])
    return (f"--- a/{path}\n+++ b/{path}\n@@ -{start},3 +{start},4 @@\n".encode() + context + b"+" + line)


@pytest.mark.parametrize(("path", "says"), [
    ("zz-evil.pth", "a .pth file"),
    ("vllm/evil.pth", "a .pth file"),
    ("sitecustomize.py", "a sitecustomize module"),
    ("vllm/usercustomize/__init__.py", "a usercustomize module"),
    ("torch_evil/__init__.py", "outside vllm's own folders"),
    ("vllm-0.33.0.dist-info/evil.py", "outside vllm's own folders"),
    ("evil_top.py", "outside vllm's own folders"),
], ids=["pth-at-top", "pth-inside", "sitecustomize", "usercustomize", "other-folder", "dist-info", "top-module"])
def test_a_diff_beside_the_real_change_that_adds_what_vllm_does_not_own_is_refused(
        vllm033_tree: Path, tmp_path: Path, path: str, says: str) -> None:
    before = fingerprint(vllm033_tree)
    diff = tmp_path / "evil.diff"
    real = _append_diff(MATH, (vllm033_tree / MATH).read_bytes(), b"# a real change\n")
    diff.write_bytes(real + added(path))
    line = apply(vllm033_tree, diff, tmp_path).assert_clean_error(2)
    assert says in line, line
    assert fingerprint(vllm033_tree) == before
    assert not (vllm033_tree / path).exists()


def test_a_link_beside_vllm_does_not_make_a_second_entry_for_one_file(vllm033_tree: Path, tmp_path: Path) -> None:
    (vllm033_tree / "alias").symlink_to("vllm")
    before = fingerprint(vllm033_tree)
    old = (vllm033_tree / MATH).read_bytes()
    diff = tmp_path / "two.diff"
    diff.write_bytes(_append_diff(MATH, old, b"# one\n") + _append_diff("alias/utils/math_utils.py", old, b"# two\n"))
    assert "alias/utils/math_utils.py: outside vllm's own folders" in apply(vllm033_tree, diff, tmp_path).assert_clean_error(2)
    assert fingerprint(vllm033_tree) == before


def test_two_entries_that_are_one_file_inside_vllm_never_read_applied(vllm033_tree: Path, tmp_path: Path) -> None:
    (vllm033_tree / "vllm" / "again").symlink_to(".")
    before = fingerprint(vllm033_tree)
    old = (vllm033_tree / MATH).read_bytes()
    diff = tmp_path / "two.diff"
    diff.write_bytes(_append_diff(MATH, old, b"# one\n") + _append_diff("vllm/again/utils/math_utils.py", old, b"# two\n"))
    res = apply(vllm033_tree, diff, tmp_path)
    assert res.returncode != 0, res.stdout
    line = res.assert_clean_error(res.returncode)
    assert "math_utils.py" in line, line
    assert (vllm033_tree / MATH).read_bytes() == old  # the pre-image, restored (or never written)
    assert fingerprint(vllm033_tree) == before


def test_a_control_character_in_a_path_is_refused_before_it_can_print(vllm033_tree: Path, tmp_path: Path) -> None:
    before = fingerprint(vllm033_tree)
    diff = tmp_path / "newline.diff"
    diff.write_bytes(b'--- /dev/null\n+++ "b/vllm/x\\nverdict: OK.py"\n@@ -0,0 +1 @@\n+x = 1\n')
    res = apply(vllm033_tree, diff, tmp_path)
    assert "contains a control character" in res.assert_clean_error(2)
    assert not any(line.startswith("verdict: OK") for line in (res.stdout + res.stderr).splitlines())
    assert fingerprint(vllm033_tree) == before


def test_allow_unknown_base_on_the_reviewed_pre_image_still_enforces_the_post_image(
        vllm033_tree: Path, tmp_path: Path) -> None:
    patch_set = _set(tmp_path)
    toml = patch_set / "patch.toml"
    text = toml.read_text()
    post = hashlib.sha256((vllm033_tree / MATH).read_bytes()).hexdigest()  # the pre-image's hash: surely wrong
    posts = re.findall(r'post_sha256 = "([0-9a-f]{64})"', text)
    assert len(posts) == 1, text
    toml.write_text(text.replace(posts[0], post))
    before = fingerprint(vllm033_tree)
    res = run("apply", "--root", str(vllm033_tree), "--patch", str(patch_set), "--python", PY, "--no-probe",
              "--allow-unknown-base", "--report-dir", str(tmp_path / "reports"))
    assert "not the reviewed post-image" in res.assert_clean_error(1)
    assert fingerprint(vllm033_tree) == before


def test_a_diff_of_more_files_than_a_patch_set_may_change_is_refused_before_any_write(
        vllm033_tree: Path, tmp_path: Path) -> None:
    before = fingerprint(vllm033_tree)
    diff = tmp_path / "many.diff"
    diff.write_bytes(b"".join(added(f"vllm/flood/m{i}.py") for i in range(201)))
    assert "201 files and 201 hunks; a patch set may change at most 200 files" in \
        apply(vllm033_tree, diff, tmp_path).assert_clean_error(2)
    assert fingerprint(vllm033_tree) == before
    assert not (vllm033_tree / "vllm" / "flood").exists()


def test_a_diff_of_more_hunks_than_a_patch_set_may_hold_is_refused(vllm033_tree: Path, tmp_path: Path) -> None:
    before = fingerprint(vllm033_tree)
    diff = tmp_path / "hunks.diff"
    hunks = b"".join(f"@@ -{n},1 +{n},1 @@\n-x{n}\n+y{n}\n".encode() for n in range(1, 5002))
    diff.write_bytes(f"--- a/{MATH}\n+++ b/{MATH}\n".encode() + hunks)
    assert "1 files and 5001 hunks" in apply(vllm033_tree, diff, tmp_path).assert_clean_error(2)
    assert fingerprint(vllm033_tree) == before


def test_a_hunk_that_still_fits_after_it_was_applied_reads_applied_on_the_reviewed_post_image(
        vllm033_tree: Path, tmp_path: Path) -> None:
    old = (vllm033_tree / MATH).read_bytes()
    lines = old.splitlines(keepends=True)
    assert lines[8] == b"RCP_LN2 = 1.4426950216\n" and lines[11].startswith(b"def cdiv")
    # Lines 7-9 (two comments and RCP_LN2) written twice: once applied, the hunk's source (those
    # lines, then the two blank lines and `def cdiv`) is still there, three lines further down.
    copy = lines[6:9]
    diff = (f"--- a/{MATH}\n+++ b/{MATH}\n@@ -7,6 +7,9 @@\n".encode() + b"".join(b" " + x for x in copy)
            + b"".join(b"+" + x for x in copy) + b"".join(b" " + x for x in lines[9:12]))
    patch_set = _set(tmp_path)
    (patch_set / "vllm-0.33.0.patch").write_bytes(diff)
    post = b"".join(lines[:9] + copy + lines[9:])
    toml = patch_set / "patch.toml"
    text = re.sub(r'post_sha256 = "[0-9a-f]{64}"', f'post_sha256 = "{hashlib.sha256(post).hexdigest()}"', toml.read_text())
    toml.write_text(text)
    first = apply(vllm033_tree, patch_set, tmp_path)
    assert first.returncode == 0, first.stderr
    assert (vllm033_tree / MATH).read_bytes() == post
    again = run("apply", "--root", str(vllm033_tree), "--patch", str(patch_set), "--python", PY, "--no-probe",
                "--report-dir", str(tmp_path / "again"), "--json")
    assert again.returncode == 0, again.stderr
    assert again.json["status"] == "already-applied"
    assert (vllm033_tree / MATH).read_bytes() == post   # not applied a second time


def test_a_new_package_that_does_not_compile_leaves_no_folder_behind(vllm033_tree: Path, tmp_path: Path) -> None:
    # One module compiles and one does not: the compile step has made `__pycache__` (and the
    # first module's bytecode) in the folders the write made, before the failure.
    before = fingerprint(vllm033_tree)
    diff = tmp_path / "package.diff"
    diff.write_bytes(added("vllm/newpkg/sub/__init__.py", b"X = 1\n") + added("vllm/newpkg/sub/bad.py", b"def (:\n"))
    line = apply(vllm033_tree, diff, tmp_path).assert_clean_error(1)
    assert "vllm/newpkg/sub/bad.py does not compile" in line and "restored" in line
    assert fingerprint(vllm033_tree) == before
    assert not (vllm033_tree / "vllm" / "newpkg").exists()
