#!/usr/bin/env python3
"""A stand-in for the providers' query APIs, for the failover scenarios: an order is paid
through WeChat Pay when its number starts with WECHAT_PREFIX, through Alipay when it starts
with ALIPAY_PREFIX (and unknown to the other provider), with the transaction id and amount
`paynotify forge` put in its notification.

    provider_query.py PORT SANDBOX_DIR AMOUNT_FEN WECHAT_PREFIX ALIPAY_PREFIX

Answers as tests/api/support/provider.rs does:
- WeChat Pay: GET /v3/pay/transactions/out-trade-no/{no} -> 200, trade_state SUCCESS,
  transaction_id 4200000000{no}, signed with the sandbox platform key (Wechatpay-Timestamp,
  -Nonce, -Serial, -Signature-Type, -Signature over "timestamp\\nnonce\\nbody\\n").
- Alipay: method alipay.trade.query on any path -> {"alipay_trade_query_response": {...},
  "sign": ...}, TRADE_SUCCESS, trade_no 2026{no}, the sign over the exact bytes of the
  response value, with the sandbox Alipay key.
The requests' own signatures are not checked. Every call is appended to SANDBOX_DIR/../queries
("wechat NO" / "alipay NO"). Only 127.0.0.1. Signs with the `cryptography` module when it is
installed, else with `openssl dgst`.
"""
import base64
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse

PORT, SBX, AMOUNT = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
WECHAT_PREFIX, ALIPAY_PREFIX = sys.argv[4], sys.argv[5]
CONFIG = open(os.path.join(SBX, "paynotify.toml")).read()
SERIAL = re.search(r'^\s*serial = "([^"]+)"', CONFIG, re.M).group(1)
MCHID = re.search(r'^mchid = "([^"]+)"', CONFIG, re.M).group(1)
APPID = re.search(r'^appid = "([^"]+)"', CONFIG, re.M).group(1)
WECHAT_KEY = os.path.join(SBX, "keys/wechat_platform_private.pem")
ALIPAY_KEY = os.path.join(SBX, "keys/alipay_private.pem")
LOG = os.path.join(os.path.dirname(os.path.abspath(SBX)), "queries")
LOCK = threading.Lock()

try:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding

    _keys = {}

    def sign(key_file, message):
        if key_file not in _keys:
            with open(key_file, "rb") as f:
                _keys[key_file] = serialization.load_pem_private_key(f.read(), password=None)
        sig = _keys[key_file].sign(message, padding.PKCS1v15(), hashes.SHA256())
        return base64.b64encode(sig).decode()

except ImportError:

    def sign(key_file, message):
        out = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", key_file],
            input=message,
            capture_output=True,
            check=True,
        ).stdout
        return base64.b64encode(out).decode()


def record(kind, no):
    with LOCK, open(LOG, "a") as f:
        f.write(f"{kind} {no}\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, body, headers=()):
        data = body.encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def wechat(self, no):
        record("wechat", no)
        if not no.startswith(WECHAT_PREFIX):
            body = json.dumps({"code": "ORDER_NOT_EXIST", "message": "订单不存在"}, ensure_ascii=False)
            return self.reply(404, body, [("Content-Type", "application/json")])
        total = AMOUNT
        body = json.dumps(
            {
                "appid": APPID,
                "mchid": MCHID,
                "out_trade_no": no,
                "transaction_id": f"4200000000{no}",
                "trade_type": "JSAPI",
                "trade_state": "SUCCESS",
                "trade_state_desc": "支付成功",
                "bank_type": "OTHERS",
                "success_time": "2026-11-30T10:00:00+08:00",
                "payer": {"openid": "oSandboxOpenId0000000000000"},
                "amount": {"total": total, "payer_total": total, "currency": "CNY", "payer_currency": "CNY"},
            },
            ensure_ascii=False,
        )
        ts = str(int(time.time()))
        nonce = "failoverprovidernonce00000000001"
        signature = sign(WECHAT_KEY, f"{ts}\n{nonce}\n{body}\n".encode())
        self.reply(
            200,
            body,
            [
                ("Content-Type", "application/json"),
                ("Wechatpay-Timestamp", ts),
                ("Wechatpay-Nonce", nonce),
                ("Wechatpay-Serial", SERIAL),
                ("Wechatpay-Signature-Type", "WECHATPAY2-SHA256-RSA2048"),
                ("Wechatpay-Signature", signature),
            ],
        )

    def alipay(self, params):
        method = params.get("method", "")
        biz = {}
        try:
            biz = json.loads(params.get("biz_content", "{}"))
        except ValueError:
            pass
        no = biz.get("out_trade_no", "")
        key = method.replace(".", "_") + "_response"
        if method == "alipay.trade.query":
            record("alipay", no)
        if method == "alipay.trade.query" and no.startswith(ALIPAY_PREFIX):
            yuan = f"{AMOUNT // 100}.{AMOUNT % 100:02d}"
            value = {
                "code": "10000",
                "msg": "Success",
                "out_trade_no": no,
                "trade_status": "TRADE_SUCCESS",
                "buyer_logon_id": "159****3821",
                "trade_no": f"2026{no}",
                "total_amount": yuan,
                "buyer_pay_amount": yuan,
                "send_pay_date": "2026-11-30 10:00:07",
            }
        else:
            value = {"code": "40004", "msg": "Business Failed", "sub_code": "ACQ.TRADE_NOT_EXIST", "sub_msg": "交易不存在"}
        text = json.dumps(value, ensure_ascii=False, indent=2)
        body = f'{{"{key}":{text},"sign":"{sign(ALIPAY_KEY, text.encode())}"}}'
        self.reply(200, body, [("Content-Type", "text/html;charset=utf-8")])

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        m = re.fullmatch(r"/v3/pay/transactions/out-trade-no/([^/]+)", url.path)
        if m:
            return self.wechat(urllib.parse.unquote(m.group(1)))
        params = dict(urllib.parse.parse_qsl(url.query))
        if "method" in params:
            return self.alipay(params)
        self.reply(404, '{"code":"NOT_FOUND","message":"no such API"}', [("Content-Type", "application/json")])

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace")
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        params.update(dict(urllib.parse.parse_qsl(raw)))
        if "method" in params:
            return self.alipay(params)
        self.reply(404, '{"code":"NOT_FOUND","message":"no such API"}', [("Content-Type", "application/json")])

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
