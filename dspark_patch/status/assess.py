"""From a site folder's files to patch-set states and integrity lists. Pure: no engine, no I/O.

For every known patch set, each of its files is compared with the variant's reviewed pre- and
post-image: all post -> applied, all pre -> absent, some of each -> partial, any file neither
-> drifted; no variant for the release -> not-applicable.

Integrity is the wheel's RECORD: a file that differs from RECORD is *unexplained* unless its
content is the post-image a known patch set gives that file (so a hand edit inside a patched
file is named, and the patch's other, untouched file is not). A hashed RECORD entry that is not
there is *missing* (unless a patch set deletes it and the file is in that set's post state).
What counts as *added* is the rule `verify` applies inside the target
(`inside/integrity.py: added_files`), imported here so both say the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import UnsupportedRelease
from ..inside.integrity import added_files, own_folders
from ..patchset import PatchSet
from ..report.status_model import PatchSetState
from ..targets.sitefiles import SiteFiles


@dataclass(frozen=True, kw_only=True)
class Assessment:
    patch_sets: tuple[tuple[str, PatchSetState], ...]
    unexplained: tuple[str, ...]
    missing: tuple[str, ...]
    added: tuple[str, ...]


def patch_set_state(patchset: PatchSet, site: SiteFiles) -> PatchSetState:
    try:
        variant = patchset.variant_for(site.release)
    except UnsupportedRelease:
        return "not-applicable"
    pre = post = neither = 0
    for path, expected in variant.files.items():
        actual = site.hashes.get(path)
        if actual == expected.post_sha256:
            post += 1
        elif actual == expected.pre_sha256:
            pre += 1
        else:
            neither += 1
    if neither:
        return "drifted"
    if pre and post:
        return "partial"
    return "applied" if post else "absent"


def _inside(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return not path.startswith("/") and ".." not in parts


def assess(site: SiteFiles, patchsets: Iterable[PatchSet]) -> Assessment:
    patchsets = [p for p in patchsets if not p.is_bare]
    states = tuple((p.id or "", patch_set_state(p, site)) for p in patchsets)
    # Per file: the contents a known patch set's post-image allows (None: the set deletes it).
    post_images: dict[str, set[str | None]] = {}
    for patchset in patchsets:
        try:
            variant = patchset.variant_for(site.release)
        except UnsupportedRelease:
            continue
        for path, expected in variant.files.items():
            post_images.setdefault(path, set()).add(expected.post_sha256)

    unexplained: list[str] = []
    missing: list[str] = []
    for path, sha256 in site.record:
        if sha256 is None or not _inside(path):
            continue  # RECORD itself and bytecode carry no hash; ../../bin/vllm is outside
        actual = site.hashes.get(path)
        if actual == sha256 or actual in post_images.get(path, ()):
            continue
        (missing if actual is None else unexplained).append(path)

    listed = {path for path, _ in site.record} | set(post_images)
    present = [*site.hashes, *site.others, *site.top_level]
    added = added_files(present, listed, own_folders(listed), site.listed_anywhere)
    return Assessment(patch_sets=states, unexplained=tuple(sorted(unexplained)),
                      missing=tuple(sorted(missing)), added=tuple(added))
