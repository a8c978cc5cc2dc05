from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import vllm


@pytest.fixture
def vllm033_tree(tmp_path: Path) -> Path:
    """A fresh, real vLLM 0.33.0 site-packages folder for this test (hard-linked to the cache)."""
    return vllm.tree_copy("0.33.0", tmp_path / "site-packages")


# Fixtures that live in tests/support, made visible to every test module.
from tests.support.engines import fixture_on_other_engine  # noqa: E402,F401
