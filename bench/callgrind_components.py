"""Instructions per request by component, from one callgrind dump (bench/instructions.sh).

    python3 bench/callgrind_components.py TITLE N DUMP

callgrind_annotate (3.19 here) shows the costs of dumps taken mid-run as inclusive even with
--inclusive=no, so the dump is read directly: each function's self cost (its cost lines, not
the lines of the calls it makes), which add up to the dump's total exactly, and the inclusive
cost (self plus calls) of the two crypto entry points: ring's RSA verify and AES-GCM open.
Everything else is grouped by patterns on the demangled symbol, first match wins (RULES).
"""

import collections
import re
import sys

title, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names, selfc, callc = {}, collections.Counter(), collections.Counter()
fn = None
pending = False
total = None
for line in open(path, errors="replace"):
    c = line[:1]
    if c.isdigit() or c in "+-*":
        parts = line.split()
        if len(parts) >= 2 and fn is not None:
            if pending:
                callc[fn] += int(parts[1])
                pending = False
            else:
                selfc[fn] += int(parts[1])
        continue
    m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
    if m:
        if m.group(3) is not None:
            names[m.group(2)] = m.group(3)
        if m.group(1) == "fn":
            fn = names[m.group(2)]
    elif line.startswith("calls="):
        pending = True
    elif line.startswith(("totals:", "summary:")):
        total = int(line.split()[1])
if total != sum(selfc.values()):
    sys.exit(f"{path}: self costs add up to {sum(selfc.values())}, the dump says {total}")


def inclusive(rx):
    return sum(selfc[f] + callc[f] for f in set(selfc) | set(callc) if re.search(rx, f))


rsa = inclusive(r"^ring::rsa::verification::<impl ring::signature::VerificationAlgorithm for ring::rsa::RsaParameters>::verify$")
aes = inclusive(r"^ring::aead::less_safe_key::LessSafeKey::open_within$")
crypto = rsa + aes
# ring's RSA and AES-GCM code: in crypto's inclusive count, not in a component below.
# Any other ring function (SHA-256, shared by the RSA verify and the notice's digest) is left
# out of the components too; the first row is what ring costs outside the two calls: the
# total less the crypto less every other row.
RING = r"ring|sha256|aesni|gcm_|ghash"
RULES = [
    ("sha2 / md5 (RustCrypto)", r"^<?(sha2|sha1|md5|digest|block_buffer)::"),
    ("base64", r"base64::"),
    ("serde_json / serde", r"serde_json|serde::|serde_core::"),
    ("HTTP (actix, httparse, http, the router's regex)", r"actix|httparse|^<?http::|h2::|bytestring|mime::|regex|percent_encoding|form_urlencoded"),
    ("logging (tracing, formatting)", r"tracing|sharded_slab|nu_ansi|matchers::|core::fmt|alloc::fmt|as core::fmt::|Formatter|fmt::Write|pad_integral|fmt_u|float_to_decimal|flt2dec|dragon|grisu|chrono::format"),
    ("database client (diesel, tokio-postgres, deadpool)", r"diesel|postgres|deadpool|fallible_iterator|stringprep|mysql|sqlite"),
    ("allocation and copies (malloc, free, memcpy, memset)", r"^(malloc|free|realloc|calloc|_int_|unlink_chunk|malloc_consolidate|tcache|cfree)|mem(cpy|move|set|cmp)|bcmp|__rust_|__rdl_|__rustc::|raw_vec|alloc::alloc|drop_in_place|strlen"),
    ("tokio / runtime, threads, time", r"tokio|mio::|futures|parking_lot|crossbeam|std::sync|std::thread|std::sys|pthread|futex|epoll|__lll_|syscall|clock_gettime|vdso|Timespec|std::time|core::sync|slab::|pin_project|sched_yield|^(recv|send|write|read|readv|writev|close|accept4?)$"),
    ("metrics (prometheus) and hashing", r"prometheus|hashbrown|hash|Sip"),
    ("the relay", r"relay"),
    ("the ledger, the intake and the rest of paynotify", r"paynotify"),
    ("std, core, libc: the rest", r"."),
]
totals = collections.Counter()
flat = collections.Counter()
for f, v in selfc.items():
    if re.search(RING, f):
        continue
    for name, rx in RULES:
        if re.search(rx, f):
            totals[name] += v
            flat[f] += v
            break
rest = total - crypto


def per(v):
    return f"{v / n:,.0f}"


print(f"\n{title}: {per(total)} instructions per request (N = {n})\n")
print("| component | instructions per request |")
print("|---|---:|")
print(f"| RSA verify (ring, inclusive: key setup, exponentiation, SHA-256 of the message) | {per(rsa)} |")
print(f"| AES-GCM decrypt (ring, inclusive) | {per(aes)} |")
print(f"| **crypto** | **{per(crypto)}** |")
ring_rest = rest - sum(totals.values())
print(f"| ring outside RSA verify and AES-GCM (SHA-256 of the notice's digest), less the allocation inside the crypto calls | {per(ring_rest)} |")
for name, _ in RULES:
    print(f"| {name} | {per(totals[name])} |")
print(f"| **everything but the crypto** | **{per(rest)}** |")
print(f"| **total** | **{per(total)}** |")
print(f"| **everything but the crypto / crypto** | **{rest / crypto:.2f}** (target ≤ 2) |")
print("\nlargest functions by self cost outside the crypto (instructions per request):")
for f, v in flat.most_common(25):
    print(f"  {v / n:9,.0f}  {f[:150]}")
