"""Real vLLM 0.33.0 trees for probe tests: patched through the CLI, then mutated textually.

A mutant is a hard-link copy of one correctly patched tree with one file replaced
(`vllm.replace_file`), so the cache and the base tree are never written through.
"""

from __future__ import annotations

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
