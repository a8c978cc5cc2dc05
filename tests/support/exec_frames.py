"""An exec's output as the engine sends it: Docker's multiplexed frames (an 8-byte header, the
stream id and the length, then the data), on a real socket whose far end has closed."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


def ended_output(frames: Iterable[tuple[int, bytes]]) -> socket.socket:
    """The near end of a socket pair holding `frames` (stream, data), the far end closed."""
    near, far = socket.socketpair()
    with far:
        far.sendall(b"".join(frame(stream, data) for stream, data in frames if data))
    return near


def output_of(stdout: bytes | None, stderr: bytes | None) -> socket.socket:
    return ended_output([(1, stdout or b""), (2, stderr or b"")])
