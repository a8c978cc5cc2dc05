"""What an installer adds to a wheel's files, recognised by name and shape, never guessed.

The published wheel is the integrity reference (references/__init__.py); an installer adds files
of its own that the wheel cannot hold (PEP 376, 610, 627): in the dist-info `INSTALLER`,
`REQUESTED`, `direct_url.json` and its own `RECORD`, and uv's `uv_cache.json`; outside the
site folder, one console script per entry point. They are data or a fixed trampoline, and are
accepted only in the shape each installer writes:

- `INSTALLER`: one line naming the tool (`pip`, `uv`, `poetry`, `conda`, …);
- `REQUESTED`: empty, or a few bytes of text (PEP 376 leaves its content free; pip and uv
  write it empty);
- `direct_url.json`: a JSON object with a string `url` and one of `archive_info`, `dir_info`,
  `vcs_info` (PEP 610);
- `uv_cache.json`: a JSON object whose keys are uv's cache-info fields (`timestamp`, `commit`,
  `tags`, `env`, `directories`);
- a console script: a RECORD row `bin/NAME` (uv `--target`), `../../bin/NAME` (pip `--target`,
  which installs into a temporary home first) or `../../../bin/NAME` (every prefix layout:
  `PREFIX/lib/pythonX.Y/{site,dist}-packages` with the script in `PREFIX/bin`), where NAME is
  an entry point the wheel declares; the file there, where it exists, is a `#!` line and the
  trampoline that imports the entry point and calls it. Installers word that trampoline
  differently (pip 23's distlib with `re.sub`, pip 26's `removesuffix`, uv's `endswith`, the
  `installer` library's double quotes), so it is checked as a syntax tree, not as text: nothing
  but `import sys`/`import re`, the entry point's own import, and under
  `if __name__ == "__main__":` rewrites of `sys.argv[0]` and `sys.exit(ENTRY())`.

Anything else that an interpreter can run (a `.py`, `.pth`, a `.so`, a script with another
body) stays a finding; so does metadata of another shape, or over its cap. Stdlib only, pure.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping

METADATA_FILES = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"})
METADATA_CAP = 64 * 1024          # bytes of one metadata file read; a larger one is a finding
SCRIPT_CAP = 64 * 1024            # bytes of one console script read; likewise
# Where each installer's RECORD row for a console script points, relative to the site folder.
SCRIPT_ROWS = ("bin/", "../../bin/", "../../../bin/")
_INSTALLER_NAME = re.compile(rb"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\r?\n?$")
_UV_CACHE_KEYS = frozenset({"timestamp", "commit", "tags", "env", "directories"})
_DIRECT_URL_INFO = ("archive_info", "dir_info", "vcs_info")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def metadata_problem(name: str, data: bytes | None) -> str | None:
    """Why the dist-info file `name` with these bytes is not the installer metadata it is named
    as (None: it is). `data` None: over METADATA_CAP or not a regular file."""
    if name not in METADATA_FILES:
        return "not installer metadata"
    if data is None:
        return f"not a regular file of at most {METADATA_CAP} bytes"
    if name == "INSTALLER":
        return None if _INSTALLER_NAME.match(data) else "not one line naming an installer"
    if name == "REQUESTED":
        return None if len(data) <= 256 and _printable(data) else "not a few bytes of text"
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "not JSON"
    if not isinstance(doc, dict):
        return "not a JSON object"
    if name == "uv_cache.json":
        extra = sorted(set(doc) - _UV_CACHE_KEYS)
        return f"keys uv does not write: {', '.join(map(str, extra))[:80]}" if extra else None
    if not isinstance(doc.get("url"), str) or sum(k in doc for k in _DIRECT_URL_INFO) != 1:
        return "not a PEP 610 record (a url and one of archive_info, dir_info, vcs_info)"
    return None


def _printable(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\r\n\t" for c in text)


def entry_points(text: str) -> dict[str, str]:
    """{script name: "module:attr"} of an entry_points.txt's console_scripts and gui_scripts."""
    scripts: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section in ("console_scripts", "gui_scripts") and "=" in line:
            name, _, value = line.partition("=")
            target = value.split("[", 1)[0].strip()
            if _NAME.match(name.strip()) and ":" in target:
                scripts[name.strip()] = target
    return scripts


def script_name(row: str, scripts: Mapping[str, str]) -> str | None:
    """The entry point a RECORD row outside the distribution's folders is the console script
    of (its path has one of SCRIPT_ROWS' shapes and names a declared script), or None."""
    for prefix in SCRIPT_ROWS:
        if row.startswith(prefix) and row[len(prefix):] in scripts:
            return row[len(prefix):]
    return None


def script_problem(data: bytes | None, entry: str) -> str | None:
    """Why these bytes are not an installer's console script for `entry` ("module:attr"),
    or None. `data` None: not a regular file of at most SCRIPT_CAP bytes."""
    if data is None:
        return f"not a regular file of at most {SCRIPT_CAP} bytes"
    if not data.startswith(b"#!/") or b"\0" in data:
        return "no #! line"
    try:
        tree = ast.parse(data.decode("utf-8"))
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return "not Python"
    module, _, attr = entry.partition(":")
    body = list(tree.body)
    # pip and uv write a /bin/sh trampoline when the interpreter's path is too long for a #!
    # line: `#!/bin/sh` then `'''exec' "PY" "$0" "$@"` and `' '''`, one string to Python.
    if data.startswith(b"#!/bin/sh\n") and body and _is_string(body[0]):
        body = body[1:]
    if not body or not isinstance(body[-1], ast.If) or not _is_main_test(body[-1].test) or body[-1].orelse:
        return "no `if __name__ == '__main__':` that calls the entry point"
    for stmt in body[:-1]:
        if isinstance(stmt, ast.Import) and all(a.name in ("sys", "re") and a.asname is None for a in stmt.names):
            continue
        if isinstance(stmt, ast.ImportFrom) and stmt.module == module and stmt.level == 0 \
                and [(a.name, a.asname) for a in stmt.names] == [(attr.split(".")[0], None)]:
            continue
        return f"line {stmt.lineno} is not the installer's"
    main = body[-1].body
    if not main or not _is_exit_call(main[-1], attr):
        return f"does not end in sys.exit({attr}())"
    for stmt in main[:-1]:
        if not _argv_rewrite(stmt):
            return f"line {stmt.lineno} is not the installer's"
    return None


def _is_string(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _is_main_test(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__")


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _is_exit_call(stmt: ast.stmt, attr: str) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _dotted(stmt.value.func) == "sys.exit"
            and len(stmt.value.args) == 1 and not stmt.value.keywords):
        return False
    inner = stmt.value.args[0]
    return isinstance(inner, ast.Call) and _dotted(inner.func) == attr and not inner.args and not inner.keywords


def _is_argv0(node: ast.expr) -> bool:
    return (isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.argv"
            and isinstance(node.slice, ast.Constant) and node.slice.value == 0)


def _const(node: ast.expr | None) -> bool:
    if node is None:
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _const(node.operand)
    return isinstance(node, ast.Constant) and isinstance(node.value, (str, int)) and not isinstance(node.value, bool)


def _argv_value(node: ast.expr) -> bool:
    """An expression of sys.argv[0] and constants only: re.sub(C, C, argv0), argv0.removesuffix(C),
    argv0[C:C]."""
    if _is_argv0(node):
        return True
    if isinstance(node, ast.Subscript) and _is_argv0(node.value) and isinstance(node.slice, ast.Slice):
        return _const(node.slice.lower) and _const(node.slice.upper) and node.slice.step is None
    if isinstance(node, ast.Call) and not node.keywords:
        if _dotted(node.func) == "re.sub" and len(node.args) == 3:
            return _const(node.args[0]) and _const(node.args[1]) and _is_argv0(node.args[2])
        if isinstance(node.func, ast.Attribute) and node.func.attr == "removesuffix" and _is_argv0(node.func.value):
            return len(node.args) == 1 and _const(node.args[0])
    return False


def _argv_test(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "endswith"
            and _is_argv0(node.func.value) and len(node.args) == 1 and _const(node.args[0]) and not node.keywords)


def _argv_rewrite(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assign):
        return len(stmt.targets) == 1 and _is_argv0(stmt.targets[0]) and _argv_value(stmt.value)
    if isinstance(stmt, ast.If):
        return _argv_test(stmt.test) and all(map(_argv_rewrite, stmt.body)) and all(map(_argv_rewrite, stmt.orelse))
    return False
