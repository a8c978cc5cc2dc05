"""The early probe's process (dspark_patch/inside/prestart.py) on its own, with a local python:
it runs the probe's source exactly as `python -c SOURCE ARGS` would, only after the go-ahead,
and refuses to serve (exit 4, so the tool runs the probe afresh) when it could have seen the
tree before the go-ahead or is not the interpreter that owns the distribution."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from dspark_patch.inside import source as inside_source
from dspark_patch.probe.prestart import GO_LINE, UNUSABLE, UNUSABLE_MARK, preload_modules

# A stand-in probe: what it prints shows what it saw as a fresh `python -c` would.
PROBE = '''\
"""its own docstring"""
import json, sys
from dataclasses import dataclass

@dataclass(frozen=True, kw_only=True)
class Seen:
    argv: list

def main():
    tree = open(sys.argv[2]).read()
    print(json.dumps({"argv": sys.argv, "doc": __doc__, "name": __name__, "tree": tree,
                      "names": sorted(k for k in globals() if not k.startswith("__")),
                      "seen": Seen(argv=sys.argv[1:]).argv}))
    return 3

if __name__ == "__main__":
    sys.exit(main())
'''


# A stand-in with an import-free part (patch.toml probe_beside = "--part"): what each process saw.
PART_PROBE = '''\
import json, os, sys
def main():
    args = sys.argv[1:]
    tree = open(args[1]).read()
    if args[-1] == "--part":
        if tree == "crash":
            raise RuntimeError("the part failed")
        print(json.dumps({"pid": os.getpid(), "tree": tree, "preloaded": "decimal" in sys.modules}))
        return 0
    part = None
    if "--part-from" in args:
        with open(args[args.index("--part-from") + 1]) as fh:
            part = fh.read()
    print(json.dumps({"pid": os.getpid(), "argv": args, "part": part, "tree": tree,
                      "preloaded": "decimal" in sys.modules}))
    return 0

if __name__ == "__main__":
    sys.exit(main())
'''


def _start(tmp_path: Path, *modules: str, wait: float = 60, probe: str = PROBE) -> tuple[subprocess.Popen, Path]:
    go = tmp_path / ".dspark-patch-go-test"
    proc = subprocess.Popen([sys.executable, "-B", "-c", inside_source("prestart"), str(go), str(wait), probe, *modules],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, go


def _waiting(proc: subprocess.Popen, *, children: int = 0) -> None:
    """Return once the early process (and its `children`) wait for the go-ahead: each is asleep
    in the kernel, polling the go file (nanosleep) or reading its part's pipe. Before that they
    import and compile, and do not sleep; so a tree changed after this was there to be read
    early, and a probe that reads it only after the go-ahead is what the test then proves."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        try:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            chans = [Path(f"/proc/{pid}/wchan").read_text() for pid in [str(proc.pid), *kids]]
        except OSError:
            chans, kids = [], []
        if len(kids) >= children and chans and all("nanosleep" in c or "pipe" in c for c in chans):
            return
        time.sleep(0.005)
    raise AssertionError("the early process never waited for its go-ahead")


def _go(go: Path, message: dict) -> None:
    half = go.with_suffix(".part")
    half.write_text(json.dumps(message))
    half.rename(go)


def test_after_the_go_ahead_the_probe_runs_as_a_fresh_python_c_would(tmp_path):
    tree = tmp_path / "model.py"
    tree.write_text("before")
    proc, go = _start(tmp_path, "json", "dataclasses")
    _waiting(proc)
    tree.write_text("patched")  # the tree changes while it waits: it must read it as it is at go
    _go(go, {"argv": ["--site", str(tree)], "python": sys.executable, "packages": ["vllm"]})
    out, err = proc.communicate(timeout=60)
    fresh = subprocess.run([sys.executable, "-B", "-c", PROBE, "--site", str(tree)], capture_output=True, text=True)
    assert proc.returncode == fresh.returncode == 3
    assert json.loads(out) == json.loads(fresh.stdout)
    assert json.loads(out)["tree"] == "patched"
    assert GO_LINE in err and err.replace(GO_LINE, b"").decode() == fresh.stderr
    assert not go.exists()  # the go-ahead file is removed once read


def test_a_distribution_module_imported_before_the_go_ahead_makes_it_unusable(tmp_path):
    proc, go = _start(tmp_path, "json")
    _go(go, {"argv": [], "python": sys.executable, "packages": ["json"]})  # json stands for vllm here
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == UNUSABLE and out == b""
    assert UNUSABLE_MARK + b" json was imported before the go-ahead" in err
    assert GO_LINE not in err


def test_another_interpreter_is_unusable_and_so_is_no_go_ahead(tmp_path):
    proc, go = _start(tmp_path)
    _go(go, {"argv": [], "python": "/opt/venv/bin/python3", "packages": ["vllm"]})
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == UNUSABLE and b"the distribution's python is /opt/venv/bin/python3" in err
    proc, _go_file = _start(tmp_path / "..", wait=0.3)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == UNUSABLE and b"no go-ahead within" in err


def test_a_cancel_ends_it_without_running_the_probe(tmp_path):
    proc, go = _start(tmp_path)
    _go(go, {"cancel": True})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == UNUSABLE and out == b"" and GO_LINE not in err


def test_a_part_beside_runs_in_its_own_process_on_the_tree_at_the_go_ahead_and_the_probe_reads_it(tmp_path):
    tree = tmp_path / "model.py"
    tree.write_text("before")
    proc, go = _start(tmp_path, "--beside=--part", "decimal", probe=PART_PROBE)
    _waiting(proc, children=1)
    tree.write_text("patched")
    _go(go, {"argv": ["--site", str(tree)], "python": sys.executable, "packages": ["vllm"]})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = json.loads(out)
    part = json.loads(seen["part"])
    # the part ran in another process, which imported nothing of the probe's imports, after the
    # go-ahead (it read the patched tree), and the probe proper got it through a pipe
    assert part["pid"] != seen["pid"] and part["tree"] == seen["tree"] == "patched"
    assert part["preloaded"] is False and seen["preloaded"] is True
    assert seen["argv"][:2] == ["--site", str(tree)] and seen["argv"][2] == "--part-from"
    assert seen["argv"][3].startswith("/dev/fd/") and len(seen["argv"]) == 4
    assert err == GO_LINE and not go.exists()


def test_a_part_that_fails_leaves_the_probe_an_empty_pipe_and_nothing_on_its_stderr(tmp_path):
    tree = tmp_path / "model.py"
    tree.write_text("crash")
    proc, go = _start(tmp_path, "--beside=--part", probe=PART_PROBE)
    _go(go, {"argv": ["--site", str(tree)], "python": sys.executable, "packages": ["vllm"]})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(out)["part"] == ""  # the probe then does the part itself
    assert err == GO_LINE


def test_with_a_part_beside_a_cancel_still_ends_both(tmp_path):
    proc, go = _start(tmp_path, "--beside=--part", probe=PART_PROBE)
    _go(go, {"cancel": True})
    out, err = proc.communicate(timeout=60)  # the streams close: no process of it holds them
    assert proc.returncode == UNUSABLE and out == b"" and GO_LINE not in err and not go.exists()


def test_preload_takes_what_the_probe_imports_anywhere_but_never_the_distribution():
    source = (
        "from __future__ import annotations\nimport argparse, os.path\nfrom pathlib import Path\n"
        "import vllm.envs\nfrom vllm import envs\nfrom . import sibling\nimport probe_census\n"
        "def main():\n    import torch\n    from torch import nn\n"
    )
    assert preload_modules([source], exclude=["vllm", "probe_census"]) == ("argparse", "os", "pathlib", "torch")
