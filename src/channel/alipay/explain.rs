//! Explaining a stored request: every check in order and why one failed.

#[allow(unused_imports)]
use super::*;

impl Alipay {
    /// Why a `sign` that does not verify over the fields received would have verified.
    pub(super) fn why_unsigned(&self, app: &App, form: &Form, signature: &[u8]) -> String {
        let verifies = |form: &Form| {
            app.key.verify(&form.sign_content(false), signature)
                || app.key.verify(&form.sign_content(true), signature)
        };
        let non_ascii = form.0.iter().any(|(_, v)| !v.is_ascii());
        let declared = form
            .get("charset")
            .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase())
            .unwrap_or_else(|| "utf-8 (absent)".to_owned());
        if non_ascii {
            for (from_gbk, what) in [(false, "GBK to UTF-8"), (true, "UTF-8 to GBK")] {
                let recoded: Option<Vec<_>> = form
                    .0
                    .iter()
                    .map(|(k, v)| Some((k.clone(), transcode(v, from_gbk)?)))
                    .collect();
                if let Some(fields) = recoded
                    && verifies(&Form(fields))
                {
                    return format!(
                        "the body is not the bytes Alipay signed: it was re-encoded from {what} \
                         on the way (charset={declared}); Alipay signs the bytes of the charset \
                         it sends, so pass the raw body through unchanged"
                    );
                }
            }
        }
        let mut others: Vec<&str> = self
            .apps
            .values()
            .filter(|other| other.app_id != app.app_id)
            .filter(|other| {
                other.key.verify(&form.sign_content(false), signature)
                    || other.key.verify(&form.sign_content(true), signature)
            })
            .map(|other| other.app_id.as_str())
            .collect();
        others.sort_unstable();
        if let Some(other) = others.first() {
            return format!(
                "signed with the Alipay public key configured for app {other}, not for app {}: \
                 alipay.apps[].alipay_public_key_file is swapped",
                app.app_id
            );
        }
        "the sign does not verify over the fields received: a field was changed, added or \
         removed on the way, the body was re-encoded, or the key configured in \
         alipay.apps[].alipay_public_key_file is not Alipay's public key for this app (the \
         app's own public key is a common mistake)"
            .to_owned()
    }
}

impl Provider for Alipay {
    fn channel(&self) -> ChannelId {
        ChannelId::Alipay
    }

    fn accounts(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.apps.keys().cloned().collect();
        ids.sort();
        ids
    }

    fn order_field(&self) -> &'static str {
        "alipay_app_id"
    }

    fn admit(&self, request: &Inbound<'_>) -> Result<Notice, Rejection> {
        crate::channel::admit(self, request)
    }

    fn explain(&self, request: &Inbound<'_>) -> Explanation {
        let mut e = Explanation::default();
        let form = match Form::parse(request.body) {
            Ok(form) => {
                e.push(
                    "form",
                    Verdict::Pass,
                    format!("{} fields, each once", form.0.len()),
                );
                form
            }
            Err(rejection) => {
                e.push("form", Verdict::Fail, rejection.to_string());
                return e;
            }
        };
        let content_type = request
            .headers
            .get("content-type")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let declared = form
            .get("charset")
            .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase());
        let utf8 = form.0.iter().all(|(_, v)| std::str::from_utf8(v).is_ok());
        e.push(
            "charset",
            Verdict::Info,
            format!(
                "charset field {}, Content-Type {content_type:?}; the decoded values {} valid UTF-8",
                declared.as_deref().unwrap_or("absent (utf-8)"),
                if utf8 { "are" } else { "are not" }
            ),
        );
        let Some(app_id) = form.get("app_id") else {
            e.push("app_id", Verdict::Fail, "missing parameter app_id");
            return e;
        };
        let app_id = String::from_utf8_lossy(app_id).into_owned();
        let Some(app) = self.apps.get(&app_id) else {
            let mut known: Vec<&String> = self.apps.keys().collect();
            known.sort();
            e.push(
                "app_id",
                Verdict::Fail,
                format!("{app_id} is not a configured app (configured: {known:?}): add it to alipay.apps"),
            );
            return e;
        };
        e.push("app_id", Verdict::Pass, format!("{app_id} is configured"));
        match form.get("sign_type") {
            None | Some(b"RSA2") => e.push("sign_type", Verdict::Pass, "RSA2"),
            Some(other) => e.push(
                "sign_type",
                Verdict::Fail,
                format!("unsupported sign_type {}", String::from_utf8_lossy(other)),
            ),
        }
        let content = form.sign_content(false);
        e.push(
            "string to sign",
            Verdict::Info,
            format!(
                "{} bytes, SHA-256 {}: \"{}\"",
                content.len(),
                crate::channel::sha256_hex(&content),
                crate::channel::shown(&content)
            ),
        );
        let signature = match form.get("sign").filter(|s| !s.is_empty()) {
            None => {
                e.push("signature", Verdict::Fail, "missing sign");
                return e;
            }
            Some(sign) => match BASE64.decode(sign) {
                Ok(signature) => signature,
                Err(_) => {
                    e.push("signature", Verdict::Fail, "sign is not base64");
                    return e;
                }
            },
        };
        let verified = app.key.verify(&content, &signature)
            || (form.0.iter().any(|(_, v)| v.is_empty())
                && app.key.verify(&form.sign_content(true), &signature));
        if !verified {
            let why = self.why_unsigned(app, &form, &signature);
            e.push("signature", Verdict::Fail, why);
            return e;
        }
        e.push(
            "signature",
            Verdict::Pass,
            format!("verifies with the Alipay public key of app {app_id}"),
        );
        match crate::channel::admit(self, request) {
            Ok(notice) => {
                e.push(
                    "decoded fields",
                    Verdict::Info,
                    format!(
                        "out_trade_no {}, trade_no {}, amount_fen {}, seller_id {}, app_id {}",
                        notice.out_trade_no,
                        notice.transaction_id,
                        notice.amount_fen,
                        notice.merchant.merchant_id,
                        notice.merchant.app_id.as_deref().unwrap_or("-")
                    ),
                );
                if notice.merchant_matches {
                    e.push(
                        "merchant",
                        Verdict::Pass,
                        "seller_id and app_id are those configured",
                    );
                } else {
                    e.push("merchant", Verdict::Fail, format!(
                        "seller_id {} is not the one configured for app {app_id}: recorded as a MERCHANT_MISMATCH anomaly, the order is not paid",
                        notice.merchant.merchant_id
                    ));
                }
                e.notice = Some(notice);
            }
            Err(rejection) => e.push("decoded fields", Verdict::Fail, rejection.to_string()),
        }
        e
    }
}
