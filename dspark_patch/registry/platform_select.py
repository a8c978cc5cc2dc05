"""Platforms of an image index, and which of them a `--platform` request selects (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dspark_patch.errors import BadInput

# GOOS/GOARCH and the OCI spec's platform values are lower-case letters and digits. Keeping to
# them is what makes `TAG-OS-ARCH-VARIANT` injective: no part can hold the `-` that joins them.
PART = re.compile(r"[a-z0-9]+")


class UnknownPlatform(BadInput):
    """`--platform` names a platform the index does not have."""

    kind = "unknown-platform"


@dataclass(frozen=True, kw_only=True, order=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> Platform:
        """`linux/arm64`, `linux/arm64/v8` (the form `docker --platform` takes)."""
        parts = text.strip().split("/")
        if len(parts) not in (2, 3) or not all(PART.fullmatch(p) for p in parts):
            raise BadInput(f"{text!r} is not a platform",
                           hint="write OS/ARCH[/VARIANT] in lower-case letters and digits, e.g. linux/amd64")
        return cls(os=parts[0], architecture=parts[1], variant=parts[2] if len(parts) == 3 else "")

    @classmethod
    def from_descriptor(cls, platform: Mapping[str, Any]) -> Platform:
        return cls(
            os=str(platform.get("os", "")),
            architecture=str(platform.get("architecture", "")),
            variant=str(platform.get("variant", "")),
        )

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    def odd_part(self) -> str | None:
        """The first of os, architecture, variant that is not `[a-z0-9]+` (variant may be empty)."""
        for part in (self.os, self.architecture):
            if not PART.fullmatch(part):
                return part
        if self.variant and not PART.fullmatch(self.variant):
            return self.variant
        return None

    @property
    def tag_suffix(self) -> str:
        """`linux-arm64-v8`: distinct for distinct platforms, since no part holds a `-`."""
        if self.odd_part() is not None:
            raise BadInput(f"platform {str(self)!r} has a part that is not lower-case letters and digits",
                           hint="no result tag is made for it")
        return "-".join(p for p in (self.os, self.architecture, self.variant) if p)

    def machine_key(self) -> tuple[str, str, str]:
        """What machines this platform runs on: arm64 with and without `v8` is one (see `matches`)."""
        variant = "v8" if self.architecture == "arm64" and not self.variant else self.variant
        return (self.os, self.architecture, variant)

    def matches(self, wanted: Platform) -> bool:
        """`linux/arm64` asks for any arm64 variant; `linux/arm64/v8` for that one only.

        Registries write arm64 with and without `v8`; both mean the same machines.
        """
        if (self.os, self.architecture) != (wanted.os, wanted.architecture):
            return False
        if not wanted.variant or self.variant == wanted.variant:
            return True
        return self.architecture == "arm64" and {self.variant, wanted.variant} <= {"", "v8"}

def parse_request(request: str) -> tuple[Platform, ...] | None:
    """A `--platform` value: None for `all`, else the platforms of its comma list (the one
    reader of the option's form; BadInput for an empty list or a malformed platform)."""
    value = request.strip()
    if value == "all":
        return None
    wanted = tuple(Platform.parse(item) for item in value.split(",") if item.strip())
    if not wanted:
        raise BadInput("--platform is empty", hint="write linux/amd64, a comma list, or all")
    return wanted


def select(available: Sequence[Platform], request: str | None, engine: Platform) -> tuple[Platform, ...]:
    """The platforms a `--platform` value selects, in the index's order.

    None selects the engine's own platform only (the caller notes that others exist);
    `all` selects every one; otherwise a comma list, each of which must be in the index.
    """
    if request is None:
        chosen = [p for p in available if p.matches(engine)]
        if not chosen:
            raise UnknownPlatform(
                f"the index has no {engine} image (it has {_listing(available)})",
                hint="choose one with --platform, or --platform all",
            )
        return (chosen[0],)
    wanted = parse_request(request)
    if wanted is None:
        return tuple(available)
    missing = [w for w in wanted if not any(p.matches(w) for p in available)]
    if missing:
        raise UnknownPlatform(
            f"the index has no {', '.join(map(str, missing))} image; it has {_listing(available)}",
            hint="choose from those, or --platform all",
        )
    return tuple(p for p in available if any(p.matches(w) for w in wanted))


def _listing(platforms: Sequence[Platform]) -> str:
    return ", ".join(map(str, platforms)) or "no platforms"
