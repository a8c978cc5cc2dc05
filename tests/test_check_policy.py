"""What a run checks, as a user meets it: a bare diff file never gets hash checks and patches
a tree that is not the wheel with a note; --allow-unknown-base says so in the report's notes;
an unreviewed variant is refused unless --allow-unreviewed, which is noted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dspark_patch.errors import UnreviewedVariant
from dspark_patch.patchset import load_bare, resolve
from dspark_patch.pipeline.policy import CheckPolicy

BARE = b"--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def test_a_bare_diff_gets_no_hash_checks_whatever_is_asked(tmp_path: Path) -> None:
    (tmp_path / "fix.diff").write_bytes(BARE)
    bare = load_bare(tmp_path / "fix.diff")
    for flags in ({}, {"allow_unknown_base": True}, {"allow_unreviewed": True}):
        policy = CheckPolicy.of(bare, **flags)
        assert not policy.hash_checks and not policy.release_checks
        assert policy.base_waiver == "bare diff file"     # a tree not the wheel: patched, with a note
        assert policy.notes == ()                          # no --allow-unknown-base note for a bare diff
        assert policy.checked_variant(bare.variants[0]) is None
        assert policy.admit(bare, replace(bare.variants[0], review="unreviewed")) is None


def test_allow_unknown_base_drops_the_hash_checks_and_says_so() -> None:
    patchset = resolve(None)
    strict, loose = CheckPolicy.of(patchset), CheckPolicy.of(patchset, allow_unknown_base=True)
    assert strict.hash_checks and strict.base_waiver is None and strict.notes == ()
    assert not loose.hash_checks and loose.base_waiver == "--allow-unknown-base"
    assert loose.notes == ("--allow-unknown-base: pre-image hashes not enforced; relying on zero-fuzz placement alone",)
    assert loose.checked_variant(patchset.variants[0]) is patchset.variants[0]


def test_an_unreviewed_variant_is_refused_unless_allowed() -> None:
    patchset = resolve(None)
    variant = replace(patchset.variants[0], review="unreviewed")
    with pytest.raises(UnreviewedVariant) as refused:
        CheckPolicy.of(patchset).admit(patchset, variant)
    assert refused.value.exit_code == 2 and "refusing to apply it" in refused.value.message
    note = CheckPolicy.of(patchset, allow_unreviewed=True).admit(patchset, variant)
    assert note == f"--allow-unreviewed: variant {variant.name} has not been reviewed by a person"
    assert CheckPolicy.of(patchset).admit(patchset, patchset.variants[0]) is None
