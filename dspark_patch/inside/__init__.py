"""Stdlib-only scripts that run under the target's own interpreter.

They travel as `python -B -c SOURCE ARGS` (nothing is written into an image to run them),
print one JSON document on stdout, and never import the patched distribution.
`source(name)` gives a script's text for a target's `run_python`.

They run isolated (`ISOLATED`: `-I`, so neither the cwd nor the script's folder is on sys.path
and no PYTHON* variable or user site applies) with a cwd outside the target's tree, so a
target's own `json.py` or `platform.py` can never shadow the standard library they import.
The one exception is `started.py`, whose question is what the image's python does when the
image starts it: it runs as the image runs it, and its answer can only add findings.
`answers.py` is the host's side of the seam: it is never shipped, and decodes what they print.
"""

from __future__ import annotations

from importlib import resources

ISOLATED = ("-I", "-B")


def source(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.py").read_text(encoding="utf-8")
