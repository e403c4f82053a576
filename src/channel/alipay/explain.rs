//! Explaining a stored request: the walk of `verify.rs` recorded, then decoding, and why a
//! check failed.

use super::wire::{Form, Kind, transcode};
use super::{Alipay, App};
use crate::channel::{Channel, Explanation, Inbound, Provider, Rejection, Trail, Verdict};
use crate::notice::{ChannelId, Notice, NoticeKind};

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
        let book = self.book();
        let mut others: Vec<&str> = book
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
        let book = self.book();
        let mut ids: Vec<String> = book
            .apps
            .keys()
            .chain(book.authorized.keys())
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    fn has_account(&self, id: &str) -> bool {
        let book = self.book();
        book.apps.contains_key(id) || book.authorized.contains_key(id)
    }

    fn order_field(&self) -> &'static str {
        "alipay_app_id"
    }

    fn admit(&self, request: &Inbound<'_>) -> Result<Notice, Rejection> {
        crate::channel::admit(self, request)
    }

    fn explain(&self, request: &Inbound<'_>) -> Explanation {
        let mut e = Explanation::default();
        let Ok(verified) = self.walk(request, &mut e) else {
            return e;
        };
        if e.first_failure().is_some() {
            // The walk went on past an unsupported sign_type, or a form at the other kind's
            // route: admit refuses the request, so there is no notice to decode.
            e.push(
                "decoded fields",
                Verdict::Skipped,
                "an earlier check refuses the request",
            );
            return e;
        }
        let app_id = verified.app.app_id.clone();
        let kind = verified.kind;
        match self
            .decode(verified)
            .and_then(|n| n.checked().map_err(Rejection::BadRequest))
        {
            Ok(notice) => {
                e.push("decoded fields", Verdict::Info, decoded(kind, &notice));
                if kind == Kind::Message {
                    // A gateway message names only its app, the one whose key verified it.
                    e.push(
                        "merchant",
                        Verdict::Pass,
                        "app_id is the app whose Alipay key verified it",
                    );
                } else if notice.merchant_matches {
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
            Err(rejection) => {
                e.stop("decoded fields", rejection, Rejection::to_string);
            }
        }
        e
    }
}

/// What a decoded notice says, in the words of the form it came in.
fn decoded(kind: Kind, notice: &Notice) -> String {
    match (&notice.kind, kind) {
        (NoticeKind::Transfer(t), _) => format!(
            "a transfer: out_biz_no {}, order_id {}, status {}, trans_amount {}, app_id {}",
            t.out_bill_no,
            t.provider_bill_no.as_deref().unwrap_or("-"),
            t.provider_state.as_deref().unwrap_or("-"),
            t.amount_fen
                .map_or_else(|| "-".to_owned(), |fen| format!("{fen} fen")),
            t.account
        ),
        (NoticeKind::Other { status }, Kind::Message) => format!(
            "msg_method {status} of app {}: acknowledged, nothing applied",
            notice.merchant.app_id.as_deref().unwrap_or("-")
        ),
        _ => format!(
            "out_trade_no {}, trade_no {}, amount_fen {}, seller_id {}, app_id {}",
            notice.out_trade_no,
            notice.transaction_id,
            notice.amount_fen,
            notice.merchant.merchant_id,
            notice.merchant.app_id.as_deref().unwrap_or("-")
        ),
    }
}
