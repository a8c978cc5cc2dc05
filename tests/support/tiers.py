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
# scripts/test's first session (the fast tier in parallel) writes its rows to this file ("later")
# instead of printing them; the next session prints them in its table.
TIER_LOG_ENV = "DSPARK_PATCH_TIER_LOG"
TIER_TABLE_ENV = "DSPARK_PATCH_TIER_TABLE"
# The pid of that first session when it runs beside this one (scripts/test: the fast tier needs
# no engine, so it runs while the engine's images are built and its tiers run): the table waits
# for its rows.
TIER_BESIDE_ENV = "DSPARK_PATCH_TIER_BESIDE_PID"
SESSION_ENV = "DSPARK_PATCH_SESSION"  # the name of a session run beside the others, for its wall row
RUN_START_ENV = "DSPARK_PATCH_RUN_START"  # scripts/test's start, seconds since the epoch

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _earlier_rows() -> list[str]:
    """What an earlier session of this run (scripts/test's parallel fast tier) left in the log;
    for one running beside this session, what it leaves once it ends."""
    path = os.environ.get(TIER_LOG_ENV)
    if not path or os.environ.get(TIER_TABLE_ENV) == "later":
        return []
    beside = os.environ.get(TIER_BESIDE_ENV, "")

    def rows() -> list[str]:
        try:
            with open(path, encoding="utf-8") as f:
                return [line.rstrip("\n") for line in f if line.strip()]
        except OSError:
            return []

    # Each session beside this one ends its rows with a `#wall` line: wait for them all (or for
    # those still running to end; a killed one leaves no rows).
    pids = [int(p) for p in beside.replace(",", " ").split() if p.isdigit()]
    found = rows()
    while sum(r.startswith("#wall ") for r in found) < len(pids) and any(_alive(p) for p in pids):
        time.sleep(0.5)
        found = rows()
    return found


def summary(terminalreporter) -> None:
    """The timing table, on stderr, before pytest's own closing line (not from xdist workers)."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    workers = getattr(terminalreporter.config.option, "numprocesses", None)
    tiers = [(t, _seconds[t], len(_tests[t])) for t in (FAST, *reversed(TIERS)) if _tests[t]]
    # The tiers count their tests' own time (summed over workers); pytest's wall time adds
    # collection and start-up.
    wall = time.monotonic() - _started[0] if _started else sum(s for _, s, _ in tiers)
    # scripts/test names the sessions that run beside another (DSPARK_PATCH_SESSION).
    named = [n for n in (os.environ.get(SESSION_ENV), f"-n {workers}" if workers else None) if n]
    label = f"pytest (wall, {', '.join(named)})" if named else "pytest (wall)"
    session = [f"  tier: {name:<16} {count:>6} {_clock(s):>7}" for name, s, count in tiers]
    session.append(f"  {label:<22} {sum(c for _, _, c in tiers):>6} {_clock(wall):>7}")
    if os.environ.get(TIER_TABLE_ENV) == "later":
        # scripts/test runs another session after this one: its table shows these rows too.
        path = os.environ.get(TIER_LOG_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write("\n".join(session) + f"\n#wall {wall}\n")
        return
    setup = _setup_rows()
    earlier = _earlier_rows()
    if not setup and not tiers and not earlier:
        return
    earlier_wall = sum(float(line.split()[1]) for line in earlier if line.startswith("#wall "))
    total = sum(s for _, s in setup) + earlier_wall + wall
    try:
        # scripts/test's own start: with a session beside the set-up and the others, the rows
        # overlap, and the total is the clock's.
        total = time.time() - float(os.environ[RUN_START_ENV])
    except (KeyError, ValueError):
        pass
    lines = ["", "time by tier (m:ss)", f"  {'step':<22} {'tests':>6} {'time':>7}"]
    lines += [f"  set-up: {name:<14} {'':>6} {_clock(s):>7}" for name, s in setup]
    if any(name.endswith("*") for name, _ in setup):
        lines.append("  (the set-up steps marked * ran beside another: ensure-docker beside the venv,")
        lines.append("   the others beside the images)")
    lines += [line for line in earlier if not line.startswith("#wall ")]
    if os.environ.get(TIER_BESIDE_ENV) and earlier:
        lines.append("  (the fast tier ran beside the set-up and the tiers after it; the registry")
        lines.append("   session beside the engine tier)")
    lines += session
    lines.append(f"  {'total':<22} {'':>6} {_clock(total):>7}")
    # pytest writes to stdout: flush it so the table lands after what it wrote so far.
    terminalreporter.flush()
    stream = sys.__stderr__ or sys.stderr
    stream.write("\n".join(lines) + "\n")
    stream.flush()

