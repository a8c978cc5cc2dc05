"""How an image starts its python, read from its config and path stats: the command behind
trampolines (`tini --`, `dumb-init`, `env NAME=VALUE`), the interpreter it runs (the entrypoint's,
or its script's `#!` one), that python's flags and what CPython puts at sys.path[0] (`Start`,
`start_of`), and the command that asks that python, started the same way, what it imports at
start (`started_argv`). What runs first because of it is judged in targets/runtime.py.
Stdlib-free of the engine: `stat` and `read_small` are the caller's.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import interpreter as interp
from .imageconfig import image_argv, image_env, search_dirs

ReadSmall = Callable[[str], "bytes | None"]
_OPTIONS_WITH_VALUE = frozenset("WXQ")


# Programs that only exec their arguments (an init for PID 1, `env` with assignments): the tool
# models what they start. Shells are modelled only bare (an interactive default that runs nothing).
_TRAMPOLINES = frozenset({"tini", "tini-static", "dumb-init", "catatonit"})
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh", "busybox"})


def unwrap(argv: list[str]) -> tuple[list[str], dict[str, str], str | None]:
    """The command behind trampolines (`tini --`, `dumb-init`, `env NAME=VALUE`): (its argv, the
    Env those assignments add, why it cannot be followed, or None)."""
    assigned: dict[str, str] = {}
    argv = list(argv)
    while argv:
        name = posixpath.basename(argv[0])
        if name in _TRAMPOLINES:
            rest = argv[1:]
            if "--" in rest:
                rest = rest[rest.index("--") + 1:]
            elif rest and rest[0].startswith("-"):
                return argv, assigned, f"{name} with options the tool does not model"
            argv = rest
        elif name == "env":
            rest = argv[1:]
            while rest and "=" in rest[0] and not rest[0].startswith("-"):
                key, _, value = rest.pop(0).partition("=")
                assigned[key] = value
            if rest and rest[0].startswith("-"):
                return argv, assigned, "env with options the tool does not model"
            argv = rest
        else:
            break
    return argv, assigned, None


def _shown(argv: list[str]) -> str:
    text = " ".join(argv)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _flags(args: list[str], values: list[tuple[str, str]] | None = None) -> tuple[set[str], str | None, str | None]:
    """(single-letter flags, "-m"/"-c"/None, the script) of a python command line's arguments;
    the values of its `-W` and `-X` options are added to `values` as ("W", value)."""
    flags: set[str] = set()
    args = list(args)
    while args:
        arg = args.pop(0)
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return flags, None, (None if arg in ("--", "-") else arg)
        if arg.startswith("--"):
            continue  # --check-hash-based-pycs etc.: nothing that changes sys.path
        letters = arg[1:]
        for i, letter in enumerate(letters):
            if letter in "mc":
                return flags, f"-{letter}", None
            if letter in _OPTIONS_WITH_VALUE:
                value = letters[i + 1:] or (args.pop(0) if args else "")
                if values is not None and letter in "WX":
                    values.append((letter, value))
                break
            flags.add(letter)
    return flags, None, None


@dataclass(frozen=True, kw_only=True)
class Start:
    """How the image starts its python, as far as the config and path stats show.

    `python`: the interpreter that runs (the entrypoint's, or its script's `#!` one), None when
    the command is not a python or cannot be followed (`unmodelled` says why); `flags`: its
    single-letter options; `first`: what CPython puts at sys.path[0] and why; `env`: what the
    trampolines add to the image's Env."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    python: str | None
    flags: frozenset[str]
    first: tuple[str, str] | None
    unmodelled: tuple[str, ...]
    options: tuple[tuple[str, str], ...] = ()   # its -W and -X options: ("W", "ignore::hook.W")

    @property
    def isolated(self) -> bool:
        return "I" in self.flags

    @property
    def ignores_env(self) -> bool:
        """-I or -E: no PYTHON* variable applies."""
        return self.isolated or "E" in self.flags

    @property
    def safe_path(self) -> bool:
        """-I, -P or PYTHONSAFEPATH: nothing is put at sys.path[0]."""
        return self.isolated or "P" in self.flags or (not self.ignores_env and bool(self.env.get("PYTHONSAFEPATH")))


def start_of(config: Mapping[str, Any], stat: interp.Stat, read_small: ReadSmall, *, what: str) -> Start:
    """The image's start (see `Start`); `what` names the checked code in "not verified" lines."""
    workdir = str(config.get("WorkingDir") or "/")
    lines: list[str] = []
    flags: set[str] = set()
    first: tuple[str, str] | None = None
    python: str | None = None
    options: list[tuple[str, str]] = []
    argv, assigned, unmodelled = unwrap(image_argv(config))
    command = interp.resolve_command(argv[0], search_dirs(config), stat) if argv and unmodelled is None else None
    if unmodelled is not None:
        lines.append(f"the image starts {_shown(image_argv(config))}: {unmodelled}; what it runs before or instead of "
                     f"{what} is not verified")
    elif argv and command is None:
        lines.append(f"the image starts {_shown(argv)}, which the tool does not find in the image (along its PATH); "
                     f"what it runs before or instead of {what} is not verified")
    if command is not None and interp.is_python_name(command):
        python = command
        flags, mode, script = _flags(argv[1:], options)
        if mode is not None:
            first = (workdir, f"the working dir, first on sys.path for `python {mode}`")
        elif script is not None:
            where = script if script.startswith("/") else posixpath.join(workdir, script)
            first = (posixpath.dirname(posixpath.normpath(where)), f"the folder of the script {script}")
    elif command is not None:
        head = read_small(command) or b""
        named = interp.shebang_python(head)
        if named is not None:
            words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
            flags, _, _ = _flags([w for w in words[1:] if w.startswith("-")], options)
            python = named if named.startswith("/") else interp.resolve_command(named, search_dirs(config), stat)
            first = (posixpath.dirname(command), f"the folder of the entrypoint script {command}")
        elif not (posixpath.basename(command) in _SHELLS and len(argv) == 1):
            # A shell with a command, a shell script, any other program: what it starts, with
            # which Env and working dir, is not in the config. (A bare shell runs nothing: a
            # deployment gives its command at run time.)
            kind = "a shell with a command or script" if posixpath.basename(command) in _SHELLS else \
                "a program that is not Python (a shell script, a launcher)"
            lines.append(f"the image starts {_shown(argv)} ({command}): {kind} the tool does not model; what it runs "
                         f"before or instead of {what} is not verified")
    return Start(argv=tuple(argv), env={**image_env(config), **assigned}, python=python, flags=frozenset(flags),
                 first=first, unmodelled=tuple(lines), options=tuple(options))


def started_argv(start: Start, *, top: str, source: str) -> list[str] | None:
    """The command that asks the image's python, started as the image starts it, what it
    imported at start and where `import top` resolves (`source`: inside/started.py, run as
    `-c`); None when the start is not a python the tool follows."""
    if start.python is None or start.unmodelled:
        return None
    first = start.first[0] if start.first is not None and not start.safe_path else ""
    flags = [f"-{f}" for f in sorted(start.flags & set("IEsSP"))]
    return [start.python, *flags, "-B", "-c", source, first, top]
