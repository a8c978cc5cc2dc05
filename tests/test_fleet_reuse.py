"""A fleet read in one run reuses the work done for its shared base, and each tag still gets the
row it gets alone.

One run of the registry route reads many tags of one base: the base's merged view and what is
derived from it (the site folder's facts, targets/views/site_fold.py) are made once, and each
tag's view is the base's plus its own top layer. Each top layer here changes something the
base's view relied on (the dist-info, a patched file, the site folder itself, a `.pth`, a link
in vLLM's folders, a folder made a file); every tag's row must be the one the tag gets read
alone, from a view made afresh with nothing reused. The honest tags, between them, keep the
base's verdict.
"""

from __future__ import annotations

import io
from dataclasses import fields, replace
from pathlib import Path

import pytest

from dspark_patch.errors import DsparkPatchError
from dspark_patch.report.status_model import ImageStatus
from dspark_patch.status.fleet import _error_row, row_from_site
from dspark_patch.status.registry_route import read_all
from dspark_patch.targets.layers import LayerView, merge, scan_layer
from dspark_patch.targets.layers.merge import _merged
from dspark_patch.targets.views.from_layers import find_site, site_files, status_retain
from tests.support import hostile, oci
from tests.support.fake_registry import fake_registry
from tests.support.hostile import Dir, File, Link, Opaque, Whiteout
from tests.test_hostile_layers import (
    CONFIG,
    PATCH_ID,
    PATCHSETS,
    SITE,
    _patched_member,
    python_layer,
    registry_reader,
    site_layer,
    trees,
)

__all__ = ["trees"]  # the honest trees, shared with tests/test_hostile_layers.py


def _tops(trees: dict[str, Path]) -> dict[str, bytes]:
    path, _ = _patched_member(trees)
    return {
        "honest-a": hostile.layer([Dir("app"), File("app/serve.py", b"print('a')\n")]),
        "no-dist-info": hostile.layer([Whiteout(f"{SITE}/vllm-0.33.0.dist-info")]),
        "patched-file-replaced": hostile.layer([File(path, b"# not the patch set's\n")]),
        "patched-file-whited-out": hostile.layer([Whiteout(path)]),
        "honest-b": hostile.layer([Dir("app"), File("app/other.py", b"print('b')\n")]),
        "site-opaque": hostile.layer([Dir(SITE), Opaque(SITE), Dir(f"{SITE}/vllm"), File(f"{SITE}/vllm/__init__.py", b"")]),
        "pth-added": hostile.layer([File(f"{SITE}/zz-hook.pth", b"import os\n")]),
        "link-in-vllm": hostile.layer([Link(f"{SITE}/vllm/models", "/opt/other")]),
        "dist-info-a-file": hostile.layer([File(f"{SITE}/vllm-0.33.0.dist-info", b"not a folder")]),
        "site-whited-out": hostile.layer([Whiteout("usr/local/lib/python3.11/dist-packages")]),
        "vllm-added-file": hostile.layer([File(f"{SITE}/vllm/extra_module.py", b"x = 1\n")]),
    }


def _alone(layers: list[bytes], ref: str) -> ImageStatus:
    """The row of one image from a view made afresh: no merged base, no derived facts reused."""
    _merged.clear()
    retain = status_retain("vllm")
    view = merge([scan_layer(io.BytesIO(data), where="layer", retain=retain) for data in layers])
    _merged.clear()
    try:
        site = find_site(LayerView(entries=dict(view.entries), where=f"image {ref}"), "vllm", CONFIG, ref)
        return row_from_site(ref, site, PATCHSETS, config=CONFIG)
    except DsparkPatchError as exc:
        return _error_row(ref, exc, id="sha256:x")


def _plain(row: ImageStatus) -> ImageStatus:
    return replace(row, ref="t", id="sha256:x", platform=None)


def test_each_tag_of_a_fleet_on_one_base_gets_the_row_it_gets_alone(trees: dict[str, Path]) -> None:
    base = [python_layer(), site_layer(trees["patched"])]
    tops = _tops(trees)
    path, _ = _patched_member(trees)
    served: dict = {}
    for name, top in tops.items():
        served.update(oci.served_image([*base, top], config=CONFIG, tag=name)[0])
    with fake_registry(served) as (address, _seen):
        refs = [f"{address}/test/img:{name}" for name in tops]
        together = read_all(registry_reader(), refs, jobs=4)
    rows = {name: _plain(together[ref][0]) for name, ref in zip(tops, refs, strict=True)}  # type: ignore[index]
    alone = {name: _plain(_alone([*base, top], ref)) for (name, top), ref in zip(tops.items(), refs, strict=True)}
    for name in tops:
        assert rows[name] == alone[name], name

    # The honest tags keep the base's verdict; each hostile one is told apart from them.
    honest = rows["honest-a"]
    assert honest.error is None and dict(honest.patch_sets)[PATCH_ID] == "applied"
    assert rows["honest-b"] == honest
    for name in tops:
        if not name.startswith("honest"):
            assert rows[name] != honest, name
    assert rows["no-dist-info"].error is not None and rows["dist-info-a-file"].error is not None
    assert rows["site-whited-out"].error is not None and "no vllm" in rows["site-whited-out"].error.lower()
    assert rows["link-in-vllm"].error is not None and "symlink" in rows["link-in-vllm"].error
    assert dict(rows["patched-file-replaced"].patch_sets)[PATCH_ID] != "applied"
    assert path.removeprefix(SITE + "/") in rows["patched-file-whited-out"].missing
    assert "zz-hook.pth" in rows["pth-added"].added
    assert "vllm/extra_module.py" in rows["vllm-added-file"].added


def _ordered(found: object) -> list:
    """A SiteFiles as its fields, dicts as their items in order (order reaches the lists)."""
    return [(f.name, list(v.items()) if isinstance(v := getattr(found, f.name), dict) else v) for f in fields(found)]


@pytest.mark.parametrize("top", [
    [File(f"{SITE}/aa.pth", b"import os\n")],                        # a file where the base has a folder
    [Whiteout(f"{SITE}/aa.pth"), File(f"{SITE}/vllm/new.py", b"")],  # the folder gone, a file added
    [Dir(f"{SITE}/aa.pth"), Dir(f"{SITE}/aa.pth/inner")],            # a folder over the folder: kept
    [File(f"{SITE}/bb.pth", b"import sys\n")],                       # a file over a file: in its place
])
def test_a_site_folders_facts_from_the_base_are_the_facts_made_afresh_in_order(trees: dict[str, Path], top: list) -> None:
    retain = status_retain("vllm")
    # `aa.pth` a folder before the file `bb.pth`: a file written over the folder stays before it
    base = [python_layer(), site_layer(trees["patched"], extra=[Dir(f"{SITE}/aa.pth"), File(f"{SITE}/bb.pth", b"")])]
    scans = [scan_layer(io.BytesIO(data), where="layer", retain=retain) for data in (*base, hostile.layer(top))]
    merge(scans[:-1] + [scan_layer(io.BytesIO(hostile.layer([Dir("app")])), where="layer", retain=retain)])
    view = merge(scans)  # the base's view from the first merge, and its facts, reused
    assert view.base is not None
    site_files(view.base, "vllm", "/" + SITE)  # the base's facts made first
    _merged.clear()
    afresh = LayerView(entries=dict(merge(scans).entries), where=view.where)  # merged from the bottom
    assert list(view.entries.items()) == list(afresh.entries.items())
    assert _ordered(site_files(view, "vllm", "/" + SITE)) == _ordered(site_files(afresh, "vllm", "/" + SITE))
    assert find_site(view, "vllm", CONFIG, "t") == find_site(afresh, "vllm", CONFIG, "t")
