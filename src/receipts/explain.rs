//! `paynotify explain`: every check made of one notify request, in order, and the first one
//! that failed in plain words. The request is a stored receipt (`--receipt ID`, read from
//! the database) or a raw HTTP request saved anywhere (`--file request.http`). The checks
//! are the channel's own (`Provider::explain`); the order checks need the database.

use std::fmt;
use std::sync::Arc;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::channel::{Check, Explanation, Inbound, Provider, Verdict};
use crate::notice::{Notice, NoticeKind};
use crate::order::OrderStatus;
use crate::receipts::store::StoredReceipt;
use crate::store::{Store, StoreError};
use crate::time::Timestamp;

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("not an HTTP request: {0}")]
    NotHttp(String),
    #[error("no channel serves {0}: the request line must name a notify URL (/notify/<channel>…)")]
    NoChannel(String),
    #[error("channel {0} is not configured here")]
    NotConfigured(String),
    #[error("no receipt {0} (never stored, or purged after receipts.keep_days)")]
    NoReceipt(i64),
    #[error("receipt {0}: its body is not base64")]
    DamagedReceipt(i64),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One request to explain, whatever it was read from.
pub struct Request {
    /// Where it came from, for the first line of the report.
    pub source: String,
    pub channel: String,
    /// The notify route it came to; `None` for a receipt stored before routes were kept.
    pub route: Option<String>,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// When it arrived: the timestamp check is made against this.
    pub now: Timestamp,
}

impl Request {
    pub fn from_receipt(receipt: &StoredReceipt) -> Result<Self, ExplainError> {
        let body = crate::receipts::decode_body(&receipt.body_b64)
            .ok_or(ExplainError::DamagedReceipt(receipt.id))?;
        Ok(Self {
            source: format!(
                "receipt {}: {} request received {}, answered {} ({}{})",
                receipt.id,
                receipt.channel,
                receipt.received_at.as_datetime().to_rfc3339(),
                receipt.status,
                receipt.outcome,
                receipt
                    .detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            ),
            channel: receipt.channel.clone(),
            route: receipt.route.clone(),
            headers: crate::receipts::header_map(&receipt.headers.0),
            body,
            now: receipt.received_at,
        })
    }

    /// A raw HTTP/1.x request: request line, headers, a blank line (CRLF or LF), the body
    /// byte for byte. The channel comes from the path (`/notify/<channel>…`).
    pub fn from_http(raw: &[u8], source: &str, now: Timestamp) -> Result<Self, ExplainError> {
        let (head, body) = split_head(raw)
            .ok_or_else(|| ExplainError::NotHttp("no blank line after the headers".into()))?;
        let head = std::str::from_utf8(head)
            .map_err(|_| ExplainError::NotHttp("the headers are not text".into()))?;
        let mut lines = head.lines();
        let request_line = lines
            .next()
            .ok_or_else(|| ExplainError::NotHttp("empty".into()))?;
        let path = request_line
            .split_whitespace()
            .nth(1)
            .ok_or_else(|| ExplainError::NotHttp(format!("request line {request_line:?}")))?;
        let route = path.split('?').next().unwrap_or(path);
        let channel = Some(route)
            .and_then(|p| p.strip_prefix("/notify/"))
            .and_then(|rest| rest.split('/').next())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| ExplainError::NoChannel(path.to_owned()))?
            .to_owned();
        let mut headers = HeaderMap::new();
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| ExplainError::NotHttp(format!("header line {line:?}")))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| ExplainError::NotHttp(format!("header name {name:?}")))?;
            let value = HeaderValue::from_str(value.trim())
                .map_err(|_| ExplainError::NotHttp(format!("header value {value:?}")))?;
            headers.append(name, value);
        }
        Ok(Self {
            source: format!("{source}: POST {path}, {} body bytes", body.len()),
            channel,
            route: Some(route.to_owned()),
            headers,
            body: body.to_vec(),
            now,
        })
    }
}

/// The headers and the body of a raw request, split at the first empty line.
fn split_head(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let crlf = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    let lf = raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let (at, len) = match (crlf, lf) {
        (Some(a), Some(b)) => {
            if a.0 <= b.0 {
                a
            } else {
                b
            }
        }
        (a, b) => a.or(b)?,
    };
    Some((&raw[..at], &raw[at + len..]))
}

/// What `explain` found.
pub struct Report {
    pub source: String,
    pub explanation: Explanation,
}

impl Report {
    /// The first failed check, if any.
    pub fn first_failure(&self) -> Option<&Check> {
        self.explanation.first_failure()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.source)?;
        for (i, check) in self.explanation.checks.iter().enumerate() {
            writeln!(
                f,
                "{:>3}. {:<4} {}: {}",
                i + 1,
                check.verdict.label(),
                check.name,
                check.detail
            )?;
        }
        match self.first_failure() {
            Some(check) => writeln!(f, "first failing check: {}: {}", check.name, check.detail),
            None => writeln!(f, "every check passed"),
        }
    }
}

/// Runs the channel's checks on `request`.
pub fn explain(providers: &[Arc<dyn Provider>], request: Request) -> Result<Report, ExplainError> {
    let provider = providers
        .iter()
        .find(|p| p.channel().as_str() == request.channel)
        .ok_or_else(|| ExplainError::NotConfigured(request.channel.clone()))?;
    let inbound = Inbound {
        headers: &request.headers,
        body: &request.body,
        now: request.now,
        route: request.route.as_deref(),
    };
    Ok(Report {
        source: request.source,
        explanation: provider.explain(&inbound),
    })
}

/// Adds the checks against the order in the database: it exists, the amount is the order's,
/// and its state lets the notice apply.
pub async fn check_order(report: &mut Report, store: &Store) -> Result<(), StoreError> {
    let Some(notice) = report.explanation.notice.clone() else {
        return Ok(());
    };
    for check in order_checks(&notice, store.order(&notice.out_trade_no).await?) {
        report.explanation.checks.push(check);
    }
    Ok(())
}

fn order_checks(notice: &Notice, order: Option<crate::order::Order>) -> Vec<Check> {
    let Some(order) = order else {
        return vec![Check::new(
            "order",
            Verdict::Fail,
            format!(
                "no order {} in this database: the provider is answered 404 and retries; create the order (POST /orders) or check the database this service uses",
                notice.out_trade_no
            ),
        )];
    };
    let mut checks = vec![Check::new(
        "order",
        Verdict::Pass,
        format!(
            "{} exists: {}, amount_fen {}, refunded_fen {}",
            order.order_no,
            order.status.as_str(),
            order.amount_fen,
            order.refunded_fen
        ),
    )];
    if matches!(notice.kind, NoticeKind::Paid) {
        if notice.amount_fen == order.amount_fen && notice.currency == order.currency {
            checks.push(Check::new(
                "amount",
                Verdict::Pass,
                format!("{} {} as the order", notice.amount_fen, notice.currency),
            ));
        } else {
            checks.push(Check::new(
                "amount",
                Verdict::Fail,
                format!(
                    "the notice pays {} {} but the order is {} {}: recorded as an AMOUNT_MISMATCH anomaly, the order is not paid",
                    notice.amount_fen, notice.currency, order.amount_fen, order.currency
                ),
            ));
        }
        let state = match order.status {
            OrderStatus::WaitPay => {
                Check::new("state", Verdict::Pass, "WAIT_PAY: the payment applies")
            }
            OrderStatus::Closed => Check::new(
                "state",
                Verdict::Fail,
                "CLOSED: money arrived for a closed order; recorded as a PAYMENT_ANOMALY for a person or a refund flow",
            ),
            other => Check::new(
                "state",
                Verdict::Info,
                format!(
                    "{}: already paid; a repeat of the same payment is a duplicate",
                    other.as_str()
                ),
            ),
        };
        checks.push(state);
    }
    checks
}
