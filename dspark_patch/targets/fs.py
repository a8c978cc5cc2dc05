"""Transactional writes of a PatchPlan into a directory, and path resolution that never leaves it.

Every file is written through a temporary file in its own directory and `os.replace`d into
place, so a reader sees either the old or the new file, never half of one; and because the
name is replaced rather than the file rewritten, a hard-linked tree never changes the other
links' content. If any write fails, every file already written is put back (and directories
we created are removed) before the error is raised: nothing half-patched remains while the
process lives. A process killed between two renames cannot do that; targets/journal.py records
beforehand what a later run needs to (the temporary names below, `.NAME.PID.N.dspark-tmp`, are
how it knows which leftovers are ours).
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dspark_patch.errors import BadInput, EnvironmentProblem, HashMismatch, TargetNotFound, UnsafePatch
from dspark_patch.patching.plan import PatchPlan

_NEW_FILE_MODE = 0o644
_NEW_DIR_MODE = 0o755
TMP_SUFFIX = ".dspark-tmp"
_tmp_numbers = itertools.count()


def resolve_inside(root: Path, rel: str) -> Path:
    """The real path of `rel` under `root`, following symlinks only while they stay inside it.

    Raises UnsafePatch for absolute paths, `..`, NUL bytes, and any path that a symlink (or a
    loop of them) would take outside the tree.
    """
    base = _root(root)
    check_relative(rel)
    try:
        full = os.path.realpath(os.path.join(base, rel))
    except (OSError, RecursionError) as exc:
        raise UnsafePatch(f"{_short(rel)}: cannot be resolved in the tree ({exc})") from None
    if not _is_inside(full, base):
        raise UnsafePatch(
            f"{rel}: resolves to {full}, outside the tree {base} (through a symbolic link)",
            hint="refusing to follow a link out of the tree; patch the real location instead",
        )
    if os.path.islink(full):  # realpath leaves a symlink loop unresolved
        raise UnsafePatch(f"{rel}: symbolic link loop", hint="fix the links in the tree")
    return Path(full)


def read_inside(root: Path, rel: str) -> bytes | None:
    """A file's bytes (None if it does not exist), read through `resolve_inside`; for `plan_patch`."""
    path = resolve_inside(root, rel)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{rel}: is not a regular file", hint="the patch can only change regular files")
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # through a regular file (ENOTDIR), a name or path too long, ...
        raise UnsafePatch(f"{_short(rel)}: not a usable path in the tree ({exc.strerror or exc})",
                          hint="the diff names a file the tree cannot hold") from None


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One file `write_plan` would write, as checked before anything is written."""

    rel: str
    mode: int                 # the mode it keeps (or gets, when added)
    made: tuple[str, ...]     # folders (relative to the tree) the write makes for it, outermost first


def check_plan(root: Path, plan: PatchPlan) -> tuple[Planned, ...]:
    """What `write_plan` checks before it writes (raising what it raises), nothing written."""
    if plan.status == "already-applied":
        return ()
    base = _root(root)
    parents: dict[str, Path] = {}
    out, dests = [], []
    for f in plan.files:
        dest, mode = _check(root, _Change(rel=f.path, before=f.pre, after=f.post), parents)
        dests.append((f.path, dest))
        made = []
        parent = dest.parent
        while f.pre is None and not os.path.lexists(parent):
            made.append(os.path.relpath(parent, base))
            parent = parent.parent
        out.append(Planned(rel=f.path, mode=mode, made=tuple(reversed(made))))
    _refuse_one_file_twice(dests)
    return tuple(out)


def write_plan(root: Path, plan: PatchPlan) -> None:
    """Write every post-image of the plan, all or nothing; an already-applied plan writes nothing."""
    if plan.status == "already-applied":
        return
    _commit(root, [_Change(rel=f.path, before=f.pre, after=f.post) for f in plan.files])


def restore_plan(root: Path, plan: PatchPlan) -> None:
    """Put every pre-image back (delete added files, recreate deleted ones), all or nothing."""
    if plan.status == "already-applied":
        return
    _commit(root, [_Change(rel=f.path, before=f.post, after=f.pre) for f in plan.files])


@dataclass(frozen=True, kw_only=True)
class _Change:
    rel: str
    before: bytes | None  # what must be there now (None: nothing)
    after: bytes | None  # what will be there (None: nothing)


@dataclass(frozen=True, kw_only=True)
class _Step:
    """One thing done, with what it takes to undo it."""

    dest: Path
    previous: bytes | None
    mode: int
    created_dirs: tuple[Path, ...] = ()


def _commit(root: Path, changes: list[_Change]) -> None:
    # Check everything before touching anything: a refusal here leaves the tree as it was.
    parents: dict[str, Path] = {}  # one transaction: each directory resolved once
    checked = [(change, *_check(root, change, parents)) for change in changes]
    _refuse_one_file_twice([(change.rel, dest) for change, dest, _ in checked])
    done: list[_Step] = []
    for change, dest, mode in checked:
        try:
            done.append(_do(change, dest, mode))
        except OSError as exc:
            failed = _undo(done)
            if failed:
                raise EnvironmentProblem(
                    f"could not write {change.rel}: {exc.strerror or exc}; rolling back also failed for "
                    f"{', '.join(failed)}, which may be left patched",
                    hint="restore those files from the release before trying again",
                ) from exc
            raise EnvironmentProblem(
                f"could not write {change.rel}: {exc.strerror or exc}; every file written before it was restored",
                hint="check free space and permissions in the target, then apply again",
            ) from exc


def _refuse_one_file_twice(dests: list[tuple[str, Path]]) -> None:
    # Two entries that are one file (a link above one of them): both would be planned against one
    # pre-image and written in turn, and the file would hold only the last.
    first: dict[Path, str] = {}
    for rel, dest in dests:
        if dest in first:
            raise UnsafePatch(f"{rel} and {first[dest]} are one file in the tree (a link above one of them)",
                              hint="keep one entry for the file, under its real path; nothing was written")
        first[dest] = rel


def _check(root: Path, change: _Change, parents: dict[str, Path]) -> tuple[Path, int]:
    dest = _write_path(root, change.rel, parents)
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UnsafePatch(
            f"{change.rel}: is a symbolic link; writing would replace the link, not the file it points to",
            hint="patch the file the link points to instead",
        )
    if change.before is None:
        if st is not None:
            raise HashMismatch(f"{change.rel}: exists, but the plan expected no file there", hint="plan again against the current tree")
        return dest, _NEW_FILE_MODE
    if st is None:
        raise HashMismatch(f"{change.rel}: does not exist, but the plan expected it", hint="plan again against the current tree")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePatch(f"{change.rel}: is not a regular file", hint="the patch can only change regular files")
    if dest.read_bytes() != change.before:
        raise HashMismatch(f"{change.rel}: changed since the plan was made", hint="plan again against the current tree")
    return dest, stat.S_IMODE(st.st_mode)


def _do(change: _Change, dest: Path, mode: int) -> _Step:
    if change.after is None:
        os.unlink(dest)
        return _Step(dest=dest, previous=change.before, mode=mode)
    created: list[Path] = []
    if change.before is None:
        missing = []
        parent = dest.parent
        while not os.path.lexists(parent):
            missing.append(parent)
            parent = parent.parent
        try:
            for directory in reversed(missing):
                os.mkdir(directory, _NEW_DIR_MODE)
                created.append(directory)
            put(dest, change.after, mode)
        except OSError:
            _remove_dirs(created)
            raise
    else:
        put(dest, change.after, mode)
    return _Step(dest=dest, previous=change.before, mode=mode, created_dirs=tuple(created))


def _undo(done: list[_Step]) -> list[str]:
    """Undo steps newest first; the paths that could not be restored."""
    failed = []
    for step in reversed(done):
        try:
            if step.previous is None:
                os.unlink(step.dest)
                _remove_dirs(list(step.created_dirs))
            else:
                put(step.dest, step.previous, step.mode)
        except OSError:
            failed.append(str(step.dest))
    return failed


def _remove_dirs(created: list[Path]) -> None:
    for directory in reversed(created):
        try:
            os.rmdir(directory)
        except OSError:
            pass  # not empty: something else put a file there meanwhile; leave it


def temp_files(folder: Path, name: str, pids: Iterable[int]) -> list[Path]:
    """The temporary files `put` of a process in `pids` may have left for the file `name` in `folder`."""
    wanted = re.compile(rf"\.{re.escape(name)}\.({'|'.join(str(p) for p in pids) or '-'})\.[0-9]+{re.escape(TMP_SUFFIX)}")
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [folder / n for n in sorted(names) if wanted.fullmatch(n)]


def put(dest: Path, data: bytes, mode: int) -> None:
    """Replace `dest` with `data` (mode `mode`) through a temporary file of ours beside it."""
    # Same directory as the destination, so os.replace is an atomic rename on one filesystem.
    # O_EXCL|O_NOFOLLOW: never write into something that appeared under our temporary name.
    tmp = f"{dest.parent}/.{dest.name}.{os.getpid()}.{next(_tmp_numbers)}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:  # os.write, not a buffered file object: one syscall per file, no wrapper
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_path(root: Path, rel: str) -> Path:
    """Where `rel` is written: its folder resolved inside the tree, its own name not followed."""
    return _write_path(root, rel, {})


def _write_path(root: Path, rel: str, parents: dict[str, Path]) -> Path:
    """Where `rel` is written: its directory resolved inside the tree (`_check` refuses a name that is a link)."""
    check_relative(rel)
    head, _, name = rel.rstrip("/").rpartition("/")
    parent = parents.get(head)
    if parent is None:
        parent = parents[head] = resolve_inside(root, head) if head else _root(root)
    return parent / name  # the caller's lstat refuses a name that is a symbolic link


def _root(root: Path) -> Path:
    base = Path(os.path.realpath(root))
    if not base.is_dir():
        raise TargetNotFound(f"{root}: no such directory", hint="pass the site-packages folder that holds vllm/")
    return base


def check_relative(rel: str) -> None:
    if not rel or "\0" in rel:
        raise UnsafePatch(f"{rel!r}: not a usable relative path")
    if rel.startswith("/"):
        raise UnsafePatch(f"{rel}: absolute path", hint="paths must be relative to the tree")
    if ".." in rel.split("/"):
        raise UnsafePatch(f"{rel}: path contains '..'", hint="paths must stay inside the tree")


def _short(rel: str) -> str:
    return rel if len(rel) <= 160 else f"{rel[:80]}…({len(rel)} characters)"


def _is_inside(path: str, base: Path) -> bool:
    base_s = str(base)
    return path == base_s or path.startswith(base_s.rstrip("/") + "/")
