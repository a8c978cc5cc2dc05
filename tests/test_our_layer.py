"""Which top layer `apply` may drop to replace a layer of ours (fast tier): the layer is read
with the strict layer reader and must hold nothing but what a layer of ours for the files its
labels name holds. Labels are input; a layer with anything else stays (StackedLayer, exit 2)."""

from __future__ import annotations

import io
import json
import re
import tarfile

import pytest

from dspark_patch.errors import StackedLayer
from dspark_patch.patchset import resolve
from dspark_patch.pipeline.image_steps import LABEL_PREFIX
from dspark_patch.pipeline.our_layer import OurLayer, check_our_layer, our_layer
from dspark_patch.targets.base import Distribution
from dspark_patch.targets.layers.scan import LayerScan, scan_layer
from dspark_patch.targets.views.from_layers import status_retain

LOCATION = "/usr/local/lib/python3.11/dist-packages"
DIST = Distribution(name="vllm", version="0.33.0", location=LOCATION, python="/usr/bin/python3",
                    python_version="3.11.2", cache_tag="cpython-311", record_file=None, record=())
FILES = {"vllm/envs.py": "a" * 64, "vllm/models/deepseek_v4/nvidia/model.py": "b" * 64}
SHIPPED = resolve("dspark-skip-mtp-buffer")


def _layer(*members: tuple[str, str]) -> LayerScan:
    """A layer tar with `members` ((path, "dir" | "file")), folders first as a commit writes them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, kind in members:
            info = tarfile.TarInfo(path)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = 2
                tar.addfile(info, io.BytesIO(b"x\n"))
    out.seek(0)
    return scan_layer(out, where="test layer", retain=status_retain("vllm"))


def _ours(*extra: tuple[str, str]) -> LayerScan:
    base = LOCATION.strip("/")
    folders = ["usr", "usr/local", "usr/local/lib", "usr/local/lib/python3.11", base, f"{base}/vllm",
               f"{base}/vllm/__pycache__", f"{base}/vllm/models", f"{base}/vllm/models/deepseek_v4",
               f"{base}/vllm/models/deepseek_v4/nvidia", f"{base}/vllm/models/deepseek_v4/nvidia/__pycache__"]
    files = [f"{base}/vllm/envs.py", f"{base}/vllm/__pycache__/envs.cpython-311.pyc",
             f"{base}/vllm/models/deepseek_v4/nvidia/model.py",
             f"{base}/vllm/models/deepseek_v4/nvidia/__pycache__/model.cpython-311.pyc"]
    return _layer(*((f, "dir") for f in folders), *((f, "file") for f in files), *extra)


LAYER = OurLayer(image_id="sha256:" + "1" * 64, named="dspark-skip-mtp-buffer", files=FILES)


def test_a_layer_of_exactly_the_labelled_files_their_bytecode_and_folders_may_go() -> None:
    check_our_layer(LAYER, _ours(), DIST)


def test_a_layer_without_the_bytecode_may_go_too() -> None:
    """apply --no-compile writes no bytecode: a subset of what a layer of ours holds."""
    base = LOCATION.strip("/")
    check_our_layer(LAYER, _layer((f"{base}/vllm", "dir"), (f"{base}/vllm/envs.py", "file")), DIST)


@pytest.mark.parametrize(("extra", "says"), [
    (("etc/team-marker", "file"), "holds 2 path(s) beyond the files its dspark-patch labels"),  # /etc and the file
    ((f"{LOCATION.strip('/')}/vllm/other.py", "file"), "holds 1 path(s) beyond"),
    ((f"{LOCATION.strip('/')}/sitecustomize.py", "file"), "holds 1 path(s) beyond"),
    ((f"{LOCATION.strip('/')}/vllm/.wh.config", "file"), "a whiteout of"),
    ((f"{LOCATION.strip('/')}/vllm/.wh..wh..opq", "file"), "an opaque folder"),
])
def test_a_layer_with_anything_else_stays(extra: tuple[str, str], says: str) -> None:
    with pytest.raises(StackedLayer, match=re.escape(says)):
        check_our_layer(LAYER, _ours(extra), DIST)


def test_a_layer_at_another_location_stays() -> None:
    moved = Distribution(**{**DIST.__dict__, "location": "/opt/venv/lib/python3.11/site-packages"})
    with pytest.raises(StackedLayer, match="beyond the files"):
        check_our_layer(LAYER, _ours(), moved)


def test_an_unreadable_top_layer_stays() -> None:
    with pytest.raises(StackedLayer, match="could not be read"):
        check_our_layer(LAYER, None, DIST)


class _Labelled:
    """An image target as far as our_layer reads it: its labels."""

    def __init__(self, labels: dict[str, str]) -> None:
        self._labels = labels

    def source_labels(self) -> dict[str, str]:
        return self._labels


VARIANT = SHIPPED.variant_for("0.33.0")


@pytest.mark.parametrize("files", [
    "not json", json.dumps(["vllm/envs.py"]), json.dumps({}), json.dumps({"../etc/passwd": "a" * 64}),
    json.dumps({"/etc/passwd": "a" * 64}), json.dumps({"vllm/./envs.py": "a" * 64}), json.dumps({"vllm/envs.py": 3}),
])
def test_labels_that_do_not_name_clean_files_are_refused(files: str) -> None:
    target = _Labelled({f"{LABEL_PREFIX}.files": files, f"{LABEL_PREFIX}.patch.id": "team"})
    with pytest.raises(StackedLayer, match="is not a list of patched files"):
        our_layer(target, "sha256:" + "1" * 64, SHIPPED, VARIANT)  # type: ignore[arg-type]


def test_no_labels_or_the_same_patch_set_is_no_layer_to_replace() -> None:
    assert our_layer(_Labelled({}), "sha256:1", SHIPPED, VARIANT) is None  # type: ignore[arg-type]
    same = _Labelled({f"{LABEL_PREFIX}.files": json.dumps(FILES), f"{LABEL_PREFIX}.patch.id": SHIPPED.id or "",
                      f"{LABEL_PREFIX}.patch.sha256": VARIANT.diff_sha256})
    assert our_layer(same, "sha256:1", SHIPPED, VARIANT) is None  # type: ignore[arg-type]
    other = _Labelled({f"{LABEL_PREFIX}.files": json.dumps(FILES), f"{LABEL_PREFIX}.patch.id": "team"})
    found = our_layer(other, "sha256:1", SHIPPED, VARIANT)  # type: ignore[arg-type]
    assert found is not None and found.named == "team" and dict(found.files) == FILES
