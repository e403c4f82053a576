//! The notification on the wire: the form, its charset, the string Alipay signs, and which of
//! Alipay's two kinds of post it is.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{FixedOffset, NaiveDateTime, TimeZone};

use super::{App, GATEWAY_ROUTE, NOTIFY_ROUTE};
use crate::channel::Rejection;
use crate::money::yuan_to_fen;
use crate::time::Timestamp;

/// The form fields, decoded once, as bytes in the body's charset, in arrival order.
pub(super) struct Form(pub(super) Vec<(Vec<u8>, Vec<u8>)>);

pub(super) fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let spaced: Vec<u8> = raw
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    percent_encoding::percent_decode(&spaced).collect()
}

impl Form {
    /// Splits on `&`, then on the first `=` only (base64 values end in `=`).
    pub(super) fn parse(body: &[u8]) -> Result<Self, Rejection> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for pair in body.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
            let (key, value) = match pair.iter().position(|b| *b == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, &pair[pair.len()..]),
            };
            let key = percent_decode(key);
            if !seen.insert(key.clone()) {
                return Err(Rejection::BadRequest(format!(
                    "parameter {} appears more than once",
                    String::from_utf8_lossy(&key)
                )));
            }
            fields.push((key, percent_decode(value)));
        }
        Ok(Self(fields))
    }

    pub(super) fn get(&self, key: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(k, _)| k == key.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    /// The string Alipay signed. The Java SDK skips empty values, the others keep them.
    pub(super) fn sign_content(&self, keep_empty: bool) -> Vec<u8> {
        let mut fields: Vec<_> = self
            .0
            .iter()
            .filter(|(k, v)| k != b"sign" && k != b"sign_type" && (keep_empty || !v.is_empty()))
            .collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::new();
        for (i, (k, v)) in fields.into_iter().enumerate() {
            if i > 0 {
                out.push(b'&');
            }
            out.extend_from_slice(k);
            out.push(b'=');
            out.extend_from_slice(v);
        }
        out
    }
}

/// The bytes Alipay signs for `body` (empty values skipped, as the Java SDK does).
pub fn string_to_sign(body: &[u8]) -> Result<Vec<u8>, Rejection> {
    Ok(Form::parse(body)?.sign_content(false))
}

/// The two kinds of form Alipay posts, each to its own URL, both signed alike (rsaCheckV1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A trade's asynchronous notification (`trade_status_sync`: payments, refunds, closes),
    /// sent to the `notify_url` of the trade's request.
    Trade,
    /// An Open Platform message (`msg_method`, `biz_content`, `utc_timestamp`), sent to the
    /// app gateway (应用网关) set in the Open Platform console: `alipay.fund.trans.order.changed`.
    Message,
}

impl Kind {
    /// A form with `msg_method` is a message; every other one a trade's notification.
    pub(super) fn of_form(form: &Form) -> Self {
        if form.get("msg_method").is_some() {
            Self::Message
        } else {
            Self::Trade
        }
    }

    /// The kind the notify route `route` takes; `None` for a path that is not one of ours.
    pub(super) fn of_route(route: &str) -> Option<Self> {
        match route {
            NOTIFY_ROUTE => Some(Self::Trade),
            GATEWAY_ROUTE => Some(Self::Message),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Trade => "a trade notification (notify_type trade_status_sync)",
            Self::Message => "an Open Platform message (msg_method)",
        }
    }

    pub(super) fn route(self) -> &'static str {
        match self {
            Self::Trade => NOTIFY_ROUTE,
            Self::Message => GATEWAY_ROUTE,
        }
    }

    /// Where Alipay is told the URL of this kind.
    pub(super) fn registered(self) -> &'static str {
        match self {
            Self::Trade => "the notify_url of the trade's request",
            Self::Message => "the app gateway (应用网关) in the Open Platform console",
        }
    }
}

/// What verification hands to decoding: the app, the kind of form and its fields as text.
#[derive(Debug)]
pub struct Verified {
    pub(super) app: Arc<App>,
    pub(super) kind: Kind,
    pub(super) fields: HashMap<String, String>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

impl Verified {
    pub(super) fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub(super) fn required(&self, key: &str) -> Result<&str, Rejection> {
        self.field(key)
            .ok_or_else(|| Rejection::BadRequest(format!("missing parameter {key}")))
    }

    pub(super) fn amount(&self, key: &str) -> Result<Option<i64>, Rejection> {
        self.field(key)
            .map(|v| yuan_to_fen(v).map_err(|e| Rejection::BadRequest(format!("{key}: {e}"))))
            .transpose()
    }

    /// Alipay times are Beijing time, `yyyy-MM-dd HH:mm:ss` (`gmt_refund` adds `.SSS`).
    pub(super) fn time(&self, key: &str) -> Option<Timestamp> {
        let text = self.field(key)?;
        let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").ok()?;
        let beijing = FixedOffset::east_opt(8 * 3600)?;
        let at = beijing.from_local_datetime(&naive).single()?;
        Some(Timestamp::new(at.with_timezone(&chrono::Utc)))
    }
}

pub(super) fn text(bytes: &[u8], gbk: bool) -> Option<String> {
    if gbk {
        let (text, had_errors) = encoding_rs::GBK.decode_without_bom_handling(bytes);
        (!had_errors).then(|| text.into_owned())
    } else {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

/// A form whose signature verified, read as text in the charset Alipay signed it in.
pub(super) fn read_fields(app: &Arc<App>, kind: Kind, form: Form) -> Result<Verified, Rejection> {
    // Now read the values as text, in the charset Alipay signed.
    let charset = form
        .get("charset")
        .map(|c| String::from_utf8_lossy(c).to_ascii_lowercase())
        .unwrap_or_else(|| "utf-8".to_owned());
    let gbk = match charset.as_str() {
        "utf-8" | "utf8" => false,
        "gbk" | "gb2312" | "gb18030" => true,
        other => {
            return Err(Rejection::BadRequest(format!(
                "unsupported charset {other}"
            )));
        }
    };
    let mut fields = HashMap::with_capacity(form.0.len());
    for (k, v) in form.0 {
        let key = text(&k, gbk);
        let value = text(&v, gbk);
        let (Some(key), Some(value)) = (key, value) else {
            return Err(Rejection::BadRequest(format!(
                "a parameter is not valid {charset}"
            )));
        };
        fields.insert(key, value);
    }
    Ok(Verified {
        app: Arc::clone(app),
        kind,
        fields,
    })
}

/// `bytes` read as `from` and written as `to` (`None` when they are not valid `from`).
pub(super) fn transcode(bytes: &[u8], from_gbk: bool) -> Option<Vec<u8>> {
    if from_gbk {
        let (text, had_errors) = encoding_rs::GBK.decode_without_bom_handling(bytes);
        (!had_errors).then(|| text.into_owned().into_bytes())
    } else {
        let text = std::str::from_utf8(bytes).ok()?;
        let (encoded, _, had_errors) = encoding_rs::GBK.encode(text);
        (!had_errors).then(|| encoded.into_owned())
    }
}
