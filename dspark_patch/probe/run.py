"""Ship a patch set's own probe through a target and read its verdict.

The probe is knowledge of one patch, so it lives in the patch set (`probe = "probe.py"` in its
patch.toml); this runner knows only the contract every probe keeps:

- arguments `--site DIR --json`; stdout one JSON object
  `{"schema": "dspark-patch/probe/v1", "ok": bool, "cases": [{"name", "ok", "detail"}, ...], ...}`
  (further top-level keys are the probe's own and are left alone);
- exit 0 every case passed, 1 a case failed, 2 usage error, 3 the interpreter lacks what the
  probe needs (torch, for the DSpark probe).

A probe may be several modules (`probe = ["probe.py", "probe_x.py", ...]` in patch.toml): the
entry first, then the modules it imports by name. `bundle` makes them one stdlib-only source:
the modules travel compressed and are imported from memory by a finder placed first on
`sys.meta_path`, and the entry runs as `__main__`.

The DSpark probe also returns a census (`"census": [{"file", "line", "function", "symbol",
"kind", "reached", "none_safe", "verdict"}, ...]`): every reference to the buffer, its accessor
and the drafter helper in the installed tree. `unguarded_readers(report)` picks out those that
make a release unsafe for the patch (reached on the DSpark V2 path and not None-safe: on
0.31.0, the V2 runner's two `get_mtp_target_hidden_states()[:n]` sites); `dspark-patch port`
names them from the same report, so `probe` and `port` always agree.

The probe runs under the target's own interpreter (`--python` for a local tree, the image's
python3 for an image) on CPU only, with its source passed as an argument: nothing is written
into the target, so an image's committed layer stays exactly the patched files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from dataclasses import replace
from pathlib import Path

from ..errors import EnvironmentProblem
from ..report.model import CensusEntry, ProbeCase, ProbeReport
from ..targets.base import Distribution, RunResult, Target
from .prestart import EarlyProbe, start_early

PROBE_SCHEMA = "dspark-patch/probe/v1"
PROBE_TIMEOUT_S = 600.0

# The probe must not see a GPU even where one exists: it checks source behaviour on CPU.
_PROBE_ENV = {"CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}


# Prepended to a multi-module probe; {modules} and {entry} are filled in by `bundle`.
_BUNDLE = """\
import base64 as _b64, importlib.abc as _abc, importlib.util as _util, sys as _sys, zlib as _zlib
_SOURCES = {modules!r}


def _text(name):
    return _zlib.decompress(_b64.b64decode(_SOURCES[name])).decode("utf-8")


class _ProbeModules(_abc.MetaPathFinder, _abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in _SOURCES and fullname != "__main__":
            return _util.spec_from_loader(fullname, self, origin="<probe:" + fullname + ".py>")
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        exec(compile(_text(name), "<" + name + ".py>", "exec"), module.__dict__)


_sys.meta_path.insert(0, _ProbeModules())
_SOURCES["__main__"] = {entry!r}
try:
    exec(compile(_text("__main__"), "<{entry_name}>", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
    _status = 0
except SystemExit as _exit:
    _status = _exit.code
if _status is not None and not isinstance(_status, int):
    print(_status, file=_sys.stderr)
    _status = 1
# The verdict is on stdout: flushed, the process ends without the interpreter's teardown (with
# torch loaded, 0.2 s natively and seconds under emulation; the probe writes no file).
try:
    _sys.stdout.flush()
    _sys.stderr.flush()
finally:
    __import__("os")._exit(_status or 0)
"""


def _packed(path: Path) -> str:
    return base64.b64encode(zlib.compress(path.read_bytes(), 9)).decode("ascii")


def bundle(probe: Path, modules: tuple[Path, ...] = ()) -> str:
    """The one source sent to the target: `probe` alone, or it with `modules` embedded.

    Each module is importable under its file's stem (`probe_census.py` -> `import probe_census`).
    Compressed so the source stays well under the kernel's limit on one argument (128 KiB).
    """
    if not modules:
        return probe.read_text(encoding="utf-8")
    return _BUNDLE.format(modules={m.stem: _packed(m) for m in modules}, entry=_packed(probe), entry_name=probe.name)


def _census_entry(e: dict) -> CensusEntry:
    # A probe naming no census (another patch set's) reports none; a malformed entry is an
    # unreadable verdict (KeyError/TypeError/ValueError, caught by the caller).
    return CensusEntry(
        file=str(e["file"]), line=int(e["line"]), function=str(e["function"]), symbol=str(e["symbol"]),
        kind=str(e["kind"]), reached=bool(e["reached"]), none_safe=bool(e["none_safe"]), verdict=str(e["verdict"]),
    )


def start_probe_early(target: Target, probe: Path, *, modules: tuple[Path, ...] = (), distribution: str,
                      timeout: float = PROBE_TIMEOUT_S, beside: str | None = None) -> EarlyProbe | None:
    """Start the probe's interpreter and imports now, on a target that can (see prestart.py);
    `beside`: the flag of the probe's import-free part (patch.toml `probe_beside`)."""
    texts = [p.read_text(encoding="utf-8") for p in (probe, *modules)]
    return start_early(target, bundle(probe, modules), sources=texts, exclude=[distribution, *(m.stem for m in modules)],
                       env=_PROBE_ENV, timeout=timeout, beside=beside)


def run_probe(target: Target, dist: Distribution, probe: Path, *, modules: tuple[Path, ...] = (),
              timeout: float = PROBE_TIMEOUT_S, early: EarlyProbe | None = None,
              only: tuple[str, ...] = ()) -> ProbeReport:
    """Run the probe script `probe` (a patch set's, with the `modules` it imports) against `dist`
    with the target's python (handing the go-ahead to `early` if it was started early, else, or if
    it cannot serve, afresh). `only`: judge just these cases (a superseded record's effect cases);
    the verdict then holds only when the probe reported exactly them, each passing."""
    source = bundle(probe, modules)
    args = ["--site", dist.location, "--json", *(a for name in only for a in ("--only", name))]
    result = early.go(dist, args, timeout=timeout) if early is not None else None
    if result is None:
        result = target.run_python(source, args, env=_PROBE_ENV, timeout=timeout)
    # Named inside the patch set's folder: the same on every machine, wherever the checkout is.
    files = ", ".join(_inside(p, probe.parent) for p in (probe, *modules))
    digest = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()
    verdict = _verdict(result, probe, dist, timeout)
    if only and verdict.ok and tuple(c.name for c in verdict.cases) != tuple(dict.fromkeys(only)):
        verdict = replace(verdict, ok=False, detail=f"the probe did not report exactly the {len(only)} cases asked for")
    return replace(verdict, source=f"{files} (sha256 {digest[:16]}…)",
                   ran_in=_where(target, dist))


def _inside(path: Path, folder: Path) -> str:
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return path.name


def _where(target: Target, dist: Distribution) -> str:
    if target.info.kind == "local":
        from ..targets.local_tree import KEPT_ENV

        return (f"this host's {dist.python}, its environment reduced to {', '.join(KEPT_ENV)}, LC_* and the "
                f"probe's own ({', '.join(sorted(_PROBE_ENV))})")
    return f"a container of {target.info.ref} ({dist.python})"


def _verdict(result: RunResult, probe: Path, dist: Distribution, timeout: float) -> ProbeReport:
    stderr_tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if result.timed_out:
        return ProbeReport(ok=False, ran=True, detail=f"the probe did not finish within {timeout:.0f} s")
    if result.returncode == 3:
        raise EnvironmentProblem(
            f"the probe {probe.name} cannot run with {dist.python}: {stderr_tail[0] or 'a module it needs is missing'}",
            hint="the target's interpreter needs what the probe imports (torch, CPU build, for DSpark); or pass --no-probe",
        )
    try:
        doc = json.loads(result.stdout.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
            raise ValueError(f"unexpected schema {doc.get('schema') if isinstance(doc, dict) else doc!r}")
        if not isinstance(doc.get("ok"), bool):
            raise ValueError("no boolean 'ok'")
        cases = tuple(ProbeCase(name=str(c["name"]), ok=bool(c["ok"]), detail=str(c["detail"])) for c in doc["cases"])
        census = tuple(_census_entry(e) for e in doc.get("census", ()))
        where = doc.get("where", [])
        if not isinstance(where, list) or len(where) > 64 or not all(isinstance(w, str) and 0 < len(w) <= 512 for w in where):
            raise ValueError("'where' is not a short list of \"path:function\" strings")
    except (ValueError, KeyError, TypeError) as exc:
        return ProbeReport(
            ok=False, ran=True,
            detail=f"the probe exited {result.returncode} without a readable verdict ({exc}); stderr: {stderr_tail[0]}",
        )
    # Every signal must agree: the exit code, the probe's own verdict and each case.
    ok = result.returncode == 0 and doc["ok"] and bool(cases) and all(c.ok for c in cases)
    failed = [c.name for c in cases if not c.ok]
    if ok:
        detail = ""
    elif failed:
        detail = f"failing cases: {', '.join(failed)}"
    elif not cases:
        detail = f"the probe reported no cases (exit {result.returncode})"
    else:
        detail = f"probe exited {result.returncode} with every case passing; stderr: {stderr_tail[0]}"
    return ProbeReport(ok=ok, ran=True, cases=cases, census=census, detail=detail, where=tuple(where))


def unguarded_readers(report: ProbeReport) -> tuple[CensusEntry, ...]:
    """The census entries on the DSpark V2 path that read the buffer without a None check,
    in the probe's order (file:line, function, symbol, kind, and the verdict saying why).

    For a tree: `run_probe(target, dist, patchset.probe, modules=patchset.probe_modules)`, then
    this on its report; empty when the probe found none (or reported no census)."""
    return tuple(e for e in report.census if e.reached and not e.none_safe)
