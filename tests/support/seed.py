"""Put a local image into a loopback registry the way `docker push` would, pushing it only once.

Many test modules need the 2 GB fixture in a registry of their own (a login, an index, a fleet).
`docker push` compresses every layer again for each new registry: on a 2-core machine that is
most of a minute per image, per module. Here the engine pushes an image once, into a seed
registry kept in the cache by image ID ($DSPARK_PATCH_CACHE/registry-seed); putting it into
another loopback registry (tests/support/registry.py, whose storage folder is known) then links
the same blobs into that registry's storage and writes the repository's links and the tag, the
files distribution itself writes for a push. What the registry then serves is byte for byte what
the engine pushed: the same manifest, the same gzip layers, the same digests.

A registry that is not a loopback one of this session gets a real `docker push`. The other
engines of the tests (Podman, a second dockerd) get an image by pulling it from the seed registry
(`pull_into`), so that they too push only the layers a registry lacks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.vllm import CACHE as PROJECT_CACHE

CACHE = PROJECT_CACHE / "registry-seed"
STORAGE = CACHE / "storage"   # the seed registry's own storage folder (loopback_registry's layout)
V2 = Path("docker") / "registry" / "v2"
# The seed registry's port, the same in every session: the engine remembers which layers it
# pushed to which registry, so an image built on a seeded one (the fleet's images on the
# fixture) is pushed as its new layers only, the rest mounted from the seeded repository.
# Below the kernel's range of ephemeral ports, where the other registries' ports come from.
PORT = 24917


@dataclass(frozen=True)
class Seeded:
    manifest: str  # sha256:... of the manifest the engine pushed
    blobs: tuple[str, ...]  # its config and layers


def _blob(root: Path, digest: str) -> Path:
    hex_ = digest.removeprefix("sha256:")
    return root / V2 / "blobs" / "sha256" / hex_[:2] / hex_ / "data"


def _image_id(local: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", local],
                          check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _entry(image_id: str) -> Path:
    return CACHE / "images" / f"{image_id.removeprefix('sha256:')}.json"


def _read(image_id: str) -> Seeded | None:
    try:
        doc = json.loads(_entry(image_id).read_text())
    except (OSError, ValueError):
        return None
    seeded = Seeded(doc["manifest"], tuple(doc["blobs"]))
    if all(_blob(STORAGE, d).is_file() for d in (seeded.manifest, *seeded.blobs)):
        return seeded
    return None


def seeded(local: str) -> Seeded:
    """The blobs of `local` in the seed registry, pushed there by the engine if not yet."""
    from tests.support.registry import loopback_registry

    image_id = _image_id(local)
    name = image_id.removeprefix("sha256:")[:24]
    with _locked():
        found = _read(image_id)
        if found is not None:
            return found
        _prune()
        with loopback_registry(CACHE, port=PORT) as host:
            remote = f"{host}/seed/{name}:image"
            subprocess.run(["docker", "tag", local, remote], check=True, capture_output=True)
            try:
                subprocess.run(["docker", "push", "--quiet", remote], check=True, capture_output=True, text=True)
            finally:
                subprocess.run(["docker", "rmi", remote], check=False, capture_output=True)
        repo = STORAGE / V2 / "repositories" / "seed" / name
        manifest = (repo / "_manifests" / "tags" / "image" / "current" / "link").read_text().strip()
        body = json.loads(_blob(STORAGE, manifest).read_bytes())
        blobs = (body["config"]["digest"], *(layer["digest"] for layer in body["layers"]))
        entry = _entry(image_id)
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps({"manifest": manifest, "blobs": list(blobs)}))
        return Seeded(manifest, blobs)


def pull_into(docker_host: str, local: str) -> None:
    """Make the engine at `docker_host` hold `local` (same image id, same name), pulled from the
    seed registry as a node gets its images: that engine then knows the digest each layer has in
    a registry, and pushing an image built on it to a repository that holds the source sends only
    the new layers (an image `docker load`ed knows none: its every push compresses and sends ~2 GB
    again). Nothing is done when that engine already has the id under that name."""
    from tests.support.registry import loopback_registry

    def there(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "--host", docker_host, *args], check=check, capture_output=True, text=True)

    image_id = _image_id(local)
    if there("image", "inspect", "-f", "{{.Id}}", local, check=False).stdout.strip() == image_id:
        return
    seeded(local)
    name = image_id.removeprefix("sha256:")[:24]
    with _locked(), loopback_registry(CACHE, port=PORT) as host:
        remote = f"{host}/seed/{name}:image"
        there("pull", "--quiet", remote)
        try:
            there("tag", remote, local)
        finally:
            there("rmi", remote, check=False)  # the name only: the image stays under `local`
    got = there("image", "inspect", "-f", "{{.Id}}", local).stdout.strip()
    if got != image_id:
        raise RuntimeError(f"{local} has id {got} on {docker_host} after the pull, expected {image_id}")


def _prune() -> None:
    """Forget the seeded images the engine no longer has, and the blobs only they used."""
    present = set(subprocess.run(["docker", "images", "-q", "--no-trunc"], check=True,
                                 capture_output=True, text=True).stdout.split())
    kept: set[str] = set()
    for entry in (CACHE / "images").glob("*.json") if (CACHE / "images").is_dir() else ():
        if f"sha256:{entry.stem}" not in present:
            entry.unlink()
            shutil.rmtree(STORAGE / V2 / "repositories" / "seed" / entry.stem[:24], ignore_errors=True)
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            doc = json.loads(entry.read_text())
            kept.update([doc["manifest"], *doc["blobs"]])
    blobs = STORAGE / V2 / "blobs" / "sha256"
    for folder in blobs.glob("*/*") if blobs.is_dir() else ():
        if f"sha256:{folder.name}" not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as out:
        out.write(text)
    os.replace(out.name, path)


def put(local: str, storage: Path, repository: str, tag: str) -> str:
    """Make the registry whose storage folder is `storage` hold `local` as `repository:tag`;
    returns the manifest's digest."""
    found = seeded(local)
    for digest in (found.manifest, *found.blobs):
        target = _blob(storage, digest)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(_blob(STORAGE, digest), target)
        except OSError:  # another file system: a copy
            shutil.copyfile(_blob(STORAGE, digest), target)
    repo = storage / V2 / "repositories" / repository
    for digest in found.blobs:
        _write(repo / "_layers" / "sha256" / digest.removeprefix("sha256:") / "link", digest)
    hex_ = found.manifest.removeprefix("sha256:")
    _write(repo / "_manifests" / "revisions" / "sha256" / hex_ / "link", found.manifest)
    _write(repo / "_manifests" / "tags" / tag / "index" / "sha256" / hex_ / "link", found.manifest)
    _write(repo / "_manifests" / "tags" / tag / "current" / "link", found.manifest)
    return found.manifest


__all__ = ["CACHE", "STORAGE", "Seeded", "pull_into", "put", "seeded"]
