"""From a site folder's files to patch-set states and integrity lists. Pure: no engine, no I/O.

For every known patch set, each of its files is compared with the variant's reviewed pre- and
post-image: all post -> applied, all pre -> absent, some of each -> partial, any file neither
-> drifted; no variant for the release -> not-applicable.

Integrity is the published wheel (`dspark_patch.references`, rules in its `compare`), never
the image's own RECORD: a file that differs from the wheel is *unexplained* unless its content
is the post-image a known patch set gives that file; a wheel file that is not there is
*missing* (unless a patch set deletes it); the image's RECORD rows are checked against the
wheel too (`record_disagrees`). With no reference for the release and platform the row says so
in `unverified` and is never clean; its lists are then taken against the image's RECORD, as a
hint. Bytecode: status/bytecode.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import references
from ..errors import UnsupportedRelease
from ..inside.integrity import added_files, own_folders
from ..patchset import PatchSet, known
from ..report.status_model import PatchSetState
from ..series import state_of
from ..targets.views.site_files import SiteFiles
from .bytecode import check as check_bytecode
from .bytecode import not_verified_line


@dataclass(frozen=True, kw_only=True)
class Assessment:
    patch_sets: tuple[tuple[str, PatchSetState], ...]
    unexplained: tuple[str, ...]
    missing: tuple[str, ...]
    added: tuple[str, ...]
    reference: str | None = None
    record_disagrees: tuple[str, ...] = ()
    bytecode: tuple[str, ...] = ()
    unverified: tuple[str, ...] = ()
    installer: tuple[str, ...] = ()
    installer_findings: tuple[str, ...] = ()
    bytecode_proven: int = 0     # .pyc recompiled and compared (status/bytecode.py's `proven`)
    bytecode_unrecompiled: tuple[str, ...] = ()   # patched modules' .pyc of another minor, not recompiled


def patch_set_state(patchset: PatchSet, site: SiteFiles, others: Sequence[PatchSet] = ()) -> PatchSetState:
    """series.state_of on the site folder's files: a file a later set changes again, or first
    changed by a set this one requires, counts as in a series."""
    return state_of(patchset, site.hashes, site.release, others, read=site.retained.get)


def _inside(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return not path.startswith("/") and ".." not in parts


def post_images(patchsets: Iterable[PatchSet], release: str) -> dict[str, set[str | None]]:
    """Per file: the contents a known patch set's post-image allows (None: the set deletes it)."""
    found: dict[str, set[str | None]] = {}
    for patchset in known(patchsets):
        try:
            variant = patchset.variant_for(release)
        except UnsupportedRelease:
            continue
        for path, expected in variant.files.items():
            found.setdefault(path, set()).add(expected.post_sha256)
    return found


def assess(site: SiteFiles, patchsets: Iterable[PatchSet], python: str | None = None) -> Assessment:
    """`python`: an interpreter of the image's minor where it is not this host's (bytecode.py)."""
    patchsets = known(patchsets)
    states = tuple((p.id or "", patch_set_state(p, site, patchsets)) for p in patchsets)
    post = post_images(patchsets, site.release)
    bytecode = check_bytecode(site, python)
    unverified = [not_verified_line(bytecode.not_verified)] if bytecode.not_verified else []

    wheel = references.wheel_hash(site.distribution, site.release, site.hashes)
    ref = references.find(site.distribution, site.release, wheel)
    if ref is not None:
        found = references.compare(ref, hashes=site.hashes, others=site.others, record=site.record, post_images=post,
                                   top_level=site.top_level, pth=site.pth, listed_anywhere=site.listed_anywhere,
                                   metadata=site.metadata, scripts=site.scripts)
        return Assessment(patch_sets=states, unexplained=found.unexplained, missing=found.missing, added=found.added,
                          reference=ref.wheel, record_disagrees=found.record_disagrees, bytecode=bytecode.findings,
                          installer=found.installer, installer_findings=found.installer_findings,
                          unverified=tuple(unverified), bytecode_proven=bytecode.proven,
                          bytecode_unrecompiled=bytecode.unrecompiled)

    # No reference: say so (never clean); the lists against the image's RECORD are a hint only.
    unexplained: list[str] = []
    missing: list[str] = []
    for path, sha256 in site.record:
        if sha256 is None or not _inside(path):
            continue  # RECORD itself and bytecode carry no hash; ../../bin/vllm is outside
        actual = site.hashes.get(path)
        if actual == sha256 or actual in post.get(path, ()):
            continue
        (missing if actual is None else unexplained).append(path)
    listed = {path for path, _ in site.record} | set(post)
    present = [*site.hashes, *site.others, *site.top_level]
    added = added_files(present, listed, own_folders(listed), site.listed_anywhere)
    unverified.insert(0, references.no_reference(site.distribution, site.release, wheel))
    return Assessment(patch_sets=states, unexplained=tuple(sorted(unexplained)),
                      missing=tuple(sorted(missing)), added=tuple(added), bytecode=bytecode.findings,
                      unverified=tuple(unverified), bytecode_proven=bytecode.proven,
                      bytecode_unrecompiled=bytecode.unrecompiled)
