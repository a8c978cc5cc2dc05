"""Image indexes in a registry: read one, list its platforms, compose and push a new one.

An index (OCI image index or Docker manifest list) names one image manifest per platform,
plus, from BuildKit, attestation manifests marked `unknown/unknown` that are not platforms.
A patched index must list exactly the source's platforms, in the source's order, with each
platform field as the source wrote it (os.version, variant, features...) and the source's
annotations; only the digests and sizes change. `republish` builds it that way from the source
descriptors, so nothing has to be re-checked field by field.

Manifests are kept as the bytes the registry served: a digest is the sha256 of those bytes, and
re-serialising JSON would change it. HTTP, credentials (Docker's config.json; basic or token
auth) and retries are oras-py's (`oras.provider.Registry`); this module only chooses requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import oras.container
import oras.provider
import requests

from dspark_patch.errors import BadInput, EnvironmentProblem, TargetNotFound
from dspark_patch.registry.platform import Platform

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
ACCEPT = (OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST)
# What BuildKit writes on the descriptor of an attestation (SBOM, provenance) manifest.
ATTESTATION_ANNOTATION = "vnd.docker.reference.type"


class RegistryUnreachable(EnvironmentProblem):
    kind = "registry-unreachable"


def docker_config_file() -> str:
    """Where `docker login` keeps credentials: $DOCKER_CONFIG/config.json, else ~/.docker/config.json."""
    folder = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(folder, "config.json")


def _has_login(config: str, host: str) -> bool:
    """Whether the docker config can give credentials for `host` (a helper or store is trusted to)."""
    try:
        with open(config, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return False
    if data.get("credsStore") or host in (data.get("credHelpers") or {}):
        return True
    return bool(((data.get("auths") or {}).get(host) or {}).get("auth"))


class RegistryRefused(EnvironmentProblem):
    """The registry answered, but refused: credentials, permissions, or a rejected manifest."""

    kind = "registry-refused"


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """One manifest or index exactly as the registry served it."""

    reference: str
    media_type: str
    digest: str
    body: bytes

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    def document(self) -> dict[str, Any]:
        loaded = json.loads(self.body)
        if not isinstance(loaded, dict):
            raise BadInput(f"{self.reference} is not a manifest (its JSON is not an object)")
        return loaded


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One descriptor of an index, with the source's own JSON for it (`raw`) kept whole."""

    digest: str
    media_type: str
    size: int
    platform: Platform | None
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def is_attestation(self) -> bool:
        annotations = self.raw.get("annotations") or {}
        if annotations.get(ATTESTATION_ANNOTATION) == "attestation-manifest":
            return True
        return self.platform is None or (self.platform.os, self.platform.architecture) == (
            "unknown",
            "unknown",
        )


@dataclass(frozen=True, kw_only=True)
class ImageIndex:
    manifest: Manifest
    entries: tuple[Entry, ...]
    annotations: Mapping[str, str]

    @property
    def images(self) -> tuple[Entry, ...]:
        """The platform images, in index order; attestations are not platforms."""
        return tuple(e for e in self.entries if not e.is_attestation)

    @property
    def platforms(self) -> tuple[Platform, ...]:
        return tuple(e.platform for e in self.images if e.platform is not None)

    def entry_for(self, platform: Platform) -> Entry:
        for entry in self.images:
            if entry.platform == platform:
                return entry
        raise BadInput(f"{self.manifest.reference} has no {platform} image")


def parse_index(manifest: Manifest) -> ImageIndex:
    if not manifest.is_index:
        raise BadInput(f"{manifest.reference} is a single-platform image, not an index")
    document = manifest.document()
    entries = []
    for raw in document.get("manifests") or []:
        platform = raw.get("platform")
        entries.append(
            Entry(
                digest=str(raw["digest"]),
                media_type=str(raw.get("mediaType", "")),
                size=int(raw["size"]),
                platform=Platform.from_descriptor(platform) if isinstance(platform, dict) else None,
                raw=raw,
            )
        )
    return ImageIndex(
        manifest=manifest, entries=tuple(entries), annotations=document.get("annotations") or {}
    )


def compose_index(
    *,
    media_type: str,
    images: Sequence[tuple[Manifest, Mapping[str, Any]]],
    annotations: Mapping[str, str] | None = None,
    attestations: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """A new index listing `images` (manifest, platform field) in order, then `attestations`."""
    if media_type not in INDEX_TYPES:
        raise BadInput(f"{media_type} is not an index media type")
    manifests = [
        {"mediaType": m.media_type, "digest": m.digest, "size": len(m.body), "platform": dict(p)}
        for m, p in images
    ]
    document: dict[str, Any] = {"schemaVersion": 2, "mediaType": media_type}
    document["manifests"] = manifests + [dict(a) for a in attestations]
    if annotations:
        document["annotations"] = dict(annotations)
    return json.dumps(document, indent=2).encode() + b"\n"


def republish(source: ImageIndex, patched: Mapping[Platform, Manifest]) -> bytes:
    """The patched index: the source's platforms in its order, each descriptor as the source
    wrote it except digest, size and media type; the source's annotations; no attestations
    (they describe the unpatched images, so carrying them would be a false statement).

    Every platform must have its patched manifest: nothing is published half patched.
    """
    missing = [str(e.platform) for e in source.images if e.platform not in patched]
    if missing:
        raise BadInput(f"no patched image for {', '.join(missing)}; the index is not published")
    manifests = []
    for entry in source.images:
        assert entry.platform is not None  # images() keeps only entries with a platform
        new = patched[entry.platform]
        descriptor = dict(entry.raw)
        descriptor.update(mediaType=new.media_type, digest=new.digest, size=len(new.body))
        manifests.append(descriptor)
    document = {k: v for k, v in source.manifest.document().items() if k != "manifests"}
    document["manifests"] = manifests
    return json.dumps(document, indent=2).encode() + b"\n"


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class Registry:
    """Manifests in one registry, through oras-py's client.

    Loopback registries are spoken to over plain HTTP, as the Docker engine does for
    127.0.0.0/8 without being told; any other host needs TLS unless `insecure` says otherwise.
    """

    def __init__(self, host: str, *, insecure: bool | None = None, timeout_s: float = 10) -> None:
        self.host = host
        if insecure is None:
            insecure = host.split(":")[0] in ("localhost", "127.0.0.1", "[::1]") or host.startswith(
                "127."
            )
        self._prefix = "http" if insecure else "https"
        self._timeout_s = timeout_s
        # Basic-auth registries (htpasswd) and token registries need different oras backends;
        # the /v2/ challenge says which. Asking first also fails fast on a dead registry
        # instead of oras's retries with back-off (about two minutes).
        scheme = self._challenge_scheme()
        self._needs_login = scheme == "basic"
        self._client = oras.provider.Registry(
            hostname=host, insecure=insecure, auth_backend="basic" if scheme == "basic" else "token"
        )

    def _challenge_scheme(self) -> str:
        try:
            answer = requests.get(f"{self._prefix}://{self.host}/v2/", timeout=self._timeout_s)
        except requests.RequestException as exc:
            raise RegistryUnreachable(
                f"registry {self.host} does not answer ({type(exc).__name__})",
                hint="check the host and port, and that the registry is running",
            ) from None
        challenge = answer.headers.get("Www-Authenticate", "")
        return challenge.split(" ", 1)[0].lower()

    def _container(self, reference: str) -> oras.container.Container:
        container = oras.container.Container(reference)
        if container.registry != self.host:
            raise BadInput(f"{reference} is not in registry {self.host}")
        # Credentials from Docker's config.json (`docker login`), when there are any; oras by
        # itself reads only ~/.docker, so DOCKER_CONFIG's file is named to it.
        config = docker_config_file()
        if self._needs_login and not _has_login(config, self.host):
            raise RegistryRefused(f"registry {self.host} asks for a login and {config} has none for it",
                                  hint=f"run `docker login {self.host}` (or point DOCKER_CONFIG at a folder that has it)")
        self._client.auth.load_configs(container, configs=[config] if os.path.exists(config) else None)
        return container

    def fetch(self, reference: str) -> Manifest:
        """The manifest or index `reference` (a tag or @digest) names, as served."""
        container = self._container(reference)
        url = f"{self._prefix}://{container.manifest_url()}"
        answer = self._client.do_request(url, "GET", headers={"Accept": ", ".join(ACCEPT)})
        if answer.status_code == 404:
            raise TargetNotFound(f"{reference} is not in the registry", hint="check the name and tag")
        self._check(answer, f"reading {reference}")
        body = answer.content
        digest = digest_of(body)
        served = answer.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryRefused(f"{reference}: the registry says {served} but the bytes are {digest}")
        if container.digest and container.digest != digest:
            raise RegistryRefused(f"{reference}: asked for {container.digest}, got {digest}")
        media_type = answer.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            document = json.loads(body)
        except ValueError:
            raise RegistryRefused(f"{reference}: the registry served a manifest that is not JSON") from None
        if not isinstance(document, dict):
            raise RegistryRefused(f"{reference}: the registry served a manifest that is not a JSON object")
        media_type = str(document.get("mediaType", media_type))
        return Manifest(reference=reference, media_type=media_type, digest=digest, body=body)

    def fetch_index(self, reference: str) -> ImageIndex | None:
        """The index `reference` names, or None when it names a single-platform image."""
        manifest = self.fetch(reference)
        return parse_index(manifest) if manifest.is_index else None

    def fetch_platform(self, index: ImageIndex, platform: Platform) -> Manifest:
        """One platform's image manifest, fetched by the digest the index names."""
        entry = index.entry_for(platform)
        repository = _repo(index.manifest.reference.split("@")[0])
        return self.fetch(f"{repository}@{entry.digest}")

    def push(self, reference: str, body: bytes, media_type: str) -> Manifest:
        """Put a manifest or index under `reference` (a tag); returns it with its digest."""
        container = self._container(reference)
        url = f"{self._prefix}://{container.manifest_url()}"
        answer = self._client.do_request(url, "PUT", data=body, headers={"Content-Type": media_type})
        self._check(answer, f"pushing {reference}")
        digest = digest_of(body)
        served = answer.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryRefused(f"{reference}: the registry stored {served}, not {digest}")
        return Manifest(reference=reference, media_type=media_type, digest=digest, body=body)

    def push_with_subject(self, reference: str, body: bytes, media_type: str) -> tuple[Manifest, bool]:
        """Put a manifest that names a `subject`; also says whether the registry acknowledged the
        subject (the OCI-Subject header of a registry with the referrers API). Without it the
        client keeps the fallback tag (registry/referrers.py)."""
        container = self._container(reference)
        url = f"{self._prefix}://{container.manifest_url()}"
        answer = self._client.do_request(url, "PUT", data=body, headers={"Content-Type": media_type})
        self._check(answer, f"pushing {reference}")
        digest = digest_of(body)
        served = answer.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryRefused(f"{reference}: the registry stored {served}, not {digest}")
        subject = json.loads(body).get("subject") or {}
        acknowledged = bool(answer.headers.get("OCI-Subject")) and answer.headers.get("OCI-Subject") == subject.get("digest")
        return Manifest(reference=reference, media_type=media_type, digest=digest, body=body), acknowledged

    def referrers(self, repository: str, digest: str) -> list[dict[str, Any]] | None:
        """The descriptors the referrers API lists for `digest`; None when the registry has no
        referrers API (a 404 for the endpoint, as distribution 2.8 answers), so the caller reads
        the fallback tag instead."""
        container = self._container(f"{repository}@{digest}")
        url = f"{self._prefix}://{container.registry}/v2/{container.api_prefix}/referrers/{digest}"
        answer = self._client.do_request(url, "GET", headers={"Accept": OCI_INDEX})
        if answer.status_code == 404:
            return None
        self._check(answer, f"listing the referrers of {repository}@{digest}")
        try:
            document = json.loads(answer.content)
        except ValueError:
            raise RegistryRefused(f"{self.host}: the referrers of {digest} are not JSON") from None
        if not isinstance(document, dict) or document.get("mediaType", OCI_INDEX) != OCI_INDEX:
            raise RegistryRefused(f"{self.host}: the referrers of {digest} are not an OCI index")
        listed = document.get("manifests") or []
        return [d for d in listed if isinstance(d, dict)]

    def fetch_blob(self, reference: str, digest: str) -> bytes:
        """A blob (an image config, say) of the repository `reference` is in, checked by digest."""
        container = self._container(_repo(reference.split("@")[0]))
        answer = self._client.get_blob(container, digest)
        self._check(answer, f"reading {digest} of {reference}")
        if digest_of(answer.content) != digest:
            raise RegistryRefused(f"{reference}: blob {digest} does not match its digest")
        return answer.content

    def push_blob(self, repository: str, blob: bytes) -> str:
        """Upload a small blob (a config, an attestation statement); returns its digest."""
        container = self._container(f"{repository}:unused")
        digest = digest_of(blob)
        with tempfile.NamedTemporaryFile() as fh:  # oras uploads from a path
            fh.write(blob)
            fh.flush()
            answer = self._client.upload_blob(
                fh.name, container, {"digest": digest, "size": len(blob)}
            )
        self._check(answer, f"uploading a blob to {repository}")
        return digest

    def _check(self, answer: requests.Response, doing: str) -> None:
        if answer.status_code in (401, 403):
            raise RegistryRefused(
                f"{self.host} refused {doing} (HTTP {answer.status_code})",
                hint=f"log in with `docker login {self.host}`",
            )
        if answer.status_code >= 300:
            raise RegistryRefused(f"{self.host} refused {doing}: HTTP {answer.status_code} {answer.text[:200]}")


def _repo(name: str) -> str:
    """`host:port/path/name:tag` -> `host:port/path/name` (a port is not a tag)."""
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':')[0]}" if head else last.split(":")[0]
