# What the image's python does at start, asked of that python as the image starts it.
#
# The one script here that does NOT run isolated: it runs as the image's USER, in its WORKDIR,
# with its Env and the entrypoint's python and flags (targets/image_start.py `Start`), so that
# `site` does at start what it does when the image starts: every .pth on every site folder,
# sitecustomize, usercustomize. What it prints is a second opinion that can only add findings
# (targets/runtime.py `judge_started`): code that ran before it may lie, never vouch.
#
# argv: SYS_PATH_0 (what CPython puts first for the entrypoint, "" for nothing), TOP (the
# top-level package to resolve). Prints one JSON document.
import sys

_at_start = []
for _name, _module in list(sys.modules.items()):
    try:
        _file = getattr(_module, "__file__", None)
    except Exception:  # noqa: BLE001 - a module object that refuses: named without a file
        _file = "?"
    _at_start.append([str(_name), _file if isinstance(_file, str) else None])

import importlib.util  # noqa: E402
import json  # noqa: E402
import site  # noqa: E402
import sysconfig  # noqa: E402


def _qualified(finder):
    kind = finder if isinstance(finder, type) else type(finder)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', '?')}"


def main():
    first, top = sys.argv[1], sys.argv[2]
    # `-c` put the working dir first ("" in sys.path[0]); the entrypoint puts its own.
    if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] == "":
        sys.path.pop(0)
    if first:
        sys.path.insert(0, first)
    answer = {"path": list(sys.path), "modules": _at_start, "finders": [_qualified(f) for f in sys.meta_path],
              "stdlib": sorted({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}),
              "stdlib_names": sorted(getattr(sys, "stdlib_module_names", ())),
              "sites": list(getattr(site, "getsitepackages", lambda: [])()), "spec": None, "error": None}
    try:
        spec = importlib.util.find_spec(top)
    except Exception as exc:  # noqa: BLE001 - what the import would meet, said as it is
        answer["error"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        if spec is not None:
            answer["spec"] = {"origin": spec.origin, "locations": list(spec.submodule_search_locations or [])}
    sys.stdout.write(json.dumps(answer))


main()
