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

Every seeded image is a tag of one repository (`seed/images`, tagged by image ID). The engine
remembers, per layer, the repositories it pushed it to, and before uploading a layer it tries to
mount it from at most four of them, newest first, dropping each that fails. With a repository
per image, the repositories of images since removed (a test's fleet, pruned at the next seeding)
were those four: every mount failed and the engine compressed and sent the fixture's gigabytes
again, about 100 s of its CPU, once per run. With one repository the engine finds each layer
already there and sends only the new ones.
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
REPOSITORY = "seed/images"  # every seeded image, tagged by (the start of) its ID


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
    if not all(_blob(STORAGE, d).is_file() for d in (seeded.manifest, *seeded.blobs)):
        return None
    # An entry of the layout before one repository (a repository per image): its blobs are
    # there, so only the tag is written, as a push would (the engine's pull finds it).
    tag = _tag(image_id)
    if not (_repo(STORAGE) / "_manifests" / "tags" / tag / "current" / "link").is_file():
        _link(STORAGE, REPOSITORY, tag, seeded)
    return seeded


def _tag(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:24]


def _repo(storage: Path) -> Path:
    return storage / V2 / "repositories" / REPOSITORY


def seeded(local: str) -> Seeded:
    """The blobs of `local` in the seed registry, pushed there by the engine if not yet."""
    from tests.support.registry import loopback_registry

    image_id = _image_id(local)
    tag = _tag(image_id)
    with _locked():
        found = _read(image_id)
        if found is not None:
            return found
        _prune()
        with loopback_registry(CACHE, port=PORT) as host:
            remote = f"{host}/{REPOSITORY}:{tag}"
            subprocess.run(["docker", "tag", local, remote], check=True, capture_output=True)
            try:
                subprocess.run(["docker", "push", "--quiet", remote], check=True, capture_output=True, text=True)
            finally:
                subprocess.run(["docker", "rmi", remote], check=False, capture_output=True)
        manifest = (_repo(STORAGE) / "_manifests" / "tags" / tag / "current" / "link").read_text().strip()
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
    with _locked(), loopback_registry(CACHE, port=PORT) as host:
        remote = f"{host}/{REPOSITORY}:{_tag(image_id)}"
        there("pull", "--quiet", remote)
        try:
            there("tag", remote, local)
        finally:
            there("rmi", remote, check=False)  # the name only: the image stays under `local`
    got = there("image", "inspect", "-f", "{{.Id}}", local).stdout.strip()
    if got != image_id:
        raise RuntimeError(f"{local} has id {got} on {docker_host} after the pull, expected {image_id}")


def _prune() -> None:
    """Forget the seeded images the engine no longer has (their tags), and the blobs only they
    used (with the repository's links to them: a push then finds them missing and sends them)."""
    present = set(subprocess.run(["docker", "images", "-q", "--no-trunc"], check=True,
                                 capture_output=True, text=True).stdout.split())
    repo = _repo(STORAGE)
    kept: set[str] = set()
    for entry in (CACHE / "images").glob("*.json") if (CACHE / "images").is_dir() else ():
        if f"sha256:{entry.stem}" not in present:
            entry.unlink()
            shutil.rmtree(repo / "_manifests" / "tags" / _tag(entry.stem), ignore_errors=True)
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            doc = json.loads(entry.read_text())
            kept.update([doc["manifest"], *doc["blobs"]])
    # The layout before one repository: a repository per image, all under seed/.
    for old in (STORAGE / V2 / "repositories" / "seed").glob("*"):
        if old != repo:
            shutil.rmtree(old, ignore_errors=True)
    blobs = STORAGE / V2 / "blobs" / "sha256"
    for folder in blobs.glob("*/*") if blobs.is_dir() else ():
        if f"sha256:{folder.name}" not in kept:
            shutil.rmtree(folder, ignore_errors=True)
            for links in ("_layers", "_manifests/revisions"):
                shutil.rmtree(repo / links / "sha256" / folder.name, ignore_errors=True)


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
    _link(storage, repository, tag, found)
    return found.manifest


def _link(storage: Path, repository: str, tag: str, found: Seeded) -> None:
    """The repository's links to blobs already in `storage`, and the tag: what a push writes."""
    repo = storage / V2 / "repositories" / repository
    for digest in found.blobs:
        _write(repo / "_layers" / "sha256" / digest.removeprefix("sha256:") / "link", digest)
    hex_ = found.manifest.removeprefix("sha256:")
    _write(repo / "_manifests" / "revisions" / "sha256" / hex_ / "link", found.manifest)
    _write(repo / "_manifests" / "tags" / tag / "index" / "sha256" / hex_ / "link", found.manifest)
    _write(repo / "_manifests" / "tags" / tag / "current" / "link", found.manifest)


__all__ = ["CACHE", "STORAGE", "Seeded", "pull_into", "put", "seeded"]
