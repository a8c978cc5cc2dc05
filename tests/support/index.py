"""A multi-platform serving image in a real loopback registry: the amd64 and arm64 fixtures
pushed by the Docker engine, then one index naming both, pushed with dspark_patch.registry.

`published_index(registry)` returns the index ref. Like the images themselves, it is built by
the project's scripts (scripts/build-images, scripts/build-arm64-fixture), never pulled.
The index is shaped like a BuildKit one: an image per platform in a fixed order, index
annotations, and optionally an attestation manifest marked `unknown/unknown`, which tools must
not take for a platform.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dspark_patch.registry.index import (
    DOCKER_LIST,
    OCI_INDEX,
    OCI_MANIFEST,
    Manifest,
    Registry,
    compose_index,
    digest_of,
)
from tests.support.images import ROOT, fixture_image
from tests.support.registry import loopback_registry, put_image

# What the published index says about itself (kept by republish, checked by tests).
INDEX_ANNOTATIONS = {
    "org.opencontainers.image.title": "dspark-patch fixture: vLLM 0.33.0, two platforms",
    "org.opencontainers.image.version": "0.33.0",
}
PLATFORMS = ({"architecture": "amd64", "os": "linux"}, {"architecture": "arm64", "os": "linux", "variant": "v8"})


@functools.cache
def _arm64_images() -> dict[str, str]:
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-arm64-fixture")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"scripts/build-arm64-fixture failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    return dict(line.partition(" ")[::2] for line in done.stdout.splitlines())


def arm64_fixture_image() -> str:
    """The linux/arm64 serving image (the real vLLM aarch64 wheel, Debian's CPU torch)."""
    return _arm64_images()["vllm-fixture-arm64"]


def arm64_official_image() -> str:
    """The official image's shape on linux/arm64: the aarch64 wheel laid out by `uv pip install
    --system`, no bytecode, USER 2000 (gid 0), `vllm serve` (scripts/build-arm64-fixture)."""
    return _arm64_images()["vllm-official-arm64"]


def arm64_official_034_image() -> str:
    """The same on the real vLLM 0.34.0 aarch64 wheel: with official_034_image(), the two
    platforms of the 0.34.0 official index (`publish_index(host, sources=(...))`)."""
    return _arm64_images()["vllm-official-arm64-0.34.0"]


@dataclass(frozen=True, kw_only=True)
class PublishedIndex:
    ref: str  # registry/repo:tag of the index
    media_type: str
    digest: str
    images: tuple[Manifest, ...]  # per platform, in index order (amd64, arm64)


def _push_image(local: str, remote: str) -> None:
    subprocess.run(["docker", "tag", local, remote], check=True, capture_output=True)
    try:
        subprocess.run(["docker", "push", "--quiet", remote], check=True, capture_output=True, text=True)
    finally:
        # The remote name is only a means to push; leaving it would make the engine think the
        # image is already local when a test pulls it back.
        subprocess.run(["docker", "rmi", remote], check=False, capture_output=True)


def _attestation(registry: Registry, repository: str, subject: Manifest) -> dict:
    """An attestation manifest like BuildKit's: an OCI manifest with an in-toto layer, listed
    in the index as `unknown/unknown` with the attestation annotations."""
    statement = json.dumps({"_type": "https://in-toto.io/Statement/v0.1", "subject": []}).encode()
    config = b"{}"
    for blob in (statement, config):
        registry.push_blob(repository, blob)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config), "size": len(config)},
        "layers": [{
            "mediaType": "application/vnd.in-toto+json",
            "digest": digest_of(statement),
            "size": len(statement),
            "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v0.2"},
        }],
    }
    body = json.dumps(manifest).encode()
    pushed = registry.push(f"{repository}:attestation-{digest_of(body)[7:19]}", body, OCI_MANIFEST)
    return {
        "mediaType": OCI_MANIFEST,
        "digest": pushed.digest,
        "size": len(body),
        "annotations": {
            "vnd.docker.reference.digest": subject.digest,
            "vnd.docker.reference.type": "attestation-manifest",
        },
        "platform": {"architecture": "unknown", "os": "unknown"},
    }


def publish_index(registry_host: str, *, repository: str = "dspark-patch/vllm-fixture",
                  tag: str = "0.33.0", kind: str = DOCKER_LIST, attestation: bool = False,
                  sources: tuple[str, str] | None = None) -> PublishedIndex:
    """Push both fixture images (or `sources`: an amd64 and an arm64 image) and an index of
    `kind` naming them; returns the index."""
    base = f"{registry_host}/{repository}"
    registry = Registry(registry_host)
    images = []
    for local, platform in zip(sources or (fixture_image(), arm64_fixture_image()), PLATFORMS):
        remote = f"{base}:{tag}-{platform['architecture']}"
        # Both images are gigabytes: the engine pushes them once (tests/support/seed.py).
        put_image(local, remote)
        images.append((registry.fetch(remote), platform))
    attestations = [_attestation(registry, base, images[0][0])] if attestation else []
    body = compose_index(media_type=kind, images=images, annotations=INDEX_ANNOTATIONS,
                         attestations=attestations)
    pushed = registry.push(f"{base}:{tag}", body, kind)
    return PublishedIndex(ref=f"{base}:{tag}", media_type=kind, digest=pushed.digest,
                          images=tuple(m for m, _ in images))


@contextmanager
def fixture_index(workdir: Path, *, kind: str = DOCKER_LIST, attestation: bool = False) -> Iterator[PublishedIndex]:
    """A fresh loopback registry holding the two-platform fixture index (for a module fixture);
    at the end, the images runs pulled from it are removed (`remove_images_from`)."""
    with loopback_registry(workdir) as host:
        try:
            yield publish_index(host, kind=kind, attestation=attestation)
        finally:
            remove_images_from(host)


def remove_images_from(host: str) -> None:
    """Remove the images runs pulled by digest (or tagged) from the registry at `host`: they
    share their layers with the local fixtures, but their names would outlive the registry."""
    listed = subprocess.run(["docker", "images", "--digests", "--format", "{{.Repository}} {{.Tag}} {{.Digest}}"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for line in listed:
        repository, tag, digest = line.split()
        if repository.startswith(host + "/"):
            ref = f"{repository}:{tag}" if tag != "<none>" else f"{repository}@{digest}"
            subprocess.run(["docker", "rmi", ref], check=False, capture_output=True)


__all__ = ["DOCKER_LIST", "OCI_INDEX", "PublishedIndex", "arm64_fixture_image", "publish_index", "remove_images_from"]
