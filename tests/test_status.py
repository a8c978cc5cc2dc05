"""`dspark-patch status` and verify's `added` check: on real vLLM 0.33.0 trees, and on a fleet of
images built FROM the fixture on the real engine, read without starting any container."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from dspark_patch.report.status_render import load_status_schema
from tests.support import images, vllm
from tests.support.cli import Result, run
from tests.support.probe_trees import SharedTree
from tests.support.vllm import replace_file

PY = sys.executable
PATCH_ID = "dspark-skip-mtp-buffer"
SITE = "/usr/local/lib/python3.11/dist-packages"   # the fixture's site folder (images/vllm-fixture)
ENVS = "vllm/envs.py"
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"
ELSEWHERE = "vllm/logger.py"


def status_json(*args: str) -> tuple[int, dict]:
    res, doc = status_run(*args)
    return res.returncode, doc


def status_run(*args: str) -> tuple[Result, dict]:
    res = run("status", *args, "--json")
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.Draft202012Validator(load_status_schema(), format_checker=jsonschema.FormatChecker()).validate(doc)
    return res, doc


def _linked_copy(tree: Path, where: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(tree), str(where)], check=True)
    return where


def add_hand_files(tree: Path) -> None:
    (tree / "vllm" / "extra_hook.py").write_text("print('hello')\n")
    (tree / "zz-hook.pth").write_text("import os\n")


# --- local trees -------------------------------------------------------------------------------
def test_status_of_real_trees_names_states_and_exact_files(tmp_path: Path, patched033: SharedTree) -> None:
    fresh = vllm.tree_copy("0.33.0", tmp_path / "fresh" / "site-packages")
    patched = patched033.copy(tmp_path / "patched" / "site-packages")  # `apply --no-probe`, made once
    # Hard-link copies of the one patched tree (files are only ever replaced, never written into).
    edited = _linked_copy(patched, tmp_path / "edited" / "site-packages")
    replace_file(edited / ENVS, (edited / ENVS).read_bytes() + b"# by hand\n")
    elsewhere = vllm.tree_copy("0.33.0", tmp_path / "elsewhere" / "site-packages")
    replace_file(elsewhere / ELSEWHERE, (elsewhere / ELSEWHERE).read_bytes() + b"# by hand\n")
    added = _linked_copy(patched, tmp_path / "added" / "site-packages")
    add_hand_files(added)
    half = vllm.tree_copy("0.33.0", tmp_path / "half" / "site-packages")
    replace_file(half / ENVS, (patched / ENVS).read_bytes())

    code, doc = status_json(*(a for t in (fresh, patched, edited, elsewhere, added, half) for a in ("--root", str(t))))
    rows = {Path(r["ref"]).parent.name: r for r in doc["images"]}
    assert code == 1 and doc["exit_code"] == 1
    assert {k: r["patch_sets"][PATCH_ID] for k, r in rows.items()} == {
        "fresh": "absent", "patched": "applied", "edited": "drifted", "elsewhere": "absent",
        "added": "applied", "half": "partial"}
    assert {k: (r["unexplained"], r["missing"], r["added"]) for k, r in rows.items()} == {
        "fresh": ([], [], []), "patched": ([], [], []), "edited": ([ENVS], [], []),
        "elsewhere": ([ELSEWHERE], [], []), "added": ([], [], ["vllm/extra_hook.py", "zz-hook.pth"]),
        "half": ([], [], [])}
    assert all(r["release"] == "0.33.0" and r["error"] is None for r in rows.values())
    assert [r["exit_code"] for r in doc["images"]] == [0, 0, 1, 1, 1, 1]


def test_status_of_a_clean_tree_exits_0_and_writes_markdown_and_junit(tmp_path: Path, patched033_tree: Path) -> None:
    tree = patched033_tree
    res = run("status", "--root", str(tree), "--report-dir", str(tmp_path / "out"), "--junit", str(tmp_path / "j.xml"))
    assert res.returncode == 0, res.stderr
    assert "applied" in res.stdout
    assert "| ✅ |" in (tmp_path / "out" / "status.md").read_text()
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 1 and "<failure" not in junit
    assert json.loads((tmp_path / "out" / "status.json").read_text())["images"][0]["patch_sets"][PATCH_ID] == "applied"


def test_status_appends_its_step_summary_as_its_own_block_and_an_unwritable_one_is_exit_3(tmp_path: Path,
                                                                                         patched033_tree: Path) -> None:
    tree = patched033_tree
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step")  # another step's last line, without its newline
    res = run("status", "--root", str(tree), env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert res.returncode == 0, res.stderr
    text = summary.read_text()
    assert text.startswith("earlier step\n\n") and "| ✅ |" in text
    # A summary that cannot be written is the environment's problem: one line, exit 3.
    res = run("status", "--root", str(tree), env={"GITHUB_STEP_SUMMARY": str(tmp_path)})
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert "cannot append the step summary" in res.stderr and "GITHUB_STEP_SUMMARY" in res.stderr


def test_verify_fails_on_an_added_module_and_an_unlisted_pth(tmp_path: Path, patched033_tree: Path) -> None:
    tree = patched033_tree
    assert run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "ok")).returncode == 0
    add_hand_files(tree)
    res = run("verify", "--root", str(tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "bad"))
    assert res.returncode == 1, res.stderr
    assert "vllm/extra_hook.py: added" in res.stderr and "zz-hook.pth: added" in res.stderr
    audit = json.loads((tmp_path / "bad" / "audit.json").read_text())
    assert audit["integrity"]["added"] == ["vllm/extra_hook.py", "zz-hook.pth"]


def test_bad_images_from_file_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "refs").write_text("# fleet\nfirst:1 second:2\n")
    line = run("status", "--images-from", str(tmp_path / "refs")).assert_clean_error(2)
    assert "refs:2" in line
    line = run("status", "--images-from", str(tmp_path / "absent")).assert_clean_error(2)
    assert "absent: no such file" in line


def test_unreachable_engine_is_exit_3_and_bad_flags_are_exit_2(tmp_path: Path) -> None:
    line = run("status", "--image", "any:1", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"}).assert_clean_error(3)
    assert "cannot reach a Docker engine" in line
    line = run("status", "--image", "any:1", "--via", "layers", "--platform", "linux/arm64").assert_clean_error(2)
    assert "--via container" in line
    assert "at least one --image" in run("status").assert_clean_error(2)


# --- pure pieces: layer stacking, states without a variant, missing files ----------------------
def _layer(files: dict[str, bytes | None]):
    """A layer tar in memory, scanned: bytes for a file, None for a whiteout of that path."""
    import io
    import tarfile

    from dspark_patch.targets.layers import scan_layer
    from dspark_patch.targets.views.from_layers import status_retain

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, data in files.items():
            folder, _, name = path.rpartition("/")
            info = tarfile.TarInfo(path if data is not None else f"{folder}/.wh.{name}")
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data or b""))
    buffer.seek(0)
    return scan_layer(buffer, where="a test layer", retain=status_retain("vllm"))


def test_layers_stack_the_oci_way_and_give_the_same_site_files_as_the_folder(tmp_path: Path) -> None:
    from dspark_patch.targets.views.from_folder import read_site
    from dspark_patch.targets.views.from_layers import merge_scans, site_files

    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    site = "usr/local/lib/python3.11/dist-packages"
    info = "vllm-0.33.0.dist-info"
    base = _layer({f"{site}/{info}/{n}": (tree / info / n).read_bytes() for n in ("METADATA", "RECORD")}
                  | {f"{site}/{ENVS}": (tree / ENVS).read_bytes(), f"{site}/vllm/gone.py": b"x\n",
                     f"{site}/old.pth": b"import os\n"})
    top = _layer({f"{site}/vllm/gone.py": None, f"{site}/old.pth": None, f"{site}/new.pth": b"import os\n"})
    found = site_files(merge_scans([base, top]), "vllm", "/" + site)
    assert found is not None and (found.location, found.release, found.python) == (f"/{site}", "0.33.0", "3.11")
    assert set(found.hashes) == {ENVS, f"{info}/METADATA", f"{info}/RECORD"}
    assert found.hashes[ENVS] == read_site(tree, "vllm").hashes[ENVS]
    assert found.top_level == ("new.pth",)
    assert site_files(merge_scans([top]), "vllm", "/" + site) is None  # no vLLM in that layer alone


def test_a_release_without_a_variant_is_not_applicable_and_a_deleted_file_is_missing(tmp_path: Path) -> None:
    from dataclasses import replace

    from dspark_patch.patchset import available
    from dspark_patch.status.assess import assess
    from dspark_patch.targets.views.from_folder import read_site

    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    (tree / ELSEWHERE).unlink()
    site = read_site(tree, "vllm")
    found = assess(site, available())
    assert found.missing == (ELSEWHERE,) and found.unexplained == () and found.added == ()
    other = assess(replace(site, release="0.31.0"), available())
    assert dict(other.patch_sets)[PATCH_ID] == "not-applicable"


# --- a fleet of images on the real engine ------------------------------------------------------
def _pyc(rel: str) -> str:
    folder, _, name = rel.rpartition("/")
    return f"{folder}/__pycache__/{name[:-3]}.cpython-311.pyc"


def _checked_hash_pyc(source: Path, path_in_image: str, work: Path) -> bytes:
    """Bytecode as apply writes it in the image (the fixture's python is 3.11, as this one)."""
    import py_compile

    out = work / "pyc" / source.name
    out.parent.mkdir(parents=True, exist_ok=True)
    py_compile.compile(str(source), cfile=str(out), dfile=path_in_image, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    return out.read_bytes()


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout


def _status_containers_left(*runs: Result) -> list[str]:
    """`status` containers these runs left behind (tests/support/containers.py: neither another
    session's at work beside this one nor one another test's killed run left is counted); with
    no runs, those of any run this test started (the signalled run's, under a host of its own)."""
    import docker

    from tests.support.containers import left_by, our_containers

    names = left_by(docker.from_env(), *runs) if runs else our_containers(docker.from_env())
    return [n for n in names if n.startswith("dspark-patch--status--")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, patched033: SharedTree):
    """Images FROM the fixture: patched, patched + hand edit, hand edit elsewhere, added files."""
    fixture = images.fixture_image()
    work = tmp_path_factory.mktemp("fleet")
    post = patched033.copy(work / "post" / "site-packages")
    name = f"dspark-patch-test/status-{secrets.token_hex(4)}"
    contents = {
        # As apply leaves it: the post-images and their checked-hash bytecode, compiled for the
        # image's path (a stale .pyc beside a patched file would be a finding).
        "patched": {ENVS: (post / ENVS).read_bytes(), MODEL: (post / MODEL).read_bytes(),
                    **{_pyc(rel): _checked_hash_pyc(post / rel, f"{SITE}/{rel}", work) for rel in (ENVS, MODEL)}},
        "edited": {ENVS: (post / ENVS).read_bytes() + b"# by hand\n", MODEL: (post / MODEL).read_bytes()},
        "elsewhere": {ELSEWHERE: (post / ELSEWHERE).read_bytes() + b"# by hand\n"},
        "added": {"vllm/extra_hook.py": b"print('hello')\n", "zz-hook.pth": b"import os\n"},
    }
    refs = {"fixture": fixture}
    try:
        for kind, files in contents.items():
            context = work / kind
            lines = [f"FROM {fixture}"]
            for i, (rel, data) in enumerate(files.items()):
                (context / str(i)).parent.mkdir(parents=True, exist_ok=True)
                (context / str(i)).write_bytes(data)
                lines.append(f"COPY {i} {SITE}/{rel}")
            (context / "Dockerfile").write_text("\n".join(lines) + "\n")
            # --no-cache: the engine's build cache would give another session's fleet (the same
            # Dockerfiles) these very image ids, and tests here count the containers of an id.
            _docker("build", "--quiet", "--no-cache", "--network", "none", "-t", f"{name}:{kind}", str(context))
            refs[kind] = f"{name}:{kind}"
        refs["no-vllm"] = images.no_vllm_image()
        yield refs
    finally:
        for kind in contents:
            subprocess.run(["docker", "rmi", "-f", f"{name}:{kind}"], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.engine
def test_status_of_a_fleet_reads_every_image_without_starting_or_leaving_anything(fleet: dict[str, str], tmp_path: Path) -> None:
    ours = [fleet[k] for k in ("patched", "edited", "elsewhere", "added")]
    ids_before = {ref: _docker("image", "inspect", "-f", "{{.Id}}", ref).strip() for ref in fleet.values()}
    images_before = _docker("images", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}")
    since = str(int(time.time()) - 1)
    (tmp_path / "refs").write_text("\n".join(fleet[k] for k in ("fixture", "patched", "edited", "elsewhere")) + "\n")

    first, doc = status_run("--images-from", str(tmp_path / "refs"), "--image", fleet["added"],
                            "--image", fleet["no-vllm"], "--jobs", "3")
    code = first.returncode
    until = str(int(time.time()) + 1)

    rows = {next(k for k, v in fleet.items() if v == r["ref"]): r for r in doc["images"]}
    # Rows in the order given: the --image options, then the file's lines.
    assert code == 1 and list(rows) == ["added", "no-vllm", "fixture", "patched", "edited", "elsewhere"]
    assert {k: r["patch_sets"].get(PATCH_ID) for k, r in rows.items()} == {
        "fixture": "absent", "patched": "applied", "edited": "drifted", "elsewhere": "absent",
        "added": "absent", "no-vllm": None}
    assert {k: (r["unexplained"], r["missing"], r["added"]) for k, r in rows.items()} == {
        "fixture": ([], [], []), "patched": ([], [], []), "edited": ([ENVS], [], []),
        "elsewhere": ([ELSEWHERE], [], []), "added": ([], [], ["vllm/extra_hook.py", "zz-hook.pth"]),
        "no-vllm": ([], [], [])}
    for kind in ("fixture", "patched", "edited", "elsewhere", "added"):
        r = rows[kind]
        assert (r["release"], r["python"], r["location"], r["platform"]) == ("0.33.0", "3.11", SITE, "linux/amd64")
        assert r["id"] == ids_before[fleet[kind]] and r["error"] is None
    assert "no vllm in image" in rows["no-vllm"]["error"] and rows["no-vllm"]["exit_code"] == 1

    # Nothing on the engine changed: same images and tags, no container of ours left; several
    # images are read from one save of their layers, so no container was even made from them.
    after = _docker("images", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}")
    # (as sets: the engine lists images created in the same second in no fixed order)
    assert sorted(line for line in images_before.splitlines() if any(r in line for r in ours)) == \
        sorted(line for line in after.splitlines() if any(r in line for r in ours))
    assert {ref: _docker("image", "inspect", "-f", "{{.Id}}", ref).strip() for ref in fleet.values()} == ids_before
    assert _status_containers_left(first) == []
    assert _container_events(since, until, {ids_before[ref] for ref in ours}) == []

    # The other way of reading (a never-started container per image) says the same.
    since = str(int(time.time()) - 1)
    second, again = status_run(*(a for k in ("edited", "added") for a in ("--image", fleet[k])), "--via", "container")
    code = second.returncode
    until = str(int(time.time()) + 1)
    # the same rows; only the route differs, and each row names its own
    assert code == 1 and [r | {"ref": None, "route": None} for r in again["images"]] == \
        [rows[k] | {"ref": None, "route": None} for k in ("edited", "added")]
    assert {r["route"]["name"] for r in again["images"]} == {"container"} and {r["route"]["name"] for r in rows.values()} == {"layers"}
    assert _status_containers_left(second) == []
    touched = _container_events(since, until, {ids_before[fleet[k]] for k in ("edited", "added")})
    actions = {line.split()[0] for line in touched}
    # Made, read through the archive API, removed: never started, nothing executed in it.
    assert "destroy" in actions and actions <= {"create", "archive-path", "destroy"}, touched


@pytest.mark.engine
@pytest.mark.parametrize("kinds", [("edited",), ("fixture", "patched", "edited", "elsewhere")], ids=["one", "four"])
def test_a_sigterm_during_status_ends_it_with_143_and_no_container_left(fleet: dict[str, str], kinds) -> None:
    # The readers' containers are made on the pool's threads, where no signal handler runs: a
    # SIGTERM (a CI job's cancel, `docker stop` of a CI container) used to end the process at
    # once and leave a Created container per image being read. Under a host name of its own
    # (support/containers.py), so that only this run's containers are counted.
    from tests.support.cli import SCRIPT
    from tests.support.containers import on_host, signalled_when

    host = f"dspark-test-{secrets.token_hex(6)}"

    def left() -> list[str]:
        return [n for n in _status_containers_left() if f"--{host}--" in n]

    argv = [str(SCRIPT), "status", "--via", "container", "--jobs", "1", *(a for k in kinds for a in ("--image", fleet[k]))]
    _, code, said = signalled_when(on_host(host, argv), left, signal.SIGTERM)
    assert code == 143, said  # ended by the signal, as `docker` and `pip` end: 128 + 15
    assert "Traceback" not in said, said
    assert left() == [], said


def _container_events(since: str, until: str, image_ids: set[str]) -> list[str]:
    events = _docker("events", "--since", since, "--until", until, "--filter", "type=container",
                     "--format", "{{.Action}} {{.From}}")
    return [line for line in events.splitlines() if any(i in line for i in image_ids)]


@pytest.mark.engine
def test_status_of_a_missing_image_is_its_row_and_exit_2(fleet: dict[str, str]) -> None:
    code, doc = status_json("--image", "127.0.0.1:9/dspark-patch/absent:1", "--image", fleet["patched"])
    assert code == 2
    missing, patched = doc["images"]
    assert "not found" in missing["error"] and missing["exit_code"] == 2
    assert patched["patch_sets"][PATCH_ID] == "applied" and patched["exit_code"] == 0


@pytest.mark.engine
@pytest.mark.parametrize("source", ["fixture", "trixie-venv"])
def test_status_reads_an_image_made_by_apply_beside_its_source_in_one_save(source: str, tmp_path: Path) -> None:
    """The source's top layer is a lower layer of the patched image: the engine's save may write
    it once and link the second copy (it did for trixie-venv); both images must be read whole."""
    fixture = images.fixture_image() if source == "fixture" else images.trixie_venv_image()
    tag = f"dspark-patch-test/status-applied:{secrets.token_hex(4)}"
    res = run("apply", "--image", fixture, "--tag", tag, "--pull", "never", "--no-probe",
              "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    try:
        for order in ((fixture, tag), (tag, fixture)):
            code, doc = status_json("--via", "layers", "--image", order[0], "--image", order[1])
            states = {row["ref"]: (row["error"], row["patch_sets"].get(PATCH_ID)) for row in doc["images"]}
            assert states == {fixture: (None, "absent"), tag: (None, "applied")}, states
            assert code == 0
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.mark.engine
def test_status_of_an_image_apply_just_made_saves_nothing_and_says_what_reading_it_says(tmp_path: Path) -> None:
    """apply --strict-layers keeps the scan of the layer it made beside its source's: the status a
    CI step runs next reads no layer of the result (no save, no container), and its row is the
    row of a read of the image's files through a container."""
    tag = f"dspark-patch-test/status-applied:{secrets.token_hex(4)}"
    res = run("apply", "--image", images.fixture_image(), "--tag", tag, "--pull", "never", "--no-probe",
              "--strict-layers", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    try:
        result = json.loads((tmp_path / "r" / "audit.json").read_text())["result_image"]["id"]
        # The window starts at the next whole second (the events' resolution): nothing of the apply
        # (its tag lock, a container of the result made and removed as it names it) falls in it.
        start = int(time.time()) + 1
        while time.time() < start:
            time.sleep(start - time.time())
        since = str(start)
        code, quick = status_json("--image", tag)
        time.sleep(1)
        until = str(int(time.time()) + 1)
        saved = _docker("events", "--since", since, "--until", until, "--filter", "type=image",
                        "--format", "{{.Action}} {{.Actor.ID}}")
        # This run's images only: the registry session beside this one saves images of its own.
        ours = {tag, result, result.removeprefix("sha256:"), images.fixture_image()}
        ours |= {i.removeprefix("sha256:") for i in _docker("image", "inspect", "-f", "{{.Id}}",
                                                            images.fixture_image()).split()}
        assert not [line for line in saved.splitlines()
                    if line.startswith("save") and line.split(" ", 1)[1] in ours], saved
        assert _container_events(since, until, {result, result.removeprefix("sha256:")}) == []
        code_c, read = status_json("--image", tag, "--via", "container")
        assert (code, [_unrouted(r) for r in quick["images"]]) == (code_c, [_unrouted(r) for r in read["images"]])
        assert quick["images"][0]["route"]["reason"].startswith("auto: every layer of the image is in the scan cache")
        assert read["images"][0]["route"]["reason"].startswith("asked with --via container")
        assert quick["images"][0]["patch_sets"][PATCH_ID] == "applied" and quick["images"][0]["error"] is None
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def _unrouted(row: dict) -> dict:
    """A row but its route: what two ways of reading the same image must agree on."""
    return {k: v for k, v in row.items() if k != "route"}


@pytest.mark.engine
def test_status_sharded_and_merged_is_the_unsharded_run(fleet: dict[str, str], tmp_path: Path) -> None:
    """A CI matrix / indexed Job of N runs, then `report merge`: the same rows in the same order,
    the same exit code, Markdown and JUnit as one run over the whole list (N = 1, 2, 3)."""
    given = [fleet[k] for k in ("patched", "no-vllm", "fixture", "added", "edited", "elsewhere")]
    given.insert(3, "127.0.0.1:9/dspark-patch/absent:1")   # not there: its row, exit 2
    refs = tmp_path / "refs"
    refs.write_text("\n".join(given) + "\n")
    code, whole = status_json("--images-from", str(refs), "--report-dir", str(tmp_path / "whole"))
    assert code == whole["exit_code"] == 2 and [r["ref"] for r in whole["images"]] == given

    # A shard reads its share as auto chooses for it (one image: a container; several: one save),
    # so each row's route may differ from the whole run's; everything else is the same.
    def bare(doc: dict) -> dict:
        return {k: [_unrouted(r) for r in v] if k == "images" else v for k, v in doc.items()
                if k not in ("started_at", "seconds", "merged")}

    def no_seconds(text: str) -> str:
        text = re.sub(r"\n### Routes\n\n(- [^\n]*\n)+", "\n", text)            # status.md: the routes' reasons
        text = re.sub(r"(?m)^(\|.*\|) [^|]* \|$", r"\1", text)                    # and its route column
        return re.sub(r'time="[0-9.]+"', 'time=""', re.sub(r", [0-9.]+s\.", ", s.", text))

    for count in (1, 2, 3):
        paths, seen = [], []
        for index in range(count):
            out = tmp_path / f"{count}-{index}"
            # The way an indexed Job runs it: the index from the environment.
            res = run("status", "--images-from", str(refs), "--shard", f"auto/{count}", "--report-dir", str(out),
                      env={"JOB_COMPLETION_INDEX": str(index)})
            shard = json.loads((out / "status.json").read_text())
            assert res.returncode == shard["exit_code"] and shard["shard"]["index"] == index, res.stderr
            seen += [r["ref"] for r in shard["images"]]
            paths.append(str(out / "status.json"))
        assert sorted(seen) == sorted(given)   # every image in exactly one shard
        res = run("report", "merge", *reversed(paths))
        assert res.returncode == 2, res.stderr
        merged = json.loads(res.stdout)
        jsonschema.Draft202012Validator(load_status_schema(), format_checker=jsonschema.FormatChecker()).validate(merged)
        assert bare(merged) == bare(whole), count
        for fmt, name in (("md", "status.md"), ("junit", "junit.xml")):
            res = run("report", "merge", *paths, "--format", fmt)
            assert res.returncode == 2 and no_seconds(res.stdout) == no_seconds((tmp_path / "whole" / name).read_text())
