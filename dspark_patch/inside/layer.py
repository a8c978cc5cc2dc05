"""Write the new image layer, as a tar, to a new file: the given files and every folder above them.

Each entry carries the owner, mode and mtime it has in this container (the files were written
keeping the pre-image's owner and mode; folders are as the image has them), so the layer is what
`docker commit` would have taken from the container for these paths and nothing else.
A path after `--delete` is written as a whiteout (`.wh.NAME`, an empty file beside it), the OCI
layer's way of removing a file the lower layers hold.
Usage: python -B -c SOURCE [--delete PATH]... FILE... (absolute paths). The tar goes to a new
temporary file (never through the exec's output stream, which some engines' exec attach
corrupts for large binary output); stdout is one JSON line naming it, with its sha256 and size,
for the host to read it through the engine's archive API and check it.
"""

import os
import stat
import sys
import tarfile


def layer(paths, deleted, out):
    entries = set()
    whiteouts = set()
    for path in deleted:
        folder, name = os.path.split(path)
        if not os.path.isdir(folder):  # nothing below can hold it: nothing to remove
            continue
        whiteouts.add(os.path.join(folder, ".wh." + name))
        while folder != "/":
            entries.add(folder)
            folder = os.path.dirname(folder)
    for path in paths:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise SystemExit(f"{path} is not a regular file")
        entries.add(path)
        folder = os.path.dirname(path)
        while folder != "/":
            entries.add(folder)
            folder = os.path.dirname(folder)
    # Sorted: every folder comes before what it holds.
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries | whiteouts):
            if entry in whiteouts:
                member = tarfile.TarInfo(entry.lstrip("/"))
                member.mode = 0o644
                tar.addfile(member)
            else:
                tar.add(entry, arcname=entry.lstrip("/"), recursive=False)


def _parse(argv):
    paths, deleted = [], []
    args = iter(argv)
    for arg in args:
        if arg == "--delete":
            deleted.append(next(args))
        else:
            paths.append(arg)
    return paths, deleted


if __name__ == "__main__":
    import hashlib
    import json
    import tempfile

    files, gone = _parse(sys.argv[1:])
    fd, where = tempfile.mkstemp(prefix=".dspark-layer-", suffix=".tar")
    with os.fdopen(fd, "w+b") as out:
        layer(files, gone, out)
        out.flush()
        out.seek(0)
        digest = hashlib.sha256()
        size = 0
        for chunk in iter(lambda: out.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    print(json.dumps({"path": where, "sha256": digest.hexdigest(), "size": size}))
