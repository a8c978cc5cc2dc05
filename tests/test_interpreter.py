"""Finding the interpreter that owns vLLM from an image's config and its files' stats (pure: the
stats are those the engine's archive API reports, given here as a table of paths)."""

from __future__ import annotations

import pytest

from dspark_patch.errors import BadInput, TargetNotFound
from dspark_patch.inside.answers import decode_locate
from dspark_patch.targets import interpreter
from dspark_patch.targets.interpreter import Interpreter, Located

FILE, DIR, LINK = 0o755, (1 << 31) | 0o755, (1 << 27) | 0o777
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def image(files: dict[str, tuple[int, str]], scripts: dict[str, bytes] | None = None):
    """stat and read_head over {path: (mode, resolved link target or "")}."""
    def stat(path: str):
        found = files.get(path)
        return None if found is None else {"name": path.rsplit("/", 1)[-1], "size": 100, "mode": found[0],
                                           "linkTarget": found[1]}

    def read_head(path: str):
        return (scripts or {}).get(path)

    return stat, read_head


DEBIAN = {
    "/usr/bin/python3.11": (FILE, ""),
    "/usr/bin/python3": (LINK, "/usr/bin/python3.11"),
    "/bin/python3": (LINK, "/usr/bin/python3.11"),       # /bin -> /usr/bin (merged /usr)
}


def test_a_console_scripts_shebang_names_the_venv_python_first():
    files = {**DEBIAN, "/opt/venv/bin/vllm": (FILE, ""), "/opt/venv/bin/python3": (LINK, "/usr/bin/python3.13"),
             "/usr/bin/python3.13": (FILE, ""), "/opt/venv/pyvenv.cfg": (FILE, "")}
    stat, head = image(files, {"/opt/venv/bin/vllm": b"#!/opt/venv/bin/python3\nimport sys\n"})
    config = {"Env": [PATH], "Entrypoint": ["/opt/venv/bin/vllm", "serve"], "Cmd": ["--port", "8000"]}
    found = interpreter.existing(interpreter.candidates(config, stat, head), stat)
    # The venv's python resolves to a system binary but has its own environment (pyvenv.cfg);
    # /usr/bin/python3 and /bin/python3 are one environment.
    assert [(i.path, i.venv) for i in found] == [("/opt/venv/bin/python3", "/opt/venv/pyvenv.cfg"),
                                                 ("/usr/bin/python3", None)]


def test_an_entrypoint_python_off_path_comes_first():
    files = {**DEBIAN, "/opt/vllm-env/bin/python3": (FILE, ""), "/opt/vllm-env/pyvenv.cfg": (FILE, "")}
    stat, head = image(files)
    config = {"Env": [PATH], "Entrypoint": ["/opt/vllm-env/bin/python3", "-m", "vllm.entrypoints.cli.main"]}
    found = interpreter.existing(interpreter.candidates(config, stat, head), stat)
    assert [i.path for i in found] == ["/opt/vllm-env/bin/python3", "/usr/bin/python3"]


def test_env_shebang_and_relative_entrypoint_resolve_along_path():
    files = {**DEBIAN, "/usr/local/bin/vllm": (FILE, "")}
    stat, head = image(files, {"/usr/local/bin/vllm": b"#!/usr/bin/env python3\n"})
    config = {"Env": [PATH], "Entrypoint": ["vllm", "serve"]}
    assert interpreter.entry_candidates(config, stat, head) == ["/usr/bin/python3"]


def test_a_dangling_python_link_and_a_folder_named_python_are_not_interpreters():
    files = {"/usr/local/bin/python3": (LINK, "/usr/local/bin/python3.12"), "/usr/bin/python": (DIR, "")}
    stat, head = image(files)
    assert interpreter.existing(interpreter.candidates({"Env": [PATH]}, stat, head), stat) == []


def _located(path: str, location: str | None) -> Located:
    found: dict = {"found": location is not None, "python": path, "python_version": "3.11.2", "cache_tag": "cpython-311",
                   "sys_path": ["/usr/lib/python3.11"]}
    if location is not None:
        found.update(name="vllm", version="0.33.0", location=location, package_dir=None, record_file=None, record=[])
    return Located(interpreter=Interpreter(path=path, binary=path, venv=None), answer=decode_locate(found))


def test_choose_one_location_seen_by_two_interpreters_is_one_installation():
    chosen = interpreter.choose("img", "vllm", [_located("/opt/v/bin/python3", "/usr/lib/site"),
                                                _located("/usr/bin/python3", "/usr/lib/site")])
    assert chosen.interpreter.path == "/opt/v/bin/python3"


def test_choose_refuses_two_installations_naming_both_and_python():
    with pytest.raises(BadInput) as refused:
        interpreter.choose("img", "vllm", [_located("/opt/v/bin/python3", "/opt/v/site"),
                                           _located("/usr/bin/python3", "/usr/lib/site")])
    line = refused.value.line()
    assert "/opt/v/bin/python3" in line and "/usr/bin/python3" in line and "--python PATH" in line
    assert refused.value.exit_code == 2


def test_choose_none_lists_every_interpreter_tried():
    with pytest.raises(TargetNotFound) as refused:
        interpreter.choose("img", "vllm", [_located("/opt/v/bin/python3", None), _located("/usr/bin/python3", None)])
    assert "looked with /opt/v/bin/python3 3.11.2" in refused.value.message and "/usr/bin/python3" in refused.value.message


@pytest.mark.parametrize(("line", "python"), [
    (b"#!/opt/venv/bin/python3.11\n", "/opt/venv/bin/python3.11"),
    (b"#!/usr/bin/env -S python3 -u\n", "python3"),
    (b"#!/bin/sh\nexec python3\n", None),
    (b"\x7fELF\x02", None),
])
def test_shebang_python(line, python):
    assert interpreter.shebang_python(line) == python
