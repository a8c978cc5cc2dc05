"""What a read-only view of a target hands to `dspark-patch status`: one site folder's files.

A view (an image read through the engine's archive API, or a local folder) fills this in
without running any code of the target; `status.assess` turns it into patch-set states and
the integrity lists. Paths are posix and relative to `location`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class SiteFiles:
    location: str                       # the site folder holding the distribution
    distribution: str                   # its name as its METADATA spells it
    release: str                        # its version (METADATA)
    python: str | None                  # "3.11": the site folder's interpreter version, if known
    record: tuple[tuple[str, str | None], ...]   # RECORD rows: (path, sha256 hex or None)
    hashes: Mapping[str, str]           # sha256 hex of every regular file in the distribution's own folders
    others: tuple[str, ...] = ()        # other entries there that are not regular files (symlinks, devices)
    top_level: tuple[str, ...] = ()     # names of the site folder's top-level files (for .pth)
    listed_anywhere: frozenset[str] = frozenset()  # paths any distribution's RECORD in the site folder lists
    unimported: tuple[str, ...] = ()    # other site folders holding the distribution that no interpreter imports
    pth: Mapping[str, bytes | None] = field(default_factory=dict)  # top-level .pth bytes (None: over references.PTH_CAP)
    dist_infos: tuple[str, ...] = ()    # every `<distribution>-*.dist-info` folder there (more than one is an error)
    # Bytecode facts for `status` (which runs nothing; targets/views/facts.py): the first 16 bytes of
    # every .pyc in the own folders; per .py (mtime, size, importlib source hash under this
    # host's magic number or None); the bytes of the files known patch sets change and of their
    # bytecode (status/bytecode.py recompiles those).
    pyc_headers: Mapping[str, bytes] = field(default_factory=dict)
    sources: Mapping[str, tuple[int, int, bytes | None]] = field(default_factory=dict)
    retained: Mapping[str, bytes] = field(default_factory=dict)
    # The installer's own files (references/installer.py judges them): the bytes of the
    # dist-info's files named like installer metadata (None: over its cap), and per console-script
    # RECORD row the file it names (bytes; None: no file there; a string: why it was not read).
    metadata: Mapping[str, bytes | None] = field(default_factory=dict)
    scripts: Mapping[str, bytes | str | None] = field(default_factory=dict)
