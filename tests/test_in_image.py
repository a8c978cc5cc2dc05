"""A CI job that runs inside the serving image (no Docker daemon): dspark-patch installed with
`pip install --target` beside the image's packages (support/tool_folder.py), mounted read-only,
run with the image's own python as `python3 -m dspark_patch apply --root SITE --layer-out FILE`.

On the official shape (uv, no bytecode, USER 2000): as root, the run applies with the image's
interpreter (plan, hashes, integrity against the published wheel, compile, probe) and writes the
layer, which holds exactly what `apply --image` appends to the same image; as the image's own
user, who cannot write dist-packages, it is one line naming the fix, and nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from dspark_patch.patchset import resolve
from tests.support.cli import run
from tests.support.images import official_image
from tests.support.tool_folder import tool_folder

pytestmark = pytest.mark.engine

SITE = "/usr/local/lib/python3.11/dist-packages"
VARIANT = resolve("dspark-skip-mtp-buffer").variant_for("0.33.0")


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tool_folder(tmp_path_factory.mktemp("tool") / "dspark-patch")


def _job(tool: Path, out: Path, script: str, *, user: str | None, image: str | None = None) -> subprocess.CompletedProcess[str]:
    """`script` (bash) in a container of `image` (default: the official one), as `user` (None: the image's own),
    with the tool at /opt/dspark-patch (read-only) and `out` at /out; networking off."""
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o777)
    argv = ["docker", "run", "--rm", "--network", "none", "--name", f"dspark-test-in-image-{uuid.uuid4().hex[:10]}",
            "-v", f"{tool}:/opt/dspark-patch:ro", "-v", f"{out}:/out", "-e", "PYTHONPATH=/opt/dspark-patch",
            "--entrypoint", "bash", *(("--user", user) if user else ()), image or official_image(), "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


APPLY = f"python3 -m dspark_patch apply --root {SITE} --layer-out /out/layer.tar --report-dir /out/r"


def test_a_job_inside_the_official_image_writes_the_layer_apply_image_appends(tool: Path, tmp_path: Path) -> None:
    done = _job(tool, tmp_path / "out", APPLY, user="0")
    assert done.returncode == 0, done.stderr[-3000:]
    audit = json.loads((tmp_path / "out/r/audit.json").read_text())
    assert audit["status"] == "applied" and audit["target"]["distribution"]["location"] == SITE
    assert audit["target"]["python"] == "/usr/bin/python3"   # the image's own interpreter ran it all
    assert audit["probe"]["ok"] and audit["compile"]["ok"]
    integrity = audit["integrity"]
    assert integrity["checked"] > 5000 and integrity["mismatched"] == integrity["added"] == []
    layer = (tmp_path / "out/layer.tar").read_bytes()
    assert audit["layer"]["diff_id"] == "sha256:" + hashlib.sha256(layer).hexdigest()
    with tarfile.open(tmp_path / "out/layer.tar") as tar:
        for rel, reviewed in VARIANT.files.items():
            body = tar.extractfile(f"{SITE.lstrip('/')}/{rel}")
            assert body is not None and hashlib.sha256(body.read()).hexdigest() == reviewed.post_sha256
        owners = {(m.uid, m.gid) for m in tar.getmembers()}
    assert owners == {(0, 0)}   # as the image has them (uv installed as root)

    # The same source through the engine: the same entries, kinds and paths.
    tag = f"dspark-patch-test/in-image:{uuid.uuid4().hex[:10]}"
    try:
        res = run("apply", "--image", official_image(), "--tag", tag, "--pull", "never", "--no-probe",
                  "--report-dir", str(tmp_path / "engine"))
        assert res.returncode == 0, res.stderr[-2000:]
        engine = json.loads((tmp_path / "engine/audit.json").read_text())["layer"]["changes"]
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
    bytecode = [c for c in audit["layer"]["changes"] if c["path"].endswith(".pyc")]
    assert len(bytecode) == len(VARIANT.files) and all(c["kind"] == "A" for c in bytecode)  # uv wrote none
    assert sorted(map(str, audit["layer"]["changes"])) == sorted(map(str, engine))


def test_as_the_images_own_user_it_is_one_line_naming_the_fix_and_nothing_is_written(tool: Path, tmp_path: Path) -> None:
    before = f"sha256sum {SITE}/vllm/envs.py; ls -a {SITE} | wc -l"
    done = _job(tool, tmp_path / "out", f"{before}; {APPLY}; echo rc=$?; {before}", user=None)
    lines = done.stdout.splitlines()
    assert "rc=3" in lines, (done.stdout, done.stderr[-2000:])
    at = lines.index("rc=3")
    assert lines[:at] == lines[at + 1:]   # envs.py and the site folder's listing as they were
    errors = [line for line in done.stderr.splitlines() if line.startswith("dspark-patch: error:")]
    assert len(errors) == 1 and "Permission denied" in errors[0] and "Traceback" not in done.stderr
    assert "run it as a user who can" in done.stderr and "USER root" in done.stderr
    assert not (tmp_path / "out/layer.tar").exists()
