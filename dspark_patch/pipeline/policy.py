"""What a run checks, decided once from the patch set and the request.

A patch set names its releases and each variant's reviewed pre- and post-image hashes; a bare
diff file names neither, so it gets no release, hash, post-image or label checks, and a tree
that is not the published wheel is patched with the findings as notes. `--allow-unknown-base`
drops the pre-image hash checks of a patch set (its post-images still hold where the files are
the reviewed pre-images) and, like a bare diff, turns the base check's findings into notes.
`--allow-unreviewed` lets apply use a variant `port` made that no person has marked reviewed.
The steps ask this policy; none of them tests for a bare diff itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnreviewedVariant
from ..patchset import PatchSet, Variant


@dataclass(frozen=True, kw_only=True)
class CheckPolicy:
    release_checks: bool            # a patch set (releases, variants, reviewed hashes); False: a bare diff file
    allow_unknown_base: bool = False
    allow_unreviewed: bool = False

    @classmethod
    def of(cls, patchset: PatchSet, *, allow_unknown_base: bool = False, allow_unreviewed: bool = False) -> CheckPolicy:
        return cls(release_checks=not patchset.is_bare, allow_unknown_base=allow_unknown_base,
                   allow_unreviewed=allow_unreviewed)

    @property
    def hash_checks(self) -> bool:
        """The reviewed pre-image hashes are enforced: a patch set without --allow-unknown-base."""
        return self.release_checks and not self.allow_unknown_base

    @property
    def base_waiver(self) -> str | None:
        """Why a tree that is not the published wheel is patched anyway (its findings become a
        note opening with this), or None: it is refused."""
        if not self.release_checks:
            return "bare diff file"
        return "--allow-unknown-base" if self.allow_unknown_base else None

    @property
    def notes(self) -> tuple[str, ...]:
        """What apply says of this policy before it plans."""
        if self.allow_unknown_base and self.release_checks:
            return ("--allow-unknown-base: pre-image hashes not enforced; relying on zero-fuzz placement alone",)
        return ()

    def checked_variant(self, variant: Variant) -> Variant | None:
        """The variant whose hashes the patched files are held to, or None (a bare diff's own)."""
        return variant if self.release_checks else None

    def unreviewed(self, variant: Variant) -> bool:
        """A patch set's variant that `port` made and no person has marked reviewed yet."""
        return self.release_checks and variant.review == "unreviewed"

    def admit(self, patchset: PatchSet, variant: Variant) -> str | None:
        """apply's rule for an unreviewed variant: refused (UnreviewedVariant, exit 2) unless
        --allow-unreviewed, and then the note that says so; None for a reviewed one."""
        if not self.unreviewed(variant):
            return None
        if not self.allow_unreviewed:
            raise UnreviewedVariant(
                f"patch set {patchset.id} variant {variant.name} is unreviewed (made by `dspark-patch port`"
                f"{' from ' + variant.ported_from if variant.ported_from else ''}); refusing to apply it",
                hint="have a person read its review file and set review = \"reviewed\" in patch.toml, "
                "or pass --allow-unreviewed (the report says so)",
            )
        return f"--allow-unreviewed: variant {variant.name} has not been reviewed by a person"
