"""A release's published wheel, fetched the way a user would: `pip download --no-deps`.

pip reads the user's own index settings (pip.conf, `PIP_INDEX_URL`, `PIP_FIND_LINKS`, ...) and
checks the hash the index gives for the file; nothing here names an index. `--only-binary=:all:`
keeps pip from building a source distribution, and `--platform` (passed through) fetches
another platform's wheel. The wheel lives in a temporary folder for the length of the `with`.
`reference add vllm==X`, and `port` and `new` without `--wheel`, all fetch through here.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..distname import filename_name
from ..errors import BadInput, WheelFetchFailed

_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<release>[A-Za-z0-9][A-Za-z0-9._!+]*)$")
_PLATFORM = re.compile(r"^[A-Za-z0-9_.]+$")


def parse_spec(spec: str) -> tuple[str, str]:
    """`vllm==0.34.0` -> ("vllm", "0.34.0"); anything else (a range, an option, a URL) is BadInput."""
    found = _SPEC.match(spec)
    if found is None:
        raise BadInput(f"{spec!r} is not NAME==RELEASE", hint="e.g. dspark-patch reference add vllm==0.34.0")
    return found["name"], found["release"]


@contextmanager
def fetched_wheel(distribution: str, release: str, platform: str | None = None) -> Iterator[Path]:
    """The published `distribution==release` wheel (for `platform`, e.g. manylinux_2_28_aarch64,
    else this machine's), downloaded by pip into a temporary folder removed afterwards."""
    if platform is not None and not _PLATFORM.match(platform):
        raise BadInput(f"--platform {platform!r} is not a wheel platform tag", hint="e.g. manylinux_2_28_aarch64")
    with tempfile.TemporaryDirectory(prefix="dspark-patch-wheel-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                   "--disable-pip-version-check", *(["--platform", platform] if platform else []),
                   "--dest", tmp, f"{distribution}=={release}"]
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
        except OSError as exc:
            raise WheelFetchFailed(f"pip could not be started for {distribution}=={release}: {exc.strerror or exc}",
                                   hint="download the wheel yourself (pip download --no-deps) and give its file") from None
        if done.returncode != 0:
            said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            raise WheelFetchFailed(
                f"pip download {distribution}=={release}{' --platform ' + platform if platform else ''} failed: "
                + (said[-1][:300] if said else f"exit {done.returncode}"),
                hint="check the release and platform, and pip's index settings; or give the wheel file yourself")
        prefix = f"{filename_name(distribution)}-{release}-"
        wheels = sorted(p for p in Path(tmp).iterdir() if p.name.endswith(".whl"))
        if len(wheels) != 1 or not wheels[0].name.lower().startswith(prefix.lower()):
            raise WheelFetchFailed(f"pip download {distribution}=={release} gave {[p.name for p in wheels]}, "
                                   f"not one {prefix}*.whl", hint="give the wheel file yourself")
        yield wheels[0]
