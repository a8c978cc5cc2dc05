"""The tool's own files: reports, port's outputs and work folder, caches. One guarded way to write them.

The folders these files go into are often in a checkout a contributor controls (the default
`./dspark-patch-reports`, `./dspark-patch-port`, a patch-set folder in a pull request), where a
committed symbolic link would turn a plain write or `rmtree` into one outside. So:

- a folder is opened one component at a time with `O_NOFOLLOW`: a component inside the working
  directory that is a link (or not a folder) is refused (`BadInput`, one line, exit 2), and so is
  the folder itself wherever it is; above the working directory, and the existing part of a path
  outside it, are the user's own choice and followed;
- every file is written to a fresh temporary name (`O_CREAT|O_EXCL|O_NOFOLLOW`) in its folder and
  renamed into place, relative to the open folder: a reader sees the old file or the new one, and
  a link planted under the file's name is refused, never written through;
- files and folders are created under the user's umask (0666 and 0777 before it);
- `remove_tree` removes only a folder (never a link) below an open folder, without following a
  link inside it (`shutil.rmtree` with `dir_fd`).

`read_regular` is the bounded read of an untrusted file: a regular file, not a link, at most
`limit` bytes, read without blocking on a FIFO. `read_json` is the one reader of the JSON the tool
is handed (audit.json, status.json, attestations): `read_regular`, then `loads_json`, which
refuses nesting deeper than `JSON_DEPTH` before the decoder (which recurses) sees it, so a hostile
document is one line and exit 2, never a RecursionError.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from .errors import BadInput, EnvironmentProblem

_TMP_SUFFIX = ".dspark-tmp"
_tmp_numbers = itertools.count()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Folder:
    """An open folder of ours: every name below it is reached through its descriptor."""

    def __init__(self, path: Path, fd: int, made: tuple[Path, ...]) -> None:
        self.path = path
        self.fd = fd
        self.made = made  # the folders this call created, outermost first

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def write(self, name: str, data: bytes, *, new: bool = False) -> Path:
        """Put `data` at `name` atomically; `new`: refuse when the name exists. Raises OSError for
        the filesystem's own failures and BadInput for a link or folder under the name."""
        _check_name(name)
        self._refuse_odd(name, new=new)
        temps: list[str] = []
        try:
            tmp = self._temp(name, data, temps)
            if new:  # a hard link fails where the name exists: exclusive and atomic at once
                os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
                os.unlink(tmp, dir_fd=self.fd)
            else:
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self._drop(temps)
            raise
        return self.path / name

    def write_set(self, files: list[tuple[str, bytes]]) -> list[Path]:
        """Put several files in place as one set: every file is written to a temporary name
        first, and only when all are written are they renamed into place. A full disk or any
        other failure leaves the folder as it was (no new file of the set, the old ones whole)."""
        for name, _ in files:
            _check_name(name)
            self._refuse_odd(name, new=False)
        temps: list[str] = []
        try:
            for name, data in files:
                self._temp(name, data, temps)
            for tmp, (name, _) in zip(temps, files, strict=True):
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self._drop(temps)
            raise
        return [self.path / name for name, _ in files]

    def _temp(self, name: str, data: bytes, made: list[str]) -> str:
        """`data` in a fresh temporary file beside `name`, created exclusively, never through a
        link; its name is added to `made` as soon as it exists (for `_drop` on a failure)."""
        tmp = f".{name[:64]}.{os.getpid()}.{next(_tmp_numbers)}{_TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=self.fd)
        made.append(tmp)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return tmp

    def _drop(self, temps: list[str]) -> None:
        """Remove the temporary files a failed write left (renamed ones are gone already)."""
        for tmp in temps:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except FileNotFoundError:
                pass

    def read(self, name: str, *, limit: int) -> bytes | None:
        """A regular file's bytes (None: no such name); a link or other kind is BadInput."""
        _check_name(name)
        return _read_fd_relative(self.fd, name, limit=limit, shown=self.path / name)

    def remove(self, name: str) -> None:
        """Remove the file (or link: the link, not what it names) at `name`, if there is one."""
        _check_name(name)
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def sub(self, name: str, *, create: bool = True) -> Folder:
        _check_name(name)
        fd, made = _step(self.fd, self.path, name, create=create)
        return Folder(self.path / name, fd, (self.path / name,) if made else ())

    def remove_tree(self, name: str) -> None:
        """Remove the folder `name` with its contents, never through a link (a link there is BadInput)."""
        _check_name(name)
        try:
            st = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise BadInput(f"{self.path / name}: is not a folder (a link or a file)",
                           hint="the tool removes only folders it made; remove it yourself")
        shutil.rmtree(name, dir_fd=self.fd)

    def _refuse_odd(self, name: str, *, new: bool) -> None:
        try:
            st = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        shown = self.path / name
        if stat.S_ISLNK(st.st_mode):
            raise BadInput(f"{shown}: is a symbolic link; the tool never writes through one",
                           hint="remove the link, or choose another folder")
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{shown}: is not a regular file", hint="remove it, or choose another folder")
        if new:
            raise BadInput(f"{shown}: already exists", hint="remove it first")


def check_folder(path: Path | str) -> None:
    """Refuse now (BadInput) a folder `open_folder` would refuse later: the part of `path` that
    exists is checked, nothing is made. For a run that would otherwise do its work first."""
    try:
        open_folder(path, create=False).close()
    except MissingFolder:
        pass


def check_names(path: Path | str, names: list[str]) -> None:
    """Refuse now (BadInput) what `Folder.write` would refuse later for any of `names` in the
    folder `path` (a link, a folder or other non-file there), and the folder as `check_folder` does."""
    try:
        folder = open_folder(path, create=False)
    except MissingFolder:
        return
    with folder:
        for name in names:
            _check_name(name)
            folder._refuse_odd(name, new=False)


def open_folder(path: Path | str, *, create: bool = True) -> Folder:
    """The folder at `path`, made when missing (`create`); refused (BadInput) when it, or one of its
    components inside the working directory, is a symbolic link or not a folder."""
    full = Path(os.path.abspath(path))
    cwd = Path(os.getcwd())
    if full == cwd or full.is_relative_to(cwd):
        base, parts = cwd, full.relative_to(cwd).parts
    else:
        # Outside the working directory the existing folders above the last one are the user's
        # own path (followed); the last one and anything made here are checked like the rest.
        base = full.parent
        while base != base.parent and not os.path.lexists(base):
            base = base.parent
        parts = full.relative_to(base).parts
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _environment(base, exc) from None
    made: list[Path] = []
    here = base
    try:
        for part in parts:
            nxt, was_made = _step(fd, here, part, create=create)
            os.close(fd)
            fd = nxt
            here = here / part
            if was_made:
                made.append(here)
    except BaseException:
        os.close(fd)
        raise
    return Folder(full, fd, tuple(made))


def write_file(path: Path | str, data: bytes | str) -> Path:
    """Write one file of ours at `path` (its folder made as needed) through `open_folder`; an
    OSError is EnvironmentProblem (exit 3) naming the file."""
    path = Path(path)
    raw = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    try:
        with open_folder(path.parent) as folder:
            folder.write(path.name, raw)
    except OSError as exc:
        raise _environment(path, exc) from None
    return path


def read_regular(path: Path | str, *, limit: int, what: str = "file") -> bytes:
    """The bytes of an untrusted file: a regular file, never a link or a device, at most `limit`
    bytes (BadInput otherwise, naming `what`)."""
    return read_regular_with_mode(path, limit=limit, what=what)[0]


def read_regular_with_mode(path: Path | str, *, limit: int, what: str = "file") -> tuple[bytes, int]:
    """`read_regular`, with the st_mode of the file it read (a key's owner-only check)."""
    path = Path(path)
    label = f"{what} {path}".strip()
    parent = os.path.dirname(os.path.abspath(path))
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise BadInput(f"{label}: cannot be read ({exc.strerror or exc})") from None
    try:
        found = _read_at(dfd, path.name, limit=limit, shown=path, what=what)
    finally:
        os.close(dfd)
    if found is None:
        raise MissingFile(f"{label}: no such file")
    return found


class MissingFile(BadInput):
    """`read_regular` of a name that is not there (a caller may name it otherwise)."""


JSON_DEPTH = 64   # arrays and objects inside each other; the tool's own documents need under 10
# A JSON string (its escapes included), to be skipped when counting brackets; unrolled so that a
# long string is one match, not one step per character.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_depth(data: bytes, *, stop: int = JSON_DEPTH) -> int:
    """How deep arrays and objects nest in `data` (brackets inside strings not counted), counted
    up to `stop + 1` and no further: a plain loop, so no input can exhaust the stack."""
    depth = deepest = 0
    for found in _BRACKETS.finditer(_JSON_STRING.sub(b'""', data)):
        if found.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop:
                    break
        else:
            depth -= 1
    return deepest


def loads_json(data: bytes, *, what: str, max_depth: int = JSON_DEPTH) -> Any:
    """Untrusted JSON bytes as Python data; BadInput (one line, exit 2) for anything that is not
    UTF-8 JSON nested at most `max_depth` deep."""
    if json_depth(data, stop=max_depth) > max_depth:
        raise BadInput(f"{what}: JSON nested more than {max_depth} levels deep",
                       hint="give a document the tool wrote")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadInput(f"{what}: cannot read it (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:   # not reached after the depth check; kept so that none ever surfaces
        raise BadInput(f"{what}: JSON nested too deep") from None


def read_json(path: Path | str, *, limit: int, what: str = "file") -> Any:
    """An untrusted JSON file: `read_regular` (no link, no device, at most `limit` bytes), then
    `loads_json` (its depth bounded). `MissingFile` when it is not there."""
    return loads_json(read_regular(path, limit=limit, what=what), what=f"{what} {path}".strip())


def _read_fd_relative(dfd: int, name: str, *, limit: int, shown: Path, what: str = "file") -> bytes | None:
    found = _read_at(dfd, name, limit=limit, shown=shown, what=what)
    return None if found is None else found[0]


def _read_at(dfd: int, name: str, *, limit: int, shown: Path, what: str) -> tuple[bytes, int] | None:
    label = f"{what} {shown}".strip()
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f"{label}: is a symbolic link", hint="give the file itself") from None
        raise BadInput(f"{label}: cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{label}: is not a regular file", hint="give a regular file")
        if st.st_size > limit:
            raise BadInput(f"{label}: is {st.st_size} bytes, more than the {limit} allowed")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise BadInput(f"{label}: is more than the {limit} bytes allowed")
        return data, st.st_mode
    except OSError as exc:
        raise BadInput(f"{label}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _step(dfd: int, here: Path, part: str, *, create: bool) -> tuple[int, bool]:
    """Open the folder `part` below `dfd` without following a link; make it first when missing."""
    made = False
    for _ in range(2):
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=dfd), made
        except FileNotFoundError:
            if not create or made:
                raise MissingFolder(f"{here / part}: no such folder") from None
            try:
                os.mkdir(part, 0o777, dir_fd=dfd)
                made = True
            except FileExistsError:
                continue  # made meanwhile: open it (checked the same way)
            except OSError as exc:
                raise _environment(here / part, exc) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                kind = "a symbolic link" if os.path.islink(here / part) else "not a folder"
                raise BadInput(f"{here / part}: is {kind}; the tool writes its own files only into real folders",
                               hint="remove it, or give another folder") from None
            raise _environment(here / part, exc) from None
    raise BadInput(f"{here / part}: could not be opened as a folder")


class MissingFolder(BadInput):
    """`open_folder(create=False)` of a folder that is not there."""


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise BadInput(f"{name!r}: not a file name")


def _environment(path: Path, exc: OSError) -> EnvironmentProblem:
    return EnvironmentProblem(f"cannot write {path}: {exc.strerror or exc}",
                              hint="check that the folder exists and is writable")
