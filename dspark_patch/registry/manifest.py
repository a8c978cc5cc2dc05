"""Manifests and indexes as a registry served them, read strictly (pure: no HTTP here).

A registry's answer is hostile input: whoever can push to a repository writes its indexes.
Everything a later step relies on is checked here, once, and anything else is one `BadManifest`
line (exit 2) naming the entry and the field, never a traceback:

- the body is a JSON object of a known media type, at most `MANIFEST_LIMIT` bytes;
- an index's `manifests` is a list of objects, each with a `sha256:` digest, a size in
  0..MANIFEST_LIMIT, a media type (an image manifest for a platform entry; an index nested in
  an index is refused), string annotations and an object `platform`;
- a platform's os, architecture and variant are `[a-z0-9]+` (what GOOS/GOARCH and the OCI
  spec's values are), so `TAG-OS-ARCH-VARIANT` result tags are distinct for distinct platforms;
- no platform is listed twice: an engine pulls one of the two images, and a republished index
  could list only one, so the other would silently disappear from the tag. arm64 with and
  without `v8` count as one platform, as `Platform.matches` does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_patch.errors import BadInput
from dspark_patch.registry.platform_select import Platform

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
IMAGE_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
ACCEPT = (OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST)
# containerd reads at most 4 MiB of a manifest or index (images/image.go, MaxManifestSize);
# distribution refuses to store a bigger one.
MANIFEST_LIMIT = 4 << 20
# What BuildKit writes on the descriptor of an attestation (SBOM, provenance) manifest.
ATTESTATION_ANNOTATION = "vnd.docker.reference.type"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class BadManifest(BadInput):
    """A manifest or index the registry served is malformed, oversized or ambiguous."""

    kind = "bad-manifest"


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def load_object(body: bytes, where: str) -> dict[str, Any]:
    """The JSON object `body` holds; anything else (not JSON, not an object, nested past what
    the parser takes) is one line."""
    try:
        loaded = json.loads(body)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else "not JSON"
        raise BadManifest(f"{where} is not a manifest (its body is {reason})",
                          hint="check what was pushed under that name") from None
    if not isinstance(loaded, dict):
        raise BadManifest(f"{where} is not a manifest (its JSON is {_kind(loaded)}, not an object)",
                          hint="check what was pushed under that name")
    return loaded


def media_type_of(document: Mapping[str, Any], served: str, where: str) -> str:
    """The body's own mediaType (else the Content-Type it was served with); it must be a kind
    of manifest or index this tool reads."""
    media_type = document.get("mediaType", served)
    if not isinstance(media_type, str) or media_type not in ACCEPT:
        raise BadManifest(f"{where} has media type {_show(media_type)}, neither an image manifest nor an index",
                          hint=f"expected one of {', '.join(ACCEPT)}")
    return media_type


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
        return load_object(self.body, self.reference)


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
    where = manifest.reference
    document = manifest.document()
    listed = document.get("manifests")
    if not isinstance(listed, list):
        raise BadManifest(f"{where}: its `manifests` is {_kind(listed)}, not a list",
                          hint="an index lists its images in a `manifests` array")
    entries = tuple(_entry(raw, f"{where}: manifests[{n}]") for n, raw in enumerate(listed))
    _refuse_twice(entries, where)
    return ImageIndex(manifest=manifest, entries=entries,
                      annotations=_annotations(document.get("annotations"), f"{where}: annotations"))


def _entry(raw: object, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise BadManifest(f"{where} is {_kind(raw)}, not a descriptor object")
    digest = raw.get("digest")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        said = "has no digest" if digest is None else f"has digest {_show(digest)}"
        raise BadManifest(f"{where} {said}", hint="a descriptor's digest is sha256: and 64 hex digits")
    size = raw.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MANIFEST_LIMIT:
        said = "has no size" if size is None else f"has size {_show(size)}"
        raise BadManifest(f"{where} ({digest}) {said}",
                          hint=f"a manifest's size is a whole number of bytes, at most {MANIFEST_LIMIT}")
    media_type = raw.get("mediaType")
    if not isinstance(media_type, str):
        raise BadManifest(f"{where} ({digest}) has media type {_show(media_type)}, not a string")
    _annotations(raw.get("annotations"), f"{where} ({digest}) annotations")
    platform_field = raw.get("platform")
    platform = None
    if platform_field is not None:
        platform = _platform(platform_field, f"{where} ({digest}) platform")
    entry = Entry(digest=digest, media_type=media_type, size=size, platform=platform, raw=raw)
    if _runs(entry):
        assert platform is not None
        odd = platform.odd_part()
        if odd is not None:
            raise BadManifest(f"{where} ({digest}) has platform value {odd!r}",
                              hint="os, architecture and variant are lower-case letters and digits")
    if not entry.is_attestation and media_type not in IMAGE_TYPES:
        raise BadManifest(f"{where} ({digest}, {platform}) has media type {_show(media_type)}, "
                          "not an image manifest", hint="an index nested in an index is not supported")
    return entry


def _runs(entry: Entry) -> bool:
    """Whether an engine could pick `entry` for a machine: it names a real platform. Engines do
    not read annotations, so an entry marked as an attestation but naming one counts."""
    return entry.platform is not None and (entry.platform.os, entry.platform.architecture) != ("unknown", "unknown")


def _platform(value: object, where: str) -> Platform:
    if not isinstance(value, dict):
        raise BadManifest(f"{where} is {_kind(value)}, not an object")
    for name in ("os", "architecture", "variant"):
        if name in value and not isinstance(value[name], str):
            raise BadManifest(f"{where}: {name} is {_kind(value[name])}, not a string")
    if not isinstance(value.get("os"), str) or not isinstance(value.get("architecture"), str):
        raise BadManifest(f"{where} lacks os or architecture")
    return Platform.from_descriptor(value)


def _annotations(value: object, where: str) -> Mapping[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadManifest(f"{where} is not an object of strings")
    return value


def _refuse_twice(entries: tuple[Entry, ...], where: str) -> None:
    seen: dict[tuple[str, str, str], Entry] = {}
    for entry in entries:
        if not _runs(entry):
            continue
        assert entry.platform is not None
        key = entry.platform.machine_key()
        if key in seen:
            first = seen[key]
            raise BadManifest(
                f"{where} lists {first.platform} twice: {first.digest} and {entry.digest} (as {entry.platform})",
                hint="an engine pulls only one of them; publish one image per platform",
            )
        seen[key] = entry


def _kind(value: object) -> str:
    if value is None:
        return "missing"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
