"""dspark-patch-prestart: start a probe's interpreter early, wait for the go-ahead, then run it.

Usage: python -B -c SOURCE GO_FILE WAIT_S PROBE_SOURCE [--beside=FLAG] [MODULE...]

While the tool locates, plans, writes, compiles and takes the layer, this interpreter imports
MODULE... (what the probe's own source imports, never the patched distribution: torch, for the
DSpark probe), compiles PROBE_SOURCE and then waits for GO_FILE, which the tool writes once the
layer is taken:
`{"argv": [...], "python": PATH, "packages": [NAME...]}` or `{"cancel": true}`.
Only then does PROBE_SOURCE run, as `python -B -c PROBE_SOURCE ARGV...` would run it: as
`__main__`, with `sys.argv` set, after the import system's caches are dropped, so it reads the
tree as it is now (patched).

Before it runs, it checks that it is the interpreter that owns the distribution (`python`) and
that no module of the distribution (`packages`) was imported while it waited; otherwise, or
with no go-ahead within WAIT_S, it exits 4 with one `dspark-patch-prestart:` line on stderr and
the tool runs the probe afresh. A probe's own exit codes are 0-3.

`--beside=FLAG` (patch.toml `probe_beside`): the probe has a part that needs none of MODULE...
(the DSpark probe's census: a walk over every vLLM module, AST work only). Then this process forks
before its imports; the child waits for GO_FILE in its place, hands the go-ahead on through a
pipe, runs the same probe source with ARGV + [FLAG] on the same, patched tree (its stdout to a
second pipe), and ends; the probe proper then gets ARGV + [FLAG + "-from", "/dev/fd/N"], that
pipe, which it reads to its end when it needs the part. Both processes are the same interpreter
and read only after the go-ahead; a child that fails leaves the pipe short, and the probe then
does the part itself, so the verdict is the one a single process gives. On two cores the part
runs beside the rest of the imports instead of after them.
"""

import importlib
import json
import os
import sys
import time

UNUSABLE = 4
GO_LINE = "dspark-patch-prestart: go\n"


def _unusable(why):
    sys.stderr.write(f"dspark-patch-prestart: {why}\n")
    sys.exit(UNUSABLE)


def _wait(path, wait_s):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="utf-8") as fh:
                return json.loads(fh.read())  # a half-written object is not JSON yet: poll again
        except (OSError, ValueError):
            time.sleep(0.01)
    _unusable(f"no go-ahead within {wait_s:.0f} s")


def _venv_config(executable):
    # Where python looks for pyvenv.cfg: beside the executable or one folder up.
    folder = os.path.dirname(executable)
    return [p for p in (os.path.join(folder, "pyvenv.cfg"), os.path.join(os.path.dirname(folder), "pyvenv.cfg"))
            if os.path.exists(p)]


def _same_interpreter(mine, wanted):
    """The same binary outside any venv has the same prefix and sys.path however it is named
    (/usr/bin/python3, /usr/bin/python3.13); a venv's python is itself only."""
    if mine == wanted:
        return True
    try:
        same = os.path.samefile(mine, wanted)
    except OSError:
        return False
    return same and not _venv_config(mine) and not _venv_config(wanted)


class _Beside:
    """The child running the probe's import-free part (`--beside=FLAG`), forked before the imports."""

    def __init__(self, go_file, wait_s, probe_source, flag):
        self.flag = flag
        go_read, go_write = os.pipe()
        self.out, out_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(go_read)
            os.close(self.out)
            _child(go_file, wait_s, probe_source, flag, go_write, out_write)  # never returns
        os.close(go_write)
        os.close(out_write)
        self._go = go_read

    def message(self, go_file, wait_s):
        """The go-ahead, as the child read it (or, if it ended without, as this process reads it)."""
        with os.fdopen(self._go, "rb") as fh:
            data = fh.read()
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError:
            return _wait(go_file, wait_s)


def _child(go_file, wait_s, probe_source, flag, go_write, out_write):
    # Locals only from here to the end: running the probe as __main__ empties this module's globals.
    exit_now, the_sys = os._exit, sys
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):  # the exec's streams are the probe's: this child keeps none of them open
            os.dup2(devnull, fd)
        code = compile(probe_source, "<string>", "exec", dont_inherit=True)
        message = _wait(go_file, wait_s)
        with os.fdopen(go_write, "wb") as fh:
            fh.write(json.dumps(message).encode("utf-8"))
        try:
            os.remove(go_file)
        except OSError:
            pass
        if message.get("cancel") or not _same_interpreter(sys.executable, message["python"]):
            os._exit(0)
        os.dup2(out_write, 1)
        os.close(out_write)
        importlib.invalidate_caches()
        try:
            _run_as_main(code, ["-c", *message["argv"], flag], the_sys)
        finally:
            the_sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - a short pipe says it: the probe does the part itself
        pass
    exit_now(0)


def _prestart():
    go_file, wait_s, probe_source, *modules = sys.argv[1:]
    beside = None
    if modules and modules[0].startswith("--beside="):
        beside = _Beside(go_file, float(wait_s), probe_source, modules.pop(0)[len("--beside="):])
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - the probe meets the same failure and reports it
            pass
    # Compiling the probe's source reads nothing of the tree either (seconds under emulation).
    code = compile(probe_source, "<string>", "exec", dont_inherit=True)
    message = beside.message(go_file, float(wait_s)) if beside else _wait(go_file, float(wait_s))
    try:
        os.remove(go_file)
    except OSError:
        pass
    if message.get("cancel"):
        sys.exit(UNUSABLE)
    if not _same_interpreter(sys.executable, message["python"]):
        _unusable(f"started with {sys.executable}, but the distribution's python is {message['python']}")
    packages = set(message["packages"])
    early = sorted(m for m in sys.modules if m.partition(".")[0] in packages)
    if early:
        _unusable(f"{early[0]} was imported before the go-ahead")
    importlib.invalidate_caches()
    # The tool counts a result only with this line: a process that ended before the go-ahead
    # (it crashed while importing, say) said nothing about the patched tree.
    sys.stderr.write(GO_LINE)
    sys.stderr.flush()
    extra = [beside.flag + "-from", f"/dev/fd/{beside.out}"] if beside else []
    _run_as_main(code, ["-c", *message["argv"], *extra], sys)


def _run_as_main(code, argv, sys_module):
    # The probe runs in __main__ itself (as with -c), with nothing of this script left in it:
    # from here on only locals are used, since the module's globals are being emptied.
    main = sys_module.modules["__main__"].__dict__
    for key in [k for k in main if k not in ("__name__", "__builtins__", "__loader__", "__spec__", "__package__")]:
        del main[key]
    main["__doc__"] = None
    main["__annotations__"] = {}
    sys_module.argv = argv
    exec(code, main)


if __name__ == "__main__":
    _prestart()
