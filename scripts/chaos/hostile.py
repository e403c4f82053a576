#!/usr/bin/env python3
"""Hostile input for paynotify: mutations of genuine notifications, sent over raw sockets, and
slow-loris connections. Standard library only; 127.0.0.1 only; every loop bounded.

    hostile.py mutate PORT CAPDIR COUNT SEED MAX_BODY   -> prints "STATUS KIND" per request
    hostile.py loris PORT CAPDIR COUNT HOLD_SECS        -> prints "STATUS KIND" per connection

CAPDIR holds notifications recorded by capture.py (NAME.path, NAME.hdr, NAME.body).
STATUS is the HTTP status answered, or "closed" (connection closed without an answer) or
"timeout" (no answer within 20 s).
"""
import os
import random
import socket
import sys
import time


def load(capdir):
    out = []
    for f in sorted(os.listdir(capdir)):
        if f.endswith(".body"):
            base = os.path.join(capdir, f[:-5])
            path = open(base + ".path").read().strip()
            hdrs = [tuple(l.split(": ", 1)) for l in open(base + ".hdr").read().splitlines() if ": " in l]
            out.append((path, hdrs, open(base + ".body", "rb").read()))
    return out


def request(path, headers, body, content_length=None, raw_head=None):
    if raw_head is not None:
        return raw_head + body
    lines = [f"POST {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    for k, v in headers:
        k = k if isinstance(k, bytes) else k.encode()
        v = v if isinstance(v, bytes) else v.encode("utf-8", "surrogateescape")
        lines.append(k + b": " + v)
    cl = len(body) if content_length is None else content_length
    if cl is not False:
        lines.append(f"Content-Length: {cl}".encode())
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def send(port, data, timeout=20):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        buf = b""
        deadline = time.time() + timeout
        while b"\r\n" not in buf and time.time() < deadline:
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                return "timeout"
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
        if not buf.startswith(b"HTTP/"):
            return "closed"
        return buf.split(b" ", 2)[1].decode()
    finally:
        s.close()


def mutations(rng, path, hdrs, body, max_body):
    """One mutated request (bytes) and the name of the mutation."""
    kind = rng.choice([
        "truncate", "flip-body", "flip-header", "drop-header", "dup-header", "junk-headers",
        "huge-header", "invalid-utf8-header", "invalid-utf8-body", "gbk-junk", "size-limit",
        "short-length", "wrong-path", "garbage-line", "empty-body", "chunked-junk", "stale-ts",
    ])
    h = list(hdrs)
    b = body
    if kind == "truncate":
        b = body[: rng.randrange(0, max(1, len(body)))]
    elif kind == "flip-body":
        b = bytearray(body)
        for _ in range(rng.randint(1, 5)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        b = bytes(b)
    elif kind == "flip-header":
        i = rng.randrange(len(h))
        k, v = h[i]
        if v:
            j = rng.randrange(len(v))
            v = v[:j] + chr((ord(v[j]) ^ 1) or 65) + v[j + 1:]
        h[i] = (k, v)
    elif kind == "drop-header":
        del h[rng.randrange(len(h))]
    elif kind == "dup-header":
        k, v = h[rng.randrange(len(h))]
        h.append((k, v + "0"))
    elif kind == "junk-headers":
        h += [(f"X-Junk-{n}", "x" * rng.randint(0, 200)) for n in range(rng.randint(1, 80))]
    elif kind == "huge-header":
        k, _ = h[rng.randrange(len(h))]
        h.append((k, "A" * rng.choice([4000, 8000, 16000, 40000])))
    elif kind == "invalid-utf8-header":
        i = rng.randrange(len(h))
        h[i] = (h[i][0], h[i][1].encode() + b"\xff\xfe\xc3\x28")
    elif kind == "invalid-utf8-body":
        i = rng.randrange(len(body) + 1)
        b = body[:i] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28"]) + body[i:]
    elif kind == "gbk-junk":
        junk = bytes(rng.randrange(0x81, 0xFF) for _ in range(rng.randint(1, 40)))
        if b"charset=" in body:
            b = body.replace(b"charset=utf-8", b"charset=GBK").replace(b"charset=UTF-8", b"charset=GBK")
        b = b + b"&subject=" + junk
    elif kind == "size-limit":
        size = max_body + rng.choice([-1, 0, 1, 2, 1024, max_body])
        b = (body * (size // max(1, len(body)) + 1))[:size]
    elif kind == "short-length":
        cut = rng.randint(1, 50)
        return request(path, h, body, content_length=max(0, len(body) - cut)), f"{kind}-{cut}"
    elif kind == "wrong-path":
        path = rng.choice(["/notify/alipay", "/notify/wechat/pay", "/notify/wechat/refund"])
        if path in ("/notify/alipay",) and b"{" not in body[:1]:
            path = "/notify/wechat/refund"
    elif kind == "garbage-line":
        head = rng.choice([b"POST /notify/wechat/pay HTTP/9.9\r\n", b"\x00\xff GARBAGE\r\n",
                           b"POST  HTTP/1.1\r\n", b"POST /notify/alipay HTTP/1.1\r\nHost\r\n"])
        return head + b"\r\n" + body, kind
    elif kind == "empty-body":
        b = b""
    elif kind == "chunked-junk":
        h.append(("Transfer-Encoding", "chunked"))
        return request(path, h, b"zz\r\n" + body[:10] + b"\r\n0\r\n\r\n", content_length=False), kind
    elif kind == "stale-ts":
        h = [(k, "1500000000" if k.lower() == "wechatpay-timestamp" else v) for k, v in h]
        if not any(k.lower() == "wechatpay-timestamp" for k, _ in h):
            b = body.replace(b"notify_time=", b"notify_time=1999-")
    return request(path, h, b), kind


def main():
    mode = sys.argv[1]
    port = int(sys.argv[2])
    caps = load(sys.argv[3])
    if mode == "mutate":
        count, seed, max_body = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
        rng = random.Random(seed)
        for _ in range(count):
            path, hdrs, body = rng.choice(caps)
            data, kind = mutations(rng, path, hdrs, body, max_body)
            print(send(port, data), kind, flush=True)
    elif mode == "loris":
        count, hold = int(sys.argv[4]), float(sys.argv[5])
        socks = []
        for n in range(count):
            path, hdrs, body = caps[n % len(caps)]
            s = socket.create_connection(("127.0.0.1", port), timeout=hold + 20)
            full = request(path, hdrs, body)
            if n % 2 == 0:
                s.sendall(full[: full.index(b"\r\n\r\n") // 2])  # half the head, never the rest
                socks.append((s, "partial-head"))
            else:
                s.sendall(full[: full.index(b"\r\n\r\n") + 4 + len(body) // 3])  # a stalled body
                socks.append((s, "stalled-body"))
        time.sleep(hold)
        for s, kind in socks:
            s.settimeout(20)
            try:
                buf = s.recv(4096)
                status = buf.split(b" ", 2)[1].decode() if buf.startswith(b"HTTP/") else "closed"
            except socket.timeout:
                status = "timeout"
            except OSError:
                status = "closed"
            print(status, kind, flush=True)
            s.close()


if __name__ == "__main__":
    main()
