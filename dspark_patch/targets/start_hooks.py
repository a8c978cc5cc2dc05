"""Code the environment makes run at start: the variables (and one file) that load code into the
image's python before `import vllm`, read from the config and a path stat; nothing runs.

Each is a runs-first finding (docs/status.md, "Code hooks in the environment"), named by every
route that asks `runtime.runs_first`. Native code that runs first cannot be verified (it can
change anything the tool would later read in the process), so it is a finding, never a note.

- glibc's dynamic loader, for every dynamically linked program (python included, whatever its
  flags): `LD_PRELOAD` and `LD_AUDIT` in the Env, and a non-empty `/etc/ld.so.preload` in the
  image (ld.so(8)). `LD_LIBRARY_PATH` is not named: it only changes where the libraries a
  program already links are found, all of them the image's own files, which no route verifies
  either way.
- CPython (Python/initconfig.c, Lib/warnings.py), unless `-E` or `-I`: a `PYTHONWARNINGS`
  entry whose category has a dot (`ignore::hook.W`): `warnings._getcategory` imports its module
  at start; `PYTHONPYCACHEPREFIX`: bytecode is read from that tree, not the `__pycache__`
  folders the checks read; `PYTHONPLATLIBDIR`: the standard library's native modules come from
  elsewhere (as `PYTHONHOME`, runtime.py). The same `-W` and `-X pycache_prefix=` options on the
  command line count whatever the flags.
"""

from __future__ import annotations

from .image_start import ReadSmall, Start
from .imageconfig import is_link
from .interpreter import Stat

LD_PRELOAD_FILE = "/etc/ld.so.preload"
_LOADER_VARIABLES = ("LD_PRELOAD", "LD_AUDIT")


def code_hooks(start: Start, stat: Stat, read_small: ReadSmall, *, what: str) -> list[str]:
    """One line for each hook of the module doc the image's config or files set; `what` names
    the checked code (`site/vllm`)."""
    lines: list[str] = []
    for name in _LOADER_VARIABLES:
        value = start.env.get(name, "")
        if value.strip():
            lines.append(f"Env {name}={_short(value)}: the dynamic loader runs this native code in every program the "
                         f"image starts, before {what}; native code that runs first is not verified")
    found = stat(LD_PRELOAD_FILE)
    if found is not None:
        data = None if is_link(found) else read_small(LD_PRELOAD_FILE)
        if data is None:
            lines.append(f"{LD_PRELOAD_FILE}: a link or a file too large to read; the dynamic loader preloads what it "
                         f"names in every program, before {what}: not verified")
        elif data.split():
            names = " ".join(data.decode("utf-8", "replace").replace(":", " ").split())
            lines.append(f"{LD_PRELOAD_FILE}: names {_short(names)}; the dynamic loader runs this native code in every "
                         f"program the image starts, before {what}; native code that runs first is not verified")
    warn = [("Env PYTHONWARNINGS=", o) for o in start.env.get("PYTHONWARNINGS", "").split(",")] if not start.ignores_env else []
    warn += [("-W ", value) for letter, value in start.options if letter == "W"]
    for source, option in warn:
        module = _category_module(option)
        if module is not None:
            lines.append(f"{source}{_short(option)}: its warning category imports module {module} at every start of "
                         f"the image's python, before {what}")
    prefixes = [("Env PYTHONPYCACHEPREFIX=", start.env.get("PYTHONPYCACHEPREFIX", ""))] if not start.ignores_env else []
    prefixes += [("-X ", value) for letter, value in start.options
                 if letter == "X" and value.startswith("pycache_prefix=")]
    for source, value in prefixes:
        if value.strip():
            lines.append(f"{source}{_short(value)}: the image's python reads bytecode from that tree, not from the "
                         f"__pycache__ folders checked beside {what}")
    if not start.ignores_env and start.env.get("PYTHONPLATLIBDIR", "").strip():
        lines.append(f"Env PYTHONPLATLIBDIR={_short(start.env['PYTHONPLATLIBDIR'])}: the standard library's native modules "
                     f"come from another folder, not the one read")
    return lines


def _category_module(option: str) -> str | None:
    """The module `warnings._setoption` imports for `option` (action:message:category:module:
    lineno): the part of a dotted category before its last dot; None when nothing is imported."""
    parts = option.split(":")
    if len(parts) < 3 or len(parts) > 5:
        return None   # CPython ignores a malformed option (a warning, nothing imported)
    category = parts[2].strip()
    module, _, klass = category.rpartition(".")
    return module if module and klass else None


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")
