from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dspark_patch import termination
from tests.support import probe_trees, schedule, tiers, vllm

# The user's own references (references/user.py: `reference add` writes them, every lookup reads
# them) are not the suite's: each run reads a folder that is not there, unless a test names its own.
os.environ["DSPARK_PATCH_REFERENCES"] = str(Path("/nonexistent") / "dspark-patch-test-references")


@pytest.fixture(autouse=True)
def _no_stop_carried_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process does: no SIGTERM or Ctrl-C recorded (termination.py). A
    test that sends its own process a signal (test_work_container_start.py) records one, and a
    later in-process run in the same worker would otherwise stop at its first step."""
    monkeypatch.setattr(termination, "_received", None)


@pytest.fixture
def vllm033_tree(tmp_path: Path) -> Path:
    """A fresh, real vLLM 0.33.0 site-packages folder for this test (hard-linked to the cache)."""
    return vllm.tree_copy("0.33.0", tmp_path / "site-packages")


@pytest.fixture(scope="session")
def patched033(tmp_path_factory: pytest.TempPathFactory) -> Iterator[probe_trees.SharedTree]:
    """A real vLLM 0.33.0 tree patched by `dspark-patch apply --no-probe`, made once per session
    (per xdist worker) for the tests whose subject is not apply itself. Take copies
    (`patched033.copy(where)`, or the `patched033_tree` fixture); never write into it."""
    shared = probe_trees.SharedTree(probe_trees.patched_tree(tmp_path_factory.mktemp("patched033") / "site-packages"))
    yield shared
    shared.check()


@pytest.fixture
def patched033_tree(patched033: probe_trees.SharedTree, tmp_path: Path) -> Path:
    """A fresh hard-link copy of the session's patched 0.33.0 tree, for this test."""
    return patched033.copy(tmp_path / "patched" / "site-packages")


# Where the fast tier's temporary folders are in RAM (scripts/test sets DSPARK_PATCH_TEST_TREES
# then), a passing test's tmp_path is removed when it ends: a tmpfs counts every hard link
# against its inode limit (about 3 million on a 24 GiB machine), and the tier's ~200 hard-link
# copies of 5,800-file trees, kept to the end, come close to it. A failing test's folder stays.
_FREE_PASSED = bool(os.environ.get("DSPARK_PATCH_TEST_TREES"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = getattr(item, "funcargs", {}).get("tmp_path") if _FREE_PASSED else None
    yield
    if folder is not None and item.stash.get(_PASSED, False):
        shutil.rmtree(folder, ignore_errors=True)


_PASSED = pytest.StashKey[bool]()


def pytest_sessionstart(session: pytest.Session) -> None:
    tiers.start()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marks that follow from the fixtures a test takes (the engine marks are in the modules).
    tiers.mark_by_fixtures(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tiers.record(report)
    schedule.record(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    schedule.save(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    # `--dist loadfile` (scripts/test): the same, longest modules first (tests/support/schedule.py).
    if config.getoption("dist") == "loadfile":
        return schedule.CostliestModuleFirst(config, log)
    return None


def pytest_terminal_summary(terminalreporter) -> None:
    tiers.summary(terminalreporter)


# Fixtures that live in tests/support, made visible to every test module.
from tests.support.engines import fixture_on_other_engine  # noqa: E402,F401
