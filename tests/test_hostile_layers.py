"""Hostile images (docs/status.md: symlink over a folder, tar differentials, decoy site folder, unclean names, resource exhaustion, the new layer's check), written by the tests themselves.

Each image is a real vLLM 0.33.0 tree (patched with the real patch set, so the honest reading is
`applied`) laid into hand-written layers, plus one hostile twist. The twist must never leave the
`applied`/clean verdict standing: the row is an error naming the layer and member, or not clean.

Routes: the reader alone (`scan_layer` + `merge`, the layer route), a `docker save` archive
written by hand (`views_from_save`, the save route), and, where the engine loads the archive,
the real engine through the CLI (`status --via layers` and `--via container`, `verify`, `apply`).
Of the tar differentials (tar-differential), dockerd 20.10 loads five (`ENGINE_LOADS`: they also go
through the engine and the CLI) and refuses four (non-octal devmajor, sparse, an unknown type, a
lone zero block: checked on the reader and the save route only). `../` and other unclean names
(unclean-member-name) are checked on the reader and the save route only (tarfile writes them; moby refuses
them, containerd clamps them).
"""

from __future__ import annotations

import functools
import io
import json
import secrets
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from dspark_patch.errors import DsparkPatchError, HostileLayer, UnreadableLayout
from dspark_patch.patchset import available
from dspark_patch.report.status_model import ImageStatus
from dspark_patch.status.fleet import _error_row, row_from_site
from dspark_patch.targets.docker.save_views import views_from_save
from dspark_patch.targets.layers import LayerView, Limits, merge, scan_layer
from dspark_patch.targets.layers.scan import path_key
from dspark_patch.targets.views.from_layers import find_site, status_retain
from tests.support import hostile, oci, vllm
from tests.support.cli import run
from tests.support.fake_registry import fake_registry
from tests.support.hostile import Dir, File, Link, Opaque, Raw, Whiteout
from tests.support.probe_trees import SharedTree

# Its engine tests count no container of a shared image: scripts/test runs them in the session
# beside the engine tier (its tests without an engine stay in the fast tier).
pytestmark = pytest.mark.beside_engine

PATCH_ID = "dspark-skip-mtp-buffer"
SITE = "usr/local/lib/python3.11/dist-packages"
CONFIG = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Entrypoint": ["vllm", "serve"]}


# --- the honest image --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory, patched033: SharedTree) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("hostile")
    clean = vllm.tree_copy("0.33.0", where / "clean" / "site-packages")
    patched = patched033.copy(where / "patched" / "site-packages")  # `apply --no-probe`, made once
    return {"clean": clean, "patched": patched}


def python_layer() -> bytes:
    """What makes an interpreter of the image: a `python3.11` binary (never run), Debian's marker,
    a console script whose `#!` names it."""
    return hostile.layer([
        Dir("etc"), File("etc/debian_version", b"12.0\n"), Dir("usr"), Dir("usr/bin"),
        File("usr/bin/python3.11", b"\x7fELF not run", 0o755), Link("usr/bin/python3", "python3.11"),
        Dir("usr/local"), Dir("usr/local/bin"), File("usr/local/bin/vllm", b"#!/usr/bin/python3\nimport vllm\n", 0o755),
        Dir("usr/local/lib"), Dir("usr/local/lib/python3.11"),
    ])


@functools.cache
def _subset() -> frozenset[str]:
    """The files a layer carries: the patch set's, vllm/__init__.py and the dist-info. RECORD is
    cut to their rows (real hashes), so the honest image is clean and the layers stay small.
    Read once (patch.toml is parsed on every `available()`; `findings` asks for each RECORD row)."""
    variant = next(p for p in available() if p.id == PATCH_ID).variant_for("0.33.0")
    return frozenset({*variant.files, "vllm/__init__.py", "vllm-0.33.0.dist-info/METADATA", "vllm-0.33.0.dist-info/RECORD",
            "vllm-0.33.0.dist-info/WHEEL"})


def site_members(tree: Path, site: str = SITE) -> list[hostile.Member]:
    retain = _subset()
    folders = sorted({"/".join(p.split("/")[:i]) for p in retain for i in range(1, p.count("/") + 1)})
    members: list[hostile.Member] = [Dir(site), *(Dir(f"{site}/{f}") for f in folders)]
    for rel in sorted(retain):
        data = (tree / rel).read_bytes()
        if rel.endswith("/RECORD"):
            lines = [line for line in data.decode().splitlines(keepends=True) if line.split(",", 1)[0] in retain]
            data = "".join(lines).encode()
        members.append(File(f"{site}/{rel}", data))
    return members


def site_layer(tree: Path, site: str = SITE, extra: Sequence[hostile.Member] = ()) -> bytes:
    parents = []
    parts = site.split("/")
    for i in range(1, len(parts)):
        parents.append(Dir("/".join(parts[:i])))
    return hostile.layer([*parents, *site_members(tree, site), *extra])


PATCHSETS = [p for p in available() if not p.is_bare]


def row_of(view: LayerView | DsparkPatchError, config: dict = CONFIG) -> ImageStatus:
    ref = "hostile:test"
    if isinstance(view, DsparkPatchError):
        return _error_row(ref, view, id="sha256:x")
    try:
        return row_from_site(ref, find_site(view, "vllm", config, ref), PATCHSETS, id="sha256:x")
    except DsparkPatchError as exc:
        return _error_row(ref, exc, id="sha256:x")


def layer_route(layers: Sequence[bytes], config: dict = CONFIG) -> ImageStatus:
    try:
        scans = [scan_layer(io.BytesIO(data), where=f"layer {hostile.diff_id(data)[:19]}", retain=status_retain("vllm"))
                 for data in layers]
        view: LayerView | DsparkPatchError = merge(scans)
    except DsparkPatchError as exc:
        view = exc
    return row_of(view, config)


def save_route(layers: Sequence[bytes], config: dict = CONFIG) -> ImageStatus:
    archive, image_id = hostile.save_archive(list(layers), config=config)
    views = views_from_save(io.BytesIO(archive), [image_id], "vllm")
    assert image_id in views, "the save route lost the image"
    return row_of(views[image_id], config)


def registry_reader(cache_root: Path | None = None):
    from dspark_patch.status.fleet import unreadable
    from dspark_patch.status.registry_route import RegistryReader
    from dspark_patch.targets.caches.scans import ScanCache
    from dspark_patch.targets.views.from_layers import status_retain_identity

    cache = ScanCache(cache_root or Path("/nonexistent"), identity=status_retain_identity("vllm"),
                      max_bytes=(1 << 30) if cache_root else 0)
    return RegistryReader(patchsets=PATCHSETS, retain_paths=frozenset(), cache=cache, platform=None,
                          row=row_from_site, error_row=_error_row, unreadable=unreadable)


def registry_route(layers: Sequence[bytes], config: dict = CONFIG) -> ImageStatus:
    """Served as gzip blobs by a loopback HTTP registry, read by the registry route (no cache)."""
    served, _ = oci.served_image(list(layers), config=config)
    with fake_registry(served) as (address, _seen):
        (row,) = registry_reader().read(f"{address}/test/img:v1") or ()
    return replace(row, id="sha256:x", platform=None, ref="hostile:test")


def cached_route(layers: Sequence[bytes], config: dict = CONFIG) -> ImageStatus:
    """Each scan stored in the scan cache and read back in a fresh one before the merge."""
    import tempfile

    from dspark_patch.targets.caches.scans import ScanCache
    from dspark_patch.targets.views.from_layers import status_retain_identity

    identity = status_retain_identity("vllm")
    with tempfile.TemporaryDirectory() as root:
        try:
            scans = []
            for data in layers:
                scan = scan_layer(io.BytesIO(data), where=f"layer {hostile.diff_id(data)[:19]}", retain=status_retain("vllm"))
                ScanCache(Path(root), identity=identity).put(hostile.diff_id(data), scan)
                again = ScanCache(Path(root), identity=identity).get(hostile.diff_id(data))
                assert again == scan, "the cache gave back another scan"
                scans.append(again)
            view: LayerView | DsparkPatchError = merge(scans)
        except DsparkPatchError as exc:
            view = exc
    return row_of(view, config)


# "served": through the registry route (the tier of a real registry is for tests/test_status_registry.py)
ROUTES = {"layers": layer_route, "save": save_route, "served": registry_route, "cached": cached_route}


def findings(row: ImageStatus) -> bool:
    """`row.findings`, less what cutting the layers down to `_subset()` makes: the published
    wheel's other files are missing, and their RECORD rows with them (checked to be only those
    in the honest test)."""
    cut = replace(row, missing=(), record_disagrees=tuple(p for p in row.record_disagrees if p in _subset()))
    return cut.findings


def verdict(row: ImageStatus) -> tuple[str | None, str | None, bool]:
    return row.error, dict(row.patch_sets).get(PATCH_ID), findings(row)


def assert_no_false_verdict(row: ImageStatus, *, says: str | None = None) -> None:
    """An error row (exit 1, naming what was refused), or a row that is not `applied` and clean."""
    if row.error is not None:
        assert row.exit_code == 1, row
        if says is not None:
            assert says in row.error, row.error
        return
    assert says is None, f"expected an error saying {says!r}, got {verdict(row)}"
    assert dict(row.patch_sets).get(PATCH_ID) != "applied" or findings(row), row


@pytest.mark.parametrize("route", ROUTES)
def test_the_honest_images_keep_their_verdicts(trees: dict[str, Path], route: str) -> None:
    read = ROUTES[route]
    applied = read([python_layer(), site_layer(trees["patched"])])
    assert verdict(applied) == (None, "applied", False)
    assert applied.missing and not set(applied.missing) & _subset()  # only what the cut leaves out
    assert applied.reference is not None and applied.reference.startswith("vllm-0.33.0-")
    assert (applied.location, applied.python) == (f"/{SITE}", "3.11")
    absent = read([python_layer(), site_layer(trees["clean"]), ])
    assert verdict(absent) == (None, "absent", False)


# --- symlink-over-folder: a symlink replaces a folder ---------------------------------------------
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("link", ["usr/local/lib/python3.11/dist-packages", "usr/local/lib/python3.11", "usr/local/lib",
                                  "usr/local"])
def test_a_symlink_over_the_site_folder_or_above_hides_the_files_below(trees: dict[str, Path], route: str, link: str) -> None:
    # The engine resolves the link: the interpreter finds no patched vLLM under it.
    top = hostile.layer([Dir("opt"), Dir("opt/elsewhere"), Link(link, "/opt/elsewhere")])
    row = ROUTES[route]([python_layer(), site_layer(trees["patched"]), top])
    assert_no_false_verdict(row)
    assert row.error is not None and "no vllm" in row.error.lower(), row


@pytest.mark.parametrize("route", ROUTES)
def test_a_site_folder_reached_through_a_link_is_read_where_the_link_leads(trees: dict[str, Path], route: str) -> None:
    # The clean tree at the link's target, the patched one where the link now stands: `absent`.
    real = "opt/py/lib/python3.11/dist-packages"
    top = hostile.layer([Link(SITE, "/" + real)])
    row = ROUTES[route]([python_layer(), site_layer(trees["patched"]), site_layer(trees["clean"], real), top])
    assert verdict(row) == (None, "absent", False), row


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("where", ["same layer", "later layer"])
@pytest.mark.parametrize("folder", ["vllm", "vllm/models"])
def test_a_symlink_over_vllms_folders_after_the_files_is_refused(trees: dict[str, Path], route: str, where: str,
                                                                 folder: str) -> None:
    link = Link(f"{SITE}/{folder}", "/opt/other")
    layers = ([python_layer(), site_layer(trees["patched"], extra=[link])] if where == "same layer"
              else [python_layer(), site_layer(trees["patched"]), hostile.layer([link])])
    row = ROUTES[route](layers)
    assert_no_false_verdict(row, says="symlink")


@pytest.mark.parametrize("route", ROUTES)
def test_a_file_over_a_folder_above_the_site_hides_it_even_unkept(trees: dict[str, Path], route: str) -> None:
    # `usr/local/lib/python3.11` becomes a plain file the predicate never keeps.
    row = ROUTES[route]([python_layer(), site_layer(trees["patched"]),
                         hostile.layer([File("usr/local/lib/python3.11", b"not a folder")])])
    assert_no_false_verdict(row)
    assert row.error is not None


# --- tar-differential: tar parser differentials ---------------------------------------------------
def _patched_member(trees: dict[str, Path]) -> tuple[str, bytes]:
    variant = next(p for p in PATCHSETS if p.id == PATCH_ID).variant_for("0.33.0")
    rel = sorted(variant.files)[0]
    return f"{SITE}/{rel}", (trees["patched"] / rel).read_bytes()


def _differentials(trees: dict[str, Path]) -> dict[str, bytes]:
    path, data = _patched_member(trees)
    name = path.encode()
    head, tail = name.rsplit(b"/", 1)
    body = data + bytes(-len(data) % 512)
    return {
        # tarfile joins a V7 header's prefix, Go ignores it
        "v7 prefix": hostile.raw_header(tail, size=len(data), magic=b"", prefix=head) + body,
        # tarfile reads the size as 0 (cut at the NUL), Go as the digits after it
        "size with leading NUL": hostile.raw_header(name, size=len(data), fields={"size": b"\0" + b"%010o\0" % len(data)}) + body,
        "global pax path": hostile.pax({"path": path}, global_=True) + hostile.raw_header(b"decoy", size=len(data)) + body,
        "pax path and gnu long name": hostile.pax({"path": path}) + hostile.gnu_long(path + ".other") +
        hostile.raw_header(b"x", size=len(data)) + body,
        # tarfile stops reading silently here, Go reads on
        "non-octal devmajor": hostile.raw_header(name, size=len(data), fields={"devmajor": b"zz\0"}) + body,
        "sparse": hostile.raw_header(name, size=len(data), typeflag=b"S", magic=b"ustar  \0") + body,
        "unknown type": hostile.raw_header(name, size=len(data), typeflag=b"Z") + body,
        "star trailer": hostile.raw_header(tail, size=len(data), prefix=head, tail=b"\0" * 8 + b"tar\0") + body,
        "one zero block then data": bytes(512) + hostile.raw_header(name, size=len(data)) + body,
    }


DIFFERENTIALS = ["v7 prefix", "size with leading NUL", "global pax path", "pax path and gnu long name",
                 "non-octal devmajor", "sparse", "unknown type", "star trailer", "one zero block then data"]


def test_the_differentials_are_real_python_tarfile_reads_them_without_complaint(trees: dict[str, Path]) -> None:
    # The refusal below matters because tarfile (what this tool used) accepts these bytes.
    cases = _differentials(trees)
    path, data = _patched_member(trees)
    before = hostile.member_bytes(File("first", b"x"))
    seen = {}
    for name in ("v7 prefix", "size with leading NUL", "non-octal devmajor", "one zero block then data"):
        with tarfile.open(fileobj=io.BytesIO(before + cases[name] + bytes(1024)), mode="r|") as tar:
            seen[name] = [(m.name, m.size) for m in tar]  # no error raised
    assert seen["v7 prefix"] == [("first", 1), (path, len(data))]        # Go: `envs.py`, at the root
    assert seen["size with leading NUL"][1] == (path, 0)                 # Go: len(data) bytes
    assert seen["non-octal devmajor"] == [("first", 1)]                   # stops silently; Go reads on
    assert seen["one zero block then data"] == [("first", 1)]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", DIFFERENTIALS)
def test_a_header_two_readers_read_differently_is_refused_naming_layer_and_member(trees: dict[str, Path], route: str,
                                                                                   case: str) -> None:
    twist = Raw(_differentials(trees)[case])
    top = hostile.layer([twist])
    row = ROUTES[route]([python_layer(), site_layer(trees["clean"]), top])
    assert_no_false_verdict(row)
    assert row.error is not None and "layer" in row.error, row
    assert hostile.diff_id(top).split(":")[1][:12] in row.error, row.error


def test_a_checksum_mismatch_is_refused() -> None:
    block = bytearray(hostile.raw_header(b"a", size=0))
    block[0] = ord("b")
    with pytest.raises(HostileLayer, match="checksum"):
        scan_layer(io.BytesIO(bytes(block) + bytes(1024)), where="layer L", retain=status_retain("vllm"))


# --- decoy-site-folder: a decoy site folder -------------------------------------------------------
@pytest.mark.parametrize("route", ROUTES)
def test_a_decoy_site_folder_of_a_python_that_is_not_there_is_not_the_answer(trees: dict[str, Path], route: str) -> None:
    decoy = "usr/local/lib/python3.14/site-packages"
    both = ROUTES[route]([python_layer(), site_layer(trees["clean"]), site_layer(trees["patched"], decoy)])
    assert verdict(both) == (None, "absent", True), both  # the copy no interpreter imports is a finding
    assert both.location == f"/{SITE}" and both.unimported == (f"/{decoy}",) and both.exit_code == 1
    alone = ROUTES[route]([python_layer(), site_layer(trees["patched"], decoy)])
    assert_no_false_verdict(alone, says="imported by no interpreter")
    assert f"/{decoy}" in (alone.error or "")


@pytest.mark.parametrize("route", ROUTES)
def test_a_module_file_that_shadows_the_package_is_refused(trees: dict[str, Path], route: str) -> None:
    # /usr/local/lib/python3.11/dist-packages comes first on Debian's sys.path; a vllm.py there wins.
    early = hostile.layer([Dir("usr/local/lib/python3.11/dist-packages"),
                           File("usr/local/lib/python3.11/dist-packages/vllm.py", b"print('other code')\n")])
    row = ROUTES[route]([python_layer(), site_layer(trees["patched"], "usr/lib/python3/dist-packages"), early])
    assert_no_false_verdict(row, says="module named vllm")


# --- unclean-member-name: member names that are not clean -----------------------------------------
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", ["{site}/vllm/../vllm/{rel}", "/{site}/{rel}", "./{site}/./{rel}", "{site}//{rel}",
                                  "../{site}/{rel}", "{site}/vllm/./{rel}"])
def test_a_member_name_that_is_not_clean_is_refused(trees: dict[str, Path], route: str, name: str) -> None:
    path, data = _patched_member(trees)
    rel = path.removeprefix(SITE + "/")
    member = tarfile.TarInfo(name.format(site=SITE, rel=rel))
    member.size = len(data)
    top = hostile.layer([Raw(member.tobuf(format=tarfile.PAX_FORMAT) + data + bytes(-len(data) % 512))])
    row = ROUTES[route]([python_layer(), site_layer(trees["clean"]), top])
    assert_no_false_verdict(row)
    assert row.error is not None and "member" in row.error, row


@pytest.mark.parametrize("route", ROUTES)
def test_a_backslash_is_an_ordinary_character_not_a_path_separator(trees: dict[str, Path], route: str) -> None:
    # As on every Linux engine: `vllm\..\vllm` is one odd folder name, not vLLM's folder.
    path, data = _patched_member(trees)
    rel = path.removeprefix(SITE + "/")
    top = hostile.layer([Dir(f"{SITE}/vllm\\..\\vllm"), File(f"{SITE}/vllm\\..\\{rel}", data)])
    row = ROUTES[route]([python_layer(), site_layer(trees["clean"]), top])
    assert verdict(row) == (None, "absent", False), row


# --- resource-exhaustion: bounded memory and time -------------------------------------------------
def test_a_scan_keeps_only_what_the_check_needs() -> None:
    many = hostile.layer([Dir("data"), *(File(f"data/f{i}", b"x") for i in range(20_000))])
    scan = scan_layer(io.BytesIO(many), where="layer L", retain=status_retain("vllm"))
    assert scan.entries == {}  # nothing under a site folder, no symlink: no name kept
    assert len(scan.present) == 20_001  # one word per member, for what a lower layer holds below it


def test_many_whiteouts_over_many_files_merge_in_one_pass_each() -> None:
    # The old merge scanned every entry for every whiteout: 20,000 × 20,000 steps. Now each layer
    # is one pass; this finishes in a moment (not timed: a quadratic merge would take minutes).
    site = f"{SITE}/pkg"
    files = hostile.layer([Dir(site), *(File(f"{site}/m{i}.py", b"x") for i in range(20_000))])
    gone = hostile.layer([*(Whiteout(f"{site}/m{i}.py") for i in range(0, 20_000, 2)), Opaque(f"{SITE}/other")])
    retain = status_retain("vllm")
    view = merge([scan_layer(io.BytesIO(files), where="a", retain=retain), scan_layer(io.BytesIO(gone), where="b", retain=retain)])
    left = {p for p in view.entries if p.startswith(site + "/")}
    assert left == {f"{site}/m{i}.py" for i in range(1, 20_000, 2)}


@pytest.mark.parametrize(("limits", "says"), [(Limits(members=10), "more than 10 members"),
                                              (Limits(pax_bytes=64), "extension header of"),
                                              (Limits(name_bytes=40), "longer than 40 bytes")])
def test_caps_give_one_clear_error(limits: Limits, says: str) -> None:
    data = hostile.layer([hostile.Raw(hostile.pax({"path": "a" * 80})), File("x"),
                          *(File(f"f{i}") for i in range(20))])
    with pytest.raises(HostileLayer, match=says):
        scan_layer(io.BytesIO(data), where="layer L", retain=status_retain("vllm"), limits=limits)


def _oversized(kind: str) -> hostile.Member:
    """A RECORD over its 32 MiB cap, or a top-level .pth over its 64 KiB cap, in a later layer."""
    if kind == "RECORD":
        return File(f"{SITE}/vllm-0.33.0.dist-info/RECORD", b"vllm/__init__.py,,\n" * ((33 << 20) // 19))
    return File(f"{SITE}/zz-big.pth", b"import os\n" + b"#" * (65 << 10))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kind", ["RECORD", ".pth"])
def test_an_oversized_record_or_pth_in_a_layer_is_refused_unread(trees: dict[str, Path], route: str, kind: str) -> None:
    row = ROUTES[route]([python_layer(), site_layer(trees["patched"]), hostile.layer([_oversized(kind)])])
    if kind == "RECORD":  # that image's row, one line, exit 2 (bad input), never a verdict
        assert row.error is not None and "RECORD: over the 32 MiB limit" in row.error and row.exit_code == 2, row
        assert row.patch_sets == () or dict(row.patch_sets) == {}, row
    else:  # not read: it counts as added (an import line in it would run at every start)
        assert row.error is None and "zz-big.pth" in row.added and row.exit_code == 1, row


def test_the_layer_reader_never_holds_an_oversized_record() -> None:
    import tracemalloc

    data = hostile.layer([_oversized("RECORD")])
    tracemalloc.start()
    try:
        scan = scan_layer(io.BytesIO(data), where="layer L", retain=status_retain("vllm"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    entry = scan.entries[f"{SITE}/vllm-0.33.0.dist-info/RECORD"]
    assert entry.too_large and entry.data is None
    assert peak < (8 << 20), peak  # streamed past: the 33 MiB never held (the layer's own bytes aside)


# --- the same-layer rules the engines disagree on ------------------------------------------------
@pytest.mark.parametrize(("members", "says"), [
    ([File("a", b"x"), File("a/b", b"y")], "non-folder"),
    ([Link("a", "/etc"), File("a/b", b"y")], "non-folder"),
    ([Whiteout("a"), File("a", b"x")], "whites out"),
    ([File("a", b"x"), Whiteout("a")], "also holds"),
    ([Raw(hostile.raw_header(b"h", typeflag=b"1", linkname=b"elsewhere"))], "hard link"),
])
def test_what_engines_unpack_differently_in_one_layer_is_refused(members: list, says: str) -> None:
    with pytest.raises(HostileLayer, match=says):
        scan_layer(io.BytesIO(hostile.layer(members)), where="layer L", retain=status_retain("vllm"))


def test_a_link_loop_is_an_error_not_a_hang() -> None:
    view = merge([scan_layer(io.BytesIO(hostile.layer([Link("a", "b"), Link("b", "a")])), where="L",
                             retain=status_retain("vllm"))])
    with pytest.raises(UnreadableLayout, match="loop"):
        view.resolve("a/x")
    assert view.resolve("/x/../../y") == "y"  # `..` stops at the root, as in a chroot


# --- new-layer-check: the new layer apply takes ---------------------------------------------------
def test_the_new_layers_check_refuses_differentials_and_opaque_folders(trees: dict[str, Path]) -> None:
    from dspark_patch.errors import CheckFailed
    from dspark_patch.targets.layers.new_layer import layer_entries

    path, data = _patched_member(trees)
    ok = layer_entries(hostile.layer([Dir(SITE), File(path, data), Whiteout(f"{SITE}/vllm/gone.py")]))
    assert [(e.path, e.deleted) for e in ok] == [(f"/{SITE}", False), (f"/{path}", False), (f"/{SITE}/vllm/gone.py", True)]
    for case in DIFFERENTIALS:
        with pytest.raises(HostileLayer):
            layer_entries(hostile.layer([Raw(_differentials(trees)[case])]))
    with pytest.raises(CheckFailed, match="opaque"):
        layer_entries(hostile.layer([Opaque(SITE)]))
    with pytest.raises(CheckFailed, match="neither a file nor a folder"):
        layer_entries(hostile.layer([Link(path, "/etc/passwd")]))


# --- through the real engine ---------------------------------------------------------------------
def _load(layers: Sequence[bytes | str], tag: str, config: dict = CONFIG) -> str | None:
    archive, image_id = hostile.save_archive(list(layers), config=config, tag=tag)
    loaded = hostile.docker_load(archive)
    return image_id if loaded.returncode == 0 else None


def _status_rows(via: str, refs: Sequence[str]) -> tuple[int, dict[str, dict]]:
    res = run("status", "--via", via, *(a for r in refs for a in ("--image", r)), "--json")
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, {row["ref"]: row for row in json.loads(res.stdout)["images"]}


@pytest.mark.engine
def test_hostile_images_made_by_hand_through_the_engine_and_the_cli(trees: dict[str, Path], tmp_path: Path) -> None:
    """Small images whose python never runs, loaded into the real engine: `status` on both routes
    gives no false verdict; `apply` refuses with one line and tags nothing."""
    base = [python_layer(), site_layer(trees["patched"])]
    cases: dict[str, list[bytes | str]] = {
        "honest": list(base),
        "link-over-site": [*base, hostile.layer([Dir("opt"), Dir("opt/elsewhere"),
                                                 Link("usr/local/lib/python3.11", "/opt/elsewhere")])],
        "link-over-models": [*base, hostile.layer([Link(f"{SITE}/vllm/models", "/opt")])],
        "decoy": [python_layer(), site_layer(trees["clean"]),
                  site_layer(trees["patched"], "usr/local/lib/python3.14/site-packages")],
    }
    tags = {name: f"127.0.0.1:9/dspark-patch-test/hostile-{name}:1" for name in cases}
    try:
        for name, layers in cases.items():
            assert _load(layers, tags[name]) is not None, f"the engine refused {name}"
        for via in ("layers", "container"):
            code, rows = _status_rows(via, list(tags.values()))
            honest = rows[tags["honest"]]
            assert (honest["error"], honest["patch_sets"].get(PATCH_ID)) == (None, "applied"), (via, honest)
            for name in ("link-over-site", "link-over-models"):
                row = rows[tags[name]]
                assert row["error"] is not None and row["exit_code"] == 1, (via, name, row)
            decoy = rows[tags["decoy"]]
            assert (decoy["error"], decoy["patch_sets"].get(PATCH_ID)) == (None, "absent"), (via, decoy)
            assert decoy["unimported"] == ["/usr/local/lib/python3.14/site-packages"], (via, decoy)
            assert decoy["exit_code"] == 1, (via, decoy)  # a finding (the honest row misses the files cut away)
            assert honest["unimported"] == []
            assert code == 1
        for name in ("link-over-site", "link-over-models", "decoy"):
            res = run("apply", "--image", tags[name], "--tag", f"{tags[name]}-patched", "--pull", "never", "--no-probe",
                      "--report-dir", str(tmp_path / f"a-{name}"))
            assert res.returncode != 0 and "Traceback" not in res.stderr, (name, res.stderr[-500:])
            assert subprocess.run(["docker", "image", "inspect", f"{tags[name]}-patched"], capture_output=True).returncode != 0
    finally:
        for tag in tags.values():
            subprocess.run(["docker", "rmi", "-f", tag, f"{tag}-patched"], capture_output=True, check=False)


ENGINE_LOADS = ["v7 prefix", "size with leading NUL", "global pax path", "pax path and gnu long name", "star trailer"]


@pytest.mark.engine
def test_differentials_the_engine_loads_are_refused_on_the_layer_route(trees: dict[str, Path]) -> None:
    """dockerd 20.10 loads these five (it refuses non-octal devmajor, sparse, unknown types and a
    lone zero block): the layer route refuses them naming the layer; the container route reads
    what the engine actually unpacked, and neither says `applied` and clean."""
    base = [python_layer(), site_layer(trees["clean"])]
    tops = {case: hostile.layer([Raw(_differentials(trees)[case])]) for case in ENGINE_LOADS}
    tags = {case: f"127.0.0.1:9/dspark-patch-test/hostile-tar:{i}" for i, case in enumerate(ENGINE_LOADS)}
    try:
        for case, top in tops.items():
            assert _load([*base, top], tags[case]) is not None, f"the engine no longer loads {case}"
        _, by_layers = _status_rows("layers", list(tags.values()))
        _, by_container = _status_rows("container", list(tags.values()))
        for case, tag in tags.items():
            row = by_layers[tag]
            assert row["error"] is not None and hostile.diff_id(tops[case])[7:19] in row["error"], (case, row)
            assert row["exit_code"] == 1
            other = by_container[tag]
            assert other["error"] is not None or other["patch_sets"].get(PATCH_ID) != "applied" or (
                other["unexplained"] or other["missing"] or other["added"]), (case, other)
    finally:
        for tag in tags.values():
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.mark.docker
def test_an_oversized_record_or_pth_through_the_engine_on_both_routes(trees: dict[str, Path]) -> None:
    """Loaded into the real engine: `status --via layers` and `--via container` refuse the image
    with the oversized RECORD in one line (exit 2) and count the unread .pth as added."""
    tags = {kind: f"127.0.0.1:9/dspark-patch-test/hostile-cap-{kind.strip('.').lower()}:{secrets.token_hex(3)}"
            for kind in ("RECORD", ".pth")}
    try:
        for kind, tag in tags.items():
            layers: list[bytes | str] = [python_layer(), site_layer(trees["patched"]), hostile.layer([_oversized(kind)])]
            assert _load(layers, tag) is not None, f"the engine refused the oversized {kind}"
        for via in ("layers", "container"):
            code, rows = _status_rows(via, list(tags.values()))
            record = rows[tags["RECORD"]]
            assert record["error"] is not None and "over the 32 MiB limit" in record["error"], (via, record)
            assert record["exit_code"] == 2 and record["patch_sets"] == {}, (via, record)
            pth = rows[tags[".pth"]]
            assert pth["error"] is None and "zz-big.pth" in pth["added"] and pth["exit_code"] == 1, (via, pth)
            assert code == 2
    finally:
        for tag in tags.values():
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def _inspect(ref: str) -> dict:
    return json.loads(subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=True).stdout)[0]


@pytest.mark.engine
def test_hostile_layers_over_a_really_patched_image_fail_status_and_verify(trees: dict[str, Path], tmp_path: Path) -> None:
    """The real attack: the image `apply` made (its labels kept, so it claims the patch), plus one
    hand-written layer. The engine runs it; `status` must not say `applied` and clean, `verify`
    (which runs the image's own python) exits 1."""
    from tests.support import images

    fixture = images.fixture_image()
    patched = f"127.0.0.1:9/dspark-patch-test/hostile-patched:{secrets.token_hex(4)}"
    res = run("apply", "--image", fixture, "--tag", patched, "--pull", "never", "--no-probe",
              "--report-dir", str(tmp_path / "apply"))
    assert res.returncode == 0, res.stderr[-800:]
    info = _inspect(patched)
    lower = list(info["RootFS"]["Layers"])
    config = {k: v for k, v in info["Config"].items() if v not in (None, "", [], {})}
    # The fixture's own layers (unpatched vLLM at python3.11) with the patched files at python3.14.
    decoy_site = "usr/local/lib/python3.14/site-packages"
    # A size field with a leading NUL: tarfile reads 0 and takes the data for a second header (the
    # patched file); the engine writes the whole data (that header and the bytes) into the file.
    path, data = _patched_member(trees)
    inner = hostile.raw_header(path.encode(), size=len(data)) + data + bytes(-len(data) % 512)
    hidden = hostile.raw_header(path.encode(), fields={"size": b"\0" + b"%010o\0" % len(inner)}) + inner
    cases: dict[str, list[bytes | str]] = {
        "models-link": [*lower, hostile.layer([Link(f"{SITE}/vllm/models", "/opt")])],
        "decoy": [*_inspect(fixture)["RootFS"]["Layers"], site_layer(trees["patched"], decoy_site)],
        "hidden-header": [*lower, hostile.layer([Raw(hidden)])],
    }
    tags = {name: f"127.0.0.1:9/dspark-patch-test/hostile-real-{name}:1" for name in cases}
    try:
        for name, layers in cases.items():
            assert _load(layers, tags[name], config) is not None, f"the engine refused {name}"
        for via in ("layers", "container"):
            _, rows = _status_rows(via, [patched, *tags.values()])
            assert (rows[patched]["error"], rows[patched]["patch_sets"].get(PATCH_ID)) == (None, "applied"), rows[patched]
            link = rows[tags["models-link"]]
            assert link["error"] is not None and "symlink" in link["error"] and link["exit_code"] == 1, (via, link)
            decoy = rows[tags["decoy"]]
            assert (decoy["error"], decoy["patch_sets"].get(PATCH_ID), decoy["location"]) == (None, "absent", f"/{SITE}"), decoy
            hid = rows[tags["hidden-header"]]
            if via == "layers":  # refused, naming the layer
                assert hid["error"] is not None and "not plain octal" in hid["error"] and hid["exit_code"] == 1, hid
            else:  # what the engine wrote: not the post-image
                assert hid["error"] is None and hid["patch_sets"][PATCH_ID] != "applied", hid
        for name, tag in tags.items():
            res = run("verify", "--image", tag, "--pull", "never", "--no-probe", "--report-dir", str(tmp_path / f"v-{name}"))
            assert res.returncode == 1 and "Traceback" not in res.stderr, (name, res.returncode, res.stderr[-800:])
            assert "OK: verified" not in res.stdout + res.stderr
        # apply refuses what the engine made of the link and of the hidden header (the decoy through
        # apply: test_hostile_apply.py, which refuses it as `unimported-copy`)
        for name in ("models-link", "hidden-header"):
            res = run("apply", "--image", tags[name], "--tag", f"{tags[name]}-again", "--pull", "never", "--no-probe",
                      "--report-dir", str(tmp_path / f"a-{name}"))
            res.assert_clean_error(1)
            assert subprocess.run(["docker", "image", "inspect", f"{tags[name]}-again"], capture_output=True).returncode != 0
    finally:
        for tag in [*tags.values(), *(f"{t}-again" for t in tags.values()), patched]:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.mark.parametrize("gone", [SITE, f"{SITE}/vllm", "usr/local/lib/python3.11"])
def test_the_new_layers_check_refuses_a_whiteout_of_a_folder_above_a_patched_file(trees: dict[str, Path], gone: str) -> None:
    from dspark_patch.patching.diff import parse_diff
    from dspark_patch.patching.plan import plan_patch
    from dspark_patch.pipeline.image_steps import layer_changes
    from dspark_patch.targets.base import Distribution
    from dspark_patch.targets.layers.new_layer import layer_entries

    patchset = next(p for p in PATCHSETS if p.id == PATCH_ID)
    variant = patchset.variant_for("0.33.0")
    clean = trees["clean"]
    plan = plan_patch(parse_diff(variant.diff, strip=patchset.strip),
                      lambda p: (clean / p).read_bytes() if (clean / p).is_file() else None)
    dist = Distribution(name="vllm", version="0.33.0", location=f"/{SITE}", python="/usr/bin/python3",
                        python_version="3.11.2", cache_tag="cpython-311", record_file=None, record=())
    folders = sorted({"/".join(f"{SITE}/{fp.path}".split("/")[:i]) for fp in plan.files
                      for i in range(1, f"{SITE}/{fp.path}".count("/") + 1)})
    honest: list[hostile.Member] = [*(Dir(f) for f in folders),
                                    *(File(f"{SITE}/{fp.path}", fp.post or b"") for fp in plan.files if fp.post is not None)]
    _, unexpected = layer_changes(plan, dist, layer_entries(hostile.layer(honest)), [], {})
    assert unexpected == ()
    changes, unexpected = layer_changes(plan, dist, layer_entries(hostile.layer([*honest, Whiteout(gone)])), [], {})
    assert [(c.kind, c.path) for c in unexpected] == [("D", f"/{gone}")]


def test_a_header_summed_as_signed_bytes_is_read_like_tarfile_and_go_read_it() -> None:
    # Old writers summed signed bytes; both readers accept either sum, so the reader does too.
    block = bytearray(hostile.raw_header("é.py".encode(), size=0))
    block[148:156] = b" " * 8
    signed = sum(b - 256 if b > 127 else b for b in block)
    block[148:156] = b"%06o\0 " % signed
    scan = scan_layer(io.BytesIO(bytes(block) + bytes(1024)), where="layer L", retain=lambda p, k: "name")
    assert list(scan.entries) == ["é.py"]
    with tarfile.open(fileobj=io.BytesIO(bytes(block) + bytes(1024)), mode="r|") as tar:
        assert [m.name for m in tar] == ["é.py"]


@pytest.mark.parametrize("record", ["SCHILY.xattr.trusted.overlay.opaque", "LIBARCHIVE.xattr.trusted.overlay.opaque",
                                    "SCHILY.xattr.trusted.overlay.redirect", "SCHILY.xattr.user.overlay.opaque"])
def test_an_overlay_xattr_on_a_folder_is_refused(record: str) -> None:
    # overlay2 applies the xattr when it unpacks the layer: `vllm/` made opaque hides every file
    # the lower layers hold under it, which no reader of the layers would see.
    data = hostile.layer([hostile.Raw(hostile.pax({record: "y"})), Dir(f"{SITE}/vllm"),
                          File(f"{SITE}/vllm/__init__.py", b"")])
    with pytest.raises(HostileLayer, match="an overlayfs xattr"):
        scan_layer(io.BytesIO(data), where="layer L", retain=status_retain("vllm"))


def test_other_xattrs_are_read_and_their_owner_kept() -> None:
    # an xattr the engine keeps as it is (a capability, an SELinux label) is no reader differential;
    # the folder's mode and owner are what a layer over it must keep (publish, verify --via registry)
    data = hostile.layer([hostile.Raw(hostile.pax({"SCHILY.xattr.security.selinux": "x", "uid": "2000"})),
                          Dir(f"{SITE}/vllm"), File(f"{SITE}/vllm/envs.py", b"x = 1\n")])
    scan = scan_layer(io.BytesIO(data), where="layer L", retain=status_retain("vllm", ("vllm/envs.py",)))
    assert scan.owners[path_key(f"{SITE}/vllm")][1] == 2000
    assert f"{SITE}/vllm/envs.py" in scan.entries
