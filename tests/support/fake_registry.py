"""A loopback HTTP server that speaks just enough of the distribution API to serve bytes that a
real registry refuses to store: malformed index JSON, oversized bodies, an answer that never
comes. Debian's `docker-registry` validates what is pushed, so these faults cannot be caused
with it; everything a well-formed hostile index can do is tested against the real one.

`served` maps `repo/manifests/REF` to (Content-Type, body) or to one of the behaviours
`HANG` (accept, never answer) and `HUGE` (stream more than any manifest may be, no length).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG = "hang"
HUGE = "huge"
HUGE_BYTES = 6 << 20


class _Handler(BaseHTTPRequestHandler):
    served: Mapping[str, tuple[str, bytes] | str] = {}
    requests_seen: list[str]
    stop: threading.Event

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.requests_seen.append(f"GET {self.path}")
        if self.path == "/v2/":
            self._answer(200, "application/json", b"{}")
            return
        key = self.path.removeprefix("/v2/")
        what = self.served.get(key)
        if what is None:
            self._answer(404, "application/json", b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
        elif what == HANG:
            self.stop.wait(60)
        elif what == HUGE:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
            self.end_headers()
            chunk = b" " * (64 << 10)
            sent = 0
            try:
                while sent < HUGE_BYTES and not self.stop.is_set():
                    self.wfile.write(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the client stopped reading, as it should
        else:
            content_type, body = what  # type: ignore[misc]
            self._answer(200, content_type, body)

    def _answer(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that stops reading an oversized body is what the tests want


@contextmanager
def fake_registry(served: Mapping[str, tuple[str, bytes] | str]) -> Iterator[tuple[str, list[str]]]:
    """Yields ('127.0.0.1:PORT', the request lines it saw); stops it afterwards."""
    stop = threading.Event()
    seen: list[str] = []
    handler = type("Handler", (_Handler,), {"served": dict(served), "requests_seen": seen, "stop": stop})
    server = _Server(("127.0.0.1", 0), handler)
    # A short poll: shutdown() waits out serve_forever's poll (0.5 s by default) on every stop.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
