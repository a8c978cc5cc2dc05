"""The sha256 of every regular file under some folders of a work container, computed here, on
the host, from the bytes the engine's archive API streams (`ImageTarget.file_hashes`).

Why: the integrity check (inside/integrity.py) hashes every file of the distribution's folders
with the image's own interpreter; under emulation that is the hashing of some 800 MB (the aarch64
vLLM wheel's shared objects) by an emulated hashlib, 15-20 s of CPU that the emulated probe
needs. The hash of a file is a function of its bytes alone, and these are the same bytes: the
engine reads the container's own filesystem, where nothing but the tool's processes runs (the
check runs before anything is written, and the early probe only reads). The image's python still
walks the folders (lstat before open, what is a regular file, its size) and gives every other
fact; the host takes these hashes only when its archive lists exactly the regular files the walk
found, with the same sizes (pipeline/integrity_check.py `check_integrity`), and otherwise the
walk hashes as before.

The archive is hostile input like a layer: it is read with the strict tar reader, and anything
it refuses, or a hard link to a file it has not seen, is "cannot tell" (None), never a hash.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
from collections.abc import Sequence

import docker.errors

from ...errors import DsparkPatchError
from ..layers import TarStream
from .reader import ChunkReader


def folder_hashes(api: object, container_id: str, location: str,
                  folders: Sequence[str]) -> dict[str, tuple[str, int]] | None:
    """{path relative to `location`: (sha256, size)} of the regular files under each folder
    (hard links counted as the file they name; links, devices and FIFOs left out, as the walk
    leaves them out); None when an archive cannot be read strictly."""
    found: dict[str, tuple[str, int]] = {}
    for folder in folders:
        parent, base = posixpath.split(folder)
        absolute = posixpath.join(location, folder)
        try:
            chunks, _ = api.get_archive(container_id, absolute, chunk_size=1 << 20)  # type: ignore[attr-defined]
        except docker.errors.NotFound:
            continue  # the walk finds no such folder either
        except docker.errors.APIError:
            return None
        stream = TarStream(io.BufferedReader(ChunkReader(chunks), 1 << 20), where=f"the engine's tar of {absolute}")
        try:
            for member in stream:
                if member.name != base and not member.name.startswith(base + "/"):
                    return None  # not the folder asked for (a link the engine followed, say)
                rel = posixpath.join(parent, member.name)
                if member.kind == "file":
                    digest = hashlib.sha256()
                    for chunk in stream.chunks():
                        digest.update(chunk)
                    found[rel] = (digest.hexdigest(), member.size)
                elif member.kind == "hardlink":
                    target = found.get(posixpath.join(parent, member.linkname))
                    if target is None:
                        return None
                    found[rel] = target
        except DsparkPatchError:
            return None
    return found
