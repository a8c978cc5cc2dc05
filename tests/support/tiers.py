"""The test tiers: which part of the machine a test needs, and how long each tier took.

A test's tier is the heaviest thing it needs, from its marks (declared in pyproject.toml):
`emulation` (the arm64 fixture, qemu), `podman`, `registry`, `engine` (a Docker engine and the
fixture images); a test with none of them is `fast` and runs without any engine
(`scripts/test --fast` runs exactly those, with DOCKER_HOST pointing at nothing, so a test that
reaches an engine without its mark fails there).

Modules that start containers carry their marks themselves; the marks that follow from a
fixture (a loopback registry, Podman as the other engine) are added here at collection.
At the end of the session a small table on stderr says how long set-up (timed by scripts/test,
handed over in DSPARK_PATCH_SETUP_TIMES) and each tier took.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

import pytest

# Heaviest first: a test is counted in the first tier whose mark it carries.
TIERS = ("emulation", "podman", "registry", "engine")
FAST = "fast"
# Fixtures that start a loopback registry (tests/support/registry.py).
REGISTRY_FIXTURES = frozenset({"registry", "login_registry", "registry_only_fixture"})
SETUP_ENV = "DSPARK_PATCH_SETUP_TIMES"

_seconds: dict[str, float] = defaultdict(float)
_tests: dict[str, set[str]] = defaultdict(set)
_started: list[float] = []


def start() -> None:
    _started.append(time.monotonic())


def tier_of(marks: set[str] | dict) -> str:
    return next((t for t in TIERS if t in marks), FAST)


def mark_by_fixtures(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("docker") is not None:  # the old name of `engine`, in older branches
            item.add_marker(pytest.mark.engine)
        if names & REGISTRY_FIXTURES:
            item.add_marker(pytest.mark.registry)
        if "fixture_on_other_engine" in names:
            item.add_marker(pytest.mark.engine)
            callspec = getattr(item, "callspec", None)
            if callspec is not None and callspec.params.get("fixture_on_other_engine") == "podman":
                item.add_marker(pytest.mark.podman)


def record(report: pytest.TestReport) -> None:
    tier = tier_of(report.keywords)
    _seconds[tier] += report.duration
    _tests[tier].add(report.nodeid)


def _setup_rows() -> list[tuple[str, float]]:
    rows = []
    for field in os.environ.get(SETUP_ENV, "").split():
        name, _, seconds = field.partition("=")
        try:
            rows.append((name, float(seconds)))
        except ValueError:
            continue
    return rows


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes:d}:{rest:02d}"


def summary(terminalreporter) -> None:
    """The timing table, on stderr, before pytest's own closing line."""
    setup = _setup_rows()
    tiers = [(t, _seconds[t], len(_tests[t])) for t in (FAST, *reversed(TIERS)) if _tests[t]]
    if not setup and not tiers:
        return
    lines = ["", "time by tier (m:ss)", f"  {'step':<22} {'tests':>6} {'time':>7}"]
    lines += [f"  set-up: {name:<14} {'':>6} {_clock(s):>7}" for name, s in setup]
    lines += [f"  tier: {name:<16} {count:>6} {_clock(s):>7}" for name, s, count in tiers]
    # The tiers count their tests' own time; pytest's wall time adds collection and start-up.
    wall = time.monotonic() - _started[0] if _started else sum(s for _, s, _ in tiers)
    lines.append(f"  {'pytest (wall)':<22} {sum(c for _, _, c in tiers):>6} {_clock(wall):>7}")
    lines.append(f"  {'total':<22} {'':>6} {_clock(sum(s for _, s in setup) + wall):>7}")
    # pytest writes to stdout: flush it so the table lands after what it wrote so far.
    terminalreporter.flush()
    stream = sys.__stderr__ or sys.stderr
    stream.write("\n".join(lines) + "\n")
    stream.flush()
