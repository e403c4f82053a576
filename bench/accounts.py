"""Helpers for bench/accounts.sh (python3 standard library only).

  accounts.py add URL TOKEN FROM COUNT CLIENTS CREDS PUBLIC_PEM PRIVATE_PEM
      POSTs COUNT WeChat direct accounts (FROM, FROM+1, …) to /admin/merchants from CLIENTS
      threads. Account i: mchid 1901000000+i, platform key serial PUB_KEY_ID_<i in 34 digits>
      (every account shares the one public key PEM, under its own serial), APIv3 key
      APIV3<i in 27 digits>; with CREDS=all also the merchant's private key (one PEM for all).
      Prints "added=… failed=… seconds=… first_p50_ms=… last_p50_ms=…" (the p50 of the first
      and the last tenth of the adds).

  accounts.py send HOST PORT RATE SECONDS FILE...
      Open loop: request k is due at start + k/RATE and goes out on a free connection at that
      time, whatever the answers before it; its latency is counted from when it was due, so a
      slow answer delays nobody's count but its own (no coordinated omission). Requests are
      taken round robin from the FILEs (`paynotify forge` files), one label per file. Prints
      "label sent=… ok=… p50_us=… p90_us=… p99_us=…" per file.
"""

import http.client
import json
import queue
import socket
import sys
import threading
import time


def body(i, creds, public_pem, private_pem):
    keys = {
        "apiv3_key": f"APIV3{i:027d}",
        "platform_keys": [{"serial": f"PUB_KEY_ID_{i:034d}", "public_key_pem": public_pem}],
    }
    if creds:
        keys["private_key_pem"] = private_pem
        keys["merchant_serial"] = "3775B6A45ACD588826D15E583A95F5DD2C4E7A01"
    return json.dumps(
        {
            "channel": "wechat",
            "account": str(1901000000 + i),
            "mode": "direct",
            "appids": ["wx5a1d0b3c7e9f2468"],
            "api_base": "https://api.mch.weixin.qq.com",
            "certificates": "static",
            "keys": keys,
        }
    )


def add(url, token, first, count, clients, creds, public_file, private_file):
    host, port = url.split(":")
    public_pem = open(public_file).read()
    private_pem = open(private_file).read()
    todo = queue.Queue()
    for i in range(first, first + count):
        todo.put(i)
    took = {}
    failed = []
    lock = threading.Lock()

    def client():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            payload = body(i, creds, public_pem, private_pem)
            t0 = time.perf_counter()
            try:
                conn.request(
                    "POST",
                    "/admin/merchants",
                    payload,
                    {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                )
                r = conn.getresponse()
                text = r.read()
                status = r.status
            except (OSError, http.client.HTTPException) as e:
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                status, text = 0, str(e).encode()
            dt = time.perf_counter() - t0
            with lock:
                if status == 201 or status == 200:
                    took[i] = dt
                else:
                    failed.append((i, status, text[:200]))

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    for i, status, text in failed[:3]:
        print(f"failed: account {i}: {status} {text!r}", file=sys.stderr)
    order = [took[i] for i in sorted(took)]
    tenth = max(1, len(order) // 10)

    def p50(v):
        return sorted(v)[len(v) // 2] * 1000 if v else float("nan")

    print(
        f"added={len(took)} failed={len(failed)} seconds={seconds:.1f} "
        f"first_p50_ms={p50(order[:tenth]):.1f} last_p50_ms={p50(order[-tenth:]):.1f}"
    )


def records(path):
    out = []
    with open(path, "rb") as f:
        while True:
            line = f.readline()
            if not line:
                return out
            out.append(f.read(int(line)))


def read_answer(sock, buf):
    """Reads one HTTP/1.1 answer (Content-Length framed); returns (status, rest of buf)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for h in lines[1:]:
        name, _, value = h.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed")
        rest += chunk
    return status, rest[length:]


def send(host, port, rate, seconds, files):
    streams = [records(f) for f in files]
    total = int(rate * seconds)
    per = [min(len(s), total // len(streams) + 1) for s in streams]
    plan = []  # (due offset, stream, request)
    k = 0
    cursors = [0] * len(streams)
    while k < total:
        s = k % len(streams)
        if cursors[s] >= per[s]:
            break
        plan.append((k / rate, s, streams[s][cursors[s]]))
        cursors[s] += 1
        k += 1
    results = [[] for _ in streams]
    bad = [0] * len(streams)
    lock = threading.Lock()
    free = queue.Queue()
    # Enough connections that one is free when a request is due (answers take ms; rate/50
    # covers 20 ms answers), each a thread of its own.
    conns = max(4, int(rate / 50))
    jobs = [queue.Queue() for _ in range(conns)]

    def worker(j):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        free.put(j)
        while True:
            job = jobs[j].get()
            if job is None:
                return
            due, s, req = job
            try:
                sock.sendall(req)
                status, buf = read_answer(sock, buf)
            except (OSError, ValueError):
                status, buf = 0, b""
                sock = socket.create_connection((host, port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            done = time.perf_counter()
            with lock:
                results[s].append(done - due)
                if status not in (200, 204):
                    bad[s] += 1
            free.put(j)

    threads = [threading.Thread(target=worker, args=(j,), daemon=True) for j in range(conns)]
    for t in threads:
        t.start()
    start = time.perf_counter() + 0.2
    for offset, s, req in plan:
        due = start + offset
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        j = free.get()  # a wait here is counted: latency runs from `due`
        jobs[j].put((due, s, req))
    for _ in range(conns):
        j = free.get()
        jobs[j].put(None)
    for s, f in enumerate(files):
        v = sorted(results[s])

        def q(p):
            return int(v[min(len(v) - 1, int(len(v) * p))] * 1e6) if v else 0

        label = f.rsplit("/", 1)[-1]
        print(f"{label} sent={len(v)} bad={bad[s]} p50_us={q(0.5)} p90_us={q(0.9)} p99_us={q(0.99)}")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "add":
        url, token, first, count, clients, creds, pub, priv = sys.argv[2:10]
        add(url, token, int(first), int(count), int(clients), creds == "all", pub, priv)
    elif what == "send":
        host, port, rate, seconds = sys.argv[2:6]
        send(host, int(port), float(rate), float(seconds), sys.argv[6:])
    else:
        sys.exit(__doc__)
