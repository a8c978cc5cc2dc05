"""Byte-compile the given files in checked-hash mode with this interpreter.

checked-hash bytecode carries the source's hash, so it stays valid whatever the file times
are (image layers and `COPY` reset mtimes) and a stale .pyc is detectable by verify.
Usage: python -B -c SOURCE FILE... ; prints {"files": [{"path", "ok", "detail", "pyc"}]}.
"""

import json
import py_compile
import sys


def compile_files(paths):
    results = []
    for path in paths:
        try:
            pyc = py_compile.compile(
                path, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
            )
            results.append({"path": path, "ok": True, "detail": "", "pyc": pyc})
        except py_compile.PyCompileError as exc:
            detail = " ".join(str(exc.msg).split())
            results.append({"path": path, "ok": False, "detail": detail, "pyc": None})
        except OSError as exc:
            results.append({"path": path, "ok": False, "detail": f"{type(exc).__name__}: {exc}", "pyc": None})
    return {"files": results}


if __name__ == "__main__":
    json.dump(compile_files(sys.argv[1:]), sys.stdout)
