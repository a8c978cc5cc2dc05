"""The official image's shape as a two-platform index (linux/amd64 + linux/arm64/v8) in a real
loopback registry: vLLM installed by uv with no bytecode, USER 2000, on both platforms
(images/vllm-official, and its arm64 twin from scripts/build-arm64-fixture). `status` of each
platform reads absent and clean, `apply --platform all --push` patches and probes both (arm64
under qemu), and `verify --platform all` passes on the result with the installer's files named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.images import official_image
from tests.support.index import arm64_official_image, publish_index, remove_images_from
from tests.support.registry import loopback_registry

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.emulation]

UV_FILES = {"../../../bin/vllm", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"}


def _names(paths: list[str]) -> set[str]:
    return {p if p.startswith("../") else p.rsplit("/", 1)[1] for p in paths}


def test_the_official_shape_as_an_index_applies_and_verifies_on_both_platforms(tmp_path: Path) -> None:
    with loopback_registry(tmp_path / "registry") as host:
        try:
            index = publish_index(host, repository="vllm/vllm-openai", sources=(official_image(), arm64_official_image()))
            res = run("status", "--image", index.ref, "--via", "registry", "--json")
            assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-2000:])
            rows = res.json["images"]
            assert sorted(r["platform"] for r in rows) == ["linux/amd64", "linux/arm64/v8"]
            for row in rows:
                platform = row["platform"]
                assert row["patch_sets"] == {"dspark-skip-mtp-buffer": "absent"}, platform
                assert (row["added"], row["unexplained"], row["missing"], row["installer_findings"]) == ([], [], [], [])
                assert _names(row["installer_metadata"]) == UV_FILES, platform

            tag = index.ref.rsplit(":", 1)[0] + ":0.33.0-dspark"
            res = run("apply", "--image", index.ref, "--platform", "all", "--tag", tag, "--push", "--json",
                      "--report-dir", str(tmp_path / "apply"))
            assert res.returncode == 0, res.stderr[-3000:]
            for p in res.json["platforms"]:
                report = p["report"]
                assert report["status"] == "applied" and report["probe"]["ok"], p["platform"]
                assert _names(report["integrity"]["installer_metadata"]) == UV_FILES, p["platform"]

            res = run("verify", "--image", tag, "--platform", "all", "--json", "--no-probe",
                      "--report-dir", str(tmp_path / "verify"))
            assert res.returncode == 0, res.stderr[-3000:]
            assert [p["report"]["status"] for p in res.json["platforms"]] == ["verified", "verified"]
        finally:
            remove_images_from(host)
