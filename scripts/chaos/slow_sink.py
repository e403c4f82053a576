#!/usr/bin/env python3
"""An HTTP receiver for the relay's http sink that can be made to stall.

    slow_sink.py PORT DIR

Every POST is recorded at arrival as a line "UNIX_TIME IDEMPOTENCY_KEY" in DIR/arrivals
(flushed at once, before any answer), then answered 200, except while DIR/stall exists: then
the answer waits until the file is removed (60 s at most) and DIR/pending counts the requests
being held. Only 127.0.0.1. Standard library only.
"""
import http.server
import os
import sys
import threading
import time

LOCK = threading.Lock()
PENDING = [0]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        key = self.headers.get("Idempotency-Key", "-")
        stall = os.path.join(DIR, "stall")
        with LOCK:
            with open(os.path.join(DIR, "arrivals"), "a") as f:
                f.write(f"{time.time():.3f} {key}\n")
            held = os.path.exists(stall)
            if held:
                PENDING[0] += 1
                write_pending()
        if held:
            end = time.time() + 60
            while os.path.exists(stall) and time.time() < end:
                time.sleep(0.05)
            with LOCK:
                PENDING[0] -= 1
                write_pending()
        try:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except OSError:
            pass  # the relay that sent it is gone

    def log_message(self, *args):
        pass


def write_pending():
    tmp = os.path.join(DIR, "pending.new")
    with open(tmp, "w") as f:
        f.write(f"{PENDING[0]}\n")
    os.replace(tmp, os.path.join(DIR, "pending"))


if __name__ == "__main__":
    PORT, DIR = int(sys.argv[1]), sys.argv[2]
    write_pending()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    server.serve_forever()
