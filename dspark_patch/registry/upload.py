"""Writing an image into a registry without an engine: blobs, then the manifest, last.

What crane's `append`/`mutate` does, for one appended layer: a blob the repository already holds
is not sent again (HEAD); a blob of another repository of the same registry is mounted
(`POST …/blobs/uploads/?mount=D&from=R`, no bytes sent); a blob from another registry is streamed
across, checked by digest on the way; our own blobs (the layer, the config) are one monolithic
upload each (POST, then PUT with the digest). The registry checks every upload against its
digest. `Uploader.sent` counts the bytes this client sent (the bench prints it).

A manifest is put last and only when its blobs are all there, so a tag never names an image
whose parts are missing; `free` asks whether a tag is taken (HEAD) before anything is written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import DsparkPatchError
from ..imageref import ImageRef
from .blobs import Blob
from .index import Registry, RegistryRefused
from .manifest import ACCEPT, digest_of

# A blob streamed across registries is sent in pieces of this size (one read of the source each).
PIECE = 1 << 20


@dataclass
class Sent:
    """What one publish sent: bytes of blob bodies uploaded, and how each base blob got there."""

    bytes: int = 0
    uploaded: int = 0     # blobs whose bytes this client sent
    mounted: int = 0      # blobs the registry linked from another repository
    present: int = 0      # blobs the repository held already
    copied_bytes: int = 0  # of `bytes`, those of blobs streamed from another registry


class Uploader:
    """Blobs and manifests into `repository` (HOST/NAME) of `registry`."""

    def __init__(self, registry: Registry, repository: str) -> None:
        self.registry = registry
        self.repository = repository
        self.sent = Sent()

    def has(self, digest: str) -> bool:
        answer, body = self.registry.call(self.repository, f"blobs/{digest}", "HEAD", f"asking for {digest}")
        if answer.status_code == 404:
            return False
        self.registry.check(answer, body, f"asking for {digest} in {self.repository}")
        return True

    def mount(self, digest: str, source_repository: str) -> bool:
        """Link `digest` from `source_repository` (same registry); False when the registry did
        not (it may answer 202 with an upload session instead: abandoned here)."""
        name = ImageRef.parse(f"{source_repository}:unused").repository
        answer, body = self.registry.call(self.repository, f"blobs/uploads/?mount={digest}&from={name}", "POST",
                                          f"mounting {digest} from {source_repository}",
                                          headers={"Content-Length": "0"})
        if answer.status_code == 201:
            return True
        if answer.status_code == 202:
            where = self.registry.location(answer)
            if where:
                self._quietly_delete(where)
            return False
        self.registry.check(answer, body, f"mounting {digest} from {source_repository}")
        return False

    def put(self, data: bytes) -> str:
        """Upload `data` (the new layer's blob, the config); returns its digest."""
        digest = digest_of(data)
        if self.has(digest):
            self.sent.present += 1
            return digest
        self._upload(digest, data, len(data))
        self.sent.uploaded += 1
        self.sent.bytes += len(data)
        return digest

    def copy(self, source: Registry, source_ref: str, blob: Blob) -> None:
        """Stream `blob` from another registry into this repository, checked by digest as it goes
        (and by the receiving registry)."""
        answer = source.open_blob(source_ref, blob.digest)
        seen = hashlib.sha256()
        count = 0

        def pieces() -> Iterator[bytes]:
            nonlocal count
            with answer:
                for piece in answer.iter_content(PIECE):
                    count += len(piece)
                    if count > blob.size:
                        raise RegistryRefused(f"{source_ref}: blob {blob.digest} is longer than its {blob.size} bytes")
                    seen.update(piece)
                    yield piece

        self._upload(blob.digest, pieces(), blob.size)
        if count != blob.size or f"sha256:{seen.hexdigest()}" != blob.digest:
            raise RegistryRefused(f"{source_ref}: blob {blob.digest} did not match its digest and size as it was copied",
                                  hint="the source registry served other bytes; nothing was tagged")
        self.sent.uploaded += 1
        self.sent.bytes += count
        self.sent.copied_bytes += count

    def _upload(self, digest: str, body: object, size: int) -> None:
        doing = f"uploading {digest} to {self.repository}"
        answer, said = self.registry.call(self.repository, "blobs/uploads/", "POST", doing,
                                          headers={"Content-Length": "0"})
        self.registry.check(answer, said, doing)
        where = self.registry.location(answer)
        if where is None:
            raise RegistryRefused(f"{self.registry.host} started no upload for {doing} (no Location)")
        joiner = "&" if "?" in where else "?"
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(body, bytes):
            headers["Content-Length"] = str(size)
        answer, said = self.registry.call(self.repository, f"{where}{joiner}digest={digest}", "PUT", doing,
                                          headers=headers, data=body)
        self.registry.check(answer, said, doing)

    def _quietly_delete(self, url: str) -> None:
        try:
            self.registry.call(self.repository, url, "DELETE", "abandoning an upload")
        except DsparkPatchError:
            pass

    def tag_digest(self, tag: str) -> str | None:
        """The digest `repository:tag` names now, or None when the tag is free."""
        reference = f"{self.repository}:{tag}"
        answer, body = self.registry.call(self.repository, f"manifests/{tag}", "HEAD", f"asking for {reference}",
                                          headers={"Accept": ", ".join(ACCEPT)})
        if answer.status_code == 404:
            return None
        self.registry.check(answer, body, f"asking for {reference}")
        return answer.headers.get("Docker-Content-Digest") or self.registry.fetch(reference).digest
