"""One image reference type: `ImageRef.parse("host:5000/path/name:tag@sha256:…")`.

The grammar and the default-registry rules are Docker's own (docker/distribution's `reference`
package, `ParseNormalizedNamed`; go-containerregistry's `pkg/name` reads them the same way):

- `[registry/]path[:tag][@digest]`; path components are lowercase `[a-z0-9]` runs joined by
  `.`, `_`, `__` or dashes; a tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; a digest is
  `algorithm:hex` (sha256 with 64 hex digits, sha512 with 128);
- the first component is a registry only when it holds a `.` or a `:`, is `localhost`, or has
  an uppercase letter (`127.0.0.1:5000/x`, `localhost/x`, `Registry/x`); otherwise the name is
  Docker Hub's (`vllm/vllm-openai`, `ubuntu`), whose one-component names live under `library/`;
- the whole name is at most 255 characters.

`registry` is the host as written, or None for a Docker Hub name (nothing here reaches Docker
Hub: a name without a host has no registry this tool talks to). `name` is the reference less
its tag and digest, as written: what the engine lists and pushes under.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .errors import BadInput

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_DIGEST_HEX = {"sha256": 64, "sha512": 128}
_ID = re.compile(r"[a-f0-9]{64}")
IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}")
NAME_LIMIT = 255
# Docker Hub's one-component names (`ubuntu`) are `library/ubuntu` there.
HUB_NAMESPACE = "library"


@dataclass(frozen=True, kw_only=True)
class ImageRef:
    registry: str | None    # "127.0.0.1:5000", "localhost", "ghcr.io"; None: a Docker Hub name
    repository: str         # the path as written: "path/name", "ubuntu" (no "library/" added)
    tag: str | None = None
    digest: str | None = None   # "sha256:<hex>"

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        """Read a reference as `docker pull` would; BadInput (one line) when it is not one."""
        def bad(why: str) -> BadInput:
            return BadInput(f"{text!r} is not an image reference: {why}",
                            hint="write it as [HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST], the path in lowercase")

        if not text:
            raise bad("it is empty")
        cls.refuse_userinfo(text)
        rest, at, digest = text.partition("@")
        if at and not _DIGEST.fullmatch(digest):
            # What precedes '@' is not quoted either: it may be a password (`user:pw@host:5000`).
            raise BadInput(f"'***@{digest}' is not an image reference: the digest {digest!r} is not "
                           "ALGORITHM:HEX (the part before '@' is not repeated here)",
                           hint="write it as [HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST]")
        if at:
            algorithm, _, hex_part = digest.partition(":")
            if algorithm in _DIGEST_HEX and len(hex_part) != _DIGEST_HEX[algorithm]:
                raise bad(f"a {algorithm} digest has {_DIGEST_HEX[algorithm]} hex digits, not {len(hex_part)}")
        name, tag = rest, None
        head, colon, last = rest.rpartition(":")
        if colon and "/" not in last:  # a colon in the last component starts the tag (not a port)
            name, tag = head, last
            if not _TAG.fullmatch(tag):
                raise bad(f"the tag {tag!r} is not [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")
        if not name:
            raise bad("it names no repository")
        if len(name) > NAME_LIMIT:
            raise bad(f"the name is longer than {NAME_LIMIT} characters")
        first, slash, remainder = name.partition("/")
        registry: str | None = None
        if slash and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
            registry, path = first, remainder
            if not _DOMAIN.fullmatch(registry):
                raise bad(f"{registry!r} is not a registry host[:port]")
        else:
            path = name
        if registry in ("docker.io", "index.docker.io"):
            registry = None  # Docker Hub written out is Docker Hub
        if registry is None and path.startswith(f"{HUB_NAMESPACE}/") and path.count("/") == 1:
            path = path[len(HUB_NAMESPACE) + 1:]
        if path.lower() != path:
            raise bad(f"the repository {path!r} must be lowercase")
        for component in path.split("/"):
            if not _PATH_COMPONENT.fullmatch(component):
                raise bad(f"{component!r} is not a path component (lowercase letters and digits joined by . _ __ or -)")
        if registry is None and _ID.fullmatch(path):
            raise bad("a 64-digit hex string is an image id, not a repository")
        return cls(registry=registry, repository=path, tag=tag, digest=digest or None)

    @staticmethod
    def refuse_userinfo(text: str) -> None:
        """BadInput for `user:password@host/repo:tag` (what follows '@' is not a digest: it holds a
        '/' or another '@'), quoting only what follows the last '@': the line goes to stderr, the
        reports and CI logs, so the credential is never repeated, not even to say it is wrong."""
        digest = text.partition("@")[2]
        if "@" in text and ("/" in digest or "@" in digest or "://" in text):
            raise BadInput(
                f"'***@{text.rpartition('@')[2]}' is not an image reference: it holds a user name or "
                "password before '@' (not repeated here)",
                hint="log in with `docker login HOST` (credentials come from the docker config) "
                "and give HOST/PATH:TAG",
            )

    @classmethod
    def host_of(cls, text: str) -> str | None:
        """The registry `text` names, or None: a Docker Hub name, an image id or anything that is
        not a reference (which the engine's own flow then reports)."""
        try:
            return cls.parse(text).registry
        except BadInput:
            return None

    @staticmethod
    def is_image_id(text: str) -> bool:
        """An image id, full or short (`sha256:<hex>`, `<hex>`): it names an image on one engine."""
        return bool(IMAGE_ID.fullmatch(text))

    @property
    def name(self) -> str:
        """Registry and repository as written: `127.0.0.1:5000/path/name`, `vllm/vllm-openai`."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    @property
    def tag_or_latest(self) -> str:
        return self.tag or "latest"

    def with_tag(self, tag: str) -> ImageRef:
        """The same repository under `tag` (no digest)."""
        return replace(self, tag=tag, digest=None)

    def with_digest(self, digest: str) -> ImageRef:
        """The same repository at `digest` (no tag): `name@sha256:…`."""
        return replace(self, tag=None, digest=digest)

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


__all__ = ["HUB_NAMESPACE", "IMAGE_ID", "NAME_LIMIT", "ImageRef"]
