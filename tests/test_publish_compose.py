"""The config and manifest `publish` writes (registry/compose.py), from a source as a registry
serves it: every field of the source kept, our labels added, one layer and one history entry
more; history dropped rather than left disagreeing with the layers; gzip blobs that are the same
for the same tar."""

from __future__ import annotations

import gzip
import hashlib
import json

from dspark_patch.registry.compose import HISTORY_NOTE, append_config, append_manifest, gzip_layer
from dspark_patch.registry.manifest import DOCKER_MANIFEST, OCI_MANIFEST, Manifest

SOURCE = {
    "architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
    "config": {"User": "2000", "Entrypoint": ["vllm", "serve"], "Env": ["PATH=/usr/bin"], "Labels": {"team": "ml"}},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "a" * 64, "sha256:" + "b" * 64]},
    "history": [{"created_by": "ADD rootfs"}, {"created_by": "ENV x=1", "empty_layer": True}, {"created_by": "RUN uv pip"}],
}
DIFF_ID = "sha256:" + "c" * 64


def _config(source: dict) -> dict:
    return json.loads(append_config(json.dumps(source).encode(), diff_id=DIFF_ID, labels={"ours": "1"},
                                    created="2026-12-07T00:00:00Z"))


def test_the_config_keeps_the_sources_and_adds_our_labels_one_layer_and_one_history_entry() -> None:
    made = _config(SOURCE)
    assert made["config"] == {**SOURCE["config"], "Labels": {"team": "ml", "ours": "1"}}
    assert made["rootfs"]["diff_ids"] == [*SOURCE["rootfs"]["diff_ids"], DIFF_ID]
    assert made["history"][:-1] == SOURCE["history"] and made["history"][-1]["created_by"] == HISTORY_NOTE
    assert (made["architecture"], made["os"], made["created"]) == ("amd64", "linux", "2026-12-07T00:00:00Z")


def test_a_history_that_does_not_account_for_the_layers_is_left_out_not_extended() -> None:
    source = {**SOURCE, "history": SOURCE["history"][:1]}
    assert "history" not in _config(source)


def test_a_source_with_no_config_gets_only_our_labels() -> None:
    source = {k: v for k, v in SOURCE.items() if k != "config"}
    assert _config(source)["config"] == {"Labels": {"ours": "1"}}


def _manifest(media_type: str) -> Manifest:
    doc = {"schemaVersion": 2, "mediaType": media_type,
           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + "d" * 64, "size": 9},
           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + "e" * 64, "size": 5}],
           "subject": {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "f" * 64, "size": 1},
           "annotations": {"org.opencontainers.image.base.name": "x"}}
    body = json.dumps(doc).encode()
    return Manifest(reference="r", media_type=media_type, digest="sha256:" + hashlib.sha256(body).hexdigest(), body=body)


def test_the_manifest_names_the_new_config_and_one_gzip_layer_of_the_sources_family() -> None:
    for media_type, layer_type in ((OCI_MANIFEST, "application/vnd.oci.image.layer.v1.tar+gzip"),
                                   (DOCKER_MANIFEST, "application/vnd.docker.image.rootfs.diff.tar.gzip")):
        source = _manifest(media_type)
        made = json.loads(append_manifest(source, config=b"{}", layer_blob=b"blob"))
        assert made["config"]["digest"] == "sha256:" + hashlib.sha256(b"{}").hexdigest() and made["config"]["size"] == 2
        assert made["layers"][:-1] == source.document()["layers"]
        assert made["layers"][-1] == {"mediaType": layer_type, "digest": "sha256:" + hashlib.sha256(b"blob").hexdigest(),
                                      "size": 4}
        assert "subject" not in made and made["annotations"] == source.document()["annotations"]


def test_the_layer_blob_is_the_same_for_the_same_tar_and_holds_it() -> None:
    tar = b"x" * 10000
    assert gzip_layer(tar) == gzip_layer(tar) and gzip.decompress(gzip_layer(tar)) == tar
