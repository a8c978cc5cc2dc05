"""targets/runtime.py's rules on an image described by a config and its files, no engine: which
flags and Env settings drop which sys.path entries, exactly as CPython does. The real images are
in tests/test_runs_first.py; here the cases those images cannot all show (flags in a `#!` line,
-I, -s, PYTHONNOUSERSITE, PYTHONSAFEPATH, a zip on PYTHONPATH, Env HOME)."""

from __future__ import annotations

from typing import Any

import pytest

from dspark_patch.targets.imageconfig import GO_DIR
from dspark_patch.targets.runtime import runs_first

SITE = "/usr/local/lib/python3.11/dist-packages"
SCRIPT = b"#!/usr/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n"
PASSWD = b"root:x:0:0:root:/root:/bin/bash\nvllm:x:2000:0::/home/vllm:/bin/bash\n"
USER_SITE = "/home/vllm/.local/lib/python3.11/site-packages"


def _image(files: dict[str, bytes | None]) -> tuple[Any, Any]:
    """stat and read_small over `files` (None: a folder)."""
    def stat(path: str) -> dict[str, Any] | None:
        if path in files:
            return {"mode": GO_DIR if files[path] is None else 0o644, "size": len(files[path] or b"")}
        if any(p.startswith(path.rstrip("/") + "/") for p in files):
            return {"mode": GO_DIR, "size": 0}
        return None

    return stat, lambda path: files.get(path)


def _lines(config: dict[str, Any], extra: dict[str, bytes | None]) -> list[str]:
    files = {"/usr/local/bin/vllm": SCRIPT, "/usr/bin/python3": b"\x7fELF", "/etc/passwd": PASSWD, **extra}
    stat, read = _image(files)
    return runs_first({"User": "2000", "WorkingDir": "/w", **config}, stat, read, site=SITE, python="3.11",
                      distribution="vllm")


VLLM_SERVE = {"Entrypoint": ["vllm", "serve"]}


@pytest.mark.parametrize("config, files, named", [
    (VLLM_SERVE, {"/usr/local/bin/vllm.py": b""}, "/usr/local/bin/vllm.py"),
    (VLLM_SERVE, {f"{USER_SITE}/vllm/__init__.py": b""}, f"{USER_SITE}/vllm/__init__.py"),
    (VLLM_SERVE, {f"{USER_SITE}/vllm.cpython-311-x86_64-linux-gnu.so": b""}, f"{USER_SITE}/vllm.cpython-311-x86_64-linux-gnu.so"),
    ({**VLLM_SERVE, "Env": ["HOME=/srv"]}, {"/srv/.local/lib/python3.11/site-packages/vllm.py": b""},
     "/srv/.local/lib/python3.11/site-packages/vllm.py"),
    ({**VLLM_SERVE, "Env": ["PYTHONUSERBASE=/u"]}, {"/u/lib/python3.11/site-packages/vllm.pyc": b""},
     "/u/lib/python3.11/site-packages/vllm.pyc"),
    ({"Entrypoint": ["python3", "-X", "dev", "-m", "vllm.entrypoints.cli.main"]}, {"/w/vllm/__init__.py": b""},
     "/w/vllm/__init__.py"),
    ({"Entrypoint": ["python3", "/app/run.py"]}, {"/app/vllm.py": b""}, "/app/vllm.py"),
    ({**VLLM_SERVE, "Env": ["PYTHONPATH=/opt/a.zip"]}, {"/opt/a.zip": b"PK"}, "/opt/a.zip: a file on sys.path"),
    ({**VLLM_SERVE, "Env": ["PYTHONPATH=:rel"]}, {"/w/rel/sitecustomize.py": b""}, "/w/rel/sitecustomize.py"),
])
def test_what_runs_first_is_named(config: dict[str, Any], files: dict[str, bytes | None], named: str) -> None:
    lines = _lines(config, files)
    assert len(lines) == 1 and lines[0].startswith(named), lines


@pytest.mark.parametrize("config, files", [
    # -I in the #! line: no script folder, no user site, no PYTHONPATH
    (VLLM_SERVE, {"/usr/local/bin/vllm": SCRIPT.replace(b"python3\n", b"python3 -I\n"),
                  "/usr/local/bin/vllm.py": b"", f"{USER_SITE}/vllm.py": b""}),
    ({**VLLM_SERVE, "Env": ["PYTHONNOUSERSITE=1"]}, {f"{USER_SITE}/vllm.py": b""}),
    ({"Entrypoint": ["python3", "-s", "-m", "vllm"]}, {f"{USER_SITE}/vllm.py": b""}),
    ({**VLLM_SERVE, "Env": ["PYTHONSAFEPATH=1"]}, {"/usr/local/bin/vllm.py": b""}),
    ({"Entrypoint": ["python3", "-E", "-m", "x"], "Env": ["PYTHONPATH=/opt/s"]}, {"/opt/s/vllm.py": b""}),
    # a namespace folder without __init__.py does not win over the regular package
    (VLLM_SERVE, {"/usr/local/bin/vllm/x.txt": b""}),
    # the site folder itself on PYTHONPATH is the checked one
    ({**VLLM_SERVE, "Env": [f"PYTHONPATH={SITE}"]}, {f"{SITE}/vllm/__init__.py": b""}),
    # a bare shell runs nothing (a deployment gives the command): nothing to name
    ({"Cmd": ["/bin/bash"]}, {"/bin/bash": b"\x7fELF"}),
    # trampolines are followed to the python they start
    ({"Entrypoint": ["tini", "--", "python3", "-I", "-m", "vllm"]}, {"/usr/bin/tini": b"\x7fELF", "/w/vllm/__init__.py": b""}),
    ({"Entrypoint": ["/usr/bin/env", "PYTHONNOUSERSITE=1", "vllm", "serve"]}, {"/usr/bin/env": b"\x7fELF",
                                                                              f"{USER_SITE}/vllm.py": b""}),
])
def test_what_cpython_would_not_put_first_is_not_named(config: dict[str, Any], files: dict[str, bytes | None]) -> None:
    assert _lines(config, files) == []


@pytest.mark.parametrize("config, files, says", [
    ({"Entrypoint": ["/bin/sh", "-c", "vllm serve"]}, {"/bin/sh": b"\x7fELF"}, "a shell with a command or script"),
    ({"Entrypoint": ["/entrypoint.sh"]}, {"/entrypoint.sh": b"#!/bin/sh\nexec vllm serve\n"},
     "a program that is not Python"),
    ({"Entrypoint": ["tini", "-g", "vllm"]}, {"/usr/bin/tini": b"\x7fELF"}, "tini with options the tool does not model"),
    ({"Entrypoint": ["env", "-i", "vllm"]}, {"/usr/bin/env": b"\x7fELF"}, "env with options the tool does not model"),
    ({"Entrypoint": ["tini", "--", "/start"]}, {"/usr/bin/tini": b"\x7fELF", "/start": b"\x7fELF"}, "not Python"),
    ({"Entrypoint": ["/missing/launcher"]}, {}, "does not find in the image"),
])
def test_what_the_tool_cannot_model_is_named_not_verified(config: dict[str, Any], files: dict[str, bytes | None],
                                                         says: str) -> None:
    lines = _lines(config, files)
    assert len(lines) == 1 and says in lines[0] and lines[0].endswith("is not verified"), lines


def test_env_assignments_in_the_entrypoint_count_as_the_image_env() -> None:
    lines = _lines({"Entrypoint": ["env", "PYTHONPATH=/opt/s", "vllm", "serve"]},
                   {"/usr/bin/env": b"\x7fELF", "/opt/s/vllm.py": b""})
    assert len(lines) == 1 and lines[0].startswith("/opt/s/vllm.py"), lines


def test_debian_sitecustomize_is_known_and_any_other_is_named() -> None:
    debian = (b"# install the apport exception handler if available\ntry:\n    import apport_python_hook\n"
              b"except ImportError:\n    pass\nelse:\n    apport_python_hook.install()\n")
    assert _lines(VLLM_SERVE, {"/usr/lib/python3.11/sitecustomize.py": debian}) == []
    assert _lines(VLLM_SERVE, {"/usr/lib/python3.11/sitecustomize.py": debian + b"import os\n"})[0].startswith(
        "/usr/lib/python3.11/sitecustomize.py")
    lines = _lines(VLLM_SERVE, {"/usr/lib/python3.11/sitecustomize.py": debian, f"{SITE}/apport_python_hook.py": b""})
    assert lines and lines[0].startswith(f"{SITE}/apport_python_hook.py")
    assert _lines({**VLLM_SERVE, "Env": ["PYTHONHOME=/opt"]}, {})[0].startswith("Env PYTHONHOME=/opt")


# --- the image's own python as it starts (inside/started.py's answer, judged here) ------------
from dspark_patch.targets.image_start import start_of, started_argv  # noqa: E402
from dspark_patch.targets.runtime import judge_started  # noqa: E402

STDLIB = "/usr/lib/python3.11"


def _answer(**changes: Any) -> dict[str, Any]:
    """What the official shape's python answers (read off the real image), with `changes`."""
    answer = {
        "path": ["/usr/local/bin", STDLIB, f"{STDLIB}/lib-dynload", SITE],
        "modules": [["sys", None], ["os", f"{STDLIB}/os.py"], ["encodings.utf_8", f"{STDLIB}/encodings/utf_8.py"],
                    ["_sitebuiltins", f"{STDLIB}/_sitebuiltins.py"], ["__main__", None],
                    ["_distutils_hack", f"{SITE}/_distutils_hack/__init__.py"],
                    ["sitecustomize", f"{STDLIB}/sitecustomize.py"], ["site", f"{STDLIB}/site.py"]],
        "finders": ["_distutils_hack.DistutilsMetaFinder", "_frozen_importlib.BuiltinImporter",
                    "_frozen_importlib.FrozenImporter", "_frozen_importlib_external.PathFinder"],
        "stdlib": [STDLIB], "stdlib_names": ["os", "encodings", "_sitebuiltins", "site", "sys"],
        "sites": [SITE, "/usr/lib/python3/dist-packages", f"{STDLIB}/dist-packages"],
        "spec": {"origin": f"{SITE}/vllm/__init__.py", "locations": [f"{SITE}/vllm"]}, "error": None,
    }
    answer.update(changes)
    return answer


def test_the_genuine_start_adds_nothing():
    assert judge_started(_answer(), site=SITE, top="vllm") == []


@pytest.mark.parametrize(("module", "file"), [
    ("zz_hook", "/usr/lib/python3/dist-packages/zz_hook.py"),       # a .pth import in another site folder
    ("evil", f"{STDLIB}/evil.py"),                                  # in the stdlib folder, not a stdlib name
    ("os", "/opt/shadow/os.py"),                                    # a stdlib name, not from the stdlib
    ("_distutils_hack", "/vllm-workspace/_distutils_hack.py"),      # setuptools' name, not from a site folder
    ("sitecustomize", "/opt/sitecustomize.py"),
])
def test_code_from_a_file_that_ran_at_start_is_named(module: str, file: str):
    answer = _answer(modules=[*_answer()["modules"], [module, file]])
    assert judge_started(answer, site=SITE, top="vllm") == [
        f"{file}: module {module} runs at every start of the image's python, before {SITE}/vllm"]


def test_a_finder_added_at_start_is_named():
    answer = _answer(finders=["site.Redirect", *_answer()["finders"]])
    assert judge_started(answer, site=SITE, top="vllm") == [
        f"site.Redirect: an import finder installed at start of the image's python, asked before {SITE}/vllm"]


@pytest.mark.parametrize(("spec", "error", "said"), [
    ({"origin": "/opt/x/vllm/__init__.py", "locations": ["/opt/x/vllm"]}, None,
     f"/opt/x/vllm/__init__.py: what `import vllm` takes in the image as it starts, not {SITE}/vllm"),
    ({"origin": None, "locations": ["/opt/x/vllm"]}, None, "takes a namespace package (['/opt/x/vllm'])"),
    (None, None, "`import vllm` in the image as it starts finds nothing"),
    (None, "ValueError: boom", "finds ValueError: boom"),
])
def test_vllm_resolved_elsewhere_is_named(spec: Any, error: Any, said: str):
    lines = judge_started(_answer(spec=spec, error=error), site=SITE, top="vllm")
    assert len(lines) == 1 and said in lines[0]


@pytest.mark.parametrize("answer", [None, [], {"path": "x"}, _answer(modules=[["a"]]), _answer(spec={"origin": 3}),
                                    _answer(spec={"origin": "x"}), _answer(stdlib=None)])
def test_an_answer_that_is_not_well_formed_is_not_verified(answer: Any):
    assert judge_started(answer, site=SITE, top="vllm") == [
        f"the image's python as the image starts it gave no readable answer; what it runs before {SITE}/vllm "
        "is not verified"]


@pytest.mark.parametrize(("config", "argv"), [
    (VLLM_SERVE, ["/usr/bin/python3", "-B", "-c", "SRC", "/usr/local/bin", "vllm"]),       # the script's folder
    ({"Entrypoint": ["python3", "-m", "vllm.entrypoints.cli.main"]},
     ["/usr/bin/python3", "-B", "-c", "SRC", "/w", "vllm"]),                                # -m: the working dir
    ({"Entrypoint": ["python3", "-I", "-m", "vllm.entrypoints.cli.main"]},
     ["/usr/bin/python3", "-I", "-B", "-c", "SRC", "", "vllm"]),                            # -I: nothing first
    ({"Entrypoint": ["python3", "-m", "x"], "Env": ["PYTHONSAFEPATH=1"]},
     ["/usr/bin/python3", "-B", "-c", "SRC", "", "vllm"]),
    ({"Entrypoint": ["/bin/sh", "-c", "vllm serve"]}, None),                               # not followed
])
def test_the_image_python_is_asked_as_the_image_starts_it(config: dict[str, Any], argv: Any):
    files = {"/usr/local/bin/vllm": SCRIPT, "/usr/bin/python3": b"\x7fELF", "/bin/sh": b"\x7fELF",
             "/etc/passwd": PASSWD}
    stat, read = _image(files)
    start = start_of({"User": "2000", "WorkingDir": "/w", **config}, stat, read, what=f"{SITE}/vllm")
    assert started_argv(start, top="vllm", source="SRC") == argv


# --- .pth files of the user site and of the interpreter's other site folders (status) ----------
OTHER = "/usr/lib/python3/dist-packages"
SITES = ["/usr/local/lib/python3.11/dist-packages", OTHER, "/usr/lib/python3.11/dist-packages"]
DISTUTILS_PTH = (b"import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == 'local'; "
                 b"enabled and __import__('_distutils_hack').add_shim(); \n")


def _pth_lines(pth: dict[str, dict[str, bytes | None]], extra: dict[str, bytes | None] | None = None,
               site: str = SITE, sites: list[str] = SITES) -> list[str]:
    files = {"/usr/local/bin/vllm": SCRIPT, "/usr/bin/python3": b"\x7fELF", "/etc/passwd": PASSWD, **(extra or {})}
    stat, read = _image(files)
    return runs_first({"User": "2000", "WorkingDir": "/w", **VLLM_SERVE}, stat, read, site=site, python="3.11",
                      distribution="vllm", sites=sites, pth_files=lambda folder: pth.get(folder))


def test_a_pth_that_imports_in_another_site_folder_is_named():
    assert _pth_lines({OTHER: {"zz-hook.pth": b"# a hook\n\nimport zz_hook\n"}}) == [
        f"{OTHER}/zz-hook.pth: runs `import zz_hook` at every start of the image's python "
        "(a site folder of the image's python)"]


def test_a_pth_in_the_user_site_is_named():
    lines = _pth_lines({USER_SITE: {"x.pth": b"import\tx\n"}})
    assert lines == [f"{USER_SITE}/x.pth: runs `import x` at every start of the image's python "
                     "(the image user's site folder)"]


def test_known_pth_and_pth_that_only_add_harmless_folders_are_not_named():
    # setuptools' own .pth (and its own _distutils_hack); a comment; a folder without vLLM;
    # a path line with leading space is a path, not an import.
    assert _pth_lines({OTHER: {"distutils-precedence.pth": DISTUTILS_PTH, "c.pth": b"# only a comment\n",
                               "p.pth": b"extra\n", "s.pth": b" import os\n"}}) == []
    # Beside setuptools' .pth, a _distutils_hack that is not one setuptools released is named.
    lines = _pth_lines({OTHER: {"distutils-precedence.pth": DISTUTILS_PTH}},
                       {f"{OTHER}/_distutils_hack/__init__.py": b"import os\n"})
    assert lines == [f"{OTHER}/_distutils_hack/__init__.py: not setuptools' own, and {OTHER}/distutils-precedence.pth "
                     "imports it at every start (a site folder of the image's python)"]


def test_a_folder_a_pth_puts_first_is_named_when_it_holds_vllm():
    shadow = {"/opt/shadow/vllm/__init__.py": b""}
    # vLLM in the second folder; a .pth in the first puts /opt/shadow before it on sys.path.
    lines = _pth_lines({SITES[0]: {"s.pth": b"/opt/shadow\n"}}, shadow, site=OTHER)
    assert lines == [f"/opt/shadow/vllm/__init__.py: imported before {OTHER}/vllm (a folder that "
                     f"{SITES[0]}/s.pth puts on sys.path)"]
    # The same .pth in a folder after the checked one appends after it: nothing runs first.
    assert _pth_lines({SITES[2]: {"s.pth": b"/opt/shadow\n"}}, shadow, site=OTHER) == []


def test_a_pth_too_large_to_read_is_not_verified():
    assert _pth_lines({OTHER: {"big.pth": None}}) == [
        f"{OTHER}/big.pth: a .pth file too large to read (a site folder of the image's python); what it runs at "
        "every start is not verified"]


# --- code hooks in the environment (targets/start_hooks.py): named whatever sys.path holds -------
@pytest.mark.parametrize("config, files, named", [
    ({**VLLM_SERVE, "Env": ["PYTHONWARNINGS=ignore::hook.W", "PYTHONPATH=/opt/h"]}, {"/opt/h/hook.py": b""},
     "Env PYTHONWARNINGS='ignore::hook.W': its warning category imports module hook"),
    ({**VLLM_SERVE, "Env": ["PYTHONWARNINGS=default,ignore:x:urllib3.exceptions.W"]}, {},
     "Env PYTHONWARNINGS='ignore:x:urllib3.exceptions.W': its warning category imports module urllib3.exceptions"),
    ({"Entrypoint": ["python3", "-Wignore::hook.W", "-m", "vllm.entrypoints.cli.main"]}, {}, "-W 'ignore::hook.W'"),
    # -E drops PYTHONWARNINGS, never -W; nor the dynamic loader's variables
    ({"Entrypoint": ["python3", "-E", "-W", "error::a.B", "-m", "x"], "Env": ["PYTHONWARNINGS=ignore::hook.W"]}, {},
     "-W 'error::a.B'"),
    ({**VLLM_SERVE, "Env": ["LD_PRELOAD=/opt/x.so"]}, {"/opt/x.so": b""}, "Env LD_PRELOAD='/opt/x.so': the dynamic loader"),
    ({"Entrypoint": ["python3", "-I", "-m", "vllm"], "Env": ["LD_AUDIT=/opt/a.so"]}, {}, "Env LD_AUDIT='/opt/a.so'"),
    ({"Entrypoint": ["env", "LD_PRELOAD=/x.so", "vllm", "serve"]}, {"/usr/bin/env": b"\x7fELF"}, "Env LD_PRELOAD='/x.so'"),
    (VLLM_SERVE, {"/etc/ld.so.preload": b"/opt/x.so\n"}, "/etc/ld.so.preload: names '/opt/x.so'"),
    ({**VLLM_SERVE, "Env": ["PYTHONPYCACHEPREFIX=/opt/pyc"]}, {}, "Env PYTHONPYCACHEPREFIX='/opt/pyc'"),
    ({"Entrypoint": ["python3", "-X", "pycache_prefix=/p", "-m", "vllm"]}, {}, "-X 'pycache_prefix=/p'"),
    ({**VLLM_SERVE, "Env": ["PYTHONPLATLIBDIR=lib64"]}, {}, "Env PYTHONPLATLIBDIR='lib64'"),
])
def test_code_hooks_of_the_environment_are_named(config: dict[str, Any], files: dict[str, bytes | None],
                                                 named: str) -> None:
    lines = _lines(config, files)
    assert len(lines) == 1 and lines[0].startswith(named), lines


@pytest.mark.parametrize("config, files", [
    ({**VLLM_SERVE, "Env": ["PYTHONWARNINGS=ignore::DeprecationWarning,default"]}, {}),
    ({**VLLM_SERVE, "Env": ["PYTHONWARNINGS=error::a.b.C::::"]}, {}),   # too many fields: CPython ignores it
    ({"Entrypoint": ["python3", "-E", "-m", "x"], "Env": ["PYTHONWARNINGS=ignore::hook.W", "PYTHONPYCACHEPREFIX=/p"]}, {}),
    ({**VLLM_SERVE, "Env": ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "PYTHONSTARTUP=/s.py", "PYTHONMALLOC=malloc",
                            "PYTHONPROFILEIMPORTTIME=1", "PYTHONBREAKPOINT=pdb.set_trace", "PYTHONEXECUTABLE=/x"]}, {}),
    (VLLM_SERVE, {"/etc/ld.so.preload": b" \n"}),
])
def test_harmless_variables_and_an_empty_preload_file_are_not_named(config: dict[str, Any],
                                                                     files: dict[str, bytes | None]) -> None:
    assert _lines(config, files) == []
