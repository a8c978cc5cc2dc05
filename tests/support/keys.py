"""Signing keys made by the test with openssl, the way a user makes them (never committed)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path


def make_key(folder: Path, name: str, *, kind: str = "ec", passphrase: str | None = None) -> KeyPair:
    """An ECDSA P-256 (`ec`) or Ed25519 (`ed25519`) PKCS#8 PEM key pair, the private one
    AES-encrypted when `passphrase` is given."""
    folder.mkdir(parents=True, exist_ok=True)
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    algorithm = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"] if kind == "ec" else ["-algorithm", "ed25519"]
    secret = ["-aes-256-cbc", "-pass", f"pass:{passphrase}"] if passphrase else []
    subprocess.run(["openssl", "genpkey", *algorithm, *secret, "-out", str(private)], check=True, capture_output=True)
    opened = ["-passin", f"pass:{passphrase}"] if passphrase else []
    subprocess.run(["openssl", "pkey", "-in", str(private), *opened, "-pubout", "-out", str(public)],
                   check=True, capture_output=True)
    return KeyPair(private=private, public=public)


def keyid(public: Path) -> str:
    """sha256 of the DER SubjectPublicKeyInfo, computed by openssl (independently of the tool)."""
    der = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(public), "-outform", "DER"],
                         check=True, capture_output=True).stdout
    import hashlib

    return hashlib.sha256(der).hexdigest()
