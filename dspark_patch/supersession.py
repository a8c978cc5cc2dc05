"""`[[superseded]]` records of a patch set: a release that ships the set's change in its own form.

A record names the releases, what upstream did (one line) and where (`file:function` entries),
the sha256 of the release files its proof was made on, the probe's *effect* cases that must pass
on the pristine release, and a review state and file, like a variant. It is never believed from
the version number alone: the release's files must be the recorded ones, and apply, verify and
probe run the effect cases on them (pipeline/supersede.py). Written by `dspark-patch port` as
`review = "unreviewed"` when a release's pristine files pass the effect cases; a person who has
read its review file marks it reviewed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from . import tomltable
from .errors import InvalidPatchSet

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_KEYS = {"name", "releases", "upstream", "where", "files", "effect_cases", "review", "review_file"}
_REQUIRED = {"name", "releases", "upstream", "where", "files"}
ReviewState = Literal["reviewed", "unreviewed"]


@dataclass(frozen=True, kw_only=True)
class Superseded:
    name: str                          # e.g. "vllm-0.34.0"
    releases: tuple[str, ...]
    upstream: str                      # what the release does instead, one line
    where: tuple[str, ...]             # "path:function" entries naming upstream's change
    files: Mapping[str, str]           # path -> sha256 of the release file the proof was made on
    effect_cases: tuple[str, ...]      # the probe's cases that must pass on the pristine release
    review: ReviewState = "reviewed"
    review_file: str | None = None     # the review note, inside the patch set's folder

    @property
    def digest_text(self) -> str:
        """What a `superseded` verdict means, for the patch set's content digest."""
        return (f"superseded\0{self.name}\0{','.join(self.releases)}\0{self.review}\0"
                + "".join(f"{p}\0{h}\0" for p, h in sorted(self.files.items()))
                + "\0".join(self.effect_cases) + "\n")


def first_difference(record: Superseded, sha256_of: Callable[[str], str | None]) -> str | None:
    """The first of the record's files whose sha256 is not the recorded one, said in one line
    (`sha256_of`: a path's digest in the tree, None where it is missing); None when all match."""
    for path, expected in sorted(record.files.items()):
        found = sha256_of(path)
        if found != expected:
            state = "missing" if found is None else f"sha256 {found[:16]}…"
            return f"{path} is {state}, not the file {record.name} was proven on"
    return None


def parse(raw: object, *, where: str, has_probe: bool, default_cases: tuple[str, ...] = ()) -> Superseded:
    """One `[[superseded]]` table; its `effect_cases` default to the patch set's own."""
    if not isinstance(raw, dict):
        raise InvalidPatchSet(f"{where}: must be a table")
    tomltable.keys(raw, allowed=_KEYS, required=_REQUIRED, where=where)
    if not has_probe:
        raise InvalidPatchSet(f"{where}: a superseded record needs the patch set's probe: its effect cases are the proof",
                              hint="add a probe whose cases test the change's effect, or leave the record out")
    name, upstream = _text(raw, "name", where), _text(raw, "upstream", where)
    releases = _strings(raw, "releases", where)
    place = _strings(raw, "where", where)
    if "effect_cases" not in raw and not default_cases:
        raise InvalidPatchSet(f"{where}: needs effect_cases (or the patch set's top-level effect_cases)",
                              hint="name the probe cases that test the change's effect, not its code")
    cases = _strings(raw, "effect_cases", where) if "effect_cases" in raw else default_cases
    if len(set(cases)) != len(cases):
        raise InvalidPatchSet(f"{where}: effect_cases lists a case twice")
    files = raw["files"]
    if not isinstance(files, dict) or not files:
        raise InvalidPatchSet(f"{where}: files must give the sha256 of each release file the proof was made on",
                              hint='e.g. [superseded.files] "vllm/x.py" = "<sha256>"')
    for path, digest in files.items():
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise InvalidPatchSet(f"{where} files.{path!r}: must be 64 lower-case hex digits, got {digest!r}")
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise InvalidPatchSet(f"{where} files: {path!r} is not a path inside the site folder")
    review = raw.get("review", "reviewed")
    if review not in ("reviewed", "unreviewed"):
        raise InvalidPatchSet(f"{where}: review must be \"reviewed\" or \"unreviewed\", got {review!r}",
                              hint="a person who has read the record's review file marks it reviewed")
    review_file = raw.get("review_file")
    if review_file is not None and (not isinstance(review_file, str) or not review_file.strip()):
        raise InvalidPatchSet(f"{where}: review_file must name the review note in the patch set's folder")
    return Superseded(name=name, releases=releases, upstream=upstream, where=place, files=dict(files),
                      effect_cases=cases, review="reviewed" if review == "reviewed" else "unreviewed",
                      review_file=review_file)


def _text(raw: dict, key: str, where: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise InvalidPatchSet(f"{where}: {key} must be a non-empty string of one line")
    return value


def effect_cases(raw: object, *, where: str) -> tuple[str, ...]:
    """The patch set's top-level `effect_cases`: its probe's cases that test the change's effect
    (what the code does), not the patch's own code; `port` runs them on a release it cannot merge
    onto, to see whether the release ships the change."""
    if raw is None:
        return ()
    cases = _strings({"effect_cases": raw}, "effect_cases", where)
    if len(set(cases)) != len(cases):
        raise InvalidPatchSet(f"{where}: effect_cases lists a case twice")
    return cases


def _strings(raw: dict, key: str, where: str) -> tuple[str, ...]:
    value = raw[key]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise InvalidPatchSet(f"{where}: {key} must be a non-empty list of strings")
    return tuple(value)
