"""Write the new image layer, as a tar, to stdout: the given files and every folder above them.

Each entry carries the owner, mode and mtime it has in this container (the files were written
keeping the pre-image's owner and mode; folders are as the image has them), so the layer is what
`docker commit` would have taken from the container for these paths and nothing else.
Usage: python -B -c SOURCE FILE... (absolute paths of regular files); the tar on stdout.
"""

import os
import stat
import sys
import tarfile


def layer(paths, out):
    entries = set()
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
        for entry in sorted(entries):
            tar.add(entry, arcname=entry.lstrip("/"), recursive=False)


if __name__ == "__main__":
    layer(sys.argv[1:], sys.stdout.buffer)
    sys.stdout.buffer.flush()
