"""What the published wheel holds, and a site folder's files checked against it.

Integrity is never taken from the image: its RECORD is written by whoever built the image, so
a hand edit plus a rewritten RECORD row would pass. Instead each supported release and
platform has a *reference*, made from the real wheel (`build.py`, `scripts/make-reference`;
the wheel's RECORD cross-checked against the bytes in the zip) and shipped in this package as
`<dist>-<release>-<wheel tags>.json.gz`: path -> [sha256, size] for every file the wheel installs.

A release the package ships none for gets one from its real wheel with `dspark-patch reference
add` (the same builder), kept in the user's folder (user.py); every lookup here reads both, each
file checked whole on load (document.py: a bad one is a BadReference error, never skipped), and a
shipped reference wins over a user file of the same name.

Which reference: the one of the release whose `<dist-info>/WHEEL` file is byte for byte the
installed one (the WHEEL file names the platform, `Tag: cp38-abi3-linux_x86_64`). An installed
WHEEL that is in no reference, or a release with none, is "no reference": never clean, and the
line says the command that adds it (`fix_command`).

`compare` is pure and serves both `status` (files read from layers or a folder) and `verify`
(facts gathered in the target by inside/integrity.py). Its rules:
- every reference file must be there with the reference's sha256, or with a post-image a known
  patch set gives it (or absent where a patch set deletes it): else *unexplained* / *missing*;
- in the distribution's own folders (the reference's top-level folders and any `<dist>-*.dist-info`),
  a file the reference does not hold is *added*, except the installer's own metadata in the
  dist-info (RECORD, and INSTALLER, REQUESTED, direct_url.json, uv_cache.json in the shape
  references/installer.py accepts: listed as `installer`; in another shape, an
  `installer_findings` line), files a patch set adds, and the
  cached bytecode of a module with a source (`__pycache__/m.<tag>[.opt-N].pyc`, proven apart:
  `verify` recompiles it, `status` checks its header); a sourceless `.pyc`, a symlink, a FIFO or
  any other non-regular entry is added;
- a RECORD row outside the distribution's folders must be the console script of an entry point
  the wheel declares, at a path an installer writes (references/installer.py); the file there,
  where there is one, must be an installer's trampoline for that entry point. Anything else is
  an `installer_findings` line;
- at the site folder's top level, `sitecustomize.*` and `usercustomize.*` are added (`site`
  imports them at every start), and a `.pth` is added unless it is one we know by content
  (setuptools' `distutils-precedence.pth`, and then the `_distutils_hack` it imports must be a
  text setuptools released: `distutils_hack_added`) or it is listed in some distribution's
  RECORD and has no `import` line (`site` executes those lines);
- the image's RECORD is checked too: a row whose hash differs from the reference, a row for a
  file the wheel does not hold, or a wheel file with no row is a *RECORD disagreement*, itself a
  finding.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from typing import Literal

from ..distname import filename_name
from ..errors import BadReference
from . import document, user
from . import installer as installer_rules

INSTALLER_FILES = installer_rules.METADATA_FILES | {"RECORD"}
# A console script's bytes as a view read them: bytes, None (no file there), or why it could not
# be read ("a symlink", "over 65536 bytes").
ScriptBytes = bytes | str | None
# .pth files known by content: setuptools writes this one (its import line only adds a
# distutils shim); the same bytes in every setuptools release since 49.
KNOWN_PTH = {"distutils-precedence.pth": frozenset({"2638ce9e2500e572a5e0de7faed6661eb569d1b696fcba07b0dd223da5f5d224"})}
PTH_CAP = 64 * 1024      # a .pth larger than this is not read: it counts as added
# What that .pth imports at every start: `_distutils_hack`, the first one on sys.path. Beside an
# accepted distutils-precedence.pth it must be setuptools' own: its `__init__.py` one of the
# texts setuptools released (v49.3.0 to v84.0.0, each tag's file; 31 texts), and no module file
# of that name at the top. The views read it like a .pth, under this key of `pth`.
DISTUTILS_HACK = "_distutils_hack/__init__.py"
KNOWN_DISTUTILS_HACK = frozenset({
    "026d425507ed93f30700abdf25056940cc15c7796b01b2863e1288520c1ac036",
    "03b38d1d8d6e9e14d4f12116683368d472a943c75ffe99986304b7b8bba0189c",
    "06c27ded9e7642a2d5d5ea432989050e91987b2d00cfdc5c0477f23cffda06b4",
    "1476fb218abe6877c54af4804ee9c98413c655c807d8a203fc2e111e41ae9bb8",
    "1542e30b6d07156f447ab4bcaec4a3a330feb93167d5dcaf548f6d6b2cdb852c",
    "228181f268b46192561e7b9a3c57ff31483e10b2584f6494e5256feb86d5e674",
    "322f93bf23a7b8ccd421cfeeb68129e66dccfc363a40b2d2917aa0e9ef30848f",
    "4513b154dbf2fa7776a1d0812e6d4396770a8e6f286000d30bf6694ff3294dd5",
    "46849a60a7cc85189cf6b5ac62b3f135004862ce6a96540a81c95ef6fbc4dc3e",
    "4bf5b0bc8f8af7ce7096e96f7167cf4f776f2cc0983f5c8f876ca780b3a67781",
    "4c2531daa12158dcabb8bce3e03386640407dfd866d9f27fc0377dd2894d3a6a",
    "4d27a48545b57dd137ae35376fcf326d2064271084a487960686f8704b94de4a",
    "52c30c27c38334fa426ba8d8784f7bb5e15df8511387ec0d0fbca8772fa224c1",
    "5f7454880e8a04fa0499ca3f0a3002ca5b7241b15119552965101b4a43c6c0cb",
    "600ff3472bad5c46ee6438a9516e844282c2e8fb946ef62c1b2060f9a2fe3c2b",
    "7688a23bb369b867ca503635e94c625981671c1e01adf621da6c59d2d07d5114",
    "870913c1cb82e84d190b5b700c4cc71af16ace684b88e19b5f6149af7b833435",
    "870c6f4869d409d7434c7ef7b99175568095b5541ac621538e5d8145fd01194f",
    "9b737c2ccce2dad2e896acfb6285c708419121078c00231a5439a7647cdd72e4",
    "9bc5b111a0a9cfbe403c5ca562f18a715571dfc12f7577a5123a4a32427112dc",
    "a325c4f62f92a19daaa558088e4339afd78e14df40c20a7d51c9dc3a714dc237",
    "a390f4d5ada584de84c5fed69fffd50fe43393401438d1615cdb9fd07e03c34a",
    "c05b8045c9a51ed915db41df44195068c3d8ee1431f93104b670695decac8b02",
    "c45c67c9dbcc6ce0432d98491eaca039563d9df5fb9d8a68608de3b9e41d80a4",
    "ccb3a83ef896531388f58fec08c15ee7998fa0a36b83196c374b74a7ca93022f",
    "ced72e54431ecf2d8d7dbd8a1e27724f1b171af3ca1503c304bf11c59a7fe861",
    "df81e6bcba34ee3e3952f776551fb669143b9490fdd6c4caeb32609f97e985b4",
    "e1d21987df00de20d4729c8afacee31bec8bcd6d799092908249a6e3d6a5e3b2",
    "e4a51d09fa11eb20b12a2861f82c5c5587ae4d3d096cf2d3246109b60991818d",
    "f0016db17603c3430ca7a444e28b1577445d9da7f7f32f746ed6820c3442a07d",
    "fcc99a0fb405120ec879fd8f8d35f974134d4c88e5ec814d42cbb06442b22f17",
})
STARTUP_MODULES = ("sitecustomize", "usercustomize")
_PYC = re.compile(r"^(?P<folder>(?:.+/)?)__pycache__/(?P<stem>[^./]+)\.[^/]+\.pyc$")


@dataclass(frozen=True, kw_only=True)
class Reference:
    distribution: str
    release: str
    wheel: str                              # the wheel's file name
    files: Mapping[str, tuple[str, int]]    # path -> (sha256 hex, size)
    scripts: Mapping[str, str] = field(default_factory=dict)  # console script name -> "module:attr"

    @cached_property  # a reference's files never change: a fleet's images ask many times
    def folders(self) -> frozenset[str]:
        return frozenset(p.split("/", 1)[0] for p in self.files if "/" in p)

    @cached_property
    def dist_info(self) -> str:
        return next(f for f in sorted(self.folders) if f.endswith(".dist-info"))




@dataclass(frozen=True, kw_only=True)
class Entry:
    """One reference file: shipped in this package, or the user's (references/user.py)."""

    name: str                                # <dist>-<release>-<wheel tags>.json.gz
    origin: Literal["shipped", "user"]
    where: str                               # the file, as a person finds it

    def load(self) -> Reference:
        return _load(self.name) if self.origin == "shipped" else _load_user(self.name)


@cache
def _load(name: str) -> Reference:
    return _reference(resources.files(__package__).joinpath(name).read_bytes(), name, f"shipped reference {name}")


def _load_user(name: str) -> Reference:
    data = user.read(name)
    return _decoded(data, name, hashlib.sha256(data).hexdigest(), str(user.folder() / name))


@cache
def _decoded(data: bytes, name: str, sha256: str, where: str) -> Reference:  # sha256: the cache's key
    return _reference(data, name, f"reference {where}")


def _reference(data: bytes, name: str, what: str) -> Reference:
    try:
        doc = document.decode(data, name)
    except document.Invalid as exc:
        raise BadReference(f"{what}: not a reference the tool can trust ({exc}); it is not used",
                           hint=user.fix_hint(name)) from None
    return Reference(distribution=doc.distribution, release=doc.release, wheel=doc.wheel, files=doc.files,
                     scripts=doc.scripts)


def _shipped_names() -> list[str]:
    return sorted(e.name for e in resources.files(__package__).iterdir() if document.split_name(e.name) is not None)


def shipped(distribution: str, release: str) -> list[str]:
    prefix = f"{filename_name(distribution)}-{release}-"
    return [n for n in _shipped_names() if n.startswith(prefix)]


def entries(distribution: str | None = None, release: str | None = None) -> list[Entry]:
    """Every reference of the distribution (and release), shipped ones first. A user file with a
    shipped one's name is not among them: the shipped one wins (`shadowed` says whether they differ)."""
    prefix = "" if distribution is None else f"{filename_name(distribution)}-" + ("" if release is None else f"{release}-")
    ours = [n for n in _shipped_names() if n.startswith(prefix)]
    found = [Entry(name=n, origin="shipped", where=str(resources.files(__package__).joinpath(n))) for n in ours]
    found += [Entry(name=n, origin="user", where=str(user.folder() / n))
              for n in user.names() if n.startswith(prefix) and n not in ours]
    return found


def shadowed() -> list[tuple[Entry, bool]]:
    """The user's files a shipped reference of the same name wins over, each with whether its
    bytes differ from the shipped one's."""
    ours = set(_shipped_names())
    return [(Entry(name=n, origin="user", where=str(user.folder() / n)),
             user.read(n) != resources.files(__package__).joinpath(n).read_bytes())
            for n in user.names() if n in ours]


def find(distribution: str, release: str, wheel_sha256: str | None) -> Reference | None:
    """The reference of this release whose WHEEL file is the installed one, or None."""
    for entry in entries(distribution, release):
        ref = entry.load()
        if wheel_sha256 is not None and ref.files.get(f"{ref.dist_info}/WHEEL", ("",))[0] == wheel_sha256:
            return ref
    return None


def folders_of(distribution: str, release: str) -> frozenset[str]:
    """The top-level folders the references of this release install into."""
    return frozenset(f for entry in entries(distribution, release) for f in entry.load().folders)


def fix_command(distribution: str, release: str) -> str:
    """The one command that gives a genuine release its reference."""
    return f"dspark-patch reference add {filename_name(distribution)}=={release}"


def no_reference(distribution: str, release: str, wheel_sha256: str | None) -> str:
    known = [e.name.removesuffix(document.SUFFIX).split("-", 2)[2] for e in entries(distribution, release)]
    if not known:
        return (f"no reference for {distribution} {release}: its files cannot be checked against the published wheel; "
                f"if it is the published release, add its reference: {fix_command(distribution, release)}")
    why = "it has no WHEEL file" if wheel_sha256 is None else "its WHEEL file is none of the published wheels'"
    return (f"no reference for {distribution} {release} on this platform ({why}; known: {', '.join(known)}): "
            "its files cannot be checked against the published wheel; if it is a published wheel's install, add "
            f"its reference: {fix_command(distribution, release)} --platform PLATFORM (its wheel's platform tag)")


def wheel_hash(distribution: str, release: str, hashes: Mapping[str, str]) -> str | None:
    """sha256 of the installed `<dist>-<release>.dist-info/WHEEL`, if there."""
    return hashes.get(f"{filename_name(distribution)}-{release}.dist-info/WHEEL")


@dataclass(frozen=True, kw_only=True)
class Comparison:
    checked: int
    unexplained: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    record_disagrees: tuple[str, ...] = ()
    installer: tuple[str, ...] = ()            # the installer's own files, accepted by their shape
    installer_findings: tuple[str, ...] = ()   # "path: why" for what is named like them and is not


def script_rows(record: Iterable[tuple[str, str | None]], scripts: Mapping[str, str]) -> tuple[str, ...]:
    """The RECORD rows a view reads the console script of (compare's `scripts`)."""
    return tuple(path for path, _ in record if installer_rules.script_name(path, scripts) is not None)


def all_scripts(distribution: str) -> dict[str, str]:
    """Every console script any reference of the distribution declares."""
    found: dict[str, str] = {}
    for entry in entries(distribution):
        found.update(entry.load().scripts)
    return found


def bytecode_source(rel: str) -> str | None:
    """The source a cached .pyc belongs to (a/__pycache__/m.cpython-311.pyc -> a/m.py), or None."""
    found = _PYC.match(rel)
    return f"{found['folder']}{found['stem']}.py" if found else None


def pth_added(name: str, sha256: str | None, data: bytes | None, listed_anywhere: Iterable[str]) -> bool:
    if sha256 is not None and sha256 in KNOWN_PTH.get(name, ()):
        return False
    if data is None:
        return True
    has_import = any(line.startswith((b"import ", b"import\t")) for line in data.splitlines())
    return has_import or name not in set(listed_anywhere)


def distutils_hack_added(top_level: Iterable[str], pth: Mapping[str, bytes | None]) -> list[str]:
    """What of `_distutils_hack` an accepted distutils-precedence.pth would import and setuptools
    did not write: a module file of that name at the top (it runs where no package is), or a
    package `__init__.py` of another text."""
    found = [name for name in top_level if name.split(".", 1)[0] == "_distutils_hack"]
    if DISTUTILS_HACK in pth:
        data = pth[DISTUTILS_HACK]
        if data is None or _sha256(data) not in KNOWN_DISTUTILS_HACK:
            found.append(DISTUTILS_HACK)
    return found


def compare(ref: Reference, *, hashes: Mapping[str, str], others: Iterable[str] = (),
            record: Iterable[tuple[str, str | None]] = (), post_images: Mapping[str, set[str | None]] | None = None,
            top_level: Iterable[str] = (), pth: Mapping[str, bytes | None] | None = None,
            listed_anywhere: Iterable[str] = (), metadata: Mapping[str, bytes | None] | None = None,
            scripts: Mapping[str, ScriptBytes] | None = None) -> Comparison:
    """The site folder against the reference (rules in the module doc).

    hashes: sha256 of every regular file in the distribution's own folders; others: the other
    entries there; record: the image's RECORD rows; post_images: per path, the contents known
    patch sets give it (None: deleted); top_level / pth: the site folder's top-level file names
    and the bytes of its .pth files (None: too large to read); metadata: the bytes of the dist-info's
    files named like installer metadata (None: not a regular file or over its cap); scripts: per
    console-script row (`script_rows`), the file's bytes as a view read them (ScriptBytes)."""
    post = post_images or {}
    others = set(others)
    unexplained, missing = [], []
    for path, (sha256, _) in ref.files.items():
        actual = hashes.get(path)
        if actual == sha256 or (actual is not None and actual in post.get(path, ())):
            continue
        if actual is None and path not in others:
            if None not in post.get(path, ()):
                missing.append(path)
            continue
        unexplained.append(path)

    info = ref.dist_info
    top = filename_name(ref.distribution)
    own = _owned_by(ref)

    def explained(path: str) -> bool:
        if path in ref.files:
            return True
        folder, _, name = path.rpartition("/")
        if folder == info and name == "RECORD":
            return True
        if folder == info and name in installer_rules.METADATA_FILES:
            why = installer_rules.metadata_problem(name, (metadata or {}).get(path))
            if why is None:
                accepted.append(path)
            else:
                findings.append(f"{path}: named as installer metadata, but {why}")
            return True
        if path in post:
            return True
        source = bytecode_source(path)
        return source is not None and (source in ref.files or path.startswith(top + "/") and source in post)

    accepted: list[str] = []
    findings: list[str] = []
    files = ref.files  # most paths are the wheel's own: explained at once, nothing else asked
    added = [p for p in hashes if p not in files and own(p) and not explained(p)]
    added += [p for p in others if own(p) and p not in ref.files]
    listed = set(listed_anywhere)
    hack = False   # an accepted distutils-precedence.pth imports _distutils_hack at every start
    for name in top_level:
        if name.split(".", 1)[0] in STARTUP_MODULES:
            added.append(name)
        elif name.endswith(".pth"):
            data = (pth or {}).get(name)
            digest = None if data is None else _sha256(data)
            if pth_added(name, digest, data, listed):
                added.append(name)
            else:
                hack = hack or digest in KNOWN_PTH.get(name, ())
    if hack:
        added += distutils_hack_added(top_level, pth or {})

    disagrees, outside, outside_accepted = _record_check(ref, tuple(record), post, scripts or {})
    findings += outside
    accepted += outside_accepted
    return Comparison(checked=len(ref.files), unexplained=tuple(sorted(unexplained)), missing=tuple(sorted(missing)),
                      added=tuple(sorted(set(added))), record_disagrees=tuple(sorted(set(disagrees))),
                      installer=tuple(sorted(set(accepted))), installer_findings=tuple(sorted(set(findings))))


def _owned_by(ref: Reference) -> Callable[[str], bool]:
    """Whether a path (relative to the site folder) is in the distribution's own folders or one of
    its dist-info folders."""
    folders, top = ref.folders, filename_name(ref.distribution)

    def own(path: str) -> bool:
        first = path.split("/", 1)[0]
        return first in folders or (first.endswith(".dist-info") and filename_name(first.split("-")[0]) == top)
    return own


def _record_check(ref: Reference, record: tuple[tuple[str, str | None], ...], post: Mapping[str, set[str | None]],
                  scripts: Mapping[str, ScriptBytes]) -> tuple[list[str], list[str], list[str]]:
    """The image's RECORD rows against the reference: (rows that disagree, findings of rows outside
    the distribution's folders, console-script rows accepted). A function of its inputs alone, so
    the tags of a fleet that share their RECORD, patch sets and scripts share the answer (kept for
    the same objects, with them, while this process runs)."""
    with _CHECKING:  # the tags read at once wait for one check of their shared RECORD
        return _record_check_once(ref, record, post, scripts)


def _record_check_once(ref: Reference, record: tuple[tuple[str, str | None], ...], post: Mapping[str, set[str | None]],
                       scripts: Mapping[str, ScriptBytes]) -> tuple[list[str], list[str], list[str]]:
    key = (id(ref), id(record), tuple(sorted((k, tuple(sorted(v, key=str))) for k, v in post.items())),
           tuple(scripts.items()))
    known = _RECORD_CHECKS.get(key)
    if known is not None and known[0] is ref and known[1] is record:
        return list(known[2][0]), list(known[2][1]), list(known[2][2])
    info = ref.dist_info
    own = _owned_by(ref)
    disagrees: list[str] = []
    findings: list[str] = []
    accepted: list[str] = []
    rows: set[str] = set()
    for path, row_sha256 in record:
        rows.add(path)
        if path.startswith(("/", "../")) or "/../" in path or not own(path):
            findings += _outside_row(ref, path, scripts, accepted)
            continue
        folder, _, name = path.rpartition("/")
        if folder == info and name in INSTALLER_FILES:
            continue
        if path in ref.files:
            if row_sha256 != ref.files[path][0] and row_sha256 not in post.get(path, ()):
                disagrees.append(path)
        elif row_sha256 is None and bytecode_source(path) in ref.files:
            continue  # pip lists the bytecode it wrote, without a hash
        elif path not in post:
            disagrees.append(path)
    disagrees += [p for p in ref.files if p not in rows]
    _RECORD_CHECKS[key] = (ref, record, (tuple(disagrees), tuple(findings), tuple(accepted)))
    for old in list(_RECORD_CHECKS)[:-16]:  # the oldest (another thread may evict the same one)
        _RECORD_CHECKS.pop(old, None)
    return disagrees, findings, accepted


_CHECKING = threading.Lock()
_RECORD_CHECKS: dict[tuple, tuple[Reference, tuple, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]] = {}


def _outside_row(ref: Reference, path: str, scripts: Mapping[str, ScriptBytes], accepted: list[str]) -> list[str]:
    """A RECORD row outside the distribution's folders: a console script of a declared entry
    point, in an installer's shape (accepted), or a finding line."""
    name = installer_rules.script_name(path, ref.scripts)
    if name is None:
        return [f"{path}: a RECORD row outside {ref.distribution}'s folders that is no console script it declares"]
    if path not in scripts:
        return [f"{path}: the console script was not read"]
    data = scripts[path]
    if data is None:
        return []  # no file there: nothing runs from this row (pip --target's row points past the target)
    why = data if isinstance(data, str) else installer_rules.script_problem(data, ref.scripts[name])
    if why is not None:
        return [f"{path}: not an installer's console script for {ref.scripts[name]} ({why})"]
    accepted.append(path)
    return []


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
