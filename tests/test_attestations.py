"""Signed attestations in a real loopback registry behind a login (Debian's docker-registry,
distribution 2.8: no referrers API, so the fallback tag): `apply --push --sign-key` attaches
one, `verify --attestation` checks it from manifests alone and refuses every forgery a user could
meet (no referrer, tampered payload, wrong key, an envelope copied onto another image, an
artifact re-pointed at another digest, a signed run that failed). Independent clients read the
same bytes: skopeo (the artifact and the fallback tag) and securesystemslib (the envelope)."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

from dspark_patch.attest.dsse import envelope, load_signer
from dspark_patch.registry import referrers
from dspark_patch.registry.index import OCI_MANIFEST, Registry, digest_of
from tests.support import images
from tests.support.cli import run
from tests.support.keys import keyid, make_key
from tests.support.registry import login_registry_in, put_image

pytestmark = pytest.mark.engine

USER, PASSWORD = "dspark", "s3cret-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory):
    """(host, DOCKER_CONFIG folder, the registry's log) of a registry asking for a login."""
    with login_registry_in(tmp_path_factory.mktemp("attest-registry"), USER, PASSWORD) as reg:
        # The source image is there already, as in a team's registry: the engine pushes only
        # the patched layer.
        put_image(images.fixture_image(), f"{reg.address}/dspark-patch/signed:source")
        yield reg


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"ec": make_key(folder, "ec", passphrase="correct horse"), "other": make_key(folder, "other"),
            "ed": make_key(folder, "ed", kind="ed25519")}


@pytest.fixture(scope="module")
def signed(login_registry, keys, tmp_path_factory):
    """`apply --image FIXTURE --tag HOST/... --push --sign-key` with an encrypted P-256 key, once."""
    host, config, _ = login_registry
    tag = f"{host}/dspark-patch/signed:{uuid.uuid4().hex[:8]}"
    out = tmp_path_factory.mktemp("signed")
    res = run("apply", "--image", images.fixture_image(), "--tag", tag, "--push", "--sign-key", str(keys["ec"].private),
              "--report-dir", str(out), env={"DOCKER_CONFIG": str(config), "DSPARK_PATCH_SIGN_PASSPHRASE": "correct horse"})
    yield tag, res, json.loads((out / "audit.json").read_text()), out
    subprocess.run(["docker", "rmi", "--force", tag], capture_output=True, check=False)


def _env(login_registry) -> dict[str, str]:
    return {"DOCKER_CONFIG": str(login_registry[1])}


def _skopeo_raw(ref: str) -> dict:
    done = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}",
                           f"docker://{ref}"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _blob(host: str, repository: str, digest: str) -> bytes:
    request = urllib.request.Request(f"http://{host}/v2/{repository}/blobs/{digest}")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read()


def _copy(src: str, dst: str) -> None:
    """A registry-side copy (same manifest digest in another repository), as `skopeo copy` makes it."""
    creds = f"{USER}:{PASSWORD}"
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", "--dest-tls-verify=false", "--src-creds", creds,
                    "--dest-creds", creds, f"docker://{src}", f"docker://{dst}"], capture_output=True, check=True)


def _pushed(audit: dict) -> tuple[str, str]:
    repository, _, digest = audit["result_image"]["repo_digest"].partition("@")
    return repository, digest


def test_apply_signs_and_attaches_the_statement_to_the_pushed_manifest(signed, keys, login_registry):
    tag, res, audit, out = signed
    assert res.returncode == 0, res.stderr
    repository, digest = _pushed(audit)
    (attached,) = audit["attestations"]
    assert attached["subject"] == f"{repository}@{digest}"
    assert attached["state"] == "attached" and attached["via"] == "fallback-tag"
    assert attached["keyid"] == keyid(keys["ec"].public)
    # A real client reads the fallback tag: an OCI index listing the artifact, which refers to the image.
    listing = _skopeo_raw(f"{repository}:sha256-{digest.removeprefix('sha256:')}")
    assert listing["mediaType"] == "application/vnd.oci.image.index.v1+json"
    (entry,) = [m for m in listing["manifests"] if m["digest"] == attached["artifact"]]
    assert entry["artifactType"] == referrers.ARTIFACT_TYPE
    assert entry["annotations"]["io.github.dspark-patch.patch.id"] == "dspark-skip-mtp-buffer"
    assert entry["annotations"]["io.github.dspark-patch.patch.variant"] == audit["patch"]["variant"]
    artifact = _skopeo_raw(f"{repository}@{attached['artifact']}")
    assert artifact["subject"]["digest"] == digest
    assert artifact["layers"][0]["mediaType"] == "application/vnd.dsse.envelope.v1+json"
    # Every form of the report names it.
    assert "### Signed attestations" in (out / "audit.md").read_text()
    assert f'name="attestation: {repository}@{digest}"' in (out / "junit.xml").read_text()


def test_securesystemslib_verifies_the_envelope_an_independent_client(signed, keys, login_registry):
    host = login_registry[0]
    audit = signed[2]
    repository, digest = _pushed(audit)
    path = repository.removeprefix(host + "/")
    artifact = _skopeo_raw(f"{repository}@{audit['attestations'][0]['artifact']}")
    body = _blob(host, path, artifact["layers"][0]["digest"])
    public = serialization.load_pem_public_key(keys["ec"].public.read_bytes())
    key = SSlibKey.from_crypto(public, keyid=keyid(keys["ec"].public))
    env = Envelope.from_dict(json.loads(body))
    assert keyid(keys["ec"].public) in env.verify([key], 1)
    statement = json.loads(env.payload)
    assert statement["predicateType"] == "https://github.com/dspark-patch/attestation/audit/v1"
    assert digest.removeprefix("sha256:") in [s["digest"]["sha256"] for s in statement["subject"]]
    assert statement["predicate"]["status"] == "applied"


def test_verify_attestation_passes_without_pulling_a_layer(signed, keys, login_registry, tmp_path):
    host, _, log = login_registry
    tag, audit = signed[0], signed[2]
    repository, digest = _pushed(audit)
    layers = [la["digest"] for la in _skopeo_raw(f"{repository}@{digest}")["layers"]]
    before_log = log.read_text(errors="replace")
    subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)  # the engine cannot help itself
    assert not _engine_has(audit["result_image"]["id"])
    res = run("verify", "--image", tag, "--attestation", "--key", str(keys["ec"].public), "--json",
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert res.returncode == 0, res.stderr
    (checked,) = res.json["attestations"]
    assert checked["state"] == "valid" and checked["subject"] == f"{repository}@{digest}"
    # apply ran the probe itself: proven, so a policy that requires a proven probe passes it
    # (publish's are claims: tests/test_publish_claims.py).
    assert checked["probe"] == "proven" and audit["probe"]["claimed_by"] == ""
    strict = run("verify", "--image", tag, "--attestation", "--key", str(keys["ec"].public), "--require-proven-probe",
                 "--report-dir", str(tmp_path / "strict"), env=_env(login_registry))
    assert strict.returncode == 0 and "probe run by the signing run" in strict.stderr, strict.stderr
    # No layer of the image was read from the registry, and the engine did not get the image.
    served = log.read_text(errors="replace")[len(before_log):]
    assert "/blobs/" in served  # the log does record blob reads: the envelope's
    assert not [d for d in layers if d in served]
    assert not _engine_has(audit["result_image"]["id"]) and not _engine_has(tag)


def _engine_has(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False).returncode == 0


def _one_line(res, code: int = 1) -> str:
    return res.assert_clean_error(code)


def test_verify_refuses_a_wrong_public_key(signed, keys, login_registry, tmp_path):
    tag = signed[0]
    res = run("verify", "--image", tag, "--attestation", "--key", str(keys["other"].public),
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert "wrong key" in _one_line(res)


def test_verify_finds_no_referrer_on_an_image_nobody_attested(signed, keys, login_registry, tmp_path):
    host = login_registry[0]
    copy = f"{host}/dspark-patch/unattested:{uuid.uuid4().hex[:8]}"
    _copy(signed[0], copy)
    res = run("verify", "--image", copy, "--attestation", "--key", str(keys["ec"].public),
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert "no referrer" in _one_line(res)


def _forge(host: str, ref: str, body: bytes, subject_ref: str | None = None) -> None:
    """Attach `body` as an envelope to `ref` (or list an artifact about `subject_ref` under it)."""
    registry = Registry(host)
    repository = ref.split("@")[0].rsplit(":", 1)[0]
    subject = registry.fetch(subject_ref or ref)
    if subject_ref is None:
        referrers.attach(registry, repository, subject, body, {})
        return
    # An artifact about another digest, listed under `ref`'s fallback tag (anyone can write that tag).
    target = registry.fetch(ref)
    envelope_digest = registry.push_blob(repository, body)
    registry.push_blob(repository, referrers.EMPTY_BLOB)
    manifest = referrers.artifact_manifest(subject=subject, envelope_digest=envelope_digest,
                                           envelope_size=len(body), annotations={})
    pushed, _ = registry.push_with_subject(f"{repository}@{digest_of(manifest)}", manifest, OCI_MANIFEST)
    referrers._add_to_fallback(registry, repository, target.digest, {  # writing the tag as a forger would
        "mediaType": pushed.media_type, "digest": pushed.digest, "size": len(manifest),
        "artifactType": referrers.ARTIFACT_TYPE})


def _signed_envelope(host: str, audit: dict) -> bytes:
    repository, _ = _pushed(audit)
    artifact = _skopeo_raw(f"{repository}@{audit['attestations'][0]['artifact']}")
    return _blob(host, repository.removeprefix(host + "/"), artifact["layers"][0]["digest"])


@pytest.fixture
def victim(signed, login_registry, monkeypatch):
    """A copy of the signed image in its own repository (same digest, no attestation yet)."""
    monkeypatch.setenv("DOCKER_CONFIG", str(login_registry[1]))
    ref = f"{login_registry[0]}/dspark-patch/victim-{uuid.uuid4().hex[:8]}:latest"
    _copy(signed[0], ref)
    return ref


def test_verify_refuses_a_tampered_payload(signed, keys, login_registry, victim, tmp_path):
    document = json.loads(_signed_envelope(login_registry[0], signed[2]))
    statement = json.loads(base64.b64decode(document["payload"]))
    statement["predicate"]["patch"]["variant"] = "someone-elses"
    document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    _forge(login_registry[0], victim, json.dumps(document).encode())
    res = run("verify", "--image", victim, "--attestation", "--key", str(keys["ec"].public),
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert "bad signature" in _one_line(res)


def test_verify_refuses_an_attestation_copied_onto_another_images_digest(signed, keys, login_registry, tmp_path, monkeypatch):
    host = login_registry[0]
    monkeypatch.setenv("DOCKER_CONFIG", str(login_registry[1]))
    other = f"{host}/dspark-patch/source-{uuid.uuid4().hex[:8]}:0.33.0"
    put_image(images.fixture_image(), other, login_registry[1])
    _forge(host, other, _signed_envelope(host, signed[2]))  # a valid signature, about another digest
    res = run("verify", "--image", other, "--attestation", "--key", str(keys["ec"].public),
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert "subject mismatch" in _one_line(res)


def test_verify_refuses_an_artifact_re_pointed_at_another_digest(signed, keys, login_registry, victim, tmp_path):
    host = login_registry[0]
    other = f"{host}/dspark-patch/victim-{uuid.uuid4().hex[:8]}:other"
    _copy(f"{signed[0]}", other)
    source = f"{host}/dspark-patch/source-{uuid.uuid4().hex[:8]}:0.33.0"
    put_image(images.fixture_image(), source, login_registry[1])
    victim_repo = victim.rsplit(":", 1)[0]
    _copy(source, f"{victim_repo}:unpatched")
    # The victim's fallback tag lists an artifact whose subject is the unpatched image.
    _forge(host, victim, _signed_envelope(host, signed[2]), subject_ref=f"{victim_repo}:unpatched")
    res = run("verify", "--image", victim, "--attestation", "--key", str(keys["ec"].public),
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert "subject mismatch" in _one_line(res)


def test_verify_refuses_a_signed_statement_whose_predicate_says_failed(signed, keys, login_registry, victim, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_PATCH_SIGN_PASSPHRASE", "correct horse")
    document = json.loads(_signed_envelope(login_registry[0], signed[2]))
    statement = json.loads(base64.b64decode(document["payload"]))
    statement["predicate"]["probe"]["ok"] = False
    _forge(login_registry[0], victim, envelope(statement, load_signer(Path(keys["ec"].private))))  # signed by the right key
    res = run("verify", "--image", victim, "--attestation", "--key", str(keys["ec"].public),
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert "predicate says failed" in _one_line(res)


def test_status_with_a_key_shows_attested_yes_no_invalid_per_image(signed, keys, login_registry, tmp_path):
    host, config, _ = login_registry
    tag = signed[0]
    subprocess.run(["docker", "--config", str(config), "pull", "--quiet", tag], capture_output=True, check=True)
    bare = f"{host}/dspark-patch/bare-{uuid.uuid4().hex[:8]}:latest"
    _copy(tag, bare)  # the same image under a name nobody attested
    subprocess.run(["docker", "--config", str(config), "pull", "--quiet", bare], capture_output=True, check=True)
    try:
        res = run("status", "--image", tag, "--image", bare, "--key", str(keys["ec"].public), "--json",
                  "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
        assert res.returncode == 0, res.stderr
        rows = {row["ref"]: row for row in res.json["images"]}
        assert rows[tag]["patch_sets"]["dspark-skip-mtp-buffer"] == "applied"
        assert rows[tag]["attested"] == {"dspark-skip-mtp-buffer": "yes"}
        assert rows[bare]["attested"] == {"dspark-skip-mtp-buffer": "no"}
        assert "no referrer" in rows[bare]["attested_detail"][0]
        assert "attested" in (tmp_path / "r" / "status.md").read_text()
        assert "attested dspark-skip-mtp-buffer: yes" in (tmp_path / "r" / "junit.xml").read_text()
        # Another team's key: the attestation there does not hold for it, which is a finding.
        other = run("status", "--image", tag, "--key", str(keys["other"].public), "--json", env=_env(login_registry))
        assert other.returncode == 1, other.stderr
        (row,) = other.json["images"]
        assert row["attested"] == {"dspark-skip-mtp-buffer": "invalid"} and "wrong key" in row["attested_detail"][0]
    finally:
        subprocess.run(["docker", "rmi", bare], capture_output=True, check=False)


def test_the_fallback_tag_keeps_the_entries_other_tools_put_there(signed, keys, login_registry, victim, tmp_path):
    host = login_registry[0]
    registry = Registry(host)
    repository = victim.rsplit(":", 1)[0]
    subject = registry.fetch(victim)
    # Another tool's referrer (an SBOM, say) is already listed, with the index's own annotations.
    sbom = b'{"spdxVersion": "SPDX-2.3"}'
    registry.push_blob(repository, sbom)
    registry.push_blob(repository, referrers.EMPTY_BLOB)
    theirs = referrers.artifact_manifest(subject=subject, envelope_digest=digest_of(sbom), envelope_size=len(sbom),
                                         annotations={})
    pushed, _ = registry.push_with_subject(f"{repository}@{digest_of(theirs)}", theirs, OCI_MANIFEST)
    entry = {"mediaType": OCI_MANIFEST, "digest": pushed.digest, "size": len(theirs), "artifactType": "application/spdx+json"}
    listing = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [entry],
               "annotations": {"org.example.owner": "sbom-tool"}}
    tag = f"{repository}:{referrers.fallback_tag(subject.digest)}"
    registry.push(tag, json.dumps(listing).encode(), "application/vnd.oci.image.index.v1+json")
    done = referrers.attach(registry, repository, subject, _signed_envelope(host, signed[2]), {})
    after = _skopeo_raw(tag)
    assert [m["digest"] for m in after["manifests"]] == [pushed.digest, done.artifact]
    assert after["manifests"][0] == entry and after["annotations"] == {"org.example.owner": "sbom-tool"}
    res = run("verify", "--image", victim, "--attestation", "--key", str(keys["ec"].public),
              "--report-dir", str(tmp_path / "r"), env=_env(login_registry))
    assert res.returncode == 0, res.stderr


def test_a_fallback_tag_that_holds_something_else_is_left_as_it_is(signed, login_registry, victim):
    from dspark_patch.registry.index import RegistryRefused

    host = login_registry[0]
    registry = Registry(host)
    repository = victim.rsplit(":", 1)[0]
    subject = registry.fetch(victim)
    tag = f"{repository}:{referrers.fallback_tag(subject.digest)}"
    squatter = registry.push(tag, subject.body, subject.media_type)  # an image manifest, not an index
    with pytest.raises(RegistryRefused, match="left as it is"):
        referrers.attach(registry, repository, subject, _signed_envelope(host, signed[2]), {})
    assert registry.fetch(tag).digest == squatter.digest  # not overwritten
    assert registry.fetch(victim).digest == subject.digest  # the image keeps its tag
