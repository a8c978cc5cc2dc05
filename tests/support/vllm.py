"""Real vLLM releases for tests: wheels from the package index, cached, never committed.

The cache lives in $DSPARK_PATCH_CACHE (default ~/.cache/dspark-patch). A wheel is fetched once
with `pip download --no-deps`; an installed tree (a real `pip install --no-deps --target`, with
its RECORD and console-script entries) is made once per release and then hard-link copied for
each test. Because trees share inodes with the cache, tests change files only by replacing them
(`replace_file`), never by writing into them in place; the tool itself writes through
`os.replace`, so it never touches a shared inode.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


def _load_script(path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("dspark_patch_vllm_wheel", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# The wheels are found the way the image scripts find them: scripts/vllm-wheel, loaded here.
_wheels = _load_script(Path(__file__).resolve().parents[2] / "scripts" / "vllm-wheel")
CACHE: Path = _wheels.CACHE
_locked = _wheels.locked
wheel = _wheels.wheel
platform_wheel = _wheels.platform_wheel

# The releases the tests read: 0.33.0 (the shipped variant), 0.32.0 (a hand port develops the
# probe against it) and 0.31.0 (refused: no drafter helper). Any of them works with every
# function below; each wheel is downloaded once.
RELEASES = ("0.33.0", "0.32.0", "0.31.0")


def _made_once(dest: Path, lock: str, make: Callable[[Path], None]) -> Path:
    """`dest`, made by `make(dest)` once (under `lock`, across processes); a folder whose
    `.complete` marker is missing is a half-made one: removed and made again."""
    with _locked(lock):
        if not (dest / ".complete").exists():
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            make(dest)
            (dest / ".complete").touch()
    return dest


def python_sources(version: str) -> Path:
    """Only the wheel's .py files, unpacked once (for diffing releases)."""
    def unpack(dest: Path) -> None:
        with zipfile.ZipFile(wheel(version)) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".py"):
                    zf.extract(info, dest)

    return _made_once(CACHE / "sources" / version, f"sources-{version}", unpack)


def installed_tree(version: str) -> Path:
    """A real `pip install --no-deps --target` of the wheel, made once (read-only by convention).

    With DSPARK_PATCH_TEST_TREES (scripts/test sets it for the fast tier where there is a RAM
    file system with room), a copy of it there, made once: tests hard-link copy the tree into
    their temporary folders, which then live on that same file system."""
    elsewhere = os.environ.get("DSPARK_PATCH_TEST_TREES")
    if not elsewhere:
        return _disk_tree(version)

    def copy(dest: Path) -> None:
        subprocess.run(["cp", "-a", str(_disk_tree(version)), str(dest / "site-packages")], check=True)

    return _made_once(Path(elsewhere) / f"vllm-{version}", f"tree-copy-{version}", copy) / "site-packages"


def _disk_tree(version: str) -> Path:
    def install(dest: Path) -> None:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
             "--disable-pip-version-check", "--target", str(dest / "site-packages"),
             str(wheel(version))],
            check=True,
        )

    return _made_once(CACHE / "trees" / f"vllm-{version}", f"tree-{version}", install) / "site-packages"


def uv_tree(version: str) -> Path:
    """A real `uv pip install --no-deps --target` of the wheel, made once: the installer of the
    official vLLM images (INSTALLER `uv`, uv_cache.json, a `bin/vllm` RECORD row, no bytecode)."""
    def install(dest: Path) -> None:
        uv = Path(sys.executable).with_name("uv")
        subprocess.run([str(uv), "pip", "install", "--quiet", "--no-deps", "--offline", "--no-cache",
                        "--python", sys.executable, "--target", str(dest / "site-packages"), str(wheel(version))],
                       check=True)

    return _made_once(CACHE / "trees" / f"vllm-{version}-uv", f"tree-uv-{version}", install) / "site-packages"


@contextmanager
def beside_the_cache() -> Iterator[Path]:
    """A scratch folder on the cache's own file system, removed afterwards: hard-link copies of
    the cached installs go there (pytest's temporary folders may be in RAM, another file system,
    where a hard link cannot reach; the fast tier copies only the pip trees it uses most there)."""
    scratch = CACHE / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    where = Path(tempfile.mkdtemp(dir=scratch))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def uv_tree_copy(version: str, where: Path) -> Path:
    """A fresh site-packages for one test: hard links into the cached uv install."""
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(uv_tree(version)), str(where)], check=True)
    return where


# How real users install a wheel, each made once per release by the real installer (the shape
# census, docs/installers.md): the folder the installer made (its root) and the site folder in it.
PY_DIR = f"python{sys.version_info[0]}.{sys.version_info[1]}"
INSTALLS: dict[str, tuple[list[str], str]] = {
    # name: (the install command, {root} for its folder, {wheel}; the site folder under the root)
    "pip --target": (["{py}", "-m", "pip", "install", "--target", "{root}", "{wheel}"], "."),
    "uv --target": (["{uv}", "pip", "install", "--python", "{py}", "--target", "{root}", "{wheel}"], "."),
    "pip --prefix": (["{py}", "-m", "pip", "install", "--prefix", "{root}", "{wheel}"], f"lib/{PY_DIR}/site-packages"),
    "uv --prefix": (["{uv}", "pip", "install", "--python", "{py}", "--prefix", "{root}", "{wheel}"],
                    f"lib/{PY_DIR}/site-packages"),
    "pip --user": (["env", "PYTHONUSERBASE={root}", "{base}", "-m", "pip", "install", "--user", "{wheel}"],
                   f"lib/{PY_DIR}/site-packages"),
    "pip in a venv": (["sh", "-c", '"$0" -m venv "$1" && "$1/bin/python" -m pip install -q --no-deps "$2"',
                       "{base}", "{root}", "{wheel}"], f"lib/{PY_DIR}/site-packages"),
    "uv in a venv": (["sh", "-c", '"$0" venv -q --python "$1" "$2" && VIRTUAL_ENV="$2" "$0" pip install -q --no-deps "$3"',
                      "{uv}", "{base}", "{root}", "{wheel}"], f"lib/{PY_DIR}/site-packages"),
}


def installed_by(how: str, version: str) -> Path:
    """The site folder of a real install of the wheel by `how` (INSTALLS), made once."""
    return _installed_root(how, version) / INSTALLS[how][1]


def _installed_root(how: str, version: str) -> Path:
    """The folder the installer made for `installed_by` (its --target, --prefix, user base, venv)."""
    command, _ = INSTALLS[how]
    slug = how.replace(" ", "").replace("-", "")

    def install(dest: Path) -> None:
        # pip and uv as a user runs them: the venv's, the checkout's pinned uv, and the base
        # interpreter (its own pip) where a venv's pip refuses (--user) or a fresh venv is made.
        values = {"py": sys.executable, "uv": str(Path(sys.executable).with_name("uv")), "base": sys._base_executable,
                  "root": str(dest / "root"), "wheel": str(wheel(version))}
        argv = [part.format(**values) for part in command]
        if argv[0] != "sh":
            argv += ["--no-deps", "--quiet"]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONUSERBASE")}
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})

    return _made_once(CACHE / "trees" / f"vllm-{version}-{slug}", f"tree-{slug}-{version}", install) / "root"


def installed_copy(how: str, version: str, where: Path) -> Path:
    """A fresh hard-link copy of `installed_by(how, version)`'s whole root; its site folder."""
    root = _installed_root(how, version)
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(root), str(where / "root")], check=True)
    return where / "root" / INSTALLS[how][1]


def tree_copy(version: str, where: Path) -> Path:
    """A fresh site-packages for one test: hard links into the cached install."""
    src = installed_tree(version)
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(src), str(where)], check=True)
    return where


def replace_file(path: Path, data: bytes) -> None:
    """Change a file in a hard-linked test tree without touching the cache's inode."""
    tmp = path.with_name(path.name + ".tmp-test")
    tmp.write_bytes(data)
    shutil.copymode(path, tmp)
    os.replace(tmp, path)
