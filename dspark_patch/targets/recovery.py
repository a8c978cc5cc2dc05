"""What a run does with the journal an interrupted `apply --root` left (targets/journal.py).

Everything the journal names is looked at before anything is written, and the run refuses
(`UnfinishedApply`, exit 1, nothing touched) when:

- a source file is neither the pre-image nor the post-image the journal records (a missing file
  counts as the null hash): someone else changed it since, and putting the journal's bytes there
  would undo their change;
- a bytecode file, or a temporary file of ours, is there but is not a regular file (a link, a folder).

Then one of two things:

- **continued**: every source file is its post-image and the journal is of the very diff this run
  applies (same sha256, same files). The temporary files are removed and the journal kept: the run
  compiles and probes as the killed one would have, and rolls back from the journal if that fails.
- **rolled back** (any other case, also what a failing run does): every source that is its
  post-image gets its pre-image back; every bytecode file that is not its pre-image gets it back
  (bytecode is derived from its source: once the source is the pre-image again, the pre-image's
  own bytecode is the right one, whoever wrote the other); the temporary files and the folders
  the write made (and the `__pycache__` the compile made in them), when empty, are removed; the
  journal last. Before writing anything, the
  journal is rewritten with this process added to its writers, so a kill during the roll-back
  leaves only leftovers the next run knows as ours.

Temporary files of ours are `.NAME.PID.N.dspark-tmp` beside a file the journal names, PID one of
its writers (targets/fs.py), and for bytecode also py_compile's own `NAME.N` (CPython's
`importlib._bootstrap_external._write_atomic`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ..errors import EnvironmentProblem, UnfinishedApply
from . import fs
from . import journal as jr

_ODD = "not a regular file"   # a state: a link, a folder, a device where a file should be


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """What was done with the journal of an interrupted apply."""

    journal: str                                  # where it was
    outcome: Literal["continued", "rolled-back"]
    files: int          # source files given their pre-image back (continued: found as post-images)
    bytecode: int       # bytecode files given their pre-image back
    temps: int          # temporary files removed


def recover(root: Path, *, diff_sha256: str, paths: frozenset[str], own: tuple[str, ...] = ()) -> Recovery | None:
    """Finish what the journal in `root` says, if there is one, and remove the temporary files a
    run killed while writing the journal or the tool's other files `own` in `root` left (None:
    there was nothing of the kind)."""
    leftovers = jr.own_leftovers(root, (jr.NAME, *own))
    journal = jr.read(root)
    if journal is None:
        _unlink(leftovers)
        return Recovery(journal=str(jr.path_of(root)), outcome="rolled-back", files=0, bytecode=0,
                        temps=len(leftovers)) if leftovers else None
    states = _sources(root, journal)
    temps = _temps(root, journal) + leftovers
    if journal.diff_sha256 == diff_sha256 and {e.path for e in journal.sources} == paths \
            and all(s == e.post_sha256 for e, s in zip(journal.sources, states, strict=True)):
        _unlink(temps)
        return Recovery(journal=str(jr.path_of(root)), outcome="continued", files=len(states), bytecode=0,
                        temps=len(temps))
    return _roll_back(root, journal, states, temps)


def roll_back(root: Path) -> Recovery:
    """Undo what the journal in `root` records, and remove it (a run that failed, or was found killed)."""
    journal = jr.read(root)
    if journal is None:
        raise UnfinishedApply(f"the journal {jr.path_of(root)} is gone: nothing to roll back from",
                              hint=f"check the tree with `dspark-patch verify --root {root}`")
    return _roll_back(root, journal, _sources(root, journal), _temps(root, journal))


def _roll_back(root: Path, journal: jr.Journal, states: list[str | None], temps: list[Path]) -> Recovery:
    for e in journal.bytecode:
        _state(fs.write_path(root, e.path), e.path, root)  # refuses a link or folder before anything is written
    if os.getpid() not in journal.pids:
        jr.write(root, replace(journal, pids=(*journal.pids, os.getpid())))
    files = bytecode = 0
    try:
        for e, now in reversed(list(zip(journal.sources, states, strict=True))):
            if now == e.post_sha256:
                _put_back(fs.write_path(root, e.path), e)
                files += 1
        for e in journal.bytecode:
            dest = fs.write_path(root, e.path)
            if _state(dest, e.path, root) != e.pre_sha256:
                _put_back(dest, e)
                bytecode += 1
        _unlink(temps)
        for folder in reversed(journal.made):
            made = fs.write_path(root, folder)
            # The compile step made `__pycache__` in a folder this write made; the bytecode of
            # the modules it added is gone (above), so it is empty now. Not through a link.
            for path in (made / "__pycache__", made):
                try:
                    os.rmdir(path)
                except OSError:
                    pass  # not empty (something else put a file there), or gone: leave it
    except OSError as exc:
        raise EnvironmentProblem(
            f"rolling back the interrupted apply of {root} failed: {exc.strerror or exc}; its journal is kept",
            hint="fix the cause (space, permissions) and run apply again: it picks up from the journal",
        ) from None
    jr.remove(root)
    return Recovery(journal=str(jr.path_of(root)), outcome="rolled-back", files=files, bytecode=bytecode,
                    temps=len(temps))


def _sources(root: Path, journal: jr.Journal) -> list[str | None]:
    """Each source file's sha256 now (None: absent), refused unless it is the pre- or the post-image."""
    states = []
    for e in journal.sources:
        now = _state(fs.write_path(root, e.path), e.path, root)
        if now not in (e.pre_sha256, e.post_sha256):
            raise UnfinishedApply(
                f"an apply of {root} was interrupted, and {e.path} is now neither the file it replaced nor the "
                f"one it wrote ({'missing' if now is None else 'sha256 ' + now}): changed since by someone else; "
                "nothing was rolled back",
                hint=f"reinstall the release into this folder, then remove the journal {jr.path_of(root)}")
        states.append(now)
    return states


def _state(dest: Path, rel: str, root: Path) -> str | None:
    """The sha256 of the regular file at `dest` (None: nothing there); refused when it is something else."""
    try:
        fd = os.open(dest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _odd(rel, root) from None
        raise EnvironmentProblem(f"cannot read {dest}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _odd(rel, root)
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def _odd(rel: str, root: Path) -> UnfinishedApply:
    return UnfinishedApply(
        f"an apply of {root} was interrupted, and {rel} is now {_ODD} (a link or a folder): changed since by "
        "someone else; nothing was rolled back",
        hint=f"reinstall the release into this folder, then remove the journal {jr.path_of(root)}")


def _temps(root: Path, journal: jr.Journal) -> list[Path]:
    found: list[Path] = []
    for e in journal.entries:
        dest = fs.write_path(root, e.path)
        found += fs.temp_files(dest.parent, dest.name, journal.pids)
        if e.bytecode:
            pattern = re.compile(rf"{re.escape(dest.name)}\.[0-9]+")
            try:
                found += [dest.parent / n for n in sorted(os.listdir(dest.parent)) if pattern.fullmatch(n)]
            except (FileNotFoundError, NotADirectoryError):
                pass
    for temp in found:
        try:
            if not stat.S_ISREG(os.lstat(temp).st_mode):
                raise _odd(os.path.relpath(temp, root), root)
        except FileNotFoundError:
            pass
    return found


def _put_back(dest: Path, e: jr.Entry) -> None:
    if e.pre is None:
        try:
            os.unlink(dest)
        except FileNotFoundError:
            pass
        return
    try:
        mode = stat.S_IMODE(os.lstat(dest).st_mode)   # every write keeps the mode; a deleted file: the journal's
    except FileNotFoundError:
        mode = e.mode
    fs.put(dest, e.pre, mode)


def _unlink(paths: list[Path]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
