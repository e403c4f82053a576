#!/usr/bin/env python3
"""Records the notifications `paynotify replay` forges, so the chaos scenarios can send the
very same bytes to several instances, again and again, and mutate them.

    capture.py PORT DIR

A request to /<name>/notify/... is stored as DIR/<name>.path (the notify path), DIR/<name>.hdr
(its headers, one `Name: value` a line, for `curl -H @file`) and DIR/<name>.body (the raw
body), then answered the way the provider expects a success (204 for WeChat Pay, `success`
for Alipay). Only 127.0.0.1. Standard library only.
"""
import http.server
import os
import sys

SKIP = {"host", "content-length", "connection", "accept", "accept-encoding", "user-agent"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        parts = self.path.lstrip("/").split("/", 1)
        name, path = parts[0], "/" + (parts[1] if len(parts) > 1 else "")
        if not name or "." in name or len(parts) < 2:
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        base = os.path.join(DIR, name)
        with open(base + ".body.tmp", "wb") as f:
            f.write(body)
        with open(base + ".hdr.tmp", "w") as f:
            for k, v in self.headers.items():
                if k.lower() not in SKIP:
                    f.write(f"{k}: {v}\n")
        with open(base + ".path.tmp", "w") as f:
            f.write(path)
        for ext in (".body", ".hdr", ".path"):
            os.replace(base + ext + ".tmp", base + ext)
        if "wechat" in path:
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_response(200)
            self.send_header("Content-Length", "7")
            self.end_headers()
            self.wfile.write(b"success")

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    PORT, DIR = int(sys.argv[1]), sys.argv[2]
    os.makedirs(DIR, exist_ok=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
