"""`dspark-patch report merge`: the shards of one `status --shard I/N` run joined into the report
the unsharded run gives (the same rows in the same order, the same exit code), or refused.

A shard document is input like any other: each is checked against `status.schema.json` and
against itself (its row count is its share of the list, its exit code its worst row's, no row
that lists findings says 0), and the shards against each other (one tool version, the same patch
sets, the same list, each index once, no target twice, none missing unless allowed). Whatever
does not hold is `BadInput`, one line naming the file, and nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from .. import ownfiles
from ..errors import BadInput, TargetNotFound
from ..routing import Route
from .status_model import FleetStatus, ImageStatus, MergeInfo, ShardInfo
from .status_render import load_status_schema

_SHOWN_CHARS = 160
SHARD_LIMIT = 256 << 20   # one shard's status.json: a row per image, far below this for any fleet
_HINT = "give the status.json that each `dspark-patch status --shard I/N` of one run wrote"


@dataclass(frozen=True, kw_only=True)
class ShardDocument:
    path: Path
    fleet: FleetStatus
    shard: ShardInfo


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(load_status_schema(), format_checker=jsonschema.FormatChecker())


def image_from_dict(row: dict[str, Any]) -> ImageStatus:
    tuples = ("unexplained", "missing", "added", "unimported", "record_disagrees", "bytecode", "unverified",
              "attested_detail", "installer_metadata", "installer_findings")
    return ImageStatus(
        ref=row["ref"], id=row["id"], platform=row["platform"], location=row["location"], release=row["release"],
        python=row["python"], patch_sets=tuple(row["patch_sets"].items()),
        **{name: tuple(row.get(name, ())) for name in tuples},
        reference=row["reference"], error=row["error"], attested=tuple(row.get("attested", {}).items()),
        exit_code=row["exit_code"], route=_route(row.get("route")))


def _route(route: dict[str, Any] | None) -> Route | None:
    return None if route is None else Route(name=route["name"], reason=route["reason"])


def read_shard(path: Path) -> ShardDocument:
    """One shard's status.json, checked against the schema and against itself."""
    try:
        data = ownfiles.read_json(path, limit=SHARD_LIMIT, what="")
    except ownfiles.MissingFile:
        raise TargetNotFound(f"{path}: no such file", hint=_HINT) from None
    except BadInput as exc:
        raise BadInput(exc.message, hint=_HINT) from None
    error = best_match(_validator().iter_errors(data))
    if error is not None:
        where = error.json_path.removeprefix("$").removeprefix(".") or "the top level"
        message = error.message if len(error.message) <= _SHOWN_CHARS else error.message[:_SHOWN_CHARS] + "..."
        raise BadInput(f"{path}: not a status document: {where}: {message}", hint=_HINT)
    if "merged" in data:
        raise BadInput(f"{path}: is already a merged report", hint=_HINT)
    if "shard" not in data:
        raise BadInput(f"{path}: is not a shard (written without --shard)", hint=_HINT)
    if "patch_set_digests" not in data:
        raise BadInput(f"{path}: names no patch set digests (written by an older dspark-patch)", hint="run every shard again with this version")
    s = data["shard"]
    shard = ShardInfo(index=s["index"], count=s["count"], targets=s["targets"], list_sha256=s["list_sha256"],
                      positions=tuple(s["positions"]))
    images = tuple(image_from_dict(row) for row in data["images"])
    fleet = FleetStatus(images=images, tool_version=data["tool_version"], started_at=data["started_at"],
                        seconds=data["seconds"], patch_set_digests=tuple(data["patch_set_digests"].items()), shard=shard,
                        notes=tuple(data.get("notes", ())))
    _check_itself(path, fleet, shard, data["exit_code"])
    return ShardDocument(path=Path(path), fleet=fleet, shard=shard)


def _check_itself(path: Path, fleet: FleetStatus, shard: ShardInfo, exit_code: int) -> None:
    where = f"{path} (shard {shard.index}/{shard.count})"
    if shard.index >= shard.count:
        raise BadInput(f"{where}: the index is not below the count", hint=_HINT)
    # The share status/shard.py gives this index: every target of it is one row.
    share = shard.targets * (shard.index + 1) // shard.count - shard.targets * shard.index // shard.count
    if len(fleet.images) != share or len(shard.positions) != share:
        raise BadInput(f"{where}: holds {len(fleet.images)} row(s) and {len(shard.positions)} position(s); its share "
                       f"of {shard.targets} target(s) is {share}", hint=_HINT)
    if len(set(shard.positions)) != share or any(p >= shard.targets for p in shard.positions):
        raise BadInput(f"{where}: its positions are not distinct places in a list of {shard.targets}", hint=_HINT)
    if len({i.ref for i in fleet.images}) != share:
        raise BadInput(f"{where}: lists a target twice", hint=_HINT)
    for image in fleet.images:
        # A row that says 0 must be one status would call clean: a merge never launders a finding.
        if image.exit_code == 0 and (image.error is not None or image.findings):
            raise BadInput(f"{where}: {image.ref}: exit code 0 with findings or an error", hint=_HINT)
        if image.exit_code != 0 and image.error is None and not image.findings:
            raise BadInput(f"{where}: {image.ref}: exit code {image.exit_code} without a finding or an error", hint=_HINT)
    if exit_code != fleet.exit_code:
        raise BadInput(f"{where}: exit code {exit_code}, but its worst row's is {fleet.exit_code}", hint=_HINT)


def merge(paths: Sequence[Path], *, allow_partial: bool = False) -> FleetStatus:
    if not paths:
        raise BadInput("give the status.json of every shard", hint=_HINT)
    docs = [read_shard(p) for p in paths]
    first = docs[0]
    for doc in docs[1:]:
        for what, mine, theirs in (
                ("tool versions", doc.fleet.tool_version, first.fleet.tool_version),
                ("patch sets", dict(doc.fleet.patch_set_digests), dict(first.fleet.patch_set_digests)),
                ("shard counts", doc.shard.count, first.shard.count),
                ("image lists", (doc.shard.targets, doc.shard.list_sha256), (first.shard.targets, first.shard.list_sha256))):
            if mine != theirs:
                shown = (theirs, mine) if what in ("tool versions", "shard counts") else None
                detail = f" ({shown[0]} and {shown[1]})" if shown else ""
                raise BadInput(f"{first.path} and {doc.path}: mixed {what}{detail}: these are not shards of one run",
                               hint="run every shard with one dspark-patch, one patch set folder and one image list")
    count = first.shard.count
    by_index: dict[int, ShardDocument] = {}
    owner: dict[str, Path] = {}
    for doc in docs:
        if doc.shard.index in by_index:
            raise BadInput(f"overlapping shards: {by_index[doc.shard.index].path} and {doc.path} are both shard "
                           f"{doc.shard.index}/{count}", hint="give each shard once")
        by_index[doc.shard.index] = doc
        for image in doc.fleet.images:
            if image.ref in owner:
                raise BadInput(f"overlapping shards: {image.ref} is in {owner[image.ref]} and {doc.path}",
                               hint="give each shard once, all from one run")
            owner[image.ref] = doc.path
    missing = tuple(i for i in range(count) if i not in by_index)
    if missing and not allow_partial:
        raise BadInput(f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing: the report would leave out "
                       f"their targets", hint="give every shard's status.json, or --allow-partial for a partial report (never clean)")
    placed = sorted(((pos, image) for doc in docs for pos, image in zip(doc.shard.positions, doc.fleet.images, strict=True)),
                    key=lambda item: (item[0], item[1].ref))
    return FleetStatus(
        images=tuple(image for _, image in placed), tool_version=first.fleet.tool_version,
        started_at=min(d.fleet.started_at for d in docs), seconds=max(d.fleet.seconds for d in docs),
        patch_set_digests=first.fleet.patch_set_digests,
        notes=tuple(dict.fromkeys(n for d in docs for n in d.fleet.notes)),
        merged=MergeInfo(count=count, shards=tuple(sorted(by_index)), missing=missing))
