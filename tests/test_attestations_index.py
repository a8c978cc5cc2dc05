"""`apply --platform all --push --sign-key` on the real two-platform fixture index (linux/amd64 +
linux/arm64/v8, arm64 under qemu) in a real loopback registry behind a login: one signed
attestation attached to each platform manifest and one to the new index, each found through the
fallback tag, and `verify --attestation` passing on all three without pulling a layer."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from dspark_patch.registry.index import OCI_INDEX, Registry, parse_index
from dspark_patch.registry.referrers import ARTIFACT_TYPE, fallback_tag
from tests.support.cli import run
from tests.support.index import publish_index, remove_images_from
from tests.support.keys import keyid, make_key
from tests.support.registry import docker_login, loopback_registry

# A registry of its own, and the arm64 image's probe runs under qemu: with the tests that
# switch qemu's handler off (scripts/test runs these tiers beside the engine tier).
pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.emulation]

USER, PASSWORD = "dspark", "s3cret-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """(host, index tag, audit, key pair, registry log): the index patched, pushed and signed once."""
    work = tmp_path_factory.mktemp("attest-index")
    keys = make_key(work / "keys", "ed", kind="ed25519")
    with loopback_registry(work / "registry", login=(USER, PASSWORD)) as host, pytest.MonkeyPatch.context() as mp:
        config = work / "docker-config"
        docker_login(config, host, USER, PASSWORD)
        mp.setenv("DOCKER_CONFIG", str(config))  # the engine's pushes and the oras client alike
        index = publish_index(host, kind=OCI_INDEX)
        tag = index.ref.rsplit(":", 1)[0] + ":0.33.0-dspark"
        try:
            res = run("apply", "--image", index.ref, "--platform", "all", "--tag", tag, "--push",
                      "--sign-key", str(keys.private), "--report-dir", str(work / "r"))
            assert res.returncode == 0, res.stderr[-3000:]
            yield host, tag, json.loads((work / "r" / "audit.json").read_text()), keys, work / "registry" / "registry.log"
        finally:
            remove_images_from(host)


def _skopeo_raw(ref: str) -> dict:
    done = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}",
                           f"docker://{ref}"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_one_attestation_per_platform_manifest_and_one_for_the_index(signed):
    host, tag, audit, keys, _ = signed
    repository = tag.rsplit(":", 1)[0]
    index = parse_index(Registry(host).fetch(tag))
    wanted = [audit["index"]["result_digest"], *(e.digest for e in index.images)]
    assert wanted[0] == index.manifest.digest
    assert [p["result_manifest"] for p in audit["platforms"]] == wanted[1:]
    attached = audit["attestations"]
    assert sorted(a["subject"] for a in attached) == sorted(f"{repository}@{d}" for d in wanted)
    assert {a["state"] for a in attached} == {"attached"} and {a["keyid"] for a in attached} == {keyid(keys.public)}
    for a in attached:
        digest = a["subject"].partition("@")[2]
        listing = _skopeo_raw(f"{repository}:{fallback_tag(digest)}")  # Debian's skopeo reads the fallback tag
        (entry,) = [m for m in listing["manifests"] if m["digest"] == a["artifact"]]
        assert entry["artifactType"] == ARTIFACT_TYPE
        assert _skopeo_raw(f"{repository}@{a['artifact']}")["subject"]["digest"] == digest


def test_verify_attestation_passes_on_the_index_and_both_platforms_without_a_layer(signed, tmp_path):
    host, tag, audit, keys, log = signed
    layers = set()
    for p in audit["platforms"]:
        manifest = _skopeo_raw(f"{tag.rsplit(':', 1)[0]}@{p['result_manifest']}")
        layers |= {la["digest"] for la in manifest["layers"]}
    before = log.read_text(errors="replace")
    res = run("verify", "--image", tag, "--attestation", "--key", str(keys.public), "--json",
              "--report-dir", str(tmp_path / "r"), env={"DOCKER_CONFIG": str(log.parent.parent / "docker-config")})
    assert res.returncode == 0, res.stderr
    assert [a["state"] for a in res.json["attestations"]] == ["valid"] * 3
    served = log.read_text(errors="replace")[len(before):]
    assert "/blobs/" in served and not [d for d in layers if d in served]
    other = make_key(tmp_path / "k", "other")
    wrong = run("verify", "--image", tag, "--attestation", "--key", str(other.public), "--platform", "linux/arm64",
                "--report-dir", str(tmp_path / "w"), env={"DOCKER_CONFIG": str(log.parent.parent / "docker-config")})
    assert "wrong key" in wrong.assert_clean_error(1)
