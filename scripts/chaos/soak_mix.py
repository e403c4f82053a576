"""Composes one segment of the soak (scripts/chaos/soak.sh) from pre-forged requests.

    soak_mix.py DIR NAME TOTAL FIRSTS_ONLY PREVIOUS...

Reads DIR/NAME.fw and DIR/NAME.fa (the segment's first deliveries, `paynotify forge` files:
each request after a line with its length), DIR/NAME.uw and DIR/NAME.ua (signed notifications
for orders that do not exist) and DIR/P.first for each PREVIOUS segment P. Writes
DIR/NAME.first (this segment's first deliveries, for the segments after it),
DIR/seg-NAME.req (TOTAL requests, shuffled: the first deliveries; a twentieth altered copies
of earlier ones, answered 401; a twentieth the unknown-order notifications again and again,
answered 404; duplicates of earlier first deliveries for the rest) and DIR/seg-NAME.want
("firsts duplicates altered unknown"). With FIRSTS_ONLY = 1 the segment is its first
deliveries alone.
"""

import os
import random
import re
import sys


def records(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path, "rb") as f:
        while True:
            line = f.readline()
            if not line:
                return out
            out.append(f.read(int(line)))


def write(path, requests):
    with open(path, "wb") as f:
        for r in requests:
            f.write(b"%d\n%s" % (len(r), r))


def altered(request):
    """One base64 character of the signature changed: same length, wrong signature."""
    m = re.search(rb"Wechatpay-Signature: |(?:&|\r\n\r\n)sign=", request)
    i = m.end()
    while not request[i : i + 1].isalnum():
        i += 1
    swapped = b"B" if request[i : i + 1] == b"A" else b"A"
    return request[:i] + swapped + request[i + 1 :]


def main():
    d, name, total, only = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    previous = sys.argv[5:]
    rng = random.Random(name)
    firsts = records(f"{d}/{name}.fw") + records(f"{d}/{name}.fa")
    write(f"{d}/{name}.first", firsts)
    bad, unknown, dups = [], [], []
    if not only:
        pool = [r for p in previous for r in records(f"{d}/{p}.first")]
        signed_unknown = records(f"{d}/{name}.uw") + records(f"{d}/{name}.ua")
        if not pool or not signed_unknown:
            sys.exit(f"segment {name}: nothing to repeat (previous: {previous})")
        bad = [altered(rng.choice(pool)) for _ in range(total // 20)]
        unknown = [signed_unknown[i % len(signed_unknown)] for i in range(total // 20)]
        dups = [pool[i % len(pool)] for i in range(total - len(firsts) - len(bad) - len(unknown))]
    mix = firsts + dups + bad + unknown
    rng.shuffle(mix)
    write(f"{d}/seg-{name}.req", mix)
    with open(f"{d}/seg-{name}.want", "w") as f:
        f.write(f"{len(firsts)} {len(dups)} {len(bad)} {len(unknown)}\n")


if __name__ == "__main__":
    main()
