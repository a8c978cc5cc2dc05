"""What the inside scripts answer, typed where the host reads them; not itself run inside.

`locate.py`, `integrity.py`, `compile.py` and `started.py` print one JSON object; the host turns it
into a frozen answer here and nowhere else (`decode_locate`, `decode_integrity`, `decode_compile`,
`decode_started`). A kept answer (targets/caches/answers.py) is read by
the same decoder: the cache folder, like the image, is input the host does not trust. Whatever is
not the shape the script writes (a key missing, a value of another type, an extra nesting) is one
error, `MalformedAnswer`, naming the script and the first field at fault; the caller says what
that means to a user (a miss for a kept answer, a failed check for a fresh one).
`encode_locate` and `encode_integrity` give back the JSON a kept answer is stored as.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RecordRow = tuple[str, str | None, int | None]           # RECORD: path, sha256 hex or None, size or None
ScriptFile = bytes | str | None                          # a console script's bytes, why it was not read, or none


class MalformedAnswer(ValueError):
    """An inside script's answer that is not the shape it writes."""

    def __init__(self, script: str, field: str, why: str) -> None:
        self.script = script
        self.field = field   # the answer's top-level key at fault ("" for the whole answer)
        super().__init__(f"{script}'s answer: {field or 'the answer'} {why}")


@dataclass(frozen=True, kw_only=True)
class Installed:
    """The distribution as one interpreter sees it (locate.py, when found)."""

    name: str
    version: str
    location: str                  # the site folder holding its dist-info
    package_dir: str | None        # where `import top` resolves, None if nowhere
    record_file: str | None        # RECORD's path relative to `location`
    record: tuple[RecordRow, ...]
    record_error: str | None = None
    duplicates: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class LocateAnswer:
    """locate.py's answer: the interpreter, and the distribution if it has one."""

    python: str
    python_version: str
    cache_tag: str
    sys_path: tuple[str, ...]
    installed: Installed | None    # None: this interpreter has no such distribution


@dataclass(frozen=True, kw_only=True)
class IntegrityAnswer:
    """integrity.py's answer: the facts of a site folder the host judges (pipeline/integrity_check.py)."""

    files: Mapping[str, tuple[str | None, int]]   # path -> (sha256, None when the host hashes; size)
    pth: Mapping[str, bytes | None]               # name -> text (latin-1), None over the cap
    bytecode: Mapping[str, str]                   # pyc -> why it is not what the interpreter compiles, or ""
    metadata: Mapping[str, bytes | None]          # dist-info file -> bytes, None over the cap
    scripts: Mapping[str, ScriptFile]             # console-script row -> bytes, why not read, or None
    others: tuple[str, ...] = ()
    top_level: tuple[str, ...] = ()
    pth_listed: tuple[str, ...] = ()
    cache_tag: str = ""
    identity: str | None = None
    proofs: str | None = None
    proofs_reused: int = 0


def decode_locate(doc: Any) -> LocateAnswer:
    """locate.py's JSON object as a LocateAnswer; MalformedAnswer if it is not one."""
    d = _Doc("locate.py", doc)
    installed = None
    if d.get("found", bool):
        installed = Installed(
            name=d.get("name", str), version=d.get("version", str), location=d.get("location", str),
            package_dir=d.get("package_dir", str, none=True), record_file=d.get("record_file", str, none=True),
            record=tuple(_record_row(d, row) for row in d.get("record", list)),
            record_error=d.get("record_error", str, none=True, missing=None),
            duplicates=d.strings("duplicates", missing=()))
    return LocateAnswer(python=d.get("python", str), python_version=d.get("python_version", str),
                        cache_tag=d.get("cache_tag", str), sys_path=d.strings("sys_path"), installed=installed)


def encode_locate(answer: LocateAnswer) -> dict[str, Any]:
    """The JSON locate.py prints for `answer` (decode_locate's inverse)."""
    doc: dict[str, Any] = {"found": answer.installed is not None, "python": answer.python,
                           "python_version": answer.python_version, "cache_tag": answer.cache_tag,
                           "sys_path": list(answer.sys_path)}
    i = answer.installed
    if i is not None:
        doc.update(name=i.name, version=i.version, location=i.location, package_dir=i.package_dir,
                   record_file=i.record_file, record=[list(row) for row in i.record])
        if i.record_error is not None:
            doc["record_error"] = i.record_error
        if i.duplicates:
            doc["duplicates"] = list(i.duplicates)
    return doc


def decode_integrity(doc: Any) -> IntegrityAnswer:
    """integrity.py's JSON object as an IntegrityAnswer; MalformedAnswer if it is not one.
    `files` is checked first (the caller may tell a walk without its files from one without
    its other facts)."""
    d = _Doc("integrity.py", doc)
    files = {path: _file_row(d, row) for path, row in d.mapping("files").items()}
    return IntegrityAnswer(
        files=files,
        pth={k: d.latin1("pth", v) for k, v in d.mapping("pth").items()},
        bytecode={k: d.value("bytecode", v, str) for k, v in d.mapping("bytecode").items()},
        metadata={k: d.latin1("metadata", v) for k, v in d.mapping("metadata").items()},
        scripts={k: _script_file(d, v) for k, v in d.mapping("scripts").items()},
        others=d.strings("others", missing=()), top_level=d.strings("top_level", missing=()),
        pth_listed=d.strings("pth_listed", missing=()), cache_tag=d.get("cache_tag", str, missing=""),
        identity=d.get("identity", str, none=True, missing=None), proofs=d.get("proofs", str, none=True, missing=None),
        proofs_reused=d.get("proofs_reused", int, missing=0))


def encode_integrity(answer: IntegrityAnswer) -> dict[str, Any]:
    """The JSON integrity.py prints for `answer` (decode_integrity's inverse)."""
    doc: dict[str, Any] = {
        "files": {p: [sha, size] for p, (sha, size) in answer.files.items()},
        "others": list(answer.others), "top_level": list(answer.top_level),
        "pth": {k: None if v is None else v.decode("latin-1") for k, v in answer.pth.items()},
        "pth_listed": list(answer.pth_listed), "bytecode": dict(answer.bytecode), "cache_tag": answer.cache_tag,
        "metadata": {k: None if v is None else v.decode("latin-1") for k, v in answer.metadata.items()},
        "scripts": {k: {"why": v} if isinstance(v, str) else None if v is None else v.decode("latin-1")
                    for k, v in answer.scripts.items()},
    }
    if answer.identity is not None or answer.proofs_reused:
        doc["proofs_reused"] = answer.proofs_reused
    if answer.identity is not None:
        doc["identity"] = answer.identity
    if answer.proofs is not None:
        doc["proofs"] = answer.proofs
    return doc


@dataclass(frozen=True, kw_only=True)
class CompiledRow:
    """compile.py's row for one file, in the order the files were given."""

    path: str
    ok: bool
    detail: str            # why it did not compile ("" when it did)


def decode_compile(doc: Any, count: int) -> tuple[CompiledRow, ...]:
    """compile.py's JSON object as one row per file it was given (`count` of them);
    MalformedAnswer if it is not that."""
    d = _Doc("compile.py", doc)
    rows = d.get("files", list)
    if len(rows) != count:
        raise d.bad("files", f"holds {len(rows)} rows for {count} files")
    out = []
    for row in rows:
        if not isinstance(row, dict):
            raise d.bad("files", f"holds {_kind(row)}, not an object")
        r = _Doc("compile.py", row)
        out.append(CompiledRow(path=r.get("path", str), ok=r.get("ok", bool), detail=r.get("detail", str)))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class StartedSpec:
    """Where `import top` resolves in the image's python as the image starts it."""

    origin: str | None            # None: a namespace package
    locations: tuple[str, ...]    # its submodule search locations


@dataclass(frozen=True, kw_only=True)
class StartedAnswer:
    """started.py's answer: the image's python as the image starts it (targets/runtime.py judges it)."""

    path: tuple[str, ...]                            # sys.path
    modules: tuple[tuple[str, str | None], ...]      # each module imported at start, and its file
    finders: tuple[str, ...]                         # sys.meta_path, qualified names
    stdlib: tuple[str, ...]
    stdlib_names: tuple[str, ...]
    sites: tuple[str, ...]
    spec: StartedSpec | None                         # None: `import top` finds nothing
    error: str | None                                # what `find_spec(top)` raised


def decode_started(doc: Any) -> StartedAnswer:
    """started.py's JSON object as a StartedAnswer; MalformedAnswer if it is not one."""
    d = _Doc("started.py", doc)
    modules = []
    for row in d.get("modules", list):
        if not (isinstance(row, list) and len(row) == 2):
            raise d.bad("modules", f"holds {_kind(row)}, not a [name, file] pair")
        modules.append((d.value("modules", row[0], str), d.value("modules", row[1], str, none=True)))
    spec = d.get("spec", dict, none=True, missing=None)
    started_spec = None
    if spec is not None:
        s = _Doc("started.py", spec)
        started_spec = StartedSpec(origin=s.get("origin", str, none=True, missing=None), locations=s.strings("locations"))
    return StartedAnswer(path=d.strings("path"), modules=tuple(modules), finders=d.strings("finders"),
                         stdlib=d.strings("stdlib"), stdlib_names=d.strings("stdlib_names"), sites=d.strings("sites"),
                         spec=started_spec, error=d.get("error", str, none=True, missing=None))


_MISSING: Any = object()


class _Doc:
    """One answer's JSON object, read key by key; every refusal is a MalformedAnswer."""

    def __init__(self, script: str, doc: Any) -> None:
        if not isinstance(doc, dict):
            raise MalformedAnswer(script, "", f"is {_kind(doc)}, not an object")
        self.script = script
        self.doc = doc

    def bad(self, key: str, why: str) -> MalformedAnswer:
        return MalformedAnswer(self.script, key, why)

    def get(self, key: str, kind: type, *, none: bool = False, missing: Any = _MISSING) -> Any:
        if key not in self.doc:
            if missing is _MISSING:
                raise self.bad(key, "is missing")
            return missing
        return self.value(key, self.doc[key], kind, none=none)

    def value(self, key: str, value: Any, kind: type, *, none: bool = False) -> Any:
        if value is None and none:
            return None
        # bool is an int to isinstance; no answer means one by the other
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.bad(key, f"holds {_kind(value)}, not {'null or ' if none else ''}{_KINDS[kind]}")
        return value

    def strings(self, key: str, *, missing: Any = _MISSING) -> tuple[str, ...]:
        items = self.get(key, list, missing=missing)
        return tuple(self.value(key, item, str) for item in items)

    def mapping(self, key: str) -> dict[str, Any]:
        found: dict[str, Any] = self.get(key, dict)
        return found

    def latin1(self, key: str, value: Any) -> bytes | None:
        text = self.value(key, value, str, none=True)
        try:
            return None if text is None else text.encode("latin-1")
        except UnicodeEncodeError:
            raise self.bad(key, "holds text that is not latin-1") from None


_KINDS = {str: "a string", int: "an integer", bool: "true or false", list: "a list", dict: "an object"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _KINDS.items() if isinstance(value, kind)), type(value).__name__)


def _record_row(d: _Doc, row: Any) -> RecordRow:
    if not isinstance(row, list) or len(row) != 3:
        raise d.bad("record", "holds a row that is not [path, sha256, size]")
    return (d.value("record", row[0], str), d.value("record", row[1], str, none=True),
            d.value("record", row[2], int, none=True))


def _file_row(d: _Doc, row: Any) -> tuple[str | None, int]:
    if not isinstance(row, list) or len(row) != 2:
        raise d.bad("files", "holds an entry that is not [sha256, size]")
    return d.value("files", row[0], str, none=True), d.value("files", row[1], int)


def _script_file(d: _Doc, value: Any) -> ScriptFile:
    """integrity.py's answer for one console script: text (latin-1), null, or {"why": …}."""
    if isinstance(value, dict):
        if set(value) != {"why"}:
            raise d.bad("scripts", "holds an object that is not {\"why\": …}")
        why: str = d.value("scripts", value["why"], str)
        return why
    return d.latin1("scripts", value)
