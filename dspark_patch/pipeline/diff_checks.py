"""What one patch set's diff may hold, checked once it is parsed: its bounds, the
distribution's own files only, and (a reviewed patch set) exactly the files its patch.toml
lists hashes for. Shared by a single patch set's steps and a series' members."""

from __future__ import annotations

from ..errors import BadInput, InvalidPatchSet, MalformedPatch, UnsafePatch
from ..inside.integrity import own_folders
from ..patching.diff import Diff, parse_diff
from ..patchset import PatchSet, Variant
from ..targets.base import Distribution


def load_diff(patchset: PatchSet, variant: Variant, dist: Distribution, strip: int | None, *,
              reviewed: bool) -> Diff:
    """The variant's diff, parsed and held to what a patch set may change: its bounds, the
    distribution's own files, and (reviewed) exactly the files patch.toml lists hashes for."""
    try:
        diff = parse_diff(variant.diff, strip=patchset.strip if strip is None else strip)
    except BadInput as exc:  # the engine parses bytes; name the file they came from
        raise type(exc)(f"{variant.diff_path}: {exc.message}", hint=exc.hint) from None
    check_bounds(diff, variant)
    check_owned(diff, dist)
    if reviewed:
        in_diff = {fp.path for fp in diff.files}
        if in_diff != set(variant.files):
            raise InvalidPatchSet(
                f"patch set {patchset.id} variant {variant.name}: the diff touches {sorted(in_diff)} "
                f"but patch.toml lists hashes for {sorted(variant.files)}",
                hint="list every file of the diff under [variants.files]",
            )
    return diff


# What one patch set's diff may hold: a real patch set changes a few files with a few dozen
# hunks; these bounds keep a hostile one from filling the tree or the planner's time.
MAX_FILES = 200
MAX_HUNKS = 5000


def check_bounds(diff: Diff, variant: Variant) -> None:
    hunks = sum(len(fp.hunks) for fp in diff.files)
    if len(diff.files) > MAX_FILES or hunks > MAX_HUNKS:
        raise MalformedPatch(
            f"{variant.diff_path.name}: {len(diff.files)} files and {hunks} hunks; a patch set may change at most "
            f"{MAX_FILES} files with {MAX_HUNKS} hunks",
            hint="split the change into several patch sets, or check that this is the diff you meant",
        )


def owned_folders(dist: Distribution) -> frozenset[str]:
    """The distribution's own top-level folders, by its RECORD: `vllm` for vLLM (not its
    dist-info, its .data, its scripts, nor a top-level module file). Without a RECORD, its
    import name."""
    owned = {top for top in own_folders(e.path for e in dist.record)
             if not top.endswith((".dist-info", ".data", ".egg-info"))}
    return frozenset(owned) or frozenset({dist.name.replace("-", "_").lower()})


def check_owned(diff: Diff, dist: Distribution) -> None:
    """A diff may change only files inside the distribution's own top-level folders: not another
    distribution's files, not its RECORD, not the site folder's top (start-up files and others
    are refused by the diff parser already)."""
    owned = owned_folders(dist)
    for fp in diff.files:
        top, _, rest = fp.path.partition("/")
        if top not in owned or not rest:
            raise UnsafePatch(
                f"{fp.path}: outside {dist.name}'s own folders ({', '.join(sorted(owned))}/) by its RECORD",
                hint=f"a patch set changes only files of {dist.name}; nothing was written",
            )
