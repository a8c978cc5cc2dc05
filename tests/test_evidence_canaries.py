"""No secret of the host, the image, the docker config or the checkout's location reaches any
evidence an image run writes or pushes (docs/evidence.md), on the real engine and a real
registry behind a login.

Canaries everywhere a secret or a private detail can come from: the host's environment
(`SECRET_TOKEN`, `HF_TOKEN`), the home folder's name (HOME, under which the docker config, the
patch set's checkout and the signing key lie), the registry password in that docker config, the
signing key's passphrase, and the source image's Env, label and build argument. Then every
command that writes evidence about an image: `apply --push --sign-key`, `verify` (the image and
its attestation), `status` on the three routes, two shards and `report merge`. No canary may be
in any file written, nor in any manifest or blob of the repository in the registry (the pushed
attestation and its fallback tag included). The local-tree commands are in test_evidence.py.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import urllib.request
import uuid
from pathlib import Path

import docker
import pytest

from dspark_patch.patchset import resolve
from tests.support import images
from tests.support.cli import run
from tests.support.keys import make_key
from tests.support.registry import docker_login, loopback_registry

pytestmark = pytest.mark.engine

CANARY = "CANARY9"
USER, PASSWORD = "dspark", f"{CANARY}-pw-{uuid.uuid4().hex[:6]}"
ACCEPT = ", ".join(["application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json"])


def _written(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file()}


def _get(host: str, path: str, accept: str | None = None) -> bytes:
    request = urllib.request.Request(f"http://{host}/v2/{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=30) as resp:
        return resp.read()


def _attached_text(host: str, repository: str, image_tag: str) -> tuple[list[str], str]:
    """(the repository's tags, and, as text, every manifest reachable from its tags other than the
    image's own, with every small blob they name: what the run attached beside the image)."""
    tags = json.loads(_get(host, f"{repository}/tags/list"))["tags"] or []
    texts = []
    seen: set[str] = set()
    pending = [t for t in tags if t != image_tag]
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        body = _get(host, f"{repository}/manifests/{ref}", ACCEPT)
        texts.append(body.decode(errors="replace"))
        doc = json.loads(body)
        pending += [m["digest"] for m in doc.get("manifests", [])]
        for blob in [doc.get("config") or {}, *doc.get("layers", [])]:
            # configs, envelopes and predicates are small; image layers are the image itself
            if blob.get("digest") and blob.get("size", 0) < (1 << 20):
                texts.append(_get(host, f"{repository}/blobs/{blob['digest']}").decode(errors="replace"))
    return tags, "\n".join(texts)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("home") / f"{CANARY}-alice"


def test_no_canary_reaches_any_evidence_of_an_image_run(home: Path, tmp_path: Path) -> None:
    client = docker.from_env()
    config = home / ".docker"
    checkout = home / f"{CANARY}-checkout" / "dspark-skip-mtp-buffer"
    shutil.copytree(resolve("dspark-skip-mtp-buffer").source, checkout)
    key = make_key(home / "keys", "signing", passphrase=f"{CANARY}-passphrase")
    env = {"HOME": str(home), "DOCKER_CONFIG": str(config), "SECRET_TOKEN": f"{CANARY}-host-env",
           "HF_TOKEN": f"hf_{CANARY}_token", "DSPARK_PATCH_SIGN_PASSPHRASE": f"{CANARY}-passphrase"}
    dockerfile = (f"FROM {images.fixture_image()}\nARG BUILD_SECRET\nENV SECRET_TOKEN={CANARY}-image-env\n"
                  f"LABEL team.secret={CANARY}-label\nRUN test -n \"$BUILD_SECRET\"\n")
    source, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), network_mode="none", rm=True,
                                    forcerm=True, buildargs={"BUILD_SECRET": f"{CANARY}-build-arg"})
    # The canaries are really in the image: in its Env, its labels and its history.
    assert CANARY in json.dumps(source.attrs["Config"]) and CANARY in json.dumps(source.history())
    reports = tmp_path / "reports"
    with loopback_registry(tmp_path / "registry", login=(USER, PASSWORD)) as host:
        docker_login(config, host, USER, PASSWORD)
        login = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        assert login in (config / "config.json").read_text()  # the password is in the docker config
        repository = f"dspark-patch/canary-{uuid.uuid4().hex[:6]}"
        tag = f"{host}/{repository}:patched"
        try:
            res = run("apply", "--image", source.id, "--patch", str(checkout), "--tag", tag, "--push",
                      "--sign-key", str(key.private), "--report-dir", str(reports / "apply"), env=env)
            assert res.returncode == 0, res.stderr[-3000:]
            commands = {
                "verify": ["verify", "--image", tag, "--patch", str(checkout), "--no-probe"],
                "verify-attestation": ["verify", "--image", tag, "--attestation", "--key", str(key.public)],
                "status-container": ["status", "--image", tag, "--via", "container"],
                "status-layers": ["status", "--image", tag, "--via", "layers"],
                "status-registry": ["status", "--image", tag, "--via", "registry"],
                "shard-0": ["status", "--image", tag, "--image", source.id, "--shard", "0/2", "--via", "container"],
                "shard-1": ["status", "--image", tag, "--image", source.id, "--shard", "1/2", "--via", "container"],
            }
            for name, args in commands.items():
                res = run(*args, "--pull", "never", "--report-dir", str(reports / name), env=env) \
                    if name != "status-registry" else run(*args, "--report-dir", str(reports / name), env=env)
                assert res.returncode == 0, (name, res.stderr[-3000:])  # (the source is clean: not patched)
            merged = reports / "merged"
            merged.mkdir()
            res = run("report", "merge", str(reports / "shard-0" / "status.json"), str(reports / "shard-1" / "status.json"),
                      "--output", str(merged / "status.json"), env=env)
            assert res.returncode == 0, res.stderr[-3000:]
            tags, attached = _attached_text(host, repository, "patched")
        finally:
            subprocess.run(["docker", "rmi", "--force", tag, source.id], capture_output=True, check=False)
    written = _written(reports)
    # Every command wrote its evidence (an attestation too), and none of it holds a canary, nor
    # the docker config's login as it is stored there.
    assert {"apply/audit.json", "apply/attestation.intoto.json", "verify/audit.json", "verify-attestation/audit.json",
            "status-container/status.json", "status-layers/status.json", "status-registry/status.json",
            "merged/status.json"} <= set(written), sorted(written)
    assert [name for name, text in written.items() if CANARY in text or login in text] == []
    # Beside the image's own tag (the image is the user's, its Env and labels with it), the
    # registry holds what the run attached: the signed attestation, under its fallback tag.
    assert len(tags) >= 2 and "patched" in tags, tags
    assert "in-toto" in attached, attached[:500]
    assert CANARY not in attached and login not in attached
