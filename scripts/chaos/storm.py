#!/usr/bin/env python3
"""A provider-like notification storm for the failover scenarios, and the verdict on it.

    storm.py create --url U --token TOKEN --amount FEN ORDER...
        creates the orders through POST /orders (retried until 200/201, bounded).
    storm.py run --url U[,U2...] --rate R --rounds K --out LOG [--deadline S] REQUESTS:PREFIX...
        sends every notification of the REQUESTS files (written by `paynotify forge`, order
        numbers PREFIX1, PREFIX2, ...) K times: round after round, one send every 1/R s.
        Like a provider, every answer other than 2xx is retried (after --retry-delay s, on the
        next URL) until a 2xx or --deadline; each attempt is one line of LOG:
        sent order round attempt code answered (times in epoch seconds; code 0: no answer).
    storm.py report --log LOG --fault-at EPOCH --db DUMP --delivered KEYS [--json OUT]
        the figures and the checks: acked (orders answered 2xx), lost (acked, not PAID on the
        surviving writer), lost at the fault (acked before it, no callback row from before it),
        healed (lost at the fault, PAID in the end), doubled (more than one ORDER_PAID, or any
        PAYMENT_ANOMALY), 5xx, recovery (from the fault to the first payment acknowledged by a
        request sent after the first failure it caused), undelivered events (PAID, never
        delivered) and events for unpaid orders. DUMP: one line per order, order_no status
        callback_epoch order_paid_events anomalies (tab-separated, from SQL on the surviving
        writer); KEYS: the ORDER_PAID biz_keys the sink delivered, one a line.
        Exit status 1 when a check failed.

Bounded in count and time; standard library only; 127.0.0.1 only.
"""
import argparse
import heapq
import http.client
import json
import queue
import sys
import threading
import time
import urllib.parse


def parse_requests(path, prefix):
    """The raw requests of a `paynotify forge` file: [(order_no, path, headers, body)]."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos, n = 0, 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        length = int(data[pos:nl])
        raw = data[nl + 1 : nl + 1 + length]
        pos = nl + 1 + length
        head, body = raw.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        target = lines[0].split(" ")[1]
        headers = {}
        for line in lines[1:]:
            k, v = line.split(":", 1)
            if k.lower() not in ("host", "content-length"):
                headers[k] = v.strip()
        n += 1
        out.append((f"{prefix}{n}", target, headers, body))
    return out


class Sender:
    """One keep-alive connection per base URL and thread."""

    def __init__(self, urls, timeout):
        self.urls = [urllib.parse.urlsplit(u) for u in urls]
        self.timeout = timeout
        self.conns = {}

    def post(self, index, path, headers, body):
        u = self.urls[index % len(self.urls)]
        for fresh in (False, True):
            conn = self.conns.get(index % len(self.urls))
            if conn is None or fresh:
                if conn is not None:
                    conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=self.timeout)
                self.conns[index % len(self.urls)] = conn
            try:
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                if resp.getheader("connection", "").lower() == "close":
                    conn.close()
                    self.conns.pop(index % len(self.urls), None)
                return resp.status
            except (OSError, http.client.HTTPException):
                conn.close()
                self.conns.pop(index % len(self.urls), None)
                if fresh:
                    return 0
        return 0


def run(args):
    reqs = []
    for spec in args.requests:
        path, prefix = spec.split(":", 1)
        reqs.extend(parse_requests(path, prefix))
    urls = args.url.split(",")
    k = args.rounds
    total = len(reqs) * k
    start = time.time()
    deadline = start + args.deadline
    heap, seq = [], 0
    # Round after round: round r of request i is due at (r * len + i) / rate.
    for r in range(k):
        for i in range(len(reqs)):
            slot = r * len(reqs) + i
            heapq.heappush(heap, (start + slot / args.rate, seq, i, r, 0))
            seq += 1
    cond = threading.Condition()
    work = queue.Queue()
    done = {"acked": 0, "gave_up": 0}
    log = open(args.out, "w", buffering=1)
    log_lock = threading.Lock()

    def worker():
        sender = Sender(urls, args.timeout)
        while True:
            item = work.get()
            if item is None:
                return
            i, r, attempt = item
            order, path, headers, body = reqs[i]
            sent = time.time()
            code = sender.post(i + r + attempt, path, headers, body)
            with log_lock:
                log.write(f"{sent:.3f}\t{order}\t{r}\t{attempt}\t{code}\t{time.time():.3f}\n")
            with cond:
                if 200 <= code < 300:
                    done["acked"] += 1
                elif time.time() + args.retry_delay < deadline and attempt + 1 < args.tries:
                    nonlocal_seq[0] += 1
                    heapq.heappush(heap, (time.time() + args.retry_delay, nonlocal_seq[0], i, r, attempt + 1))
                    cond.notify()
                else:
                    done["gave_up"] += 1
                    with log_lock:
                        log.write(f"{time.time():.3f}\t{order}\t{r}\t{attempt}\tgave-up\t{time.time():.3f}\n")
                cond.notify()

    nonlocal_seq = [seq]
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.threads)]
    for t in threads:
        t.start()
    with cond:
        while done["acked"] + done["gave_up"] < total:
            now = time.time()
            if now > deadline + args.timeout + 1:
                break
            if heap and heap[0][0] <= now:
                _, _, i, r, attempt = heapq.heappop(heap)
                work.put((i, r, attempt))
                continue
            wait = (heap[0][0] - now) if heap else 0.5
            cond.wait(timeout=min(max(wait, 0.001), 0.5))
    left = len(heap)
    for _ in threads:
        work.put(None)
    log.close()
    print(
        f"storm: {len(reqs)} orders x {k} deliveries in {time.time() - start:.1f} s; "
        f"{done['acked']} answered 2xx, {done['gave_up'] + left} given up",
        file=sys.stderr,
    )
    return 0 if done["acked"] == total else 1


def create(args):
    base = urllib.parse.urlsplit(args.url)
    failed = []

    def one(order):
        body = json.dumps(
            {"order_no": order, "amount_fen": args.amount, "currency": "CNY", "subject": "failover"}
        )
        headers = {
            "Authorization": f"Bearer {args.token}",
            "Idempotency-Key": f"ck-{order}",
            "content-type": "application/json",
        }
        for _ in range(40):
            try:
                conn = http.client.HTTPConnection(base.hostname, base.port, timeout=10)
                conn.request("POST", "/orders", body=body, headers=headers)
                status = conn.getresponse().status
                conn.close()
                if status in (200, 201):
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.25)
        failed.append(order)

    orders = list(args.orders)
    chunks = [orders[i :: args.threads] for i in range(args.threads)]
    threads = [threading.Thread(target=lambda c=c: [one(o) for o in c]) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        print(f"storm: could not create {len(failed)} orders, e.g. {failed[:3]}", file=sys.stderr)
        return 1
    return 0


def report(args):
    first_ok, codes = {}, {}
    n5xx = n5xx_after = other = 0
    last_5xx = first_fail = None
    gave_up = set()
    rows = []
    with open(args.log) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 6:
                continue
            sent, order, code, done = float(parts[0]), parts[1], parts[4], float(parts[5])
            codes[code] = codes.get(code, 0) + 1
            if code == "gave-up":
                gave_up.add(order)
                continue
            c = int(code)
            rows.append((sent, order, c, done))
            if 200 <= c < 300:
                if order not in first_ok or done < first_ok[order]:
                    first_ok[order] = done
            else:
                if sent >= args.fault_at and (first_fail is None or done < first_fail):
                    first_fail = done
                if 500 <= c < 600 or c == 0:
                    n5xx += 1
                    if done >= args.fault_at:
                        n5xx_after += 1
                        last_5xx = done if last_5xx is None else max(last_5xx, done)
            if c != 0 and not (200 <= c < 300 or c == 503):
                other += 1
    # Recovery: from the fault to the first payment acknowledged for the first time by a
    # request sent after the first failure the fault caused (0 when nothing failed); the
    # first 2xx of any kind (a duplicate answered without a write) likewise.
    first_any = first_new = None
    if first_fail is None:
        first_any = first_new = args.fault_at
    else:
        for sent, order, c, done in rows:
            if 200 <= c < 300 and sent >= first_fail:
                first_any = done if first_any is None else min(first_any, done)
                if first_ok.get(order) == done:
                    first_new = done if first_new is None else min(first_new, done)
    db = {}
    with open(args.db) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 5:
                continue
            order, status, cb, events, anomalies = parts[:5]
            db[order] = {
                "status": status,
                "cb": float(cb) if cb not in ("", "\\N", "NULL") else None,
                "events": int(events),
                "anomalies": int(anomalies),
            }
    delivered = set()
    if args.delivered:
        with open(args.delivered) as f:
            delivered = {line.strip() for line in f if line.strip()}
    acked = set(first_ok)
    lost = sorted(o for o in acked if db.get(o, {}).get("status") != "PAID")
    # Acked before the fault, and the surviving writer has no callback row from before it:
    # the write was gone with the old primary (a later delivery or a recheck may have
    # applied it again).
    lost_at_fault = sorted(
        o
        for o in acked
        if first_ok[o] < args.fault_at
        and (db.get(o, {}).get("cb") is None or db[o]["cb"] > args.fault_at)
    )
    healed = [o for o in lost_at_fault if db.get(o, {}).get("status") == "PAID"]
    doubled = sorted(o for o, r in db.items() if r["events"] > 1 or r["anomalies"] > 0)
    paid_no_cb = sorted(o for o, r in db.items() if r["status"] == "PAID" and r["cb"] is None)
    undelivered = sorted(o for o, r in db.items() if r["status"] == "PAID" and o not in delivered)
    fig = {
        "orders": len(db),
        "requests": sum(v for k, v in codes.items() if k != "gave-up"),
        "codes": codes,
        "acked": len(acked),
        "lost": len(lost),
        "lost_at_fault": len(lost_at_fault),
        "healed": len(healed),
        "doubled": len(doubled),
        "5xx": n5xx,
        "5xx_after_fault": n5xx_after,
        "other_non_2xx": other,
        "gave_up": len(gave_up),
        "recovery_s": None if first_new is None else round(first_new - args.fault_at, 2),
        "first_2xx_after_fault_s": None if first_any is None else round(first_any - args.fault_at, 2),
        "last_5xx_after_fault_s": None if last_5xx is None else round(last_5xx - args.fault_at, 2),
        "paid": sum(1 for r in db.values() if r["status"] == "PAID"),
        "undelivered": len(undelivered) if args.delivered else None,
        # Events the sink published for payments the surviving writer does not have.
        "events_for_unpaid": sum(1 for o in delivered if o in db and db[o]["status"] != "PAID")
        if args.delivered
        else None,
    }
    problems = []
    if lost and not args.lost_is_measured:
        problems.append(f"{len(lost)} orders answered 2xx are not PAID (e.g. {lost[:3]})")
    if doubled:
        problems.append(f"{len(doubled)} orders paid twice or with an anomaly (e.g. {doubled[:3]})")
    if paid_no_cb:
        problems.append(f"{len(paid_no_cb)} PAID orders without a callback row")
    if args.delivered and undelivered:
        problems.append(f"{len(undelivered)} PAID orders whose ORDER_PAID was never delivered (e.g. {undelivered[:3]})")
    if other:
        problems.append(f"{other} answers other than 2xx, 503 or no answer")
    if gave_up and not args.allow_give_up:
        problems.append(f"{len(gave_up)} orders never answered 2xx (e.g. {sorted(gave_up)[:3]})")
    if first_any is None:
        problems.append("no 2xx after the fault")
    fig["problems"] = problems
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fig, f)
    print(json.dumps({k: v for k, v in fig.items() if k != "problems"}))
    for p in problems:
        print(f"CHECK FAILED: {p}")
    return 1 if problems else 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create")
    c.add_argument("--url", required=True)
    c.add_argument("--token", required=True)
    c.add_argument("--amount", type=int, required=True)
    c.add_argument("--threads", type=int, default=8)
    c.add_argument("orders", nargs="+")
    r = sub.add_parser("run")
    r.add_argument("--url", required=True)
    r.add_argument("--rate", type=float, default=200)
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--out", required=True)
    r.add_argument("--deadline", type=float, default=120)
    r.add_argument("--retry-delay", type=float, default=0.25)
    r.add_argument("--tries", type=int, default=1000)
    r.add_argument("--timeout", type=float, default=15)
    r.add_argument("--threads", type=int, default=48)
    r.add_argument("requests", nargs="+")
    s = sub.add_parser("report")
    s.add_argument("--log", required=True)
    s.add_argument("--fault-at", type=float, required=True)
    s.add_argument("--db", required=True)
    s.add_argument("--delivered")
    s.add_argument("--json")
    s.add_argument("--allow-give-up", action="store_true")
    s.add_argument("--lost-is-measured", action="store_true", help="a lost payment is reported, not a failure")
    args = p.parse_args()
    return {"create": create, "run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
