"""The tree the official vLLM images carry: the real wheel installed by uv, and what installers add.

`vllm/vllm-openai` installs vLLM with `uv pip install --system`: INSTALLER says `uv`, the dist-info
holds uv_cache.json, direct_url.json and REQUESTED, the RECORD has a row for the console script,
and there is no bytecode. Those are the installer's own files (references/installer.py): accepted
by name and shape, named in the report, never a finding; anything of another shape stays one.
The trees here are real installs of the real 0.33.0 wheel (tests/support/vllm.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dspark_patch.patchset import resolve
from dspark_patch.references import installer
from tests.support.cli import run
from tests.support.vllm import beside_the_cache, replace_file, uv_tree_copy

PY = sys.executable
INFO = "vllm-0.33.0.dist-info"
VARIANT = resolve("dspark-skip-mtp-buffer").variant_for("0.33.0")
ENTRY = "vllm.entrypoints.cli.main:main"
UV_FILES = {"bin/vllm", f"{INFO}/INSTALLER", f"{INFO}/REQUESTED", f"{INFO}/direct_url.json", f"{INFO}/uv_cache.json"}


@pytest.fixture
def uv033() -> Iterator[Path]:
    with beside_the_cache() as where:
        yield uv_tree_copy("0.33.0", where / "site-packages")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pyc(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*.pyc"))


def test_the_uv_tree_is_what_uv_writes(uv033: Path) -> None:
    """The fixture itself: uv's files, no bytecode (else the tests below prove nothing of uv)."""
    info = uv033 / INFO
    assert (info / "INSTALLER").read_text() == "uv"
    assert {"uv_cache.json", "direct_url.json", "REQUESTED"} <= {p.name for p in info.iterdir()}
    assert any(line.startswith("bin/vllm,") for line in (info / "RECORD").read_text().splitlines())
    assert _pyc(uv033) == []


def test_status_of_the_pristine_uv_tree_is_absent_and_names_the_installer_files(uv033: Path) -> None:
    res = run("status", "--root", str(uv033), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    row = res.json["images"][0]
    assert row["patch_sets"] == {"dspark-skip-mtp-buffer": "absent"}
    assert (row["added"], row["unexplained"], row["missing"], row["record_disagrees"], row["installer_findings"]) == \
        ([], [], [], [], [])
    assert set(row["installer_metadata"]) == UV_FILES


def test_apply_verify_and_status_on_the_uv_tree(uv033: Path, tmp_path: Path) -> None:
    res = run("apply", "--root", str(uv033), "--python", PY, "--json", "--report-dir", str(tmp_path / "apply"))
    assert res.returncode == 0, res.stderr
    audit = res.json
    assert audit["status"] == "applied"
    assert audit["integrity"]["added"] == [] and audit["integrity"]["installer_findings"] == []
    assert set(audit["integrity"]["installer_metadata"]) == UV_FILES
    for path, expected in VARIANT.files.items():
        assert _sha(uv033 / path) == expected.post_sha256
    # No bytecode before; after, exactly the patched modules' (compiled by the target's python).
    tag = sys.implementation.cache_tag
    assert _pyc(uv033) == sorted(f"{os.path.dirname(p)}/__pycache__/{Path(p).stem}.{tag}.pyc" for p in VARIANT.files)

    res = run("verify", "--root", str(uv033), "--python", PY, "--json", "--report-dir", str(tmp_path / "verify"))
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "verified"
    assert res.json["integrity"]["bytecode_checked"] == len(VARIANT.files)
    modules = sum(1 for _ in uv033.rglob("*.py"))
    assert res.json["integrity"]["modules_without_bytecode"] == modules - len(VARIANT.files)

    res = run("status", "--root", str(uv033), "--json")
    assert res.returncode == 0, res.stdout
    row = res.json["images"][0]
    assert row["patch_sets"] == {"dspark-skip-mtp-buffer": "applied"}
    assert (row["added"], row["unexplained"], row["missing"], row["installer_findings"]) == ([], [], [], [])


def _rewrite_record(tree: Path, old: str, new: str) -> None:
    """The RECORD with the row that starts with `old` starting with `new` instead."""
    record = tree / INFO / "RECORD"
    lines = record.read_text().splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if line.startswith(old)]
    assert len(rows) == 1
    lines[rows[0]] = new + lines[rows[0]][len(old):]
    replace_file(record, "".join(lines).encode())


def _script_with(line: str) -> Callable[[Path], None]:
    def mutate(tree: Path) -> None:
        script = tree / "bin" / "vllm"
        head, _, rest = script.read_bytes().partition(b"\n")
        replace_file(script, head + b"\n" + line.encode() + b"\n" + rest)
    return mutate


# name: (mutation, the path the finding names, where it is listed in status --json)
HOSTILE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "uv_cache.json that is code": (
        lambda t: replace_file(t / INFO / "uv_cache.json", b"import os\nos.system('id')\n"),
        f"{INFO}/uv_cache.json", "installer_findings"),
    "INSTALLER of megabytes": (
        lambda t: replace_file(t / INFO / "INSTALLER", b"uv" + b"x" * (2 << 20)), f"{INFO}/INSTALLER",
        "installer_findings"),
    "a .pth named like installer metadata": (
        lambda t: (t / "uv_cache.pth").write_text("import os\n"), "uv_cache.pth", "added"),
    "installer metadata with a .pth name in the dist-info": (
        lambda t: (t / INFO / "INSTALLER.pth").write_text("import os\n"), f"{INFO}/INSTALLER.pth", "added"),
    "a RECORD row for bin/vllm outside the prefix": (
        lambda t: _rewrite_record(t, "bin/vllm,", "../../../../../../usr/bin/vllm,"),
        "../../../../../../usr/bin/vllm", "installer_findings"),
    "a console script that is not the installer's": (
        _script_with("import os; os.system('true')"), "bin/vllm", "installer_findings"),
    "a console script that calls another entry point": (
        lambda t: replace_file(t / "bin" / "vllm", (t / "bin" / "vllm").read_bytes().replace(
            b"from vllm.entrypoints.cli.main import main", b"from os import main")), "bin/vllm", "installer_findings"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_what_is_not_the_installers_own_stays_a_finding(case: str, uv033: Path, tmp_path: Path) -> None:
    mutate, path, listed = HOSTILE[case]
    mutate(uv033)
    res = run("status", "--root", str(uv033), "--json")
    assert res.returncode == 1, res.stdout
    row = res.json["images"][0]
    named = [x for x in row[listed] if x == path or x.startswith(path + ": ")]
    assert len(named) == 1, row
    assert path not in row["installer_metadata"]

    res = run("verify", "--root", str(uv033), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert path in res.stdout + res.stderr

    before = {p: _sha(uv033 / p) for p in VARIANT.files}
    res = run("apply", "--root", str(uv033), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "a"))
    line = res.assert_clean_error(1)
    assert "modified-base" in res.stdout + res.stderr or "not the published wheel" in line
    assert path in line
    assert {p: _sha(uv033 / p) for p in VARIANT.files} == before


# Console scripts as real installers write them (the #! line differs by where they ran). pip 26
# and uv are the trees' own; these two were written by pip 23.2 and by the `installer` library.
PIP_23 = b"""#!/usr/bin/python3
# -*- coding: utf-8 -*-
import re
import sys
from vllm.entrypoints.cli.main import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
INSTALLER_LIB = PIP_23.replace(b"'", b'"')
# What pip and uv write where the interpreter's path is too long for a #! line.
TRAMPOLINE = b"#!/bin/sh\n'''exec' \"/opt/a/very/long/path/bin/python\" \"$0\" \"$@\"\n' '''\n" + PIP_23.split(b"\n", 1)[1]


def test_real_installers_console_scripts_are_accepted(uv033: Path, vllm033_tree: Path) -> None:
    assert installer.script_problem((uv033 / "bin" / "vllm").read_bytes(), ENTRY) is None
    assert installer.script_problem((vllm033_tree / "bin" / "vllm").read_bytes(), ENTRY) is None  # pip's
    for data in (PIP_23, INSTALLER_LIB, TRAMPOLINE):
        assert installer.script_problem(data, ENTRY) is None


@pytest.mark.parametrize("body", [
    PIP_23.replace(b"import sys\n", b"import sys, os\n"),                        # another import
    PIP_23.replace(b"sys.exit(main())", b"os.system('x'); sys.exit(main())"),     # extra call
    PIP_23.replace(b"sys.exit(main())", b"sys.exit(main(1))"),                   # arguments
    PIP_23.replace(b"    sys.argv[0] = re.sub", b"    sys.argv[1] = re.sub"),     # another argv
    PIP_23.replace(b"if __name__ == '__main__':", b"if True:"),
    PIP_23 + b"print('after')\n",
    PIP_23.replace(b"#!/usr/bin/python3\n", b""),                                 # no #! line
    b"#!/usr/bin/python3\n\x00",
    TRAMPOLINE.replace(b"import re\n", b"exec('x')\n"),
])
def test_console_scripts_of_another_shape_are_refused(body: bytes) -> None:
    assert installer.script_problem(body, ENTRY) is not None


def test_installer_metadata_shapes(uv033: Path, vllm033_tree: Path) -> None:
    for tree in (uv033, vllm033_tree):  # uv's and pip's own files
        for name in ("INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"):
            if (tree / INFO / name).exists():
                assert installer.metadata_problem(name, (tree / INFO / name).read_bytes()) is None, name
    assert installer.metadata_problem("INSTALLER", b"uv\nimport os\n") is not None
    assert installer.metadata_problem("REQUESTED", b"\x00\x01") is not None
    assert installer.metadata_problem("direct_url.json", b'{"url": "file:///x"}') is not None
    assert installer.metadata_problem("direct_url.json", json.dumps(["a"]).encode()) is not None
    assert installer.metadata_problem("uv_cache.json", b'{"timestamp": 1, "code": "import os"}') is not None
    assert installer.metadata_problem("uv_cache.json", None) is not None
    assert installer.metadata_problem("METADATA", b"") is not None
