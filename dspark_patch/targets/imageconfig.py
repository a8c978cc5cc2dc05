"""What an image's config says, and what the engine's path stats mean: one home for both.

The config (Entrypoint, Cmd, Env) is read the way the engine runs a container of the image:
argv is Entrypoint + Cmd (Cmd alone without an Entrypoint), Env is `KEY=VALUE` items (the first
`=` splits), PATH is the engine's default when the image sets none. The engine's stat of a
path (`get_archive`'s header, and `layers/merge.py`'s stand-in for it) carries Go's
`os.FileMode` bits: the directory and symlink bits sit above the permission bits.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Any

GO_DIR, GO_LINK = 1 << 31, 1 << 27       # Go's os.ModeDir and os.ModeSymlink
# Go's os.ModeType: a path-stat mode with none of these bits is a regular file (Dir, Symlink,
# NamedPipe, Socket, Device, CharDevice, Irregular).
GO_TYPE = (1 << 31) | (1 << 27) | (1 << 25) | (1 << 24) | (1 << 26) | (1 << 21) | (1 << 19)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the engine's default
# Where interpreters usually are when the config names none, most trusted first.
COMMON_BINS = ("/opt/venv/bin", "/opt/conda/bin", "/venv/bin", "/usr/local/bin", "/usr/bin")
# Where site folders usually are (only to name a copy of a package that no interpreter imports).
COMMON_PREFIXES = ("/usr/local", "/usr", "/opt/conda", "/opt/venv", "/venv", "/opt/python")
PYTHON_MINORS = tuple(range(14, 5, -1))   # newest first: 3.14 … 3.6
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"   # Debian's python3-* packages


def image_env(config: Mapping[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in config.get("Env") or () if "=" in e)


def image_argv(config: Mapping[str, Any]) -> list[str]:
    """What a container of the image runs: Entrypoint + Cmd (Cmd alone without an Entrypoint)."""
    entrypoint = list(config.get("Entrypoint") or ())
    return entrypoint + list(config.get("Cmd") or ()) if entrypoint else list(config.get("Cmd") or ())


def search_dirs(config: Mapping[str, Any]) -> list[str]:
    """VIRTUAL_ENV's bin, the image's PATH, then the usual roots; each once, in that order."""
    env = image_env(config)
    dirs = [env["VIRTUAL_ENV"].rstrip("/") + "/bin"] if env.get("VIRTUAL_ENV") else []
    dirs += [d for d in env.get("PATH", DEFAULT_PATH).split(":") if d.startswith("/")]
    dirs += COMMON_BINS
    return list(dict.fromkeys(posixpath.normpath(d) for d in dirs))


def site_prefixes(config: Mapping[str, Any]) -> list[str]:
    """The prefixes (`/usr/local`, a venv) whose site folders are worth a look: those of
    VIRTUAL_ENV and of each PATH entry's `bin`, then the usual ones; each once, never `/`."""
    env = image_env(config)
    prefixes: list[str] = []
    for entry in [env.get("VIRTUAL_ENV", "") + "/bin", *env.get("PATH", "").split(":")]:
        if entry.endswith("/bin") and entry != "/bin":
            prefixes.append(posixpath.dirname(entry) or "/")
    prefixes += COMMON_PREFIXES
    return [p for p in dict.fromkeys(prefixes) if p != "/"]


def site_candidates(config: Mapping[str, Any], is_folder: Callable[[str], bool]) -> list[str]:
    """Every site folder at the usual places under `site_prefixes` that `is_folder` finds."""
    found: list[str] = []
    for prefix in site_prefixes(config):
        for minor in PYTHON_MINORS:
            lib = f"{prefix}/lib/python3.{minor}"
            if not is_folder(lib):
                continue
            for name in ("site-packages", "dist-packages"):
                if is_folder(f"{lib}/{name}"):
                    found.append(f"{lib}/{name}")
        if prefix == "/usr" and is_folder(DEBIAN_DIST_PACKAGES):
            found.append(DEBIAN_DIST_PACKAGES)
    return found


def is_dir(stat: Mapping[str, Any] | None) -> bool:
    return stat is not None and bool(int(stat.get("mode", 0)) & GO_DIR)


def is_link(stat: Mapping[str, Any] | None) -> bool:
    return stat is not None and bool(int(stat.get("mode", 0)) & GO_LINK)


__all__ = ["COMMON_BINS", "COMMON_PREFIXES", "DEBIAN_DIST_PACKAGES", "DEFAULT_PATH", "GO_DIR", "GO_LINK", "GO_TYPE",
           "PYTHON_MINORS", "image_argv", "image_env", "is_dir", "is_link", "search_dirs", "site_candidates",
           "site_prefixes"]
