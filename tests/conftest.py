from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import tiers, vllm


@pytest.fixture
def vllm033_tree(tmp_path: Path) -> Path:
    """A fresh, real vLLM 0.33.0 site-packages folder for this test (hard-linked to the cache)."""
    return vllm.tree_copy("0.33.0", tmp_path / "site-packages")


def pytest_sessionstart(session: pytest.Session) -> None:
    tiers.start()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marks that follow from the fixtures a test takes (the engine marks are in the modules).
    tiers.mark_by_fixtures(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tiers.record(report)


def pytest_terminal_summary(terminalreporter) -> None:
    tiers.summary(terminalreporter)


# Fixtures that live in tests/support, made visible to every test module.
from tests.support.engines import fixture_on_other_engine  # noqa: E402,F401
