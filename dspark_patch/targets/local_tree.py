"""A local site-packages folder as a target (`--root DIR`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import PathDistribution
from pathlib import Path
from typing import TYPE_CHECKING

from .. import ownfiles
from ..distname import canonical_name
from ..errors import (
    AmbiguousDistribution,
    BadInput,
    CheckFailed,
    DsparkPatchError,
    EnvironmentProblem,
    TargetNotFound,
    UnsafePatch,
)
from ..inside import ISOLATED
from ..inside import source as inside_source
from ..inside.locate import BadRecord, record_of
from . import fs, journal, probe_record, recovery
from .base import Distribution, RecordEntry, RunResult, TargetInfo
from .layers.new_layer import TakenLayer, layer_answer, taken

if TYPE_CHECKING:
    from ..patching.plan import PatchPlan
    from .probe_record import ProbeRecord
    from .recovery import Recovery


# The tree's own files must never run on the host: `-I` (inside/__init__.py) and a cwd outside
# the tree, so a `json.py` or `platform.py` at its top cannot shadow the scripts' stdlib.
NEUTRAL_CWD = "/"

# What a run on the host (the tree's own checks and, above all, the patch set's probe: code from
# the patch set) gets of the job's environment: enough to start an interpreter and find its
# libraries, nothing else. A CI job's secrets (tokens, cloud keys) are not passed; the run's own
# variables (the probe's: no GPU, no bytecode, no user site) are added per call.
KEPT_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH")




class LocalTree:
    """The folder that holds the top-level package (a site-packages folder)."""

    def __init__(self, root: str | os.PathLike[str], *, python: str | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise TargetNotFound(f"--root {root}: no such directory", hint="give the site-packages folder that holds the package")
        self.root = self.root.resolve()
        self.python = _find_python(python)
        self._layer: bytes | None = None

    @property
    def info(self) -> TargetInfo:
        return TargetInfo(kind="local", ref=str(self.root), id=None)

    @property
    def notes(self) -> tuple[str, ...]:
        return ()

    def locate(self, distribution: str) -> Distribution:
        wanted = canonical_name(distribution)
        mine = [d for d in sorted(self.root.glob("*.dist-info"))
                if (m := PathDistribution(d).metadata) and m["Name"] and canonical_name(m["Name"]) == wanted]
        if len(mine) > 1:
            raise AmbiguousDistribution(
                f"{self.root} holds {len(mine)} {distribution} distributions ({', '.join(d.name for d in mine)})",
                hint="an installer leaves exactly one dist-info per distribution; which one is in use is not decidable")
        for info_dir in mine:
            dist = PathDistribution(info_dir)
            name = dist.metadata["Name"]
            if name:
                python_version, cache_tag = self._interpreter()
                try:
                    record_file, record = record_of(dist)
                except (BadRecord, OSError) as exc:
                    raise BadInput(f"{info_dir.name}/RECORD in {self.root}: {exc}",
                                   hint="the RECORD is malformed; reinstall the release") from None
                return Distribution(
                    name=name,
                    version=dist.version,
                    location=str(self.root),
                    python=self.python,
                    python_version=python_version,
                    cache_tag=cache_tag,
                    record_file=record_file,
                    record=tuple(RecordEntry(path=p, sha256=h, size=n) for p, h, n in record),
                )
        raise TargetNotFound(
            f"no {distribution} distribution (*.dist-info) in {self.root}",
            hint="--root must be the site-packages folder that holds the package and its dist-info",
        )

    def read(self, path: str) -> bytes | None:
        return fs.read_inside(self.root, path)

    def write(self, plan: PatchPlan) -> None:
        fs.write_plan(self.root, plan)

    def restore(self, plan: PatchPlan) -> None:
        fs.restore_plan(self.root, plan)

    # Journaled: what a later run needs when this one is killed half-way (targets/journal.py).
    def pending(self) -> str | None:
        return str(journal.path_of(self.root)) if journal.exists(self.root) else None

    def recover(self, diff_sha256: str, paths: frozenset[str]) -> Recovery | None:
        probe_record.check(self.root)
        return recovery.recover(self.root, diff_sha256=diff_sha256, paths=paths, own=(probe_record.NAME,))

    def write_journaled(self, plan: PatchPlan, bytecode: Sequence[str]) -> None:
        planned = fs.check_plan(self.root, plan)  # refusals first: a refused plan leaves no journal
        entries = [journal.Entry(path=f.path, pre=f.pre, pre_sha256=f.pre_sha256, post_sha256=f.post_sha256, mode=p.mode)
                   for f, p in zip(plan.files, planned, strict=True)]
        entries += [self._bytecode_entry(pyc) for pyc in bytecode]
        made = tuple(dict.fromkeys(folder for p in planned for folder in p.made))
        probe_record.forget(self.root)
        journal.write(self.root, journal.Journal(diff_sha256=plan.diff_sha256, entries=tuple(entries), made=made,
                                                 pids=(os.getpid(),)))
        try:
            fs.write_plan(self.root, plan)
        except BaseException:
            # write_plan put back what it wrote; this removes the journal (kept if it cannot be).
            with contextlib.suppress(DsparkPatchError, OSError):
                recovery.roll_back(self.root)
            raise

    def roll_back(self) -> Recovery:
        return recovery.roll_back(self.root)

    def probed(self, record: ProbeRecord) -> bool:
        return probe_record.holds(self.root, record)

    def settle(self, record: ProbeRecord | None) -> None:
        if record is not None:
            probe_record.write(self.root, record)
        if journal.exists(self.root):
            journal.remove(self.root)

    def _bytecode_entry(self, pyc: str) -> journal.Entry:
        dest = fs.write_path(self.root, pyc)
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            return journal.Entry(path=pyc, pre=None, pre_sha256=None, post_sha256=None, mode=0o644, bytecode=True)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePatch(f"{pyc}: is not a regular file (a link or a folder)",
                              hint="the compile step replaces a module's bytecode; remove it first")
        data = dest.read_bytes()
        return journal.Entry(path=pyc, pre=data, pre_sha256=hashlib.sha256(data).hexdigest(), post_sha256=None,
                             mode=stat.S_IMODE(st.st_mode), bytecode=True)

    def take_layer(self, paths: Sequence[str], deleted: Sequence[str] = ()) -> TakenLayer:
        """The layer `apply --root --layer-out` writes: the files `paths` (relative to the root),
        a whiteout for each of `deleted`, and every folder above them, as the tree's interpreter
        writes the tar (inside/layer.py, as an image's python does: owner, mode and mtime as they
        are here), read back with the strict layer reader. Kept for `write_layer`."""
        absolute = [str(self.root / p) for p in paths]
        for path in deleted:
            absolute += ["--delete", str(self.root / path)]
        result = self.run_python(inside_source("layer"), absolute, timeout=300)
        said = layer_answer(result.stdout) if result.returncode == 0 else None
        if said is None:
            last = (result.stderr.decode(errors="replace").strip().splitlines() or [f"exit {result.returncode}"])[-1]
            raise CheckFailed(f"writing the new layer failed: {last[-300:]}",
                              hint="the tree is put back; nothing was written to --layer-out")
        where, sha, size = Path(said[0]), said[1], said[2]
        try:
            data = where.read_bytes()
        finally:
            with contextlib.suppress(OSError):
                where.unlink()
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise CheckFailed(f"the new layer read back ({len(data)} bytes) is not the one {self.python} wrote",
                              hint="the tree is put back; nothing was written to --layer-out")
        self._layer = data
        return taken(data)

    def write_layer(self, path: str) -> None:
        """The layer `take_layer` took, to `path`, whole or not at all, through the tool's guarded
        writer (ownfiles: a temporary file beside it, renamed; never through a link)."""
        if self._layer is None:
            raise RuntimeError("take_layer() must run before write_layer()")
        ownfiles.write_file(path, self._layer)

    def run_python(
        self,
        source: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
    ) -> RunResult:
        full_env = {**_kept_env(os.environ), **(env or {})}
        try:
            done = subprocess.run(
                [self.python, *ISOLATED, "-c", source, *args],
                capture_output=True, env=full_env, timeout=timeout, cwd=NEUTRAL_CWD,
            )
        except subprocess.TimeoutExpired as exc:
            return RunResult(returncode=-1, stdout=exc.stdout or b"", stderr=exc.stderr or b"", timed_out=True)
        return RunResult(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)

    def _interpreter(self) -> tuple[str, str]:
        result = self.run_python(
            "import platform, sys; print(platform.python_version(), sys.implementation.cache_tag)", timeout=60
        )
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"--python {self.python} does not run: {result.stderr.decode(errors='replace').strip()[:200]}",
                hint="give a working Python interpreter",
            )
        version, cache_tag = result.stdout.decode().split()
        return version, cache_tag


def _kept_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k in KEPT_ENV or k.startswith("LC_")}


def _find_python(python: str | None) -> str:
    if python is None:
        return sys.executable
    found = shutil.which(python)
    if found is None:
        raise TargetNotFound(f"--python {python}: no such interpreter", hint="give the path of the Python that runs the tree")
    return os.path.abspath(found)
