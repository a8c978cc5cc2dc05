"""`dspark-patch new ID --root DIR --wheel FILE`: a patch set made from an edited installed tree,
as patch-package makes a patch from an edited node_modules.

The tree is compared with the published wheel of its release (the reference `verify` uses: the
wheel file given must be that very wheel, every file taken from it checked against it). Known
patch sets already in the tree are found hunk by hunk (pipeline/new_found.py), also where the
edit went on inside their hunks' context: a file one of them changes is diffed from that set's
result, and the set is recorded in `requires`, so the new set's `pre_sha256` is the hash after
it, as a series needs. A known set with no variant for the tree's release is left out, with a
note. Added and deleted files are kept; bytecode is not part of a patch; a binary file, or a
file name that is not UTF-8, is refused. The result is `OUT/ID/patch.toml` and the release's
diff, `review = "unreviewed"` (a person reads it and marks it reviewed), written as a pair or
not at all, and checked to load back and to reproduce the tree from the wheel, in the series it
requires, before it stays.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import ownfiles, references
from ..errors import BadInput, EnvironmentProblem, InvalidPatchSet, TargetNotFound, UnsafePatch
from ..patching.diff import parse_diff
from ..patching.series_plan import plan_series
from ..patchset import DIFF_LIMIT, PatchSet, available, is_id, load_dir
from ..porting.variant import CandidateFile, make_diff
from ..references.fetch import fetched_wheel
from ..targets.views.from_folder import read_site
from ..targets.views.site_files import SiteFiles
from . import new_found

DISTRIBUTION = "vllm"


@dataclass(frozen=True, kw_only=True)
class NewRequest:
    id: str
    wheel: str | None = None     # the published wheel's file; None: fetched (references/fetch.py)
    root: str | None = None      # an edited site-packages folder, or
    image: str | None = None     # an image someone edited in a container and committed
    out: str | None = None       # default: the first folder of DSPARK_PATCH_PATH, else "."


@dataclass(frozen=True, kw_only=True)
class NewSet:
    folder: Path
    release: str
    requires: tuple[str, ...]
    files: tuple[tuple[str, str], ...]    # (path, "modify" | "add" | "delete")
    notes: tuple[str, ...] = ()           # known sets left out or found only in part


def make(request: NewRequest) -> NewSet:
    if not is_id(request.id):
        raise BadInput(f"{request.id!r} is not a patch-set id: lower-case letters, digits, '.', '_' or '-'",
                       hint="e.g. dspark-patch new team-envs --root ...")
    if (request.root is None) == (request.image is None):
        raise BadInput("new takes exactly one of --root DIR and --image REF", hint="name the edited tree or image")
    out = _out_folder(request.out)
    if os.path.lexists(out / request.id):
        raise BadInput(f"{out / request.id} exists already; a new patch set never overwrites one",
                       hint="choose another id, or remove that folder")
    if request.root is not None:
        root = Path(request.root)
        site = read_site(root, DISTRIBUTION)
        where = Path(site.location)
        return _make(request, out, site, lambda paths: {
            p: ownfiles.read_regular(where / p, limit=DIFF_LIMIT, what=p) for p in paths if p in site.hashes})
    from ..targets import open_store

    with open_store().open_reader(request.image or "") as reader:
        site = reader.read_site(DISTRIBUTION)
        return _make(request, out, site, lambda paths: dict(reader.read_site(DISTRIBUTION, retain=paths).retained))


def _make(request: NewRequest, out: Path, site: SiteFiles, contents: Callable[[list[str]], Mapping[str, bytes]]) -> NewSet:
    """`contents(paths)`: the tree's bytes of those files (one read of them all)."""
    wheel_sha = references.wheel_hash(site.distribution, site.release, site.hashes)
    ref = references.find(site.distribution, site.release, wheel_sha)
    if ref is None:
        raise BadInput(references.no_reference(site.distribution, site.release, wheel_sha),
                       hint="new diffs a tree against the published wheel of its release")
    if request.wheel is None:  # the published wheel of the tree's release and platform, fetched
        with fetched_wheel(ref.distribution, ref.release, platform=ref.wheel.removesuffix(".whl").split("-")[-1]) as path:
            return _from_wheel(request, out, site, contents, ref, _Wheel(path, ref))
    return _from_wheel(request, out, site, contents, ref, _Wheel(Path(request.wheel), ref))


def _from_wheel(request: NewRequest, out: Path, site: SiteFiles, contents: Callable[[list[str]], Mapping[str, bytes]],
                ref: references.Reference, wheel: _Wheel) -> NewSet:
    owned = {p.split("/", 1)[0] for p in ref.files if "/" in p and not p.split("/", 1)[0].endswith((".dist-info", ".data"))}
    known, notes = new_found.for_release([p for p in available() if not p.is_bare], site.release)
    # Every file that is not the wheel's, and every file a known set changes: read once.
    wanted = {p for p, h in site.hashes.items() if p.split("/", 1)[0] in owned and _source(p)
              and ref.files.get(p, ("",))[0] != h}
    for path in sorted(wanted):
        _utf8_name(path)
    wanted |= {p for k in known for p in _files(k, site.release) if p in site.hashes}
    tree = contents(sorted(wanted))
    found = new_found.carried(known, tree, site.hashes, site.release)
    applied = list(found.sets)
    chain = _chain_result(applied, wheel, site.release)          # the files the applied sets give
    changes: dict[str, tuple[bytes | None, bytes | None]] = {}
    paths = sorted({p for p in (*ref.files, *site.hashes, *chain) if p.split("/", 1)[0] in owned and _source(p)})
    for path in paths:
        before = chain[path] if path in chain else (wheel.read(path) if path in ref.files else None)
        now = site.hashes.get(path)
        if now == (None if before is None else _sha(before)):
            continue
        after = tree.get(path) if now is not None else None
        if now is not None and (after is None or _sha(after) != now):
            raise BadInput(f"{path} changed while it was read", hint="run new again on a tree nobody is editing")
        _utf8_name(path)
        _text(path, before)
        _text(path, after)
        changes[path] = (before, after)
    if not changes:
        carried = f" plus {', '.join(p.id or '' for p in applied)}" if applied else ""
        raise BadInput(f"{request.root or request.image} has no change beyond the published wheel {ref.wheel}{carried}: "
                       "nothing to make", hint="edit the installed files first, then run new on that tree")
    requires = tuple(p.id or "" for p in applied if set(_files(p, site.release)) & set(changes))
    diff, toml = _set_files(request.id, site.release, requires, changes)
    folder = _write(out, request.id, site.release, (diff, toml),
                    lambda made: _check(made, changes, chain, wheel, site.release))
    return NewSet(folder=folder, release=site.release, requires=requires,
                  files=tuple((p, "add" if b is None else "delete" if a is None else "modify")
                              for p, (b, a) in sorted(changes.items())),
                  notes=(*notes, *found.notes))


def _out_folder(out: str | None) -> Path:
    if out is not None:
        return Path(out)
    first = next((e for e in os.environ.get("DSPARK_PATCH_PATH", "").split(os.pathsep) if e), None)
    return Path(first) if first else Path(".")


class _Wheel:
    """The published wheel's files, each checked against the reference before it is used."""

    def __init__(self, path: Path, ref: references.Reference) -> None:
        if not path.is_file():
            raise TargetNotFound(f"--wheel {path}: no such file",
                                 hint=f"give {ref.wheel} (pip download --no-deps {ref.distribution}=={ref.release})")
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise BadInput(f"--wheel {path}: not a readable wheel ({exc})", hint=f"give {ref.wheel}") from None
        self._path, self._ref = path, ref

    def has(self, name: str) -> bool:
        return name in self._ref.files

    def read(self, name: str) -> bytes:
        expected = self._ref.files[name][0]
        try:
            data = self._zip.read(name)
        except KeyError:
            data = b""
        if _sha(data) != expected:
            raise BadInput(f"--wheel {self._path}: {name} is not the published {self._ref.wheel}'s",
                           hint=f"give the published wheel {self._ref.wheel} (pip download --no-deps "
                                f"{self._ref.distribution}=={self._ref.release})")
        return data


def _files(patchset: PatchSet, release: str) -> Mapping[str, object]:
    return patchset.variant_for(release).files


def _chain_result(applied: list[PatchSet], wheel: _Wheel, release: str) -> dict[str, bytes | None]:
    """Each file the applied sets change, as the wheel's file with those sets applied in order."""
    if not applied:
        return {}
    steps = []
    for patchset in applied:
        variant = patchset.variant_for(release)
        steps.append((patchset.id or "", parse_diff(variant.diff, strip=patchset.strip)))
    paths = {f.path for _name, diff in steps for f in diff.files}
    base = {path: wheel.read(path) if wheel.has(path) else None for path in paths}
    plan = plan_series(steps, base.get)
    return {f.path: f.post for f in plan.combined.files}


def _source(path: str) -> bool:
    return "/__pycache__/" not in f"/{path}" and not path.endswith((".pyc", ".pyo"))


def _text(path: str, data: bytes | None) -> None:
    if data is None:
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = b"\0"
    if b"\0" in data:
        raise UnsafePatch(f"{path} is a binary file; a patch set carries text diffs only",
                          hint="take the binary change out of the tree, or ship it another way")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _utf8_name(path: str) -> None:
    """A patch set names its files in UTF-8 (patch.toml is TOML, the diff's headers are read so),
    one name to a header line."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise BadInput(f"{shown}: the file name is not UTF-8; a patch set names its files in UTF-8",
                       hint="rename the file in the tree (or remove it), then run new again") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise BadInput(f"{path!r}: the file name holds a control character; a diff cannot name it",
                       hint="rename the file in the tree (or remove it), then run new again")


def _quote(text: str) -> str:
    """A TOML basic string (the name checked by `_utf8_name`; quote and backslash escaped)."""
    return '"' + "".join(f"\\u{ord(c):04x}" if c in '"\\' else c for c in text) + '"'


def _set_files(pid: str, release: str, requires: tuple[str, ...],
               changes: Mapping[str, tuple[bytes | None, bytes | None]]) -> tuple[bytes, bytes]:
    """The diff and patch.toml, as bytes: all made before anything is written."""
    diff = make_diff(tuple(CandidateFile(path=p, pre=b, post=a) for p, (b, a) in sorted(changes.items())))
    name = f"{DISTRIBUTION}-{release}"
    lines = [f'id = "{pid}"', f'title = "{pid}"',
             f'summary = "made by dspark-patch new from an edited vLLM {release} tree; describe the change here"',
             f'distribution = "{DISTRIBUTION}"']
    if requires:
        lines.append("requires = [" + ", ".join(f'"{r}"' for r in requires) + "]")
    lines += ["", "[[variants]]", f'name = "{name}"', f'releases = ["{release}"]', f'diff = "{name}.patch"',
              'review = "unreviewed"']
    for path, (before, after) in sorted(changes.items()):
        lines += ["", f"[variants.files.{_quote(path)}]"]
        if before is not None:
            lines.append(f'pre_sha256 = "{_sha(before)}"')
        if after is not None:
            lines.append(f'post_sha256 = "{_sha(after)}"')
    return diff, ("\n".join(lines) + "\n").encode("utf-8")


def _write(out: Path, pid: str, release: str, files: tuple[bytes, bytes], check: Callable[[Path], None]) -> Path:
    """The diff and patch.toml as a pair or not at all: the folder is made here (one that is
    there already is refused), both files go in under temporary names renamed into place together
    (ownfiles' write_set), and the set is checked where it lies; any failure removes the folder."""
    diff, toml = files
    with ownfiles.open_folder(out) as parent, parent.sub(pid) as folder:
        if not folder.made:
            raise BadInput(f"{out / pid} exists already; a new patch set never overwrites one",
                           hint="choose another id, or remove that folder")
        try:
            folder.write_set([(f"{DISTRIBUTION}-{release}.patch", diff), ("patch.toml", toml)])
            check(out / pid)
        except BaseException as exc:
            parent.remove_tree(pid)
            if isinstance(exc, OSError):
                raise EnvironmentProblem(f"cannot write {out / pid}: {exc.strerror or exc}; nothing was kept",
                                         hint="check that the folder is writable and has room") from None
            raise
    return out / pid


def _check(folder: Path, changes: Mapping[str, tuple[bytes | None, bytes | None]],
           chain: Mapping[str, bytes | None], wheel: _Wheel, release: str) -> None:
    """The written set loads back and, placed on the wheel after the sets it requires, gives the
    tree's files (else `_write` removes it again: a bug here must not leave a set that lies)."""
    made = load_dir(folder)
    variant = made.variant_for(release)
    diff = parse_diff(variant.diff, strip=made.strip)
    start = {path: chain[path] if path in chain else (wheel.read(path) if wheel.has(path) else None)
             for path in changes}
    plan = plan_series([(made.id or "", diff)], start.get)
    if {f.path: f.post for f in plan.combined.files} != {p: a for p, (_b, a) in changes.items()}:
        raise InvalidPatchSet(f"{folder}: the written diff does not reproduce the tree",
                              hint="this is a bug in dspark-patch new; nothing was kept")
