"""Real vLLM 0.33.0 trees for probe tests: patched through the CLI, then mutated textually.

A mutant is a hard-link copy of one correctly patched tree with one file replaced
(`vllm.replace_file`), so the cache and the base tree are never written through. The patched
tree is made once per session (the `patched033` fixture in tests/conftest.py, a `SharedTree`);
tests whose subject is not `apply` itself take copies of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import cli, vllm

PYTHON = sys.executable  # the venv's interpreter: it has torch, as an image's would


def patched_tree(where: Path) -> Path:
    """A real 0.33.0 site-packages with the patch set applied by `dspark-patch apply`."""
    tree = vllm.tree_copy("0.33.0", where)
    done = cli.run("apply", "--root", str(tree), "--python", PYTHON, "--no-probe",
                   "--report-dir", str(where.parent / f"{where.name}-apply-report"))
    assert done.returncode == 0, done.stdout + done.stderr
    return tree


def copy_tree(base: Path, where: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(base), str(where)], check=True)
    return where


def stat_snapshot(tree: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under tree: (inode, mode, size, mtime_ns). A file replaced, added, removed
    or written into (through any hard link to it) changes it; nothing is read."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in (*dirnames, *filenames):
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), tree)] = (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns)
    return out


class SharedTree:
    """One tree made once (a session's patched 0.33.0 tree) that tests take hard-link copies of.

    Every copy first checks that the tree is as it was made: a test that wrote into a file of
    its copy in place (instead of replacing it) would have changed every other copy's file too,
    and that fails here, naming the file, rather than as some other test's odd verdict."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self._made = stat_snapshot(tree)

    def check(self) -> None:
        now = stat_snapshot(self.tree)
        if now != self._made:
            changed = sorted(k for k in self._made.keys() | now.keys() if self._made.get(k) != now.get(k))
            raise AssertionError(f"the shared tree {self.tree} was changed by a test (through a hard link?): {changed[:5]}")

    def copy(self, where: Path) -> Path:
        self.check()
        return copy_tree(self.tree, where)


def edit(tree: Path, rel: str, old: str, new: str) -> None:
    """Replace `old` (which must occur exactly once) in one file of the tree."""
    path = tree / rel
    source = path.read_text()
    assert source.count(old) == 1, f"{old!r} does not occur exactly once in {rel}"
    vllm.replace_file(path, source.replace(old, new).encode())


def probe(tree: Path, report_dir: Path) -> tuple[int, dict]:
    """`dspark-patch probe --root T --python PY --json` (no hash checks): exit code and report."""
    done = cli.run("probe", "--root", str(tree), "--python", PYTHON, "--json",
                   "--report-dir", str(report_dir))
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.json
