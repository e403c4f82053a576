//! Explaining a stored request: every check in order and why one failed.

#[allow(unused_imports)]
use super::*;

impl WechatPay {
    /// Why a signature that does not verify over the bytes received would have verified:
    /// the body WeChat signed recovered from what a proxy did to it, or another key.
    pub(super) fn why_unsigned(
        &self,
        serial: &str,
        timestamp: &str,
        nonce: &str,
        body: &[u8],
        signature: &[u8],
    ) -> String {
        let verifies = |key: &RsaVerifier, body: &[u8]| {
            key.verify(&string_to_sign(timestamp, nonce, body), signature)
        };
        let key = self.keys.get(&serial.to_ascii_uppercase()).map(|p| &p.key);
        if let Some(key) = key {
            let compact = without_json_whitespace(body);
            if compact != body && verifies(key, &compact) {
                return "the body is not the bytes WeChat signed: it was re-serialised \
                        (whitespace differs); pass the raw request body through unchanged"
                    .to_owned();
            }
            for trimmed in [body.strip_suffix(b"\r\n"), body.strip_suffix(b"\n")]
                .into_iter()
                .flatten()
            {
                if verifies(key, trimmed) {
                    return "the body is not the bytes WeChat signed: a line ending was added \
                            at its end"
                        .to_owned();
                }
            }
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
                && let Ok(canonical) = serde_json::to_vec(&value)
                && canonical != body
                && verifies(key, &canonical)
            {
                return "the body is not the bytes WeChat signed: it was re-serialised \
                        (key order or escapes differ)"
                    .to_owned();
            }
        }
        let mut others: Vec<&String> = self
            .keys
            .iter()
            .filter(|(s, p)| !s.eq_ignore_ascii_case(serial) && verifies(&p.key, body))
            .map(|(s, _)| s)
            .collect();
        others.sort();
        if let Some(other) = others.first() {
            return format!(
                "signed with the platform key {other}, not with {serial} that Wechatpay-Serial \
                 names: the serial-to-key mapping in wechat.merchants[].platform_keys is wrong"
            );
        }
        "the signature does not verify over the bytes received: the body or a Wechatpay-* \
         header was changed on the way (a proxy or framework re-serialised or re-encoded it), \
         the platform key configured for this serial is not WeChat's, or WeChat did not send it"
            .to_owned()
    }
}

impl Provider for WechatPay {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn accounts(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .keys
            .values()
            .map(|p| p.merchant.mchid.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn order_field(&self) -> &'static str {
        "wechat_mchid"
    }

    fn admit(&self, request: &Inbound<'_>) -> Result<Notice, Rejection> {
        crate::channel::admit(self, request)
    }

    fn explain(&self, request: &Inbound<'_>) -> Explanation {
        let mut e = Explanation::default();
        let h = request.headers;
        let mut found = HashMap::new();
        for name in [
            "Wechatpay-Timestamp",
            "Wechatpay-Nonce",
            "Wechatpay-Signature",
            "Wechatpay-Serial",
        ] {
            match single_header(h, name) {
                Ok(Some(value)) => {
                    e.push(format!("header {name}"), Verdict::Pass, format!("present once: {value}"));
                    found.insert(name, value);
                }
                Ok(None) => e.push(
                    format!("header {name}"),
                    Verdict::Fail,
                    format!("missing: WeChat always sends {name}; something on the way dropped it, or WeChat did not send this request"),
                ),
                Err(rejection) => e.push(format!("header {name}"), Verdict::Fail, rejection.to_string()),
            }
        }
        match single_header(h, "Wechatpay-Signature-Type") {
            Ok(None) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Pass,
                format!("absent (means {SIGNATURE_TYPE})"),
            ),
            Ok(Some(SIGNATURE_TYPE)) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Pass,
                SIGNATURE_TYPE,
            ),
            Ok(Some(other)) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Fail,
                format!("{other} is not supported (only {SIGNATURE_TYPE})"),
            ),
            Err(rejection) => e.push(
                "header Wechatpay-Signature-Type",
                Verdict::Fail,
                rejection.to_string(),
            ),
        }
        let (Some(timestamp), Some(nonce), Some(signature), Some(serial)) = (
            found.get("Wechatpay-Timestamp").copied(),
            found.get("Wechatpay-Nonce").copied(),
            found.get("Wechatpay-Signature").copied(),
            found.get("Wechatpay-Serial").copied(),
        ) else {
            e.push(
                "signature",
                Verdict::Skipped,
                "a signature header is missing",
            );
            return e;
        };

        match timestamp.parse::<i64>() {
            Ok(seconds) => {
                let skew = request.now.unix_seconds().saturating_sub(seconds);
                if skew.abs() <= TIMESTAMP_WINDOW_SECS {
                    e.push("timestamp skew", Verdict::Pass, format!("{skew} s between Wechatpay-Timestamp and arrival (window ±{TIMESTAMP_WINDOW_SECS} s)"));
                } else {
                    e.push("timestamp skew", Verdict::Fail, format!("{skew} s between Wechatpay-Timestamp and arrival, outside WeChat's ±{TIMESTAMP_WINDOW_SECS} s: a replay, a request held back, or a clock that is off"));
                }
            }
            Err(_) => e.push(
                "timestamp skew",
                Verdict::Fail,
                format!("Wechatpay-Timestamp {timestamp:?} is not unix seconds"),
            ),
        }

        let platform = self.keys.get(&serial.to_ascii_uppercase());
        match platform {
            Some(p) => e.push(
                "serial",
                Verdict::Pass,
                format!(
                    "{serial} is a configured platform key of merchant {}",
                    p.merchant.mchid
                ),
            ),
            None => {
                let mut known: Vec<&String> = self.keys.keys().collect();
                known.sort();
                e.push("serial", Verdict::Fail, format!(
                    "{serial} is not a configured platform key (configured: {known:?}): WeChat signs with the key it names; add its public key or certificate to wechat.merchants[].platform_keys (a rotation, or a new merchant)"
                ));
            }
        }

        let message = string_to_sign(timestamp, nonce, request.body);
        e.push(
            "string to sign",
            Verdict::Info,
            format!(
                "{} bytes, SHA-256 {}: \"{}\"",
                message.len(),
                crate::channel::sha256_hex(&message),
                crate::channel::shown(&message)
            ),
        );

        if signature.starts_with(PROBE_PREFIX) {
            e.push("signature", Verdict::Fail, "a WECHATPAY/SIGNTEST/ probe: WeChat checks that merchants refuse it; refusing it is correct");
        } else {
            match (platform, BASE64.decode(signature)) {
                (_, Err(_)) => {
                    e.push(
                        "signature",
                        Verdict::Fail,
                        "Wechatpay-Signature is not base64",
                    );
                }
                (None, Ok(_)) => {
                    e.push("signature", Verdict::Skipped, "no key for this serial");
                }
                (Some(p), Ok(sig)) => {
                    if p.key.verify(&message, &sig) {
                        e.push(
                            "signature",
                            Verdict::Pass,
                            "verifies with the platform key of this serial",
                        );
                    } else {
                        let why = self.why_unsigned(serial, timestamp, nonce, request.body, &sig);
                        e.push("signature", Verdict::Fail, why);
                    }
                }
            }
        }

        let Some(platform) = platform else {
            e.push(
                "decryption",
                Verdict::Skipped,
                "no merchant for this serial",
            );
            return e;
        };
        let envelope: Envelope = match serde_json::from_slice(request.body) {
            Ok(envelope) => envelope,
            Err(err) => {
                e.push(
                    "decryption",
                    Verdict::Fail,
                    format!("the body is not WeChat's notification JSON: {err}"),
                );
                return e;
            }
        };
        let r = envelope.resource;
        let open = |key: &LessSafeKey| -> Option<Vec<u8>> {
            let nonce = Nonce::try_assume_unique_for_key(r.nonce.as_bytes()).ok()?;
            let mut sealed = BASE64.decode(&r.ciphertext).ok()?;
            key.open_in_place(nonce, Aad::from(r.associated_data.as_bytes()), &mut sealed)
                .ok()
                .map(|plain| plain.to_vec())
        };
        let merchant = Arc::clone(&platform.merchant);
        let Some(plaintext) = open(&merchant.apiv3_key) else {
            let mut others: Vec<&str> = self
                .keys
                .values()
                .filter(|p| {
                    p.merchant.mchid != merchant.mchid && open(&p.merchant.apiv3_key).is_some()
                })
                .map(|p| p.merchant.mchid.as_str())
                .collect();
            others.sort_unstable();
            others.dedup();
            let detail = match others.first() {
                Some(other) => format!(
                    "the resource does not decrypt with the apiv3_key of merchant {}, but does with merchant {other}'s: the platform key {serial} is configured under the wrong merchant",
                    merchant.mchid
                ),
                None if r.algorithm != "AEAD_AES_256_GCM" => {
                    format!("unsupported algorithm {}", r.algorithm)
                }
                None => format!(
                    "the resource does not decrypt with the apiv3_key of merchant {}: the key configured is not the APIv3 key set in the WeChat Pay merchant platform (it was changed, or mistyped); fix wechat.merchants[].apiv3_key, then re-apply the receipts",
                    merchant.mchid
                ),
            };
            e.push("decryption", Verdict::Fail, detail);
            return e;
        };
        e.push(
            "decryption",
            Verdict::Pass,
            format!(
                "decrypts with the apiv3_key of merchant {} ({} bytes)",
                merchant.mchid,
                plaintext.len()
            ),
        );

        let verified = Verified {
            merchant,
            event_type: envelope.event_type.clone(),
            plaintext,
        };
        match self
            .decode(verified)
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
        {
            Ok(notice) => {
                e.push("decoded fields", Verdict::Info, format!(
                    "event {}, out_trade_no {}, transaction_id {}, amount_fen {}, currency {}, mchid {}, appid {}",
                    envelope.event_type, notice.out_trade_no, notice.transaction_id, notice.amount_fen,
                    notice.currency, notice.merchant.merchant_id, notice.merchant.app_id.as_deref().unwrap_or("-")
                ));
                if notice.merchant_matches {
                    e.push(
                        "merchant",
                        Verdict::Pass,
                        "mchid and appid are those configured for this key",
                    );
                } else {
                    e.push("merchant", Verdict::Fail, format!("mchid {} / appid {} are not those configured for this key: recorded as a MERCHANT_MISMATCH anomaly, the order is not paid", notice.merchant.merchant_id, notice.merchant.app_id.as_deref().unwrap_or("-")));
                }
                // Decoded even when the signature failed: the order checks still tell the
                // reader whether re-applying it would pay the order.
                e.notice = Some(notice);
            }
            Err(rejection) => e.push("decoded fields", Verdict::Fail, rejection.to_string()),
        }
        e
    }
}
