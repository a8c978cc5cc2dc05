"""DSSE signing and checking, key handling, and the referrers API path (on a tiny loopback fake:
the real test registry, distribution 2.8, has no referrers API). No Docker engine needed."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

from dspark_patch.attest.check import Subject, check
from dspark_patch.attest.dsse import PASSPHRASE_ENV, AttestationInvalid, envelope, load_signer, load_verifier, open_envelope, pae
from dspark_patch.errors import BadInput
from dspark_patch.patchset import resolve
from dspark_patch.registry import referrers
from dspark_patch.registry.index import OCI_MANIFEST, Registry, digest_of
from tests.support.cli import run
from tests.support.keys import keyid, make_key
from tests.support.referrers_fake import referrers_registry

STATEMENT = {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "x", "digest": {"sha256": "ab" * 32}}],
             "predicateType": "https://example.test/p", "predicate": {"ok": True}}


def test_pae_is_the_dsse_spec_encoding():
    # The example in the DSSE protocol document.
    assert pae("http://example.com/HelloWorld", b"hello world") == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


@pytest.mark.parametrize("kind", ["ec", "ed25519"])
def test_an_envelope_verifies_with_securesystemslib_and_round_trips(tmp_path, kind):
    pair = make_key(tmp_path, "k", kind=kind)
    signer = load_signer(pair.private)
    assert signer.keyid == keyid(pair.public)  # the id anyone with the public key computes
    body = envelope(STATEMENT, signer)
    assert open_envelope(body, load_verifier(pair.public)) == STATEMENT
    public = serialization.load_pem_public_key(pair.public.read_bytes())
    key = SSlibKey.from_crypto(public, keyid=signer.keyid)
    verified = Envelope.from_dict(json.loads(body)).verify([key], 1)
    assert list(verified) == [signer.keyid]


def test_tampered_payload_wrong_key_and_swapped_type_are_refused(tmp_path):
    pair, other = make_key(tmp_path, "k"), make_key(tmp_path, "o", kind="ed25519")
    doc = json.loads(envelope(STATEMENT, load_signer(pair.private)))
    tampered = dict(doc, payload=base64.b64encode(json.dumps({**STATEMENT, "predicate": {"ok": False}}).encode()).decode())
    with pytest.raises(AttestationInvalid, match="bad signature"):
        open_envelope(json.dumps(tampered).encode(), load_verifier(pair.public))
    with pytest.raises(AttestationInvalid, match="wrong key"):
        open_envelope(json.dumps(doc).encode(), load_verifier(other.public))
    with pytest.raises(AttestationInvalid, match="payloadType"):
        open_envelope(json.dumps(dict(doc, payloadType="text/plain")).encode(), load_verifier(pair.public))
    with pytest.raises(AttestationInvalid, match="not a DSSE envelope"):
        open_envelope(b"\x00garbage", load_verifier(pair.public))


def test_an_encrypted_key_opens_with_the_passphrase_from_the_environment(tmp_path, monkeypatch):
    pair = make_key(tmp_path, "k", passphrase="s3cret")
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    with pytest.raises(BadInput, match=PASSPHRASE_ENV):
        load_signer(pair.private)
    monkeypatch.setenv(PASSPHRASE_ENV, "wrong")
    with pytest.raises(BadInput, match="does not open it"):
        load_signer(pair.private)
    monkeypatch.setenv(PASSPHRASE_ENV, "s3cret")
    assert load_signer(pair.private).keyid == keyid(pair.public)


def test_keys_other_than_p256_and_ed25519_are_bad_input(tmp_path):
    for name, key in (("rsa", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
                      ("p384", ec.generate_private_key(ec.SECP384R1()))):
        path = tmp_path / f"{name}.key"
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
        with pytest.raises(BadInput, match="only ECDSA P-256 and Ed25519"):
            load_signer(path)
    with pytest.raises(BadInput, match="no such file"):
        load_signer(tmp_path / "absent.key")
    (tmp_path / "junk.pub").write_text("not a key\n")
    with pytest.raises(BadInput, match="not a PEM public key"):
        load_verifier(tmp_path / "junk.pub")


def test_the_cli_refuses_sign_key_without_push_and_attestation_without_key(tmp_path):
    pair = make_key(tmp_path, "k")
    res = run("apply", "--image", "127.0.0.1:1/none:1", "--sign-key", str(pair.private), "--report-dir", str(tmp_path / "a"))
    assert "--push" in res.assert_clean_error(2)
    res = run("verify", "--image", "127.0.0.1:1/none:1", "--attestation", "--report-dir", str(tmp_path / "b"))
    assert "--key" in res.assert_clean_error(2)
    res = run("verify", "--root", str(tmp_path), "--attestation", "--key", str(pair.public), "--report-dir", str(tmp_path / "c"))
    assert "--image" in res.assert_clean_error(2)
    res = run("apply", "--image", "127.0.0.1:1/none:1", "--tag", "127.0.0.1:1/none:2", "--push",
              "--sign-key", str(tmp_path / "absent.key"), "--report-dir", str(tmp_path / "d"))
    assert "absent.key: no such file" in res.assert_clean_error(2)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_signing_key_group_or_others_may_open_is_refused_unless_allowed(tmp_path, mode):
    pair = make_key(tmp_path, "k")
    pair.private.chmod(mode)
    res = run("apply", "--image", "127.0.0.1:1/none:1", "--tag", "127.0.0.1:1/none:2", "--push",
              "--sign-key", str(pair.private), "--report-dir", str(tmp_path / "r"),
              env={"DOCKER_HOST": "unix:///nonexistent"})
    line = res.assert_clean_error(2)   # before any work: exit 3 would mean the engine was tried
    assert f"mode {mode:04o}" in line and "chmod 600" in line and "--allow-open-key" in line
    assert load_signer(pair.private, allow_open=True).keyid == keyid(pair.public)
    pair.private.chmod(0o600)
    assert load_signer(pair.private).keyid == keyid(pair.public)


def test_a_registry_with_the_referrers_api_is_used_and_no_fallback_tag_is_written(tmp_path):
    pair = make_key(tmp_path, "k")
    with referrers_registry() as (host, store):
        registry = Registry(host)
        repository = f"{host}/team/image"
        config = registry.push_blob(repository, b"{}")
        image = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
                            "layers": []}).encode()
        subject = registry.push(f"{repository}:1", image, OCI_MANIFEST)
        statement = dict(STATEMENT, subject=[{"name": repository, "digest": {"sha256": subject.digest[7:]}}])
        done = referrers.attach(registry, repository, subject, envelope(statement, load_signer(pair.private)), {})
        assert done.via == "referrers-api"
        assert not any("sha256-" in r for r in store.requests if r.startswith("PUT"))
        listed, via = referrers.find(registry, repository, subject.digest)
        assert via == "referrers-api" and [d["digest"] for d in listed] == [done.artifact]
        # The statement is not a dspark-patch audit, so the check finds it and says why it does not hold.
        found = check(registry, Subject(repository=repository, digest=subject.digest), load_verifier(pair.public),
                      resolve(None))
        assert found.state == "invalid" and found.via == "referrers-api" and "not a dspark-patch audit" in found.detail
        assert digest_of(image) == subject.digest


def test_hostile_referrers_are_refused_with_a_reason_never_a_crash(tmp_path):
    """Artifacts anyone could push (the referrers list is a hint): odd shapes, wrong digests, a
    huge claimed size, an envelope that is not one. Each is `invalid` with its reason."""
    pair = make_key(tmp_path, "k")
    with referrers_registry() as (host, store):
        registry = Registry(host)
        repository = f"{host}/team/image"
        config = registry.push_blob(repository, b"{}")
        image = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
                            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2}}).encode()
        subject = registry.push(f"{repository}:1", image, OCI_MANIFEST)
        described = {"mediaType": OCI_MANIFEST, "digest": subject.digest, "size": len(image)}
        junk = registry.push_blob(repository, b"not an envelope")
        shapes = [
            {"layers": 5},
            {"layers": [{"mediaType": referrers.ENVELOPE_MEDIA_TYPE, "digest": "../../etc/passwd", "size": 3}]},
            {"layers": [{"mediaType": referrers.ENVELOPE_MEDIA_TYPE, "digest": junk, "size": 10**12}]},
            {"layers": [{"mediaType": referrers.ENVELOPE_MEDIA_TYPE, "digest": junk, "size": 15}]},
        ]
        for i, extra in enumerate(shapes):
            body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": referrers.ARTIFACT_TYPE,
                               "subject": described, "annotations": {"n": str(i)}, **extra}).encode()
            registry.push(f"{repository}:{digest_of(body).replace(':', '-')[:40]}", body, OCI_MANIFEST)
        found = check(registry, Subject(repository=repository, digest=subject.digest), load_verifier(pair.public),
                      resolve(None))
        assert found.state == "invalid" and "and 3 more invalid" in found.detail
        assert "not a DSSE envelope" in found.detail  # the newest is looked at first
