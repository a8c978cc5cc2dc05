"""Stands in for a model server in tests: log lines, a ready line, then wait to be stopped."""

import os
import signal
import sys
import time

# As PID 1 python ignores SIGTERM unless told; a real server stops on it.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

print("starting server-double with args:", " ".join(sys.argv[1:]))
print("DOUBLE_GREETING=" + os.environ.get("DOUBLE_GREETING", "<unset>"))
if "--exit-now" in sys.argv:
    print("exiting as asked")
    sys.exit(3)
print("Available KV cache memory: 6.76 GiB")
print("server ready")
while True:
    time.sleep(3600)
