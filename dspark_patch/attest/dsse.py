"""DSSE envelopes (https://github.com/secure-systems-lab/dsse/blob/master/envelope.md) signed and
checked with `cryptography`: ECDSA P-256 (SHA-256, DER signature, as cosign writes) or Ed25519.

Keys are PEM: a PKCS#8 private key to sign (the kind `openssl genpkey` and `cosign import-key-pair`
take), encrypted or not, its passphrase from DSPARK_PATCH_SIGN_PASSPHRASE; a SubjectPublicKeyInfo
public key to check. The `keyid` is the sha256 (hex) of the public key's DER SubjectPublicKeyInfo,
so anyone holding the public key computes the same id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from dspark_patch import ownfiles
from dspark_patch.errors import BadInput, CheckFailed

PAYLOAD_TYPE = "application/vnd.in-toto+json"
PASSPHRASE_ENV = "DSPARK_PATCH_SIGN_PASSPHRASE"

Algorithm = Literal["ecdsa-p256-sha256", "ed25519"]
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


class AttestationInvalid(CheckFailed):
    """An attestation that does not hold: no referrer, bad signature, wrong key, wrong subject..."""

    kind = "attestation-invalid"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, so the type cannot be swapped."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def keyid_of(key: PublicKey) -> str:
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _algorithm(key: PublicKey | PrivateKey, path: Path) -> Algorithm:
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return "ecdsa-p256-sha256"
    raise BadInput(f"{path}: a {type(key).__name__.removeprefix('_')} key; only ECDSA P-256 and Ed25519 are supported",
                   hint="make one with `openssl genpkey -algorithm ed25519` or `-algorithm EC -pkeyopt ec_paramgen_curve:P-256`")


KEY_LIMIT = 1 << 20   # a PEM key is a few hundred bytes


def _read(path: Path, what: str) -> bytes:
    return ownfiles.read_regular(path, limit=KEY_LIMIT, what=what)


@dataclass(frozen=True, kw_only=True)
class Signer:
    keyid: str
    algorithm: Algorithm
    _key: PrivateKey = field(repr=False)

    def sign(self, data: bytes) -> bytes:
        if isinstance(self._key, ed25519.Ed25519PrivateKey):
            return self._key.sign(data)
        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))


@dataclass(frozen=True, kw_only=True)
class Verifier:
    keyid: str
    algorithm: Algorithm
    _key: PublicKey = field(repr=False)

    def valid(self, signature: bytes, data: bytes) -> bool:
        try:
            if isinstance(self._key, ed25519.Ed25519PublicKey):
                self._key.verify(signature, data)
            else:
                self._key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True


def _read_private(path: Path, *, allow_open: bool) -> bytes:
    """The key file's bytes, refused (like ssh) when its mode lets group or others read or write
    it: whoever can read the key can sign attestations the cluster's policy admits, so a key
    others can read is a key already shared. The mode is read from the file opened."""
    data, mode = ownfiles.read_regular_with_mode(path, limit=KEY_LIMIT, what="--sign-key")
    if mode & 0o077 and not allow_open:
        raise BadInput(f"--sign-key {path} is open to group or others (mode {stat.S_IMODE(mode):04o}): "
                       "a signing key must be readable by its owner only",
                       hint=f"chmod 600 {path}, or pass --allow-open-key")
    return data


def load_signer(path: Path, *, allow_open: bool = False) -> Signer:
    """The private key at `path` (PEM, PKCS#8; encrypted: passphrase from DSPARK_PATCH_SIGN_PASSPHRASE);
    one group or others may read is refused unless `allow_open`."""
    pem = _read_private(path, allow_open=allow_open)
    passphrase = os.environ.get(PASSPHRASE_ENV)
    try:
        key = serialization.load_pem_private_key(pem, password=passphrase.encode() if passphrase else None)
    except TypeError:
        # Raised both for an encrypted key without a passphrase and a plain key given one.
        if passphrase:
            raise BadInput(f"--sign-key {path} is not encrypted, but {PASSPHRASE_ENV} is set",
                           hint=f"unset {PASSPHRASE_ENV}") from None
        raise BadInput(f"--sign-key {path} is encrypted and {PASSPHRASE_ENV} is not set",
                       hint=f"put the key's passphrase in the environment variable {PASSPHRASE_ENV}") from None
    except (ValueError, UnsupportedAlgorithm):
        if passphrase and b"ENCRYPTED" in pem:
            raise BadInput(f"--sign-key {path}: the passphrase in {PASSPHRASE_ENV} does not open it") from None
        raise BadInput(f"--sign-key {path} is not a PEM private key",
                       hint="give a PKCS#8 PEM private key (ECDSA P-256 or Ed25519)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise BadInput(f"--sign-key {path}: a {type(key).__name__.removeprefix('_')}; only ECDSA P-256 and Ed25519 are supported")
    algorithm = _algorithm(key, path)
    return Signer(keyid=keyid_of(key.public_key()), algorithm=algorithm, _key=key)


def load_verifier(path: Path) -> Verifier:
    """The public key at `path` (PEM SubjectPublicKeyInfo, as `openssl pkey -pubout` writes)."""
    pem = _read(path, "--key")
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm):
        raise BadInput(f"--key {path} is not a PEM public key",
                       hint="give the public half of the signing key (openssl pkey -in KEY -pubout)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
        raise BadInput(f"--key {path}: only ECDSA P-256 and Ed25519 public keys are supported")
    algorithm = _algorithm(key, path)
    return Verifier(keyid=keyid_of(key), algorithm=algorithm, _key=key)


def envelope(statement: dict[str, Any], signer: Signer) -> bytes:
    """The signed envelope of `statement`, as JSON bytes (what is pushed as the artifact's layer)."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    signature = signer.sign(pae(PAYLOAD_TYPE, payload))
    document = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": signer.keyid, "sig": base64.b64encode(signature).decode()}],
    }
    return json.dumps(document, indent=2).encode() + b"\n"


def open_envelope(body: bytes, verifier: Verifier) -> dict[str, Any]:
    """The statement inside a DSSE envelope, once a signature by `verifier`'s key holds.

    Hostile input: every field is checked for shape before use; anything else is refused with
    the reason (`AttestationInvalid`, exit 1)."""
    if ownfiles.json_depth(body) > ownfiles.JSON_DEPTH:
        raise AttestationInvalid(f"the attestation is not a DSSE envelope (JSON nested more than {ownfiles.JSON_DEPTH} deep)")
    try:
        document = json.loads(body)
    except ValueError:
        raise AttestationInvalid("the attestation is not a DSSE envelope (not JSON)") from None
    if not isinstance(document, dict) or not isinstance(document.get("signatures"), list):
        raise AttestationInvalid("the attestation is not a DSSE envelope (no signatures)")
    payload_type = document.get("payloadType")
    if payload_type != PAYLOAD_TYPE:
        raise AttestationInvalid(f"the envelope's payloadType is {payload_type!r}, not {PAYLOAD_TYPE}")
    try:
        payload = base64.b64decode(str(document.get("payload", "")), validate=True)
    except binascii.Error:
        raise AttestationInvalid("the envelope's payload is not base64") from None
    signed = pae(PAYLOAD_TYPE, payload)
    keyids = []
    for entry in document["signatures"]:
        if not isinstance(entry, dict):
            continue
        keyids.append(str(entry.get("keyid", "")))
        try:
            signature = base64.b64decode(str(entry.get("sig", "")), validate=True)
        except binascii.Error:
            continue
        # The keyid is only a hint: a signature counts when it verifies with the given key.
        if verifier.valid(signature, signed):
            if ownfiles.json_depth(payload) > ownfiles.JSON_DEPTH:
                raise AttestationInvalid(f"the signed payload is JSON nested more than {ownfiles.JSON_DEPTH} deep")
            try:
                statement = json.loads(payload)
            except ValueError:
                raise AttestationInvalid("the signed payload is not JSON") from None
            if not isinstance(statement, dict):
                raise AttestationInvalid("the signed payload is not an in-toto statement")
            return statement
    if verifier.keyid in keyids:
        raise AttestationInvalid(f"bad signature: the envelope signed by key {verifier.keyid[:16]} does not verify "
                                 "(its payload or signature was changed)")
    named = ", ".join(k[:16] for k in keyids) or "no key"
    raise AttestationInvalid(f"wrong key: the envelope is signed by {named}, not by --key ({verifier.keyid[:16]})")
