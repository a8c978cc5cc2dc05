"""Distribution names, the one place that normalises them.

Two forms, for two jobs (the packaging specs' own): `canonical_name` compares names (PEP 503:
runs of `-`, `_`, `.` become one `-`, lowercase: `Foo_Bar` and `foo.bar` are `foo-bar`);
`filename_name` is the name as wheel and `.dist-info` file names and the package's folder
spell it (the binary distribution format's escaping: the same runs become `_`), so it is what a
site folder's entries are compared with.
https://peps.python.org/pep-0503/#normalized-names
https://packaging.python.org/en/latest/specifications/binary-distribution-format/#escaping-and-unicode
"""

from __future__ import annotations

import re

_RUNS = re.compile(r"[-_.]+")


def canonical_name(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` -> `foo-bar-baz`."""
    return _RUNS.sub("-", name).lower()


def filename_name(name: str) -> str:
    """As wheel and dist-info file names spell it: `Foo-Bar.baz` -> `foo_bar_baz`."""
    return _RUNS.sub("_", name).lower()


__all__ = ["canonical_name", "filename_name"]
