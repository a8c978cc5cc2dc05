"""What the engine needs for one platform of a multi-platform image: its own platform, a
platform's image pulled by digest, and proof that it can run that platform's programs.

A foreign platform runs under emulation (qemu through binfmt_misc on the engine's host). The
engine's host is what matters, and with a remote engine (DOCKER_HOST) that is not this
machine, so emulation is checked on the engine: a container of the image itself is started,
and the kernel's `exec format error` means no emulator is registered for its architecture.
"""

from __future__ import annotations

import docker.errors

from ...errors import EnvironmentProblem
from .client import DockerEngine, reason, removed_by_name

# `uname -m` (what the engine's info reports) -> the architecture images are labelled with.
_ARCHITECTURES = {
    "x86_64": ("amd64", ""),
    "amd64": ("amd64", ""),
    "aarch64": ("arm64", "v8"),
    "arm64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"),
    "ppc64le": ("ppc64le", ""),
    "s390x": ("s390x", ""),
    "riscv64": ("riscv64", ""),
}
# qemu's name for an architecture, as binfmt_misc and Debian's qemu-user-static name handlers.
QEMU_NAMES = {"amd64": "x86_64", "arm64": "aarch64", "arm": "arm", "ppc64le": "ppc64le",
              "s390x": "s390x", "riscv64": "riscv64"}
_EXEC_FORMAT = "exec format error"


class NoEmulation(EnvironmentProblem):
    """The engine cannot run a foreign platform's programs: no emulator is registered."""

    kind = "no-emulation"


def engine_platform(engine: DockerEngine) -> tuple[str, str, str]:
    """(os, architecture, variant) of the engine's host, as image indexes spell them."""
    try:
        info = engine.client.info()
    except docker.errors.APIError as exc:
        raise EnvironmentProblem(f"cannot ask the engine at {engine.host} for its platform: {reason(exc)}") from exc
    machine = str(info.get("Architecture", ""))
    architecture, variant = _ARCHITECTURES.get(machine, (machine, ""))
    return str(info.get("OSType") or "linux"), architecture, variant


def check_emulation(engine: DockerEngine, image_id: str, platform: str, python: str = "python3") -> None:
    """Start the image's own `python -c pass`; an `exec format error` is exit 3 naming the fix.

    Anything else (say, an image without that python) is left for the target to report."""
    architecture = platform.split("/")[1] if "/" in platform else platform
    qemu = QEMU_NAMES.get(architecture, architecture)
    outcome = ""
    try:
        with removed_by_name("emulation", engine.remove_container) as name:
            container = engine.create_container(image_id, name=name, entrypoint=[python, "-c", "pass"],
                                                command=[], user="0")
            container.start()
            status = container.wait(timeout=120)
            if int(status.get("StatusCode", 0)) != 0:
                outcome = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    except docker.errors.APIError as exc:
        outcome = reason(exc)
    if _EXEC_FORMAT in outcome.lower():
        raise NoEmulation(
            f"the engine at {engine.host} cannot run {platform} programs (exec format error): "
            f"no emulator is registered for {qemu}",
            hint=f"on the engine's host install qemu-user-static and register qemu-{qemu} in binfmt_misc "
            "with the F flag (scripts/ensure-binfmt does both on Debian)",
        )
