"""Start a patch set's probe early, and hand it the go-ahead once the layer is taken.

The probe's interpreter start and its imports (torch: about 2 s natively, far more under
emulation) need nothing of the patched tree, so on a target that can (`PreStarting`: an image)
they run while the tool locates, plans, writes, compiles and takes the layer. The process
started here (inside/prestart.py) imports what the probe's source imports — never the patched
distribution — and waits; `EarlyProbe.go` writes the go-ahead, and only then does the probe
read the tree, as a fresh `python -B -c PROBE --site DIR --json` would.

Whatever goes wrong with the early start (the target cannot, the interpreter is not the one
that owns the distribution, a module of it got imported early, the process is gone), `go`
returns None and the caller runs the probe afresh: the verdict always comes from a run that
saw only the patched tree. A run that fails before the go-ahead leaves the process waiting; it
ends with the work container, which the target removes on every way out.
"""

from __future__ import annotations

import ast
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from ..errors import DsparkPatchError
from ..inside import source as inside_source
from ..targets.base import HANDSHAKE_PREFIX, Distribution, PreStarting, Running, RunResult, Target

UNUSABLE = 4                 # inside/prestart.py's exit code: the early start cannot serve
UNUSABLE_MARK = b"dspark-patch-prestart:"
GO_LINE = b"dspark-patch-prestart: go\n"   # written by the early process as it starts the probe
WAIT_S = 1800.0              # the longest the early process waits for its go-ahead


def preload_modules(sources: Iterable[str], *, exclude: Iterable[str]) -> tuple[str, ...]:
    """The top-level modules the probe's sources import anywhere, less `exclude` (the patched
    distribution's packages and the probe's own modules), in first-seen order."""
    excluded = set(exclude)
    found: dict[str, None] = {}
    for text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in excluded and top != "__future__":
                    found.setdefault(top)
    return tuple(found)


def distribution_packages(dist: Distribution) -> tuple[str, ...]:
    """The top-level import names the distribution installs (from its RECORD), and its own name."""
    names = {dist.name.replace("-", "_")}
    for entry in dist.record:
        top = entry.path.partition("/")[0]
        if top.endswith((".dist-info", ".data")) or top in ("..", "__pycache__", ""):
            continue
        names.add(top[:-3] if top.endswith(".py") else top)
    return tuple(sorted(names))


class EarlyProbe:
    """The early process on `target`, waiting for the go-ahead written to `/HANDSHAKE`."""

    def __init__(self, *, target: PreStarting, running: Running, handshake: str) -> None:
        self.target, self.running, self.handshake = target, running, handshake
        self.unused: str | None = None  # why it could not serve, once `go` found out

    def go(self, dist: Distribution, args: Sequence[str], *, timeout: float) -> RunResult | None:
        """Let the probe run on `dist` with `args`; its result, or None when it must run afresh."""
        message = {"argv": list(args), "python": dist.python, "packages": list(distribution_packages(dist))}
        try:
            self.target.put_handshake(self.handshake, json.dumps(message).encode())
            result = self.running.wait(timeout)
        except DsparkPatchError as exc:
            self.unused = exc.message
            return None
        if result.timed_out:  # after the go-ahead (before it, it only polls): the probe's own time
            return result
        before, went, after = result.stderr.partition(GO_LINE)
        if not went:
            mark = next((x for x in before.splitlines() if x.startswith(UNUSABLE_MARK)), None)
            self.unused = (mark[len(UNUSABLE_MARK):].decode("utf-8", "replace").strip() if mark is not None
                           else f"it ended (exit {result.returncode}) before the go-ahead")
            return None
        # What the probe itself wrote to stderr, as a fresh run would have it.
        return replace(result, stderr=before + after)

    def cancel(self) -> None:
        """No probe after all (already applied): let the early process end now."""
        try:
            self.target.put_handshake(self.handshake, b'{"cancel": true}')
        except DsparkPatchError:
            pass  # it ends with the container


def start_early(target: Target, source: str, *, sources: Sequence[str], exclude: Iterable[str],
                env: Mapping[str, str], timeout: float, beside: str | None = None) -> EarlyProbe | None:
    """Start `source` (the probe as it will run) early on `target`, if the target can; `beside`:
    the flag of its import-free part, run in a child beside the imports (inside/prestart.py)."""
    if not isinstance(target, PreStarting):
        return None
    handshake = HANDSHAKE_PREFIX + secrets.token_hex(8)
    argv = [f"/{handshake}", str(WAIT_S), source, *([f"--beside={beside}"] if beside else []),
            *preload_modules(sources, exclude=exclude)]
    try:
        running = target.start_python(inside_source("prestart"), argv, env=env, timeout=WAIT_S + timeout)
    except DsparkPatchError:
        return None
    return EarlyProbe(target=target, running=running, handshake=handshake)


__all__ = ["EarlyProbe", "preload_modules", "start_early"]
