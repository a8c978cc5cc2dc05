"""`status --shard I/N`: which share of the target list one run of a CI matrix or an indexed
Kubernetes Job reads.

The rule: the de-duplicated list (roots and images, as `status` itself de-duplicates them) is
sorted by the reference as written and cut into N consecutive runs whose sizes differ by at most
one; shard I (0-based, as `JOB_COMPLETION_INDEX` is) is the I-th run. So every target is in
exactly one shard, each shard is computed from the list alone (no shard needs another's
result), the order the list is given in does not matter, and the tags of one repository, which
sort next to each other and share their base layers, mostly land in one shard (read once there).

Pure: no engine, no files. `fleet.status` applies it to the request's targets.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import BadInput
from ..report.status_model import ShardInfo

INDEX_ENV = "JOB_COMPLETION_INDEX"   # set by Kubernetes in each pod of a Job with completionMode: Indexed
AUTO = "auto"
_HINT = f"give --shard I/N with 0 <= I < N, e.g. --shard 0/4, or --shard {AUTO}/4 to take I from ${INDEX_ENV}"


@dataclass(frozen=True, kw_only=True)
class Shard:
    index: int   # 0-based
    count: int


def parse_shard(text: str, environ: Mapping[str, str] = os.environ) -> Shard:
    """`I/N`, or `auto/N` for I from $JOB_COMPLETION_INDEX. Anything else is bad input, one line."""
    index_text, slash, count_text = text.strip().partition("/")
    if not slash or not count_text.isdigit() or not (index_text.isdigit() or index_text == AUTO):
        raise BadInput(f"--shard {text!r} is not I/N", hint=_HINT)
    count = int(count_text)
    if count < 1:
        raise BadInput(f"--shard {text}: N must be at least 1", hint=_HINT)
    if index_text == AUTO:
        value = environ.get(INDEX_ENV)
        if value is None:
            raise BadInput(f"--shard {text}: ${INDEX_ENV} is not set (an indexed Kubernetes Job sets it)",
                           hint="give the index yourself: --shard I/N")
        if not value.strip().isdigit():
            raise BadInput(f"--shard {text}: ${INDEX_ENV} is {value!r}, not a shard index", hint=_HINT)
        index_text = value.strip()
    index = int(index_text)
    if index >= count:
        raise BadInput(f"--shard {index}/{count}: the index must be below {count} (shards are numbered 0 to {count - 1})",
                       hint=_HINT)
    return Shard(index=index, count=count)


def list_sha256(targets: Sequence[str]) -> str:
    """The whole list, independent of its order: every shard of one run records the same value."""
    return hashlib.sha256("".join(f"{t}\n" for t in sorted(set(targets))).encode("utf-8", "surrogateescape")).hexdigest()


def bounds(total: int, shard: Shard) -> tuple[int, int]:
    """Shard I's run of the sorted list: [start, end). Sizes differ by at most one."""
    return total * shard.index // shard.count, total * (shard.index + 1) // shard.count


def pick(targets: Sequence[str], shard: Shard) -> ShardInfo:
    """The share of `targets` (de-duplicated, in the order given) that `shard` reads: positions
    in that order, so a merge can put every row back where an unsharded run has it."""
    order = list(dict.fromkeys(targets))
    start, end = bounds(len(order), shard)
    mine = set(sorted(order)[start:end])
    return ShardInfo(index=shard.index, count=shard.count, targets=len(order), list_sha256=list_sha256(order),
                     positions=tuple(i for i, t in enumerate(order) if t in mine))
