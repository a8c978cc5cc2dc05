"""Stdlib-only scripts that run under the target's own interpreter.

They travel as `python -B -c SOURCE ARGS` (nothing is written into an image to run them),
print one JSON document on stdout, and never import the patched distribution.
`source(name)` gives a script's text for a target's `run_python`.
"""

from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.py").read_text(encoding="utf-8")
