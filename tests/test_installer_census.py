"""The census of real install shapes (docs/installers.md), one row a test: the real 0.33.0 wheel
installed by the real pip and uv each way users install it, then `status`, `apply` and
`verify` as a user runs them on that site folder. Every row must read `absent` with nothing
added before and `applied` after, naming exactly the installer files that installer wrote.
The image rows (uv --system, a vLLM upgraded or reinstalled in a later layer) are in
tests/test_official_shape.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.vllm import INSTALLS, beside_the_cache, installed_copy

PY = sys.executable
INFO = "vllm-0.33.0.dist-info"
# What each installer adds: pip writes INSTALLER, REQUESTED and direct_url.json; uv uv_cache.json
# too; the console script's row is where each puts it (pip --target's points past the target:
# no file there, nothing to read).
PIP = {f"{INFO}/INSTALLER", f"{INFO}/REQUESTED", f"{INFO}/direct_url.json"}
UV = PIP | {f"{INFO}/uv_cache.json"}
EXPECTED = {
    "pip --target": PIP,
    "uv --target": UV | {"bin/vllm"},
    "pip --prefix": PIP | {"../../../bin/vllm"},
    "uv --prefix": UV | {"../../../bin/vllm"},
    "pip --user": PIP | {"../../../bin/vllm"},
    "pip in a venv": PIP | {"../../../bin/vllm"},
    "uv in a venv": UV | {"../../../bin/vllm"},
}


def test_every_install_shape_has_its_row() -> None:
    assert set(EXPECTED) == set(INSTALLS)


@pytest.mark.parametrize("how", sorted(EXPECTED))
def test_install_shape(how: str, tmp_path: Path) -> None:
    with beside_the_cache() as where:
        _check_shape(how, installed_copy(how, "0.33.0", where / "install"), tmp_path)


def _check_shape(how: str, site: Path, tmp_path: Path) -> None:
    res = run("status", "--root", str(site), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    row = res.json["images"][0]
    assert row["patch_sets"] == {"dspark-skip-mtp-buffer": "absent"}
    assert (row["added"], row["unexplained"], row["missing"], row["record_disagrees"], row["installer_findings"]) == \
        ([], [], [], [], [])
    assert set(row["installer_metadata"]) == EXPECTED[how]

    res = run("apply", "--root", str(site), "--python", PY, "--json", "--report-dir", str(tmp_path / "apply"))
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "applied" and res.json["probe"]["ok"]
    assert set(res.json["integrity"]["installer_metadata"]) == EXPECTED[how]
    res = run("verify", "--root", str(site), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "verify"))
    assert res.returncode == 0, res.stderr
    res = run("status", "--root", str(site), "--json")
    assert res.returncode == 0 and res.json["images"][0]["patch_sets"] == {"dspark-skip-mtp-buffer": "applied"}
