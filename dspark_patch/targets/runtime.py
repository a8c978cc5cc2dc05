"""What an image runs before, or instead of, the vLLM the tool checked: read from its config.

The checks read one site folder; the image runs its entrypoint as its USER, in its WORKDIR, with
its Env. CPython then puts on `sys.path`, before any site folder (3.11, Modules/getpath.py and
Lib/site.py):
- `sys.path[0]`: the folder of the script it runs (an entrypoint whose `#!` names a python: the
  `vllm` console script's own folder), or the working dir for `python -m` / `-c`; none with
  `-I`, `-P` or `PYTHONSAFEPATH`;
- every `PYTHONPATH` entry (a relative one against the working dir), unless `-E` or `-I`;
- the user's site folder, `$PYTHONUSERBASE` or `~/.local` of the USER's HOME (its passwd
  entry, as the engine sets HOME, unless Env sets HOME), `lib/pythonX.Y/site-packages`, unless
  `-s`, `-I` or `PYTHONNOUSERSITE`;
and `site` imports `sitecustomize` at every start, `-I` included: Debian's stdlib has one, a link
to /etc/pythonX.Y/sitecustomize.py, whose known text imports `apport_python_hook` if there is
one. `PYTHONHOME` moves the standard library and the site folders.

`runs_first` names each of these that holds what `import vllm` would take first (a package with
an `__init__.py`, or a module file `vllm.py`, `vllm.pyc`, `vllm*.so`), a `sitecustomize`,
`usercustomize` or `_distutils_hack` there (what setuptools' `.pth` imports at start), a Debian sitecustomize that is not Debian's, an `apport_python_hook`
the Debian one would import, `PYTHONHOME`, and the code hooks of the Env and of
/etc/ld.so.preload (`LD_PRELOAD`, a module category in `PYTHONWARNINGS`: targets/start_hooks.py). Only what the config says and a path stat shows:
nothing runs. Both status routes, `verify` and `apply` ask it (one rule), docs/status.md.
`judge_started` judges what the image's own python, started as the image starts it, answered.
How the image starts its python (its argv, flags, sys.path[0]) is targets/image_start.py's.
Stdlib-free of the engine: `stat` and `read_small` are the caller's.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..inside.answers import MalformedAnswer, decode_started
from ..references import DISTUTILS_HACK, KNOWN_DISTUTILS_HACK, KNOWN_PTH
from . import interpreter as interp
from .image_start import ReadSmall, start_of
from .imageconfig import is_dir, is_link
from .start_hooks import code_hooks

# A folder's `.pth` files by name (None: too large or not a regular file, so not read); None when
# there is no such folder.
PthFiles = Callable[[str], "Mapping[str, bytes | None] | None"]
# Debian's /etc/python3.X/sitecustomize.py (bookworm's 3.11, trixie's 3.13): the apport hook.
_DEBIAN_SITECUSTOMIZE_TEXT = (b"# install the apport exception handler if available\ntry:\n    import apport_python_hook\n"
                              b"except ImportError:\n    pass\nelse:\n    apport_python_hook.install()\n")
# Modules that run at start: `site` imports the first two; setuptools' distutils-precedence.pth
# (in any site folder) imports the first `_distutils_hack` on sys.path.
_STARTUP = ("sitecustomize", "usercustomize", "_distutils_hack")


def _known_sitecustomize(data: bytes) -> bool:
    return data == _DEBIAN_SITECUSTOMIZE_TEXT


def _exists(found: Mapping[str, Any] | None) -> bool:
    return found is not None


def _home(config: Mapping[str, Any], env: Mapping[str, str], read_small: ReadSmall) -> str:
    if env.get("HOME"):
        return env["HOME"]
    user = str(config.get("User") or "root").split(":", 1)[0]
    for line in (read_small("/etc/passwd") or b"").decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and (fields[0] == user or fields[2] == user):
            return fields[5] or "/"
    return "/root" if user in ("", "root", "0") else "/"


def _holders(folder: str, top: str, python: str | None, stat: interp.Stat) -> list[str]:
    """What `import top` would take from `folder`, and start-up modules there."""
    found = []
    for package in (top, *_STARTUP):
        # A path stat through a file is an error on some engines: ask for the folder first.
        inside = stat(f"{folder}/{package}")
        if (inside is None or is_dir(inside)) and _exists(stat(f"{folder}/{package}/__init__.py")):
            found.append(f"{folder}/{package}/__init__.py")
    tag = (python or "").replace(".", "")
    names = [f"{top}.py", f"{top}.pyc", f"{top}.so", f"{top}.abi3.so"]
    if tag:
        names += [f"{top}.cpython-{tag}-{arch}-linux-gnu.so" for arch in ("x86_64", "aarch64")]
    names += [f"{name}.{ext}" for name in _STARTUP for ext in ("py", "pyc")]
    found += [f"{folder}/{name}" for name in names if _exists(stat(f"{folder}/{name}"))]
    return found


def runs_first(config: Mapping[str, Any], stat: interp.Stat, read_small: ReadSmall, *, site: str,
               python: str | None, distribution: str, sites: Sequence[str] = (),
               pth_files: PthFiles | None = None) -> list[str]:
    """One line for each thing the image, started as configured, runs before or instead of the
    distribution read at `site` (module doc). Empty: nothing the config and the files show.

    With `pth_files` (status, which reads layers or path stats and runs nothing), also the `.pth`
    files of the user site and of the interpreter's other site folders `sites` (in sys.path
    order, `site` among them): `site` runs their `import` lines at every start, and their other
    lines add folders to sys.path (`pth_first`). verify and apply ask the image's own python
    instead (`judge_started`)."""
    top = distribution.replace("-", "_").lower()
    workdir = str(config.get("WorkingDir") or "/")
    start = start_of(config, stat, read_small, what=f"{site}/{top}")
    lines = list(start.unmodelled)
    lines += code_hooks(start, stat, read_small, what=f"{site}/{top}")
    flags, first, env = start.flags, start.first, start.env
    isolated, ignore_env, safe = start.isolated, start.ignores_env, start.safe_path
    if not ignore_env and env.get("PYTHONHOME"):
        lines.append(f"Env PYTHONHOME={env['PYTHONHOME']}: the interpreter's library and site folders come from there, "
                     "not from what was read")
    places: list[tuple[str, str]] = []
    if first is not None and not safe:
        places.append(first)
    if not ignore_env:
        for entry in (e for e in env.get("PYTHONPATH", "").split(":") if e):
            folder = entry if entry.startswith("/") else posixpath.join(workdir, entry)
            places.append((folder, f"PYTHONPATH entry {entry!r} in the image's Env"))
    user_site: str | None = None
    if not (isolated or "s" in flags or (not ignore_env and env.get("PYTHONNOUSERSITE"))) and python:
        base = env.get("PYTHONUSERBASE") if not ignore_env and env.get("PYTHONUSERBASE") else \
            posixpath.join(_home(config, env, read_small), ".local")
        user_site = posixpath.normpath(f"{base}/lib/python{python}/site-packages")
        places.append((user_site, "the image user's site folder"))
    real_site = posixpath.normpath(site)
    for folder, why in places:
        folder = posixpath.normpath(folder)
        if folder == real_site:
            continue
        # (A layer view keeps only the folders it was asked for: no stat is no proof of absence.)
        kind = stat(folder)
        if kind is not None and not is_dir(kind) and not is_link(kind):
            lines.append(f"{folder}: a file on sys.path ({why}), imported from as an archive and not read")
            continue
        for path in _holders(folder, top, python, stat):
            lines.append(f"{path}: imported before {site}/{top} ({why})")
    if pth_files is not None:
        lines += pth_first(sites, user_site, pth_files, stat, read_small, site=real_site, top=top, python=python)
    if python:
        stdlib = f"/usr/lib/python{python}/sitecustomize.py"
        found = stat(stdlib)
        if found is not None:
            # Debian's is a link into /etc; a path stat gives its target resolved.
            data = read_small(str(found.get("linkTarget") or stdlib) if is_link(found) else stdlib)
            if data is None or not _known_sitecustomize(data):
                lines.append(f"{stdlib}: a sitecustomize that is not Debian's runs at every start (-I too)")
            else:
                for folder in (real_site, "/usr/lib/python3/dist-packages", f"/usr/lib/python{python}",
                               f"/usr/local/lib/python{python}/dist-packages"):
                    for name in ("apport_python_hook.py", "apport_python_hook.pyc", "apport_python_hook"):
                        if _exists(stat(f"{folder}/{name}")):
                            lines.append(f"{folder}/{name}: Debian's sitecustomize imports it at every start (-I too)")
    return list(dict.fromkeys(lines))


def pth_first(sites: Sequence[str], user_site: str | None, pth_files: PthFiles, stat: interp.Stat,
              read_small: ReadSmall, *, site: str, top: str, python: str | None) -> list[str]:
    """What the `.pth` files of the user site and of the other site folders do at start, as
    `site.addpackage` reads them: a line that starts with `import ` runs (named, unless the file
    is one known by content); any other line adds a folder to sys.path, named when it holds
    what `import top` would take and the `.pth`'s folder comes before `site` (the user site
    always does). A `.pth` too large to read is named too: it is not read as clean. Beside a
    known setuptools `.pth`, the `_distutils_hack` it imports must be one setuptools released."""
    order = [posixpath.normpath(s) for s in sites]
    folders: list[tuple[str, str, bool]] = []
    if user_site is not None:
        folders.append((user_site, "the image user's site folder", True))
    before = order.index(site) if site in order else len(order)
    folders += [(folder, "a site folder of the image's python", i < before)
                for i, folder in enumerate(order) if folder != site and folder != user_site]
    lines: list[str] = []
    for folder, why, first in dict.fromkeys(folders):
        for name, data in sorted((pth_files(folder) or {}).items()):
            path = f"{folder}/{name}"
            if data is None:
                lines.append(f"{path}: a .pth file too large to read ({why}); what it runs at every start is not verified")
                continue
            if hashlib.sha256(data).hexdigest() in KNOWN_PTH.get(name, ()):
                hack = f"{folder}/{DISTUTILS_HACK}"
                if stat(hack) is not None:
                    text = read_small(hack)
                    if text is None or hashlib.sha256(text).hexdigest() not in KNOWN_DISTUTILS_HACK:
                        lines.append(f"{hack}: not setuptools' own, and {path} imports it at every start ({why})")
                continue
            for raw in data.decode("utf-8", "replace").splitlines():
                if raw.startswith("#") or not raw.strip():
                    continue
                if raw.startswith(("import ", "import\t")):
                    flat = raw.replace("\t", " ")
                    shown = flat if len(flat) <= 60 else flat[:57] + "..."
                    lines.append(f"{path}: runs `{shown}` at every start of the image's python ({why})")
                    break
                added = posixpath.normpath(posixpath.join(folder, raw.rstrip()))
                if first and added != site:
                    lines += [f"{found}: imported before {site}/{top} (a folder that {path} puts on sys.path)"
                              for found in _holders(added, top, python, stat)]
    return lines


# The finders CPython installs, and the one setuptools' distutils-precedence.pth adds at start.
# Files of the standard library's folder that `sys.stdlib_module_names` does not list (Debian's).
_STDLIB_UNLISTED = frozenset({"_distutils_system_mod"})
_KNOWN_FINDERS = frozenset({"_frozen_importlib.BuiltinImporter", "_frozen_importlib.FrozenImporter",
                            "_frozen_importlib_external.PathFinder", "_distutils_hack.DistutilsMetaFinder"})


def judge_started(answer: Any, *, site: str, top: str) -> list[str]:
    """Findings from the image's python as it starts (inside/started.py): where `import top`
    resolves if not at `site/top`, each module with a file that ran at start and is neither the
    standard library's nor setuptools' `_distutils_hack` from a site folder, each import finder
    added at start. Code that ran first may have lied: this only ever adds findings."""
    try:
        started = decode_started(answer)
    except MalformedAnswer:
        return [f"the image's python as the image starts it gave no readable answer; what it runs before "
                f"{site}/{top} is not verified"]
    lines: list[str] = []
    wanted = posixpath.normpath(f"{site}/{top}/__init__.py")
    spec = started.spec
    if started.error is not None or spec is None:
        why = started.error or "nothing"
        lines.append(f"`import {top}` in the image as it starts finds {why} (sys.path {list(started.path[:6])}), "
                     f"not {site}/{top}")
    elif spec.origin is None:
        lines.append(f"`import {top}` in the image as it starts takes a namespace package ({list(spec.locations[:3])}), "
                     f"not {site}/{top}")
    elif posixpath.normpath(spec.origin) != wanted:
        lines.append(f"{spec.origin}: what `import {top}` takes in the image as it starts, not {site}/{top}")
    stdlib = [posixpath.normpath(p) for p in started.stdlib]
    sites = [posixpath.normpath(p) for p in [*started.sites, site]]
    names = set(started.stdlib_names)
    for name, file in started.modules:
        if file is None or name == "__main__":
            continue  # built in, frozen, or a namespace a .pth made: no file of code ran
        path = posixpath.normpath(file)
        root = name.split(".", 1)[0]
        if _under(path, stdlib) and (root in names or not names or root in _STDLIB_UNLISTED
                                     or root.startswith("_sysconfigdata_")
                                     or (name == "sitecustomize" and path in {f"{p}/sitecustomize.py" for p in stdlib})):
            continue  # (a Debian sitecustomize's text is checked by `runs_first`)
        if root == "_distutils_hack" and _under(path, sites):
            continue  # setuptools' own, imported by its .pth (its source is checked by `runs_first`)
        lines.append(f"{path}: module {name} runs at every start of the image's python, before {site}/{top}")
    for finder in started.finders:
        if finder not in _KNOWN_FINDERS:
            lines.append(f"{finder}: an import finder installed at start of the image's python, asked before "
                         f"{site}/{top}")
    return list(dict.fromkeys(lines))


def _under(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


