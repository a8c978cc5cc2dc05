"""Which site folders an image's interpreters import from, derived without running them.

Both routes of `status` use this (a merged layer view and a never-started container answer the
same `stat`/`read_head`/`read_small` questions), so both find the same folder (docs/status.md: decoy site folder).
The interpreters are the ones `targets/interpreter.py` finds for `apply` (entrypoint's
first, then VIRTUAL_ENV, PATH, the usual roots); for each, `sys.path` is derived as CPython's
`getpath` and `site` build it:
- the version is the binary's own name (`python3.11`, after links), else the one
  `lib/python3.X/os.py` landmark beside it (several: unknown, it imports nothing we can name);
- a venv (`pyvenv.cfg`, PEP 405) has `lib/python3.X/site-packages` of its own, then, with
  `include-system-site-packages = true`, those of its `home` interpreter;
- prefix `/usr` on Debian (`/etc/debian_version`, or `lib/python3/dist-packages`) gets Debian's list
  (`/usr/local/lib/python3.X/dist-packages`, `/usr/lib/python3/dist-packages`,
  `/usr/lib/python3.X/dist-packages`), another `/usr` the lib64/lib pairs of Fedora's, any other
  prefix `PREFIX/lib/python3.X/site-packages`;
- `PYTHONPATH` from the image's Env comes first.
What this cannot see: a user site (`~/.local`, per user at run time), `.pth` lines that add
folders, `sys.path` changes made by code at start-up, `-I`/`-E` in an entrypoint. docs/status.md.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import imageconfig
from .. import interpreter as interp

ReadSmall = Callable[[str], "bytes | None"]
_VERSIONED = re.compile(r"^python(3\.\d+)$")
MINORS = tuple(range(6, 20))


@dataclass(frozen=True, kw_only=True)
class SitePath:
    interpreter: str                 # as the image runs it
    python: str | None               # "3.11", None when it cannot be told
    sites: tuple[str, ...]           # absolute, in sys.path order


def interpreter_sites(config: Mapping[str, Any], stat: interp.Stat, read_head: interp.ReadHead,
                      read_small: ReadSmall) -> list[SitePath]:
    found = interp.existing(interp.candidates(config, stat, read_head), stat)
    extra = [p for p in imageconfig.image_env(config).get("PYTHONPATH", "").split(":") if p.startswith("/")]
    out = []
    for python in found:
        version, sites = _derive(python, stat, read_small, depth=0)
        out.append(SitePath(interpreter=python.path, python=version,
                            sites=tuple(dict.fromkeys([*extra, *sites]))))
    return out


def _version(binary: str, stat: interp.Stat) -> str | None:
    named = _VERSIONED.match(posixpath.basename(binary))
    if named:
        return named.group(1)
    prefix = posixpath.dirname(posixpath.dirname(binary))
    landmarks = [f"3.{m}" for m in MINORS if stat(f"{prefix}/lib/python3.{m}/os.py") is not None]
    return landmarks[0] if len(landmarks) == 1 else None


def _derive(python: interp.Interpreter, stat: interp.Stat, read_small: ReadSmall, *, depth: int) -> tuple[str | None, list[str]]:
    if python.venv is not None:
        cfg = _pyvenv(read_small(python.venv))
        root = posixpath.dirname(python.venv)
        version = minor_version(cfg.get("version") or cfg.get("version_info") or "") or _version(python.binary, stat)
        sites = [f"{root}/lib/python{version}/site-packages"] if version else []
        home = cfg.get("home", "").rstrip("/")
        if cfg.get("include-system-site-packages", "").lower() == "true" and home.startswith("/") and depth < 3:
            base = f"{home}/python{version}" if version and stat(f"{home}/python{version}") else f"{home}/python3"
            for candidate in interp.existing([base], stat):
                _, system = _derive(interp.Interpreter(path=candidate.path, binary=candidate.binary, venv=None),
                                    stat, read_small, depth=depth + 1)
                sites += system
        return version, sites
    version = _version(python.binary, stat)
    if version is None:
        return None, []
    prefix = posixpath.dirname(posixpath.dirname(python.binary))
    if prefix == "/usr" and (_is_dir(stat("/usr/lib/python3/dist-packages")) or stat("/etc/debian_version") is not None):
        return version, [f"/usr/local/lib/python{version}/dist-packages", "/usr/lib/python3/dist-packages",
                         f"/usr/lib/python{version}/dist-packages"]
    if prefix == "/usr":
        return version, [f"/usr/local/lib64/python{version}/site-packages", f"/usr/local/lib/python{version}/site-packages",
                         f"/usr/lib64/python{version}/site-packages", f"/usr/lib/python{version}/site-packages"]
    return version, [f"{prefix}/lib/python{version}/site-packages"]


def importing(paths: Sequence[SitePath], holds: Callable[[str], bool]) -> list[tuple[SitePath, str]]:
    """For each interpreter that imports the package: the first site folder that holds it."""
    found = []
    for path in paths:
        site = next((s for s in path.sites if holds(s)), None)
        if site is not None:
            found.append((path, site))
    return found


def _pyvenv(data: bytes | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        key, eq, value = line.partition("=")
        if eq:
            out[key.strip().lower()] = value.strip()
    return out


def minor_version(version: str) -> str | None:
    """"3.11" of "3.11.2" (or of "3.11"), None for anything else."""
    found = re.match(r"^(3\.\d+)", version)
    return found.group(1) if found else None


def _is_dir(found: Mapping[str, Any] | None) -> bool:
    return imageconfig.is_dir(found)


def choose_site(ref: str, distribution: str, paths: Sequence[SitePath], holds: Callable[[str], bool],
                everywhere: Callable[[], Sequence[str]]) -> tuple[SitePath, str]:
    """The one site folder the image's interpreters import `distribution` from.

    None imports it: a copy elsewhere is named (imported by no interpreter), never read. Two
    interpreters importing different copies: which one runs cannot be told without running it."""
    from ...errors import TargetNotFound, UnreadableLayout

    found = importing(paths, holds)
    if not found:
        seen = [s for s in everywhere() if not any(s in p.sites for p in paths)]
        looked = "; ".join(f"{p.interpreter} ({p.python or 'version unknown'})" for p in paths) or "none found"
        if seen:
            raise UnreadableLayout(f"{distribution} in image {ref} at {', '.join(seen)} is imported by no interpreter "
                                   f"of the image (interpreters: {looked})",
                                   hint="status reads the copy the image's python imports; this image's python imports none")
        raise TargetNotFound(f"no {distribution} in image {ref} (interpreters: {looked})",
                             hint=f"list images that have {distribution} installed")
    sites = dict.fromkeys(site for _, site in found)
    if len(sites) > 1:
        both = " and ".join(f"{p.interpreter} imports the one at {site}" for p, site in found)
        raise UnreadableLayout(f"image {ref} has {distribution} in more than one environment: {both}",
                               hint="which one runs depends on the command; read them with --root after copying out")
    return found[0]
