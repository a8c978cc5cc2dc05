"""The official image's shape on the real engine: vLLM installed by uv, no bytecode, USER 2000.

`vllm/vllm-openai` installs vLLM with `uv pip install --system` and runs as uid 2000 (gid 0) in
its non-root variant, where dist-packages is not writable. images/vllm-official is built that
way, offline, from the real wheels (0.33.0 and 0.32.0), and so are the census's two images with
vLLM in two layers (0.32.0 upgraded to 0.33.0 by a later `uv pip install -U`, and 0.33.0
reinstalled over itself). What a user of such an image must see:
the pristine image reads `absent` with nothing added (both status routes), `apply` writes one
layer and keeps the image's user and entrypoint, `verify` passes, the result reads `applied`, and
the image's own user imports the patched `vllm.envs` from the bytecode `apply` wrote (it cannot
write `__pycache__` itself).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from dspark_patch.patchset import resolve
from tests.support.cli import run
from tests.support.containers import left_by
from tests.support.images import (
    fixture_image,
    official_032_image,
    official_image,
    official_reinstalled_image,
    official_upgraded_image,
)

pytestmark = pytest.mark.engine

PATCH = "dspark-skip-mtp-buffer"
SITE = "/usr/local/lib/python3.11/dist-packages"
UV_FILES = {"../../../bin/vllm", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"}
# Run as the image's own user: find vLLM without running its __init__ (its dependencies are not
# installed in the fixtures), import the patched vllm.envs, and say where its bytecode came from.
IMPORT_ENVS = """
import importlib.util, os, sys, types
spec = importlib.util.find_spec("vllm")
pkg = types.ModuleType("vllm"); pkg.__path__ = list(spec.submodule_search_locations); sys.modules["vllm"] = pkg
import vllm.envs as envs
os.environ["VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"] = "1"
print(os.getuid(), os.getgid(), envs.VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER, os.path.exists(envs.__cached__),
      os.access(os.path.dirname(envs.__cached__), os.W_OK))
"""


def _installer_names(paths: list[str]) -> set[str]:
    return {p if p.startswith("../") else p.rsplit("/", 1)[1] for p in paths}


def _pyc_in_site(client: docker.DockerClient, image: str) -> list[str]:
    out = client.containers.run(image, ["-c", f"find {SITE} -name '*.pyc' | sort"], entrypoint="sh",
                                network_disabled=True, remove=True)
    return out.decode().split()


@pytest.mark.parametrize("release, source", [
    ("0.33.0", official_image), ("0.32.0", official_032_image),
    # the census's image rows (docs/installers.md): vLLM in two layers
    ("0.33.0", official_upgraded_image), ("0.33.0", official_reinstalled_image),
], ids=["0.33.0", "0.32.0", "upgraded-in-a-later-layer", "reinstalled-in-a-later-layer"])
def test_apply_verify_and_status_on_the_official_shape(release: str, source: Callable[[], str], tmp_path: Path) -> None:
    client = docker.from_env()
    image = source()
    before = client.images.get(image)
    assert before.attrs["Config"]["User"] == "2000" and _pyc_in_site(client, image) == []
    tag = f"dspark-patch/test-result:official-{uuid.uuid4().hex[:8]}"
    runs = []
    try:
        for via in ("layers", "container"):
            res = run("status", "--image", image, "--pull", "never", "--via", via, "--json")
            runs.append(res)
            assert res.returncode == 0, (via, res.stdout[-2000:], res.stderr)
            row = res.json["images"][0]
            assert (row["release"], row["patch_sets"]) == (release, {PATCH: "absent"}), via
            assert (row["added"], row["unexplained"], row["missing"], row["installer_findings"]) == ([], [], [], [])
            assert _installer_names(row["installer_metadata"]) == UV_FILES, via

        res = run("apply", "--image", image, "--pull", "never", "--tag", tag, "--json",
                  "--report-dir", str(tmp_path / "apply"))
        runs.append(res)
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr)
        audit = res.json
        assert audit["status"] == "applied" and audit["target"]["distribution"]["version"] == release
        assert _installer_names(audit["integrity"]["installer_metadata"]) == UV_FILES
        assert audit["integrity"]["added"] == [] and audit["probe"]["ok"]
        after = client.images.get(tag)
        assert after.attrs["RootFS"]["Layers"] == [*before.attrs["RootFS"]["Layers"], after.attrs["RootFS"]["Layers"][-1]]
        for key in ("User", "Entrypoint", "Cmd", "WorkingDir", "Env"):
            assert after.attrs["Config"][key] == before.attrs["Config"][key], key
        assert client.images.get(image).id == before.id
        variant = resolve(PATCH).variant_for(release)
        tag_name = "cpython-311"
        assert _pyc_in_site(client, tag) == sorted(
            f"{SITE}/{Path(p).parent}/__pycache__/{Path(p).stem}.{tag_name}.pyc" for p in variant.files)

        res = run("verify", "--image", tag, "--pull", "never", "--report-dir", str(tmp_path / "verify"))
        runs.append(res)
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr)
        assert "verdict: OK: verified" in res.stderr

        res = run("status", "--image", tag, "--image", image, "--image", fixture_image(), "--pull", "never", "--json")
        runs.append(res)
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr)
        rows = {i["ref"]: i for i in res.json["images"]}
        assert rows[tag]["patch_sets"] == {PATCH: "applied"} and rows[image]["patch_sets"] == {PATCH: "absent"}
        assert all((r["added"], r["unexplained"], r["missing"], r["installer_findings"]) == ([], [], [], [])
                   for r in rows.values())

        out = client.containers.run(tag, ["-c", IMPORT_ENVS], entrypoint="python3", network_disabled=True,
                                    remove=True)
        assert out.decode().split()[-5:] == ["2000", "0", "True", "True", "False"]
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
    assert len(runs) == 5 and left_by(client, *runs) == []
