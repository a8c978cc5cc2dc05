"""`dspark-patch publish`: the layer an in-image run wrote, onto the image it ran in, registry to
registry, with no engine.

In order (publish/run.py): read the audit report strictly (claim.py: a whole apply of reviewed
patch sets to a site folder, with a layer); read the source image from its registry as
`status --via registry` does (strict layer reader, scan cache); prove the report was made from
that tree and the layer is exactly what that run wrote (proofs.py); compose the new config and
manifest (registry/compose.py: the source's config kept, our labels, one layer); upload the
layer's blob and the config, mount (or find) the source's layers, never send them again when the
registry has them (registry/upload.py); then, last, put the manifest under the tag, only when
the source reference still names what was read and the tag is free (or --force), and read the
digest back. Nothing is written before every proof holds; a failure after that leaves blobs no
tag names (a registry's garbage collection takes them), never a tag on a partial image.

Every layer of the source is read, also below the one that holds vLLM: an upper layer settles
only the paths it names (a file, a whiteout, an opaque folder), and a lower one can still add a
module inside vllm/, another copy of vLLM, a `.pth` or a start-up hook, each a finding here
(tests/test_publish_lower_layers.py). Only the scan cache spares a layer its fetch.

An index: one in-image run per platform, each proven against that platform's image; every
platform's image is pushed by its digest, then the new index (registry/index.py `republish`)
under the tag, only when every platform of the source has its run. `--sign-key` signs the
published report's statement and attaches it after the tag, as `apply --push --sign-key` does.
verify.py is the other half of the engine-free route: `verify --via registry`.
"""

from .run import LayerPair, Published, PublishRequest, publish

__all__ = ["LayerPair", "PublishRequest", "Published", "publish"]
