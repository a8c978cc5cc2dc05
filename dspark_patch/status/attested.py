"""`status --key`: for each applied patch set of each image, is a valid signed attestation for
it attached to the image's manifest in its registry? Read from the registry alone (the manifest
the reference names, its referrers, the envelope): no layer, no engine.

An image named without a registry host (a local name, an id) has no registry to carry one: `no`.
"""

from __future__ import annotations

from dataclasses import replace

from ..attest.check import Subject, check
from ..attest.dsse import Verifier
from ..errors import DsparkPatchError
from ..imageref import ImageRef
from ..patchset import PatchSet
from ..registry.index import Registry
from ..report.status_model import AttestedState, ImageStatus


def with_attestations(row: ImageStatus, verifier: Verifier, patchsets: dict[str, PatchSet],
                      registries: dict[str, Registry]) -> ImageStatus:
    applied = [pid for pid, state in row.patch_sets if state == "applied" and pid in patchsets]
    if row.error or not applied:
        return row
    host = ImageRef.host_of(row.ref)
    if host is None:
        return replace(row, attested=tuple((pid, "no") for pid in applied),
                       attested_detail=(f"{row.ref} names no registry, so no attestation can be attached to it",))
    states: list[tuple[str, AttestedState]] = []
    details: list[str] = []
    try:
        registry = registries.get(host) or registries.setdefault(host, Registry(host))
        subject = Subject(repository=ImageRef.parse(row.ref).name, digest=registry.fetch(row.ref).digest)
    except DsparkPatchError as exc:
        return replace(row, attested=tuple((pid, "no") for pid in applied),
                       attested_detail=(f"the registry was not read: {exc.line()}",))
    for pid in applied:
        try:
            found = check(registry, subject, verifier, patchsets[pid])
        except DsparkPatchError as exc:
            states.append((pid, "no"))
            details.append(f"{pid}: the registry was not read: {exc.line()}")
            continue
        state: AttestedState = {"valid": "yes", "none": "no"}.get(found.state, "invalid")  # type: ignore[assignment]
        states.append((pid, state))
        if found.detail:
            details.append(f"{pid}: {found.detail}")
    updated = replace(row, attested=tuple(states), attested_detail=tuple(details))
    if any(s == "invalid" for _, s in states) and updated.exit_code == 0:
        updated = replace(updated, exit_code=1)  # a forged or broken attestation is a finding
    return updated
