"""Patch sets: `patches/<id>/patch.toml` plus one diff per release variant.

Loaded and validated once; a patch set is data, not code (like auditwheel's policy files).
A bare diff file given with `--patch FILE` becomes a patch set without variants, which skips
the release and hash checks (the report says so).
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from . import ownfiles, supersession, tomltable
from .errors import BadInput, InvalidPatchSet, UnknownPatchSet, UnsupportedRelease

DEFAULT_PATCH_SET = "dspark-skip-mtp-buffer"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_TOP_KEYS = {"id", "title", "summary", "distribution", "strip", "probe", "probe_beside", "requires", "env", "variants",
             "superseded", "effect_cases"}
_BESIDE = re.compile(r"^--[a-z][a-z0-9-]*$")
_REQUIRED_TOP = {"id", "title", "summary", "distribution", "variants"}
_VARIANT_KEYS = {"name", "releases", "diff", "files", "review", "ported_from"}
_REQUIRED_VARIANT = {"name", "releases", "diff", "files"}
# A variant written by `dspark-patch port` starts "unreviewed"; a person who has read its
# review file (docs/porting.md) changes it to "reviewed". A variant without the key was
# reviewed by hand before the key existed.
ReviewState = Literal["reviewed", "unreviewed"]
_REVIEW_STATES: dict[str, ReviewState] = {"reviewed": "reviewed", "unreviewed": "unreviewed"}
_FILE_KEYS = {"pre_sha256", "post_sha256"}
# A patch set may come from a pull request: every file of it is read only when it is a regular
# file inside its folder, and only up to these sizes (the shipped ones are a few KiB).
TOML_LIMIT = 1 << 20
DIFF_LIMIT = 8 << 20
PROBE_LIMIT = 1 << 20
# Where vLLM reads its environment variables, by name, as string literals: a variable a patch set
# introduces (`env`) is added there, on an added line of each variant's diff (unread_env.py).
ENVS_FILE = "vllm/envs.py"
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_VLLM_LITERAL = re.compile(rb"""(['"])(VLLM_[A-Z0-9_]+)\1""")


@dataclass(frozen=True, kw_only=True)
class FileHashes:
    pre_sha256: str | None    # None: the variant adds the file
    post_sha256: str | None   # None: the variant deletes the file


@dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    releases: tuple[str, ...]
    diff_path: Path
    diff: bytes
    files: dict[str, FileHashes]
    review: ReviewState = "reviewed"
    ported_from: str | None = None   # the variant `dspark-patch port` made this one from

    @property
    def diff_sha256(self) -> str:
        return hashlib.sha256(self.diff).hexdigest()


@dataclass(frozen=True, kw_only=True)
class PatchSet:
    id: str | None             # None for a bare diff file
    title: str
    summary: str
    distribution: str
    strip: int
    probe: Path | None         # the patch set's own probe script, or None: it has none
    probe_modules: tuple[Path, ...] = ()  # modules the probe imports, bundled with it (probe = [entry, ...])
    # The flag of the probe's part that needs none of its imports (probe/prestart.py runs it in a
    # child beside them when the probe starts early): `probe_beside = "--census"`, or None.
    probe_beside: str | None = None
    source: Path               # the folder (or bare diff file) it was loaded from
    variants: tuple[Variant, ...]
    # The patch sets that must come before this one in a series (series.py): for a file one of
    # them also changes, this set's pre_sha256 is the hash after them.
    requires: tuple[str, ...] = ()
    # Releases that ship the change in their own form (supersession.py): proven, never assumed.
    superseded: tuple[supersession.Superseded, ...] = ()
    # The probe's cases that test the change's effect (supersession.effect_cases).
    effect_cases: tuple[str, ...] = ()
    # The environment variables it introduces (`env = [...]`): each on an added line of every
    # variant's diff of vllm/envs.py, and every VLLM_* literal added there named (checked on load).
    env: tuple[str, ...] = ()

    @property
    def is_bare(self) -> bool:
        return self.id is None

    @property
    def content_sha256(self) -> str:
        """What a state of this patch set means (every variant's releases, diff and file hashes):
        two runs agree on `applied` only when their patch sets have the same digest."""
        text = "".join(
            f"{v.name}\0{','.join(v.releases)}\0{v.diff_sha256}\0"
            + "".join(f"{path}\0{h.pre_sha256}\0{h.post_sha256}\0" for path, h in sorted(v.files.items())) + "\n"
            for v in self.variants) + "".join(r.digest_text for r in self.superseded)
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()

    def superseded_for(self, release: str) -> supersession.Superseded | None:
        """The record saying `release` ships this set's change in its own form, or None."""
        return next((r for r in self.superseded if release in r.releases), None)

    def variant_for(self, release: str) -> Variant:
        for variant in self.variants:
            if release in variant.releases:
                return variant
        covered = ", ".join(r for v in self.variants for r in v.releases) or "none"
        raise UnsupportedRelease(
            f"patch set {self.id} has no variant for {self.distribution} {release}; it covers {covered}",
            hint=f"install a covered release, or add and test a variant for {release}",
        )


def is_id(text: str) -> bool:
    """Whether `text` may be a patch set's id (and its folder's name)."""
    return bool(_ID.match(text))


def patches_dir() -> Path:
    """Where the shipped patch sets live: $DSPARK_PATCH_PATCHES, else the package data.

    The repository's top-level patches/ folder is installed as `dspark_patch.patches` (wheel,
    sdist and editable install alike; see setup.py), so one lookup serves every install."""
    env = os.environ.get("DSPARK_PATCH_PATCHES")
    if env:
        return Path(env)
    # Wheels install unpacked and the editable finder maps onto the checkout: always a real folder.
    return Path(str(resources.files("dspark_patch.patches")))


def team_dirs() -> tuple[Path, ...]:
    """The folders of a team's own patch sets: $DSPARK_PATCH_PATH, a `:`-separated list (as
    PATH), each a folder holding patch-set folders. An empty entry is skipped; an entry that is
    not a folder is refused (a typo must not quietly leave a patch set out of every verdict)."""
    dirs: list[Path] = []
    for entry in os.environ.get("DSPARK_PATCH_PATH", "").split(os.pathsep):
        if not entry:
            continue
        folder = Path(entry)
        if not folder.is_dir():
            raise BadInput(f"DSPARK_PATCH_PATH names {entry!r}, which is not a folder",
                           hint="list folders that hold patch-set folders, separated by ':'")
        if folder not in dirs:
            dirs.append(folder)
    return tuple(dirs)


def search_dirs() -> tuple[Path, ...]:
    """Every folder patch sets are found in, in order: the shipped ones, then DSPARK_PATCH_PATH's
    (a folder named twice, or the shipped one named again, is searched once)."""
    dirs: list[Path] = []
    seen: set[Path] = set()
    for folder in (patches_dir(), *team_dirs()):
        real = folder.resolve()
        if real not in seen:
            seen.add(real)
            dirs.append(folder)
    return tuple(dirs)


def known(patchsets: Iterable[PatchSet]) -> list[PatchSet]:
    """The patch sets that name their releases and reviewed hashes, what a tree's state is told
    against; a bare diff file names neither."""
    return [p for p in patchsets if not p.is_bare]


def patched_paths(patchsets: Iterable[PatchSet]) -> frozenset[str]:
    """Every file a known patch set changes, whatever the release (a tree's views keep their bytes)."""
    return frozenset(path for p in known(patchsets) for v in p.variants for path in v.files)


def available() -> list[PatchSet]:
    """Every patch set found: the shipped ones, then those of DSPARK_PATCH_PATH's folders. An id
    found in two folders is refused: which of two different patch sets a verdict was told
    against must never depend on the order of a search path."""
    found: dict[str, PatchSet] = {}
    for folder in _folders_with_patch_sets():
        patchset = load_dir(folder)
        assert patchset.id is not None
        if patchset.id in found:
            raise _twice(patchset.id, found[patchset.id].source, folder)
        found[patchset.id] = patchset
    return list(found.values())


def _folders_with_patch_sets() -> list[Path]:
    folders: list[Path] = []
    for root in search_dirs():
        if root.is_dir():
            folders.extend(d for d in sorted(root.iterdir()) if (d / "patch.toml").is_file())
    return folders


def _twice(pid: str, first: Path, second: Path) -> InvalidPatchSet:
    return InvalidPatchSet(f"patch set {pid} is in both {first} and {second}",
                           hint="rename one (its folder and its id), or take its folder out of DSPARK_PATCH_PATH")


def _by_id(pid: str) -> Path | None:
    """The one folder of patch set `pid` among the search folders, or None."""
    hits = [root / pid for root in search_dirs() if (root / pid / "patch.toml").is_file()]
    if len(hits) > 1:
        raise _twice(pid, hits[0], hits[1])
    return hits[0] if hits else None


def resolve(spec: str | None, *, strip: int | None = None) -> PatchSet:
    """`--patch` as a user gives it: a patch-set id, a patch-set folder, or a bare diff file."""
    if spec is None:
        spec = DEFAULT_PATCH_SET
    path = Path(spec)
    if path.is_dir():
        return load_dir(path)
    if path.is_file():
        return load_bare(path, strip=1 if strip is None else strip)
    folder = _by_id(spec) if _ID.match(spec) else None
    if folder is not None:
        return load_dir(folder)
    known = ", ".join(p.id or "" for p in available()) or "none"
    raise UnknownPatchSet(
        f"no patch set, folder or diff file named {spec!r}; known patch sets: {known}",
        hint="run `dspark-patch list`",
    )


def load_bare(path: Path, *, strip: int = 1) -> PatchSet:
    data = ownfiles.read_regular(path, limit=DIFF_LIMIT, what="diff file")
    variant = Variant(name="bare-diff", releases=(), diff_path=path, diff=data, files={})
    return PatchSet(
        id=None, title=path.name, summary="a bare diff file: no release or hash checks",
        distribution="vllm", strip=strip, probe=None, source=path, variants=(variant,),
    )


def load_dir(folder: Path) -> PatchSet:
    toml_path = folder / "patch.toml"
    where = str(toml_path)
    if not os.path.lexists(toml_path):
        raise UnknownPatchSet(f"{folder} has no patch.toml", hint="a patch set is a folder with patch.toml and its diffs")
    raw = _read(_inside(folder, "patch.toml", what="patch.toml", where=where), limit=TOML_LIMIT, what="patch.toml")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidPatchSet(f"{where}: not valid TOML: {exc}", hint="fix the file") from None
    except RecursionError:
        raise InvalidPatchSet(f"{where}: not valid TOML: nested too deeply", hint="fix the file") from None

    tomltable.keys(doc, allowed=_TOP_KEYS, required=_REQUIRED_TOP, where=where)
    pid = tomltable.string(doc, "id", where)
    if not _ID.match(pid):
        raise InvalidPatchSet(f"{where}: id {pid!r} must be lower-case letters, digits, '.', '_' or '-'")
    if pid != folder.name:
        raise InvalidPatchSet(f"{where}: id {pid!r} differs from its folder name {folder.name!r}", hint="rename one of them")
    strip = doc.get("strip", 1)
    if not isinstance(strip, int) or isinstance(strip, bool) or strip < 0:
        raise InvalidPatchSet(f"{where}: strip must be a non-negative integer")
    probe, probe_modules = _probe(folder, doc.get("probe"), where=where)
    beside = doc.get("probe_beside")
    if beside is not None and (probe is None or not isinstance(beside, str) or not _BESIDE.match(beside)):
        raise InvalidPatchSet(f"{where}: probe_beside must be a probe's flag such as \"--census\", "
                              f"and needs a probe, got {beside!r}",
                              hint="name the flag the probe runs its import-free part with, or leave it out")
    requires = _requires(doc.get("requires", []), pid, where=where)
    raw_variants = doc["variants"]
    if not isinstance(raw_variants, list) or not raw_variants:
        raise InvalidPatchSet(f"{where}: needs at least one [[variants]] table")

    variants = tuple(_variant(folder, v, where=f"{where} [[variants]] #{i}") for i, v in enumerate(raw_variants, 1))
    seen: dict[str, str] = {}
    for variant in variants:
        for release in variant.releases:
            if release in seen:
                raise InvalidPatchSet(f"{where}: release {release} is in both {seen[release]} and {variant.name}")
            seen[release] = variant.name
    # A set without the key claims nothing (a team's older set stays valid); with it, all is checked.
    env = _env(doc["env"], variants, strip, where=where) if "env" in doc else ()
    effects = supersession.effect_cases(doc.get("effect_cases"), where=where)
    if effects and probe is None:
        raise InvalidPatchSet(f"{where}: effect_cases names cases of a probe, and the patch set has none")
    superseded = _superseded(folder, doc.get("superseded", []), seen, where=where, has_probe=probe is not None,
                             default_cases=effects)
    return PatchSet(
        id=pid, title=tomltable.string(doc, "title", where), summary=tomltable.string(doc, "summary", where),
        distribution=tomltable.string(doc, "distribution", where), strip=strip, probe=probe, probe_modules=probe_modules,
        probe_beside=beside, source=folder, variants=variants, requires=requires, superseded=superseded,
        effect_cases=effects, env=env,
    )


def _superseded(folder: Path, raw: object, seen: dict[str, str], *, where: str,
                has_probe: bool, default_cases: tuple[str, ...]) -> tuple[supersession.Superseded, ...]:
    """The `[[superseded]]` tables: a release is either a variant's or a record's, never both."""
    if not isinstance(raw, list):
        raise InvalidPatchSet(f"{where}: superseded must be [[superseded]] tables")
    records = []
    for i, table in enumerate(raw, 1):
        record = supersession.parse(table, where=f"{where} [[superseded]] #{i}", has_probe=has_probe,
                                    default_cases=default_cases)
        if record.review_file is not None:
            review = _inside(folder, record.review_file, what="review_file", where=where)
            if not os.path.lexists(review):
                raise InvalidPatchSet(f"{where}: review file {record.review_file} is missing from {folder}")
        for release in record.releases:
            if release in seen:
                raise InvalidPatchSet(f"{where}: release {release} is in both {seen[release]} and {record.name}",
                                      hint="a release either needs the patch (a variant) or ships it (a superseded record)")
            seen[release] = record.name
        records.append(record)
    return tuple(records)



def _env(raw: object, variants: tuple[Variant, ...], strip: int, *, where: str) -> tuple[str, ...]:
    """`env = ["VLLM_...", ...]`: the variables the patch set introduces, as data the diffs prove:
    each diff adds every name as a string literal in vllm/envs.py, and names no other there."""
    if not isinstance(raw, list) or not all(isinstance(n, str) and _ENV_NAME.match(n) for n in raw) \
            or len(set(raw)) != len(raw):
        raise InvalidPatchSet(f"{where}: env must list environment variable names once each, got {raw!r}",
                              hint='e.g. env = ["VLLM_MY_FLAG"]; leave it out if the patch set introduces none')
    for variant in variants:
        added = _added_literals(variant.diff, strip)
        unlisted = sorted(added - set(raw))
        if unlisted:
            raise InvalidPatchSet(f"{where}: variant {variant.name} adds {', '.join(unlisted)} to {ENVS_FILE}, "
                                  "which env does not name", hint="list every variable the patch set introduces in env")
        absent = [n for n in raw if n not in added]
        if absent:
            raise InvalidPatchSet(f"{where}: env names {', '.join(absent)}, which variant {variant.name} does not add "
                                  f"to {ENVS_FILE} as a string literal", hint="name only what the diffs introduce")
    return tuple(raw)


def _added_literals(diff: bytes, strip: int) -> set[str]:
    """The VLLM_* string literals on the added lines of the diff's vllm/envs.py."""
    found: set[str] = set()
    path = None
    for line in diff.splitlines():
        if line.startswith(b"+++ "):
            name = line[4:].split(b"\t", 1)[0].strip().decode("utf-8", "replace")
            path = "/".join(name.split("/")[strip:])
        elif line.startswith(b"+") and path == ENVS_FILE:
            found.update(m.group(2).decode() for m in _VLLM_LITERAL.finditer(line))
    return found


def _requires(raw: object, pid: str, *, where: str) -> tuple[str, ...]:
    """`requires = ["id", ...]`: the patch sets that must come before this one in a series."""
    if not isinstance(raw, list) or not all(isinstance(r, str) and _ID.match(r) for r in raw):
        raise InvalidPatchSet(f"{where}: requires must be a list of patch-set ids, got {raw!r}",
                              hint='e.g. requires = ["dspark-skip-mtp-buffer"]; leave it out if it needs none')
    if pid in raw:
        raise InvalidPatchSet(f"{where}: patch set {pid} requires itself", hint="remove its own id from requires")
    if len(set(raw)) != len(raw):
        raise InvalidPatchSet(f"{where}: requires lists a patch set twice", hint="list each id once")
    return tuple(raw)


def _probe(folder: Path, raw: object, *, where: str) -> tuple[Path | None, tuple[Path, ...]]:
    """The patch set's probe: a Python file in its own folder, run by the target's interpreter.

    `probe = "probe.py"` names one file; `probe = ["probe.py", "probe_x.py", ...]` names the entry
    script first and then the modules it imports by their names (`import probe_x`), which the
    runner bundles with it into the one source it sends.
    """
    if raw is None:
        return None, ()
    names = raw if isinstance(raw, list) and raw else [raw]
    paths: list[Path] = []
    for name in names:
        if not isinstance(name, str) or not name.endswith(".py"):
            raise InvalidPatchSet(f"{where}: probe must name a .py file in the patch set's folder (or a list of them, the entry first), got {raw!r}",
                                  hint='e.g. probe = "probe.py"; leave it out if the patch set has no probe')
        path = _inside(folder, name, what="probe", where=where)
        if not os.path.lexists(path):
            raise InvalidPatchSet(f"{where}: probe file {name} is missing from {folder}",
                                  hint="add the file, or remove it from the probe key")
        try:  # the probe's source travels as text: it must be UTF-8 (read again when it runs)
            _read(path, limit=PROBE_LIMIT, what="probe file").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidPatchSet(f"{where}: probe file {name} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                                  hint="save the probe as UTF-8") from None
        if path in paths:
            raise InvalidPatchSet(f"{where}: probe file {name} is listed twice", hint="list each file once")
        paths.append(path)
    return paths[0], tuple(paths[1:])


def _inside(folder: Path, name: str, *, what: str, where: str) -> Path:
    if not name or "\0" in name or len(name) > 255:
        raise InvalidPatchSet(f"{where}: {what} {name[:80]!r} is not a file name in {folder}")
    try:
        path = (folder / name).resolve()
        inside = path.parent == folder.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links, a name the system refuses
        raise InvalidPatchSet(f"{where}: {what} {name[:80]!r} cannot be resolved in {folder} ({exc})") from None
    if not inside:
        raise InvalidPatchSet(f"{where}: {what} {name!r} must be a file inside {folder}")
    return path


def _read(path: Path, *, limit: int, what: str) -> bytes:
    """A file of the patch set: a regular file (its links resolved inside the folder by `_inside`),
    at most `limit` bytes; anything else is InvalidPatchSet (exit 2)."""
    try:
        return ownfiles.read_regular(path, limit=limit, what=what)
    except BadInput as exc:
        raise InvalidPatchSet(exc.message, hint=exc.hint) from None


def _variant(folder: Path, raw: object, *, where: str) -> Variant:
    if not isinstance(raw, dict):
        raise InvalidPatchSet(f"{where}: must be a table")
    tomltable.keys(raw, allowed=_VARIANT_KEYS, required=_REQUIRED_VARIANT, where=where)
    name = tomltable.string(raw, "name", where)
    releases = raw["releases"]
    if not isinstance(releases, list) or not releases or not all(isinstance(r, str) and r for r in releases):
        raise InvalidPatchSet(f"{where}: releases must be a non-empty list of version strings")
    diff_name = tomltable.string(raw, "diff", where)
    diff_path = _inside(folder, diff_name, what="diff", where=where)
    if not os.path.lexists(diff_path):
        raise InvalidPatchSet(f"{where}: diff file {diff_name} is missing from {folder}")
    diff = _read(diff_path, limit=DIFF_LIMIT, what="diff file")
    files_raw = raw["files"]
    if not isinstance(files_raw, dict) or not files_raw:
        raise InvalidPatchSet(f"{where}: files must list the sha256 before and after of every target file")
    files: dict[str, FileHashes] = {}
    for path, hashes in files_raw.items():
        fwhere = f"{where} files.{path!r}"
        if not isinstance(hashes, dict):
            raise InvalidPatchSet(f"{fwhere}: must be a table with pre_sha256 and post_sha256")
        tomltable.keys(hashes, allowed=_FILE_KEYS, required=set(), where=fwhere)
        pre = hashes.get("pre_sha256")
        post = hashes.get("post_sha256")
        for key, value in (("pre_sha256", pre), ("post_sha256", post)):
            if value is not None and (not isinstance(value, str) or not _SHA256.match(value)):
                raise InvalidPatchSet(f"{fwhere}: {key} must be 64 lower-case hex digits, got {value!r}")
        if pre is None and post is None:
            raise InvalidPatchSet(f"{fwhere}: needs pre_sha256, post_sha256 or both")
        files[path] = FileHashes(pre_sha256=pre, post_sha256=post)
    review = raw.get("review", "reviewed")
    if review not in _REVIEW_STATES:
        raise InvalidPatchSet(f"{where}: review must be \"reviewed\" or \"unreviewed\", got {review!r}",
                              hint="a person who has read the variant's review file marks it reviewed")
    ported_from = raw.get("ported_from")
    if ported_from is not None and (not isinstance(ported_from, str) or not ported_from.strip()):
        raise InvalidPatchSet(f"{where}: ported_from must name the variant this one was ported from")
    return Variant(name=name, releases=tuple(releases), diff_path=diff_path, diff=diff, files=files,
                   review=_REVIEW_STATES[review], ported_from=ported_from)


