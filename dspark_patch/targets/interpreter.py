"""Which interpreter in an image owns vLLM, found without a shell and without guessing `python3`.

Candidates come from the image's config, in the order a reader of the image would trust them:
the interpreter its Entrypoint/Cmd names (argv[0] itself when it is a python, else the python
of a script's `#!` line or of the venv `bin/` it lives in), then VIRTUAL_ENV and the PATH of its
Env, then the usual roots (/opt/venv, /opt/conda, /venv, /usr/local, /usr). Which of them exist
is asked of the engine's archive API (a path stat: nothing in the image runs, so an image with
no shell or no `python3` on PATH is fine). Each distinct environment then runs
`inside/locate.py`, and the ones that found the distribution decide (`choose`).

Two paths are one environment when they resolve to the same binary and neither is a venv's
(PEP 405: a `pyvenv.cfg` next to the executable or one folder up makes its own environment,
although its `python` is usually a symlink to the system one).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import BadInput, TargetNotFound
from ..inside.answers import Installed, LocateAnswer
from .imageconfig import GO_DIR, GO_LINK, image_argv, search_dirs

Stat = Callable[[str], "Mapping[str, Any] | None"]    # the engine's path stat, None if absent
ReadHead = Callable[[str], bytes | None]               # a small file's first bytes, None if absent

NAMES = ("python3", "python")
SYSTEM_BINS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True, kw_only=True)
class Interpreter:
    path: str          # as the image would run it (a venv's own bin/python, not its target)
    binary: str        # the file it resolves to
    venv: str | None   # the pyvenv.cfg that gives it its own environment


def is_python_name(path: str) -> bool:
    return bool(_PYTHON_NAME.match(posixpath.basename(path)))


def shebang_python(head: bytes) -> str | None:
    """The python a `#!` line names: an absolute path, or a bare name after `/usr/bin/env`."""
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if words and posixpath.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if not words or not is_python_name(words[0]):
        return None
    return words[0]


def resolve_command(name: str, dirs: Sequence[str], stat: Stat) -> str | None:
    """argv[0] as the runtime would find it: absolute as given, otherwise along PATH."""
    if name.startswith("/"):
        return name if _exists(stat(name)) else None
    if "/" in name:
        return None  # relative to the working directory: nothing an entrypoint should rely on
    for folder in dirs:
        path = f"{folder}/{name}"
        if _exists(stat(path)):
            return path
    return None


def entry_candidates(config: Mapping[str, Any], stat: Stat, read_head: ReadHead) -> list[str]:
    """Interpreters the image's own command names (most trusted first)."""
    argv = image_argv(config)
    if not argv:
        return []
    dirs = search_dirs(config)
    command = resolve_command(argv[0], dirs, stat)
    if command is None:
        return []
    if is_python_name(command):
        return [command]
    found: list[str] = []
    head = read_head(command)
    named = shebang_python(head) if head else None
    if named is not None:
        found.append(named if named.startswith("/") else (resolve_command(named, dirs, stat) or ""))
    folder = posixpath.dirname(command)
    if folder.endswith("/bin") and folder not in SYSTEM_BINS:  # a venv's console script: its python is next to it
        found += [f"{folder}/{name}" for name in NAMES]
    return [f for f in dict.fromkeys(found) if f]


def candidates(config: Mapping[str, Any], stat: Stat, read_head: ReadHead) -> list[str]:
    entry = entry_candidates(config, stat, read_head)
    rest = [f"{d}/{name}" for d in search_dirs(config) for name in NAMES]
    return list(dict.fromkeys(entry + rest))


def existing(paths: Sequence[str], stat: Stat, *, workers: int = 8) -> list[Interpreter]:
    """The paths that exist as files (after links), one per environment, in the given order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        stats = list(pool.map(stat, paths))
        binaries = [_binary(p, s) for p, s in zip(paths, stats, strict=True)]
        present = [(p, b) for p, b in zip(paths, binaries, strict=True) if b is not None]
        # A link's target must itself be a file (a dangling `python` link runs nothing).
        targets = sorted({b for p, b in present if b != p})
        target_ok = dict(zip(targets, (_is_file(s) for s in pool.map(stat, targets)), strict=True))
        present = [(p, b) for p, b in present if b == p or target_ok[b]]
        cfgs = [c for p, _ in present for c in _venv_cfgs(p)]
        cfg_found = dict(zip(cfgs, (_exists(s) for s in pool.map(stat, cfgs)), strict=True))
    found: dict[tuple[str, str | None], Interpreter] = {}
    for path, binary in present:
        venv = next((c for c in _venv_cfgs(path) if cfg_found[c]), None)
        found.setdefault((binary, venv), Interpreter(path=path, binary=binary, venv=venv))
    return list(found.values())


@dataclass(frozen=True, kw_only=True)
class Located:
    """What one interpreter's `inside/locate.py` said."""

    interpreter: Interpreter
    answer: LocateAnswer


def choose(ref: str, distribution: str, results: Sequence[Located]) -> Located:
    """The one environment that holds `distribution`; none or two distinct ones are refused."""
    holding = [(r, r.answer.installed) for r in results if r.answer.installed is not None]
    if not holding:
        looked = "; ".join(f"{r.interpreter.path} {r.answer.python_version} at sys.path "
                           f"{':'.join(r.answer.sys_path)}" for r in results)
        raise TargetNotFound(f"no {distribution} installed in image {ref} (looked with {looked})",
                             hint=f"patch an image that has {distribution} installed, or name its python with --python PATH")
    by_location: dict[str, tuple[Located, Installed]] = {}
    for r, installed in holding:  # same files seen by two interpreters (a venv on the system site): one
        by_location.setdefault(installed.location, (r, installed))
    if len(by_location) > 1:
        both = " and ".join(f"{r.interpreter.path} ({i.name} {i.version} at {loc})"
                            for loc, (r, i) in by_location.items())
        raise BadInput(f"image {ref} has {distribution} in more than one environment: {both}",
                       hint="choose the one to patch with --python PATH")
    return holding[0][0]


def _venv_cfgs(path: str) -> list[str]:
    folder = posixpath.dirname(path)
    return [f"{folder}/pyvenv.cfg", f"{posixpath.dirname(folder)}/pyvenv.cfg"]


def _binary(path: str, stat: Mapping[str, Any] | None) -> str | None:
    if stat is None or int(stat.get("mode", 0)) & GO_DIR:
        return None
    target = str(stat.get("linkTarget") or "")
    if int(stat.get("mode", 0)) & GO_LINK and target:
        # dockerd reports the link fully resolved in the container; other engines may give it as written.
        return posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return path


def _exists(stat: Mapping[str, Any] | None) -> bool:
    return stat is not None


def _is_file(stat: Mapping[str, Any] | None) -> bool:
    return stat is not None and not int(stat.get("mode", 0)) & GO_DIR


def is_small_file(stat: Mapping[str, Any] | None, limit: int = 1 << 16) -> bool:
    """A regular file small enough to be a script worth reading for its `#!` line."""
    return stat is not None and not int(stat.get("mode", 0)) & (GO_DIR | GO_LINK) and int(stat.get("size", 0)) <= limit
