"""A loopback HTTP proxy in front of a real registry, for the faults the registry will not make.

Debian's distribution never answers 429 and never closes a connection in the middle of an
answer; a registry behind a load balancer does both. The proxy forwards every request to the
real registry (tests/support/registry.py) unchanged and counts them by path; per path it can:

- `throttle`: answer 429 with `Retry-After` (seconds, or an HTTP date) the first time, and 429
  again to any request for that path that comes before the wait has passed, so a client that
  honours the wait asks exactly twice and one that does not asks more (counted, not timed);
- `drop`: send the status, the headers and half the body, then close the socket (`times` times).
"""

from __future__ import annotations

import email.utils
import http.client
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


@dataclass
class Faults:
    throttle: str | None = None        # a regex of paths answered 429 first
    wait_s: int = 1                    # the Retry-After it asks for
    http_date: bool = False            # say it as an HTTP date instead of seconds
    drop: str | None = None            # a regex of paths whose answer is broken off
    drop_times: int = 1                # how many times per path (a large number: always)
    requests: Counter[str] = field(default_factory=Counter)   # path -> requests seen
    throttled: Counter[str] = field(default_factory=Counter)  # path -> 429s sent
    dropped: Counter[str] = field(default_factory=Counter)    # path -> answers broken off
    _until: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(upstream: str, faults: Faults) -> type[BaseHTTPRequestHandler]:
    host, port = upstream.rsplit(":", 1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _any(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            with faults._lock:
                faults.requests[path] += 1
                throttle = self._throttle(path)
                drop = faults.drop is not None and re.search(faults.drop, path) is not None \
                    and faults.dropped[path] < faults.drop_times
                if drop:
                    faults.dropped[path] += 1
            if throttle is not None:
                self.send_response(429)
                self.send_header("Retry-After", throttle)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if drop:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)
            finally:
                conn.close()

        def _throttle(self, path: str) -> str | None:
            """The Retry-After to answer with now, or None to forward (caller holds the lock)."""
            if faults.throttle is None or re.search(faults.throttle, path) is None:
                return None
            until = faults._until.get(path)
            now = time.time()
            if until is None:
                until = faults._until[path] = (int(now) + 1 + faults.wait_s) if faults.http_date else now + faults.wait_s
            elif now >= until:
                return None
            faults.throttled[path] += 1
            if faults.http_date:
                return email.utils.formatdate(until, usegmt=True)
            return str(max(1, round(until - now)))

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any

    return Handler


@contextmanager
def fault_proxy(upstream: str, faults: Faults) -> Iterator[str]:
    """Yields 'host:port' of a proxy to `upstream` ('127.0.0.1:PORT') that makes `faults`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(upstream, faults))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


__all__ = ["Faults", "fault_proxy"]
