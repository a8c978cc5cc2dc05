"""Integrity against the published wheel, bytecode proven, nothing of the target run on the host,
bad data a clean error (docs/status.md: forged bytecode, self-attested integrity, target code on the host, malformed RECORD rows, and resource exhaustion's RECORD/FIFO part).

Hostile trees are real vLLM 0.33.0 installs (hard-linked copies of the cached `pip install
--target`) changed by the test; hostile images are built FROM the fixture by a Dockerfile.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import marshal
import os
import secrets
import shutil
import subprocess
import sys
import zipfile
from importlib import _bootstrap_external, resources  # type: ignore[attr-defined]
from pathlib import Path

import jsonschema
import pytest

from dspark_patch.patchset import available as available_patch_sets
from dspark_patch.references import build
from dspark_patch.report.status_render import load_status_schema
from tests.support import images, vllm
from tests.support.cli import run
from tests.support.vllm import replace_file

PY = sys.executable
PATCH_ID = "dspark-skip-mtp-buffer"
SITE = "/usr/local/lib/python3.11/dist-packages"
ENVS = "vllm/envs.py"
INFO = "vllm-0.33.0.dist-info"
X86 = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64"
ARM = "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64"


def status_json(*args: str) -> tuple[int, dict]:
    res = run("status", *args, "--json")
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.Draft202012Validator(load_status_schema()).validate(doc)
    return res.returncode, doc


def b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def rewrite_record(tree: Path, rows: dict[str, str | None]) -> None:
    """Replace (or drop, for None) RECORD rows by path; rows not there are appended."""
    record = tree / INFO / "RECORD"
    lines = record.read_text().splitlines()
    out, seen = [], set()
    for line in lines:
        path = line.rsplit(",", 2)[0].strip('"')
        if path in rows:
            seen.add(path)
            if rows[path] is not None:
                out.append(rows[path])
            continue
        out.append(line)
    out += [row for path, row in rows.items() if path not in seen and row is not None]
    replace_file(record, ("\n".join(out) + "\n").encode())


def record_row(path: str, data: bytes) -> str:
    return f"{path},sha256={b64(hashlib.sha256(data).digest())},{len(data)}"


def forged_pyc(source: Path, code_text: bytes) -> bytes:
    """Checked-hash bytecode carrying `source`'s hash but the code of `code_text`."""
    code = compile(code_text, str(source), "exec", dont_inherit=True)
    return bytes(_bootstrap_external._code_to_hash_pyc(code, importlib.util.source_hash(source.read_bytes()), True))


def shadowing_stdlib(tree: Path, marker: Path) -> None:
    """A json.py and platform.py at the tree's top that leave `marker` when imported."""
    for name in ("json", "platform"):
        (tree / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} ran\\n')\n")


# --- the reference --------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("release", ["0.34.0", "0.33.0", "0.32.0"])
@pytest.mark.parametrize("platform", ["x86_64", "aarch64"])
def test_the_shipped_reference_is_what_the_real_wheel_gives(release: str, platform: str) -> None:
    """Each release a variant of the shipped patch set supports has a reference per platform."""
    wheel = vllm.wheel(release) if platform == "x86_64" else vllm.platform_wheel(release, "manylinux_2_28_aarch64")
    document = build.reference_from_wheel(wheel)
    shipped = resources.files("dspark_patch.references").joinpath(build.file_name(document)).read_bytes()
    assert build.encode(document) == shipped
    tag = "manylinux_2_28_x86_64" if platform == "x86_64" else "manylinux_2_28_aarch64"
    assert build.file_name(document) == f"vllm-{release}-cp38-abi3-{tag}.json.gz"
    with zipfile.ZipFile(wheel) as zf:  # every file of the wheel, the wheel's RECORD aside
        info = f"vllm-{release}.dist-info"
        assert set(document["files"]) == {n for n in zf.namelist() if not n.endswith("/") and n != f"{info}/RECORD"}
    assert json.loads(gzip.decompress(shipped))["files"]["vllm/envs.py"][0] == \
        hashlib.sha256(zipfile.ZipFile(wheel).read("vllm/envs.py")).hexdigest()


def test_a_wheel_whose_record_lies_gives_no_reference(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/__init__.py", b"x = 1\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", b"Tag: py3-none-any\n")
        zf.writestr("demo-1.0.dist-info/RECORD", record_row("demo/__init__.py", b"x = 2\n") + "\n"
                    + record_row("demo-1.0.dist-info/WHEEL", b"Tag: py3-none-any\n") + "\ndemo-1.0.dist-info/RECORD,,\n")
    with pytest.raises(build.WheelDisagrees, match="demo/__init__.py"):
        build.reference_from_wheel(wheel)
    done = subprocess.run([PY, "-m", "dspark_patch.references.build", str(wheel), "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "demo/__init__.py" in done.stderr and not list(tmp_path.glob("*.json.gz"))


# --- self-attested-integrity: self-attested integrity ---------------------------------------------
def test_a_hand_edit_with_its_record_row_rewritten_and_startup_hooks_are_findings(tmp_path: Path) -> None:
    clean = vllm.tree_copy("0.33.0", tmp_path / "clean" / "site-packages")
    tree = vllm.tree_copy("0.33.0", tmp_path / "hostile" / "site-packages")
    marker = tmp_path / "ran-on-host"
    init = tree / "vllm/__init__.py"
    edited = init.read_bytes() + b"\nimport os  # by hand\n"
    replace_file(init, edited)
    hook = b"import os; os.environ.setdefault('HOOKED', '1')\n"
    (tree / "zz-fake.pth").write_bytes(hook)   # listed in the RECORD of a one-file fake distribution
    fake = tree / "zzfake-1.0.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: zzfake\nVersion: 1.0\n")
    (fake / "RECORD").write_text(record_row("zz-fake.pth", hook) + "\nzzfake-1.0.dist-info/RECORD,,\n")
    (tree / "sitecustomize.py").write_text("print('every interpreter start')\n")
    rewrite_record(tree, {"vllm/__init__.py": record_row("vllm/__init__.py", edited)})
    shadowing_stdlib(tree, marker)

    code, doc = status_json("--root", str(clean), "--root", str(tree))
    good, bad = doc["images"]
    assert (good["unexplained"], good["added"], good["record_disagrees"], good["exit_code"]) == ([], [], [], 0)
    assert good["reference"] == f"{X86}.whl" and good["patch_sets"][PATCH_ID] == "absent"
    assert bad["unexplained"] == ["vllm/__init__.py"] and bad["record_disagrees"] == ["vllm/__init__.py"]
    assert bad["added"] == ["sitecustomize.py", "zz-fake.pth"]
    assert code == 1 and bad["exit_code"] == 1

    res = run("apply", "--root", str(tree), "--python", PY, "--dry-run", "--report-dir", str(tmp_path / "dry"))
    assert "is not the published wheel" in res.assert_clean_error(1)  # apply holds the tree to the wheel too
    res = run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 1, res.stderr
    integrity = res.json["integrity"]
    assert integrity["mismatched"] == ["vllm/__init__.py"] and integrity["record_disagrees"] == ["vllm/__init__.py"]
    assert integrity["added"] == ["sitecustomize.py", "zz-fake.pth"] and integrity["reference"] == f"{X86}.whl"
    # target-code-on-host: the tree's json.py / platform.py never ran (dry run, locate, integrity check)
    assert not marker.exists()


def test_the_distutils_hack_that_setuptools_pth_imports_must_be_setuptools_own(tmp_path: Path) -> None:
    """setuptools' distutils-precedence.pth (accepted by its known bytes) imports `_distutils_hack`
    at every start: beside it, that package is accepted only as a text setuptools released (here:
    the venv's own setuptools), and a rewritten one, or a `_distutils_hack.py` module at the top,
    is added for status, verify and apply, on a real 0.33.0 tree."""
    setuptools_site = Path(importlib.util.find_spec("_distutils_hack").origin).parent.parent  # type: ignore[union-attr, arg-type]
    genuine = (setuptools_site / "_distutils_hack/__init__.py").read_bytes()
    trees = {}
    for name in ("genuine", "rewritten", "module"):
        tree = vllm.tree_copy("0.33.0", tmp_path / name / "site-packages")
        shutil.copyfile(setuptools_site / "distutils-precedence.pth", tree / "distutils-precedence.pth")
        (tree / "_distutils_hack").mkdir()
        (tree / "_distutils_hack/__init__.py").write_bytes(genuine + (b"\nimport os  # runs at start\n" if name == "rewritten" else b""))
        if name == "module":
            (tree / "_distutils_hack.py").write_text("def add_shim(): pass\n")
        trees[name] = tree
    code, doc = status_json(*(a for t in trees.values() for a in ("--root", str(t))))
    rows = {Path(r["ref"]).parent.name: r for r in doc["images"]}
    assert (rows["genuine"]["added"], rows["genuine"]["exit_code"]) == ([], 0), rows["genuine"]
    assert rows["rewritten"]["added"] == ["_distutils_hack/__init__.py"] and rows["rewritten"]["exit_code"] == 1
    assert rows["module"]["added"] == ["_distutils_hack.py"] and rows["module"]["exit_code"] == 1
    assert code == 1
    for name in ("rewritten", "module"):
        res = run("verify", "--root", str(trees[name]), "--python", PY, "--no-probe", "--json",
                  "--report-dir", str(tmp_path / f"v-{name}"))
        assert res.returncode == 1 and res.json["integrity"]["added"] == rows[name]["added"], res.stderr
        res = run("apply", "--root", str(trees[name]), "--python", PY, "--dry-run", "--report-dir", str(tmp_path / f"a-{name}"))
        assert "is not the published wheel" in res.assert_clean_error(1)
    res = run("verify", "--root", str(trees["genuine"]), "--python", PY, "--no-probe", "--json",
              "--report-dir", str(tmp_path / "v-genuine"))
    assert res.json["integrity"]["added"] == [], res.json["integrity"]


def test_a_second_vllm_dist_info_is_an_error_everywhere(tmp_path: Path) -> None:
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    second = tree / "vllm-0.34.0.dist-info"
    second.mkdir()
    (second / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n")
    (second / "RECORD").write_text("vllm-0.34.0.dist-info/RECORD,,\n")
    code, doc = status_json("--root", str(tree))
    row = doc["images"][0]
    assert code == 1 and "2 vllm distributions" in row["error"] and row["patch_sets"] == {}
    before = (tree / ENVS).read_bytes()
    for command in (("apply", "--no-probe"), ("verify", "--no-probe")):
        res = run(*command, "--root", str(tree), "--python", PY, "--report-dir", str(tmp_path / command[0]))
        assert "2 vllm distributions" in res.assert_clean_error(1)
    assert (tree / ENVS).read_bytes() == before


def test_an_unknown_wheel_is_no_reference_and_never_clean(tmp_path: Path) -> None:
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    wheel = tree / INFO / "WHEEL"
    replace_file(wheel, wheel.read_bytes().replace(b"linux_x86_64", b"linux_riscv64"))
    code, doc = status_json("--root", str(tree))
    row = doc["images"][0]
    assert code == 1 and row["exit_code"] == 1 and row["reference"] is None
    assert row["unverified"][0].startswith("no reference for vllm 0.33.0 on this platform")
    res = run("status", "--root", str(tree))
    assert res.returncode == 1 and "changed" in res.stderr and "no reference for vllm 0.33.0" in res.stdout


# --- forged-bytecode: forged bytecode -------------------------------------------------------------
def test_forged_bytecode_is_caught_by_verify_and_status(tmp_path: Path, patched033_tree: Path) -> None:
    tree = patched033_tree  # `apply --no-probe` of a fresh tree, made once per session (tests/conftest.py)
    code, doc = status_json("--root", str(tree))
    assert code == 0 and doc["images"][0]["bytecode"] == [] and doc["images"][0]["patch_sets"][PATCH_ID] == "applied"

    marker = tmp_path / "forged-ran"
    envs = tree / ENVS
    pyc = Path(importlib.util.cache_from_source(str(envs)))
    replace_file(pyc, forged_pyc(envs, f"open({str(marker)!r}, 'w').write('forged')\n".encode()))
    # an unpatched module's timestamp bytecode with a header that is not its source's
    logger_pyc = Path(importlib.util.cache_from_source(str(tree / "vllm/logger.py")))
    stale = bytearray(logger_pyc.read_bytes())
    stale[8:12] = (int.from_bytes(stale[8:12], "little") ^ 1).to_bytes(4, "little")
    replace_file(logger_pyc, bytes(stale))
    (tree / "vllm/sourceless.pyc").write_bytes(pyc.read_bytes())  # sourceless bytecode is importable
    shadowing_stdlib(tree, marker)

    code, doc = status_json("--root", str(tree))
    row = doc["images"][0]
    assert code == 1 and row["patch_sets"][PATCH_ID] == "applied"
    assert [b.split(":")[0] for b in row["bytecode"]] == ["vllm/__pycache__/envs.cpython-311.pyc",
                                                          "vllm/__pycache__/logger.cpython-311.pyc"]
    assert "vllm/sourceless.pyc" in row["added"]
    assert any(u.startswith("bytecode not verified") for u in row["unverified"])

    res = run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 1, res.stderr
    stale_list = res.json["integrity"]["stale_bytecode"]
    assert stale_list == ["vllm/__pycache__/envs.cpython-311.pyc does not hold the code of vllm/envs.py "
                          "(recompiled with this interpreter and compared)"]
    assert res.json["integrity"]["bytecode_checked"] > 3000 and "vllm/sourceless.pyc" in res.json["integrity"]["added"]
    assert not marker.exists()  # neither the forged code nor the shadowing modules ran


# --- apply refuses a tree that is not the published wheel (forged-bytecode, self-attested-integrity, resource-exhaustion) ---
def _hand_edit(tree: Path) -> None:
    init = tree / "vllm/__init__.py"
    edited = init.read_bytes() + b"\nimport os  # by hand\n"
    replace_file(init, edited)
    rewrite_record(tree, {"vllm/__init__.py": record_row("vllm/__init__.py", edited)})


def _pth_in_a_fake_distribution(tree: Path) -> None:
    hook = b"import os; os.environ.setdefault('HOOKED', '1')\n"
    (tree / "zz-fake.pth").write_bytes(hook)
    fake = tree / "zzfake-1.0.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: zzfake\nVersion: 1.0\n")
    (fake / "RECORD").write_text(record_row("zz-fake.pth", hook) + "\nzzfake-1.0.dist-info/RECORD,,\n")


def _forged_bytecode(tree: Path) -> None:
    # an unpatched module's .pyc, checked-hash with its source's hash: the interpreter loads it
    logger = tree / "vllm/logger.py"
    replace_file(Path(importlib.util.cache_from_source(str(logger))), forged_pyc(logger, b"import os\n"))


def _fifo_for_a_file(tree: Path) -> None:
    (tree / "vllm/logger.py").unlink()
    os.mkfifo(tree / "vllm/logger.py")


NOT_THE_WHEEL = {  # class: what status and verify name (the twist)
    "hand edit, RECORD row rewritten (5)": (_hand_edit, "vllm/__init__.py"),
    ".pth with an import line in a fake distribution (5)": (_pth_in_a_fake_distribution, "zz-fake.pth"),
    "sitecustomize.py (5)": (lambda t: (t / "sitecustomize.py").write_text("print('every start')\n"), "sitecustomize.py"),
    "a module added under vllm/ (5)": (lambda t: (t / "vllm/extra.py").write_text("x = 1\n"), "vllm/extra.py"),
    "a wheel file removed": (lambda t: (t / "vllm/logger.py").unlink(), "vllm/logger.py"),
    "forged bytecode of an unpatched module (4)": (_forged_bytecode, "vllm/__pycache__/logger.cpython-311.pyc"),
    "a FIFO in place of a file (9)": (_fifo_for_a_file, "vllm/logger.py"),
}


@pytest.mark.parametrize("case", NOT_THE_WHEEL)
def test_apply_refuses_a_tree_that_is_not_the_published_wheel(tmp_path: Path, case: str) -> None:
    """The pre-image hashes of the two patched files hold; the rest of the tree is not the
    wheel. apply refuses before writing (exit 1, one line), status is not clean, and nothing of
    the tree runs on the host (target-code-on-host)."""
    twist, named = NOT_THE_WHEEL[case]
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    twist(tree)
    marker = tmp_path / "ran-on-host"
    shadowing_stdlib(tree, marker)
    variant = next(p for p in available_patch_sets() if p.id == PATCH_ID).variant_for("0.33.0")
    before = {rel: (tree / rel).read_bytes() for rel in variant.files}
    pycs = {rel: Path(importlib.util.cache_from_source(str(tree / rel))).read_bytes() for rel in variant.files}

    res = run("apply", "--root", str(tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "a"))
    line = res.assert_clean_error(1)
    assert "is not the published wheel" in line and named in line and "nothing was written" in line, line
    assert {rel: (tree / rel).read_bytes() for rel in variant.files} == before
    assert {rel: Path(importlib.util.cache_from_source(str(tree / rel))).read_bytes() for rel in variant.files} == pycs
    audit = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert audit["status"] == "failed" and audit["errors"][0]["kind"] == "modified-base"
    assert audit["integrity"]["reference"] == f"{X86}.whl"
    assert [s["name"] for s in audit["steps"]][-1] == "integrity"  # nothing after it ran: no write
    assert "<failure" in (tmp_path / "a" / "junit.xml").read_text()  # CI shows the integrity case failing

    # (verify of each exits 1: the tests above and below, and test_local_apply_verify.py)
    code, doc = status_json("--root", str(tree))
    row = doc["images"][0]
    if case == "forged bytecode of an unpatched module (4)":
        # status runs nothing: a .pyc whose header carries its source's hash cannot be told from an
        # honest one without compiling, so status says so (never plain clean); verify recompiles
        # and fails (test_forged_bytecode_* above), and apply refused it here.
        assert any(u.startswith("bytecode not verified") for u in row["unverified"]), row
    else:
        assert code == 1 and row["exit_code"] == 1
        assert named in row["unexplained"] + row["added"] + row["missing"] + [b.split(":")[0] for b in row["bytecode"]], row
    assert not marker.exists()


def test_allow_unknown_base_patches_a_tree_that_is_not_the_wheel_and_says_so(tmp_path: Path) -> None:
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    (tree / "sitecustomize.py").write_text("print('every start')\n")
    res = run("apply", "--root", str(tree), "--python", PY, "--no-probe", "--allow-unknown-base", "--json",
              "--report-dir", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr
    doc = res.json
    assert doc["status"] == "applied" and doc["integrity"] is None
    assert any(n.startswith("--allow-unknown-base: the tree is not the published wheel") and "sitecustomize.py" in n
               for n in doc["notes"]), doc["notes"]


def test_apply_of_a_pristine_tree_reports_the_check_and_an_unknown_release_only_notes_it(tmp_path: Path) -> None:
    tree = vllm.tree_copy("0.33.0", tmp_path / "clean" / "site-packages")
    res = run("apply", "--root", str(tree), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr
    integrity = res.json["integrity"]
    assert integrity["reference"] == f"{X86}.whl" and integrity["bytecode_checked"] > 3000
    assert (integrity["mismatched"], integrity["missing"], integrity["added"], integrity["stale_bytecode"]) == ([], [], [], [])
    # a WHEEL that is none of the published ones: nothing to check against, a note, patched as before
    other = vllm.tree_copy("0.33.0", tmp_path / "other" / "site-packages")
    wheel = other / INFO / "WHEEL"
    replace_file(wheel, wheel.read_bytes().replace(b"linux_x86_64", b"linux_riscv64"))
    res = run("apply", "--root", str(other), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    assert res.json["integrity"] is None
    assert any(n.startswith("no reference for vllm 0.33.0 on this platform") and "pre-image hashes alone" in n
               for n in res.json["notes"]), res.json["notes"]


def instructions_only_pyc(source: Path) -> bytes:
    """Checked-hash bytecode of `source` whose first LOAD_CONST loads another of the module's own
    constants: the names, constants and nesting are the source's, one instruction is not."""
    import dis

    code = compile(source.read_bytes(), str(source), "exec", dont_inherit=True)
    raw = bytearray(code.co_code)
    at = next(i for i in range(0, len(raw), 2) if raw[i] == dis.opmap["LOAD_CONST"])
    raw[at + 1] = (raw[at + 1] + 1) % len(code.co_consts)
    forged = code.replace(co_code=bytes(raw))
    assert forged != code
    return bytes(_bootstrap_external._code_to_hash_pyc(forged, importlib.util.source_hash(source.read_bytes()), True))


def test_bytecode_that_differs_only_in_its_instructions_fails_verify_and_apply(tmp_path: Path) -> None:
    """Class 4, the quiet form: what another release of the interpreter writes, or a forger who
    keeps every name and constant. Not a note: verify exits 1 and apply refuses, and the message
    says how to rewrite honest bytecode; status, which runs nothing, never calls it clean."""
    from dspark_patch.inside.integrity import _same_shape

    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    logger = tree / "vllm/logger.py"
    pyc = Path(importlib.util.cache_from_source(str(logger)))
    forged = instructions_only_pyc(logger)
    assert _same_shape(marshal.loads(forged[16:]), compile(logger.read_bytes(), str(logger), "exec", dont_inherit=True))
    replace_file(pyc, forged)
    named = "vllm/__pycache__/logger.cpython-311.pyc does not hold the code of vllm/logger.py"

    code, doc = status_json("--root", str(tree))
    row = doc["images"][0]
    assert row["patch_sets"][PATCH_ID] == "absent"
    assert any(u.startswith("bytecode not verified") for u in row["unverified"]), row  # never plainly clean

    res = run("apply", "--root", str(tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "a"))
    line = res.assert_clean_error(1)
    assert named in line and "compileall -f" in line, line
    res = run("apply", "--root", str(tree), "--python", PY, "--no-probe", "--allow-unknown-base",
              "--report-dir", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    res = run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 1, res.stderr
    stale = res.json["integrity"]["stale_bytecode"]
    assert len(stale) == 1 and stale[0].startswith(named) and f"-m compileall -f {logger}" in stale[0], stale
    assert res.json["integrity"]["notes"] == []
    # the fix the message names makes the tree whole again
    done = subprocess.run([PY, "-m", "compileall", "-q", "-f", str(logger)], capture_output=True)
    assert done.returncode == 0
    res = run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "v2"))
    assert res.returncode == 0, res.stderr[-800:]


def test_a_kept_bytecode_proof_spares_the_compile_and_never_covers_a_changed_pyc(tmp_path: Path) -> None:
    """A second verify of a local tree proves its bytecode from the proofs the first one kept
    (no compile, seconds saved per run); a .pyc changed since gets no proof from them: the forged
    file is named as before. A proofs file is believed only under this machine's cache key: a
    proof planted for the forged .pyc (anyone can compute one) or any other rewrite of the file
    costs the compile and a note, and the forged file is still named."""
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    env = {"DSPARK_PATCH_CACHE": str(tmp_path / "cache"), "DSPARK_PATCH_CACHE_KEY": str(tmp_path / "state/key")}

    def verify(name: str) -> dict:
        res = run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--json",
                  "--report-dir", str(tmp_path / name), env=env)
        assert res.returncode in (0, 1), res.stderr
        return res.json

    first = verify("v1")["integrity"]
    assert first["bytecode_checked"] > 3000 and first["bytecode_proofs_reused"] == 0
    assert (tmp_path / "state/key").stat().st_mode & 0o777 == 0o600
    kept = [p for p in (tmp_path / "cache/bytecode").glob("*/vllm-0.33.0") if p.parent.name != "by-target"]
    # the seal (32 bytes), then one proof for each .pyc but the two stale ones
    assert len(kept) == 1 and kept[0].stat().st_size == 32 + 16 * (first["bytecode_checked"] - 2), kept
    second = verify("v2")["integrity"]
    # the unpatched tree's two patched files have pip's timestamp bytecode, named stale, never proofs
    assert len(first["stale_bytecode"]) == 2 and second["stale_bytecode"] == first["stale_bytecode"]
    assert second["bytecode_checked"] == first["bytecode_checked"]
    assert second["bytecode_proofs_reused"] == second["bytecode_checked"] - 2

    logger = tree / "vllm/logger.py"
    forged = instructions_only_pyc(logger)
    replace_file(Path(importlib.util.cache_from_source(str(logger))), forged)
    third = verify("v3")
    assert third["integrity"]["bytecode_proofs_reused"] == second["bytecode_proofs_reused"] - 1
    named = sorted(set(third["integrity"]["stale_bytecode"]) - set(second["stale_bytecode"]))
    assert [line.split()[0] for line in named] == ["vllm/__pycache__/logger.cpython-311.pyc"], named
    assert third["status"] == "failed" and not any("cache" in n for n in third["notes"])

    # Planted: a proof for the forged .pyc under the interpreter's identity (its folder's name),
    # appended to the kept file; then the file replaced by that proof alone.
    identity = kept[0].parent.name
    source_hex, forged_hex = hashlib.sha256(logger.read_bytes()).hexdigest(), hashlib.sha256(forged).hexdigest()
    planted = b"".join(hashlib.sha256(f"{identity}\0{opt}\0{source_hex}\0{forged_hex}".encode()).digest()[:16]
                       for opt in ("", "0", "None"))
    for body in (kept[0].read_bytes() + planted, kept[0].read_bytes()[:32] + planted):
        kept[0].write_bytes(body)
        fourth = verify("v4")
        assert fourth["status"] == "failed", fourth["integrity"]
        assert fourth["integrity"]["stale_bytecode"] == third["integrity"]["stale_bytecode"]
        assert fourth["integrity"]["bytecode_proofs_reused"] == 0
        assert fourth["integrity"]["bytecode_checked"] == third["integrity"]["bytecode_checked"]
        assert any("bytecode entry in the cache folder" in n and "not sealed by this machine's cache key" in n
                   for n in fourth["notes"]), fourth["notes"]
    # the refused file was written again, sealed: the next check reuses it
    assert verify("v5")["integrity"]["bytecode_proofs_reused"] == third["integrity"]["bytecode_proofs_reused"]


# --- malformed-record, resource-exhaustion: bad RECORD data, FIFOs --------------------------------
MALFORMED_ROWS = ("vllm/envs.py,sha256=not*base64!,100", "vllm/envs.py,sha256=AAAA,100",
                  "vllm/envs.py,sha256=,12x", "vllm/envs.py,md5=abc,1")


def test_a_malformed_record_row_is_one_line_and_the_other_rows_stay(tmp_path: Path) -> None:
    # One status run over every malformed tree and one clean tree (read once, not once per row).
    clean = vllm.tree_copy("0.33.0", tmp_path / "clean" / "site-packages")
    trees = []
    for i, row in enumerate(MALFORMED_ROWS):
        trees.append(vllm.tree_copy("0.33.0", tmp_path / f"bad{i}" / "site-packages"))
        rewrite_record(trees[-1], {ENVS: row})
    code, doc = status_json(*(a for t in (*trees, clean) for a in ("--root", str(t))))
    *bad, good = doc["images"]
    for row, image in zip(MALFORMED_ROWS, bad, strict=True):
        assert "RECORD" in image["error"] and "row" in image["error"] and image["exit_code"] == 2, row
    assert good["error"] is None and good["exit_code"] == 0 and code == 2
    for row, tree in zip(MALFORMED_ROWS, trees, strict=True):
        for command in ("apply", "verify"):
            res = run(command, "--root", str(tree), "--python", PY, "--no-probe", "--report-dir", str(tree.parent / command))
            assert "RECORD" in res.assert_clean_error(2), (row, command)


def test_an_oversized_record_is_refused_unread(tmp_path: Path) -> None:
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    record = tree / INFO / "RECORD"
    replace_file(record, record.read_bytes() + b"#" * (33 << 20))
    code, doc = status_json("--root", str(tree))
    assert code == 2 and "over the 32 MiB limit" in doc["images"][0]["error"]
    for command in ("verify", "apply"):
        res = run(command, "--root", str(tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / command))
        assert "over the 32 MiB limit" in res.assert_clean_error(2)


def test_a_fifo_in_record_or_in_place_of_a_file_never_blocks(tmp_path: Path) -> None:
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    os.mkfifo(tree / "vllm/listed_fifo")
    (tree / "vllm/logger.py").unlink()
    os.mkfifo(tree / "vllm/logger.py")
    rewrite_record(tree, {"vllm/listed_fifo": "vllm/listed_fifo,sha256=" + b64(bytes(32)) + ",0"})
    code, doc = status_json("--root", str(tree))
    row = doc["images"][0]
    assert code == 1 and "vllm/logger.py" in row["unexplained"] and "vllm/listed_fifo" in row["added"]
    assert "vllm/listed_fifo" in row["record_disagrees"]
    res = run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 1, res.stderr
    assert "vllm/logger.py" in res.json["integrity"]["mismatched"] and "vllm/listed_fifo" in res.json["integrity"]["added"]


# --- an image built FROM the fixture --------------------------------------------------------------
def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.engine
def test_a_hostile_image_is_never_clean_and_fails_verify(tmp_path: Path) -> None:
    fixture = images.fixture_image()
    tree = vllm.tree_copy("0.33.0", tmp_path / "tree" / "site-packages")
    context = tmp_path / "context"
    context.mkdir()
    init = (tree / "vllm/__init__.py").read_bytes() + b"\nimport os  # by hand\n"
    (context / "init").write_bytes(init)
    rewrite_record(tree, {"vllm/__init__.py": record_row("vllm/__init__.py", init)})
    shutil.copy(tree / INFO / "RECORD", context / "RECORD")
    (context / "envs.pyc").write_bytes(forged_pyc(tree / ENVS, b"import os\nos.environ['FORGED'] = '1'\n"))
    envs_pyc = f"{SITE}/vllm/__pycache__/envs.cpython-311.pyc"
    (context / "Dockerfile").write_text("\n".join([
        f"FROM {fixture}", "USER root",
        f"COPY init {SITE}/vllm/__init__.py", f"COPY RECORD {SITE}/{INFO}/RECORD", f"COPY envs.pyc {envs_pyc}",
        # the header of the copied source's bytecode would be stale: put the real one back
        f"RUN python3 -c \"import py_compile; py_compile.compile('{SITE}/vllm/__init__.py')\"",
        "USER vllm"]) + "\n")
    tag = f"dspark-patch-test/integrity:{secrets.token_hex(4)}"
    _docker("build", "--quiet", "--network", "none", "-t", tag, str(context))
    try:
        for via in ("container", "layers"):
            code, doc = status_json("--via", via, "--image", tag, "--image", fixture) if via == "layers" else \
                status_json("--via", via, "--image", tag)
            row = doc["images"][0]
            assert code == 1 and row["unexplained"] == ["vllm/__init__.py"], (via, row)
            assert row["record_disagrees"] == ["vllm/__init__.py"], (via, row)
            assert [b.split(":")[0] for b in row["bytecode"]] == ["vllm/__pycache__/envs.cpython-311.pyc"], (via, row)
            if via == "layers":
                assert doc["images"][1]["exit_code"] == 0 and doc["images"][1]["unexplained"] == []
        res = run("verify", "--image", tag, "--pull", "never", "--no-probe", "--json", "--report-dir", str(tmp_path / "v"))
        assert res.returncode == 1, res.stderr
        integrity = res.json["integrity"]
        assert integrity["mismatched"] == ["vllm/__init__.py"] and integrity["record_disagrees"] == ["vllm/__init__.py"]
        # (the other patched file's bytecode is pip's timestamp bytecode: the image is not patched)
        assert "vllm/__pycache__/envs.cpython-311.pyc does not hold the code of vllm/envs.py " \
               "(recompiled with this interpreter and compared)" in integrity["stale_bytecode"]
        assert [s.split()[0] for s in integrity["stale_bytecode"]] == [
            "vllm/__pycache__/envs.cpython-311.pyc", "vllm/models/deepseek_v4/nvidia/__pycache__/model.cpython-311.pyc"]
        # the fixture's bytecode is the image's own python's (images/vllm-fixture/Dockerfile): no other .pyc differs
        assert integrity["notes"] == [] and not any("bytecode not proven" in n for n in res.json["notes"])
        # apply refuses it before writing: no tag, no container left
        containers = _docker("ps", "-aq", "--filter", f"ancestor={tag}")
        res = run("apply", "--image", tag, "--pull", "never", "--tag", f"{tag}-patched", "--json",
                  "--report-dir", str(tmp_path / "a"))
        assert res.returncode == 1, res.stderr[-800:]
        assert res.json["errors"][0]["kind"] == "modified-base" and res.json["integrity"]["mismatched"] == ["vllm/__init__.py"]
        assert "vllm/__pycache__/envs.cpython-311.pyc does not hold the code of vllm/envs.py " \
               "(recompiled with this interpreter and compared)" in res.json["integrity"]["stale_bytecode"]
        assert subprocess.run(["docker", "image", "inspect", f"{tag}-patched"], capture_output=True).returncode != 0
        assert _docker("ps", "-aq", "--filter", f"ancestor={tag}") == containers
    finally:
        subprocess.run(["docker", "rmi", "-f", tag, f"{tag}-patched"], capture_output=True, check=False)


def test_the_layer_reader_sees_startup_hooks_and_pth_files_and_refuses_a_bad_record() -> None:
    """On the layer route (a layer written here: the reader alone, no engine)."""
    import io
    import tarfile

    from dspark_patch.errors import BadInput
    from dspark_patch.patchset import available
    from dspark_patch.status.assess import assess
    from dspark_patch.targets.layers import scan_layer
    from dspark_patch.targets.views.from_layers import merge_scans, site_files, status_retain

    site = "usr/local/lib/python3.11/dist-packages"
    wheel = (vllm.installed_tree("0.33.0") / INFO / "WHEEL").read_bytes()

    def layer(files: dict[str, bytes]):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, data in files.items():
                member = tarfile.TarInfo(f"{site}/{rel}")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
        buffer.seek(0)
        return scan_layer(buffer, where="a test layer", retain=status_retain("vllm"))

    base = {f"{INFO}/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n", f"{INFO}/WHEEL": wheel,
            "vllm/__init__.py": b"", "sitecustomize/__init__.py": b"print('start')\n", "zz.pth": b"import os\n"}
    good = layer({**base, f"{INFO}/RECORD": (record_row("vllm/__init__.py", b"") + "\n").encode()})
    found = assess(site_files(merge_scans([good]), "vllm", "/" + site), available())
    assert {"sitecustomize", "zz.pth"} <= set(found.added) and found.reference == f"{X86}.whl"
    assert "vllm/envs.py" in found.missing and "vllm/envs.py" in found.record_disagrees
    bad = layer({**base, f"{INFO}/RECORD": b"vllm/__init__.py,sha256=%%%,0\n"})
    with pytest.raises(BadInput, match=r"RECORD: row 1"):
        site_files(merge_scans([bad]), "vllm", "/" + site)


def test_every_release_a_shipped_variant_supports_has_a_reference_for_both_platforms() -> None:
    """Without one, status of a correctly patched image of that release could never be clean."""
    from dspark_patch.patchset import available
    from dspark_patch.references import shipped

    releases = {r for ps in available() if ps.distribution == "vllm" for v in ps.variants for r in v.releases}
    assert {"0.33.0", "0.32.0"} <= releases
    for release in sorted(releases):
        names = shipped("vllm", release)
        assert any("x86_64" in n for n in names) and any("aarch64" in n for n in names), (release, names)
