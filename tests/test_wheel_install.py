"""A new user's install: the wheel built from a clean copy of this checkout, installed (not
editable) into a fresh virtualenv outside it, lists, shows, applies and verifies the shipped patch
set on a real vLLM 0.33.0 tree. Nothing here can see the checkout's patches/ folder.

The sdist is built first and the wheel is built FROM it, the way pip builds from an sdist on an
index; a wheel built straight from the source must hold the same files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from dspark_patch import __version__
from dspark_patch.patchset import load_dir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable  # the project's .venv python: it has torch, which the DSpark probe needs
SHIPPED = load_dir(REPO / "patches" / "dspark-skip-mtp-buffer")
PATCH_FILES = sorted(p.name for p in SHIPPED.source.iterdir() if p.is_file())
QUIET = ["--quiet", "--disable-pip-version-check"]


def sh(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def clean_copy(dest: Path) -> Path:
    """What a fresh clone of this working tree holds: tracked and new files, nothing git ignores."""
    listed = sh("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO).stdout
    for rel in filter(None, listed.split("\0")):
        if (REPO / rel).is_file():  # a file deleted but not yet committed is not in a clone
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    return dest


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = clean_copy(tmp / "src")
    backend = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    sdist = tmp / "sdist" / sh(PY, "-c", backend, "build_sdist", tmp / "sdist", cwd=src).stdout.split()[-1]
    direct = tmp / "direct" / sh(PY, "-c", backend, "build_wheel", tmp / "direct", cwd=src).stdout.split()[-1]
    # pip unpacks the sdist and builds the wheel in its own isolated build environment.
    sh(PY, "-m", "pip", "wheel", *QUIET, "--no-deps", "-w", tmp / "from-sdist", sdist)
    (from_sdist,) = (tmp / "from-sdist").glob("dspark_patch-*.whl")
    return {"sdist": sdist, "wheel": from_sdist, "direct": direct, "tmp": tmp}


@pytest.fixture(scope="module")
def installed(builds) -> Path:
    """A fresh virtualenv (no system site-packages) with the wheel installed, not editable."""
    venv = builds["tmp"] / "venv"
    sh(PY, "-m", "venv", "--without-pip", venv)
    sh(PY, "-m", "pip", "--python", venv / "bin" / "python", "install", *QUIET, builds["wheel"])
    return venv


def members(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if ".dist-info/" not in n}


def test_the_sdist_and_the_wheel_built_from_it_carry_every_patch_set_file(builds):
    with tarfile.open(builds["sdist"]) as tf:
        in_sdist = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {f"patches/dspark-skip-mtp-buffer/{name}" for name in PATCH_FILES} <= in_sdist

    wheel = members(builds["wheel"])
    with zipfile.ZipFile(builds["wheel"]) as zf:
        for name in PATCH_FILES:  # byte for byte what the checkout holds: the probe included
            shipped = zf.read(f"dspark_patch/patches/dspark-skip-mtp-buffer/{name}")
            assert shipped == (SHIPPED.source / name).read_bytes(), name
    # Every module of the package is in it (a sub-package missing from setup.py would not be),
    # and nothing else: no tests, no test-only patch sets.
    modules = {str(p.relative_to(REPO)) for p in (REPO / "dspark_patch").rglob("*.py")}
    assert modules == {n for n in wheel if n.endswith(".py") and not n.startswith("dspark_patch/patches/")}
    assert not any(n.startswith("tests/") for n in wheel)
    assert members(builds["direct"]) == wheel


def test_the_installed_wheel_lists_applies_and_verifies_on_a_real_tree(installed: Path, vllm033_tree: Path,
                                                                          tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in {"DSPARK_PATCH_PATCHES", "PYTHONPATH", "VIRTUAL_ENV"}}
    outside = tmp_path / "elsewhere"  # the user's working folder: not the checkout
    outside.mkdir()
    tool = installed / "bin" / "dspark-patch"

    def cli(*args: str | Path) -> subprocess.CompletedProcess:
        return sh(tool, *args, cwd=outside, env=env)

    where = sh(installed / "bin" / "python", "-c", "import dspark_patch; print(dspark_patch.__file__)",
               cwd=outside, env=env).stdout.strip()
    assert where.startswith(str(installed)), where  # the installed copy, not the checkout
    no_torch = subprocess.run([installed / "bin" / "python", "-c", "import torch"], capture_output=True, env=env)
    assert no_torch.returncode != 0  # the tool needs no torch; the target's python runs the probe

    assert cli("--version").stdout.strip() == f"dspark-patch {__version__}"
    assert "dspark-skip-mtp-buffer" in cli("list").stdout.split()
    shown = cli("show", "dspark-skip-mtp-buffer").stdout
    variant = SHIPPED.variant_for("0.33.0")
    assert all(h.post_sha256 in shown for h in variant.files.values()) and "probe: probe.py" in shown

    cli("apply", "--root", vllm033_tree, "--python", PY, "--report-dir", outside / "apply")
    for rel, hashes in variant.files.items():
        assert hashlib.sha256((vllm033_tree / rel).read_bytes()).hexdigest() == hashes.post_sha256, rel
    verified = cli("verify", "--root", vllm033_tree, "--python", PY, "--report-dir", outside / "verify")
    assert "verified" in verified.stdout + verified.stderr
    audit = (outside / "verify" / "audit.json").read_text()
    assert '"status": "verified"' in audit and '"census: no unguarded reader of _mtp_hidden_buffer on the DSpark V2 path"' in audit  # the shipped probe ran
