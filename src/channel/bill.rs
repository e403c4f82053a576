//! A provider's daily bill (对账单), the neutral side: what a bill line is, what a bill
//! totals to, why a bill could not be had, and the [`BillSource`] a provider's API client
//! implements so `crate::bills` can compare any provider's books with the ledger.
//!
//! A provider fetches the file, checks it (WeChat's SHA1 of the decompressed bytes) and
//! hands back a [`BillFile`]: a verified file on disk that is read once, streaming, line by
//! line, so a bill of a million rows is never held in memory. Reading checks the file's own
//! summary against its detail rows; a bill that fails any check is never acted upon.

use std::time::Duration;

use chrono::{FixedOffset, NaiveDate, NaiveDateTime, TimeZone};
use serde::Serialize;

use super::api::{ApiFuture, Failure, Plumbing};
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// Whether a bill line is money in or money back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineKind {
    Payment,
    Refund,
}

impl LineKind {
    /// As stored in `bill_line.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Payment => "payment",
            Self::Refund => "refund",
        }
    }
}

/// One detail row of a bill, read by header name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BillLine {
    pub kind: LineKind,
    /// The merchant's order number (WeChat 商户订单号, Alipay 商户订单号).
    pub out_trade_no: String,
    /// The provider's trade number (WeChat 微信订单号, Alipay 支付宝交易号).
    pub transaction_id: String,
    /// A refund row's refund number (WeChat 商户退款单号, Alipay 退款批次号/请求号).
    pub out_refund_no: Option<String>,
    /// Positive fen: a payment's order amount (WeChat 订单金额, Alipay 订单金额), a refund's
    /// refunded amount (WeChat 申请退款金额, Alipay's negative 订单金额 made positive).
    pub amount_fen: i64,
    /// The provider's fee in thousandths of a fen (WeChat states it to 0.00001 yuan); what
    /// it gives back on a refund is negative.
    pub fee_milli_fen: i64,
    /// The provider's own words for the row (WeChat 交易状态 / 退款状态, Alipay 业务类型).
    pub status: String,
    /// When the provider booked it (WeChat 交易时间, Alipay 完成时间), Beijing time as stated.
    pub at: Option<Timestamp>,
}

/// What a bill adds up to: counted from its detail rows, once they agree with its summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct BillTotals {
    pub count: i64,
    pub amount_fen: i64,
    pub refund_count: i64,
    pub refund_fen: i64,
    /// The fees of every row, summed exactly and rounded half away from zero to the fen.
    pub fee_fen: i64,
}

impl BillTotals {
    /// Adds one detail row.
    pub fn add(&mut self, line: &BillLine, fee_milli_fen: &mut i64) {
        match line.kind {
            LineKind::Payment => {
                self.count += 1;
                self.amount_fen += line.amount_fen;
            }
            LineKind::Refund => {
                self.refund_count += 1;
                self.refund_fen += line.amount_fen;
            }
        }
        *fee_milli_fen += line.fee_milli_fen;
        self.fee_fen = round_milli_fen(*fee_milli_fen);
    }
}

/// Thousandths of a fen to fen, half away from zero (as the providers' summaries round).
pub fn round_milli_fen(milli: i64) -> i64 {
    let whole = milli / 1000;
    let rest = milli % 1000;
    if rest >= 500 {
        whole + 1
    } else if rest <= -500 {
        whole - 1
    } else {
        whole
    }
}

/// A signed amount of yuan with at most five decimals (a fee: WeChat states its fees to
/// 0.00001 yuan, and Alipay may), in thousandths of a fen, and the number of decimals it was
/// stated with.
pub fn yuan_to_milli_fen(text: &str) -> Option<(i64, usize)> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = match digits.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() => (whole, fraction),
        Some(_) => return None,
        None => (digits, ""),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(whole) || !(fraction.is_empty() || all_digits(fraction)) || fraction.len() > 5 {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let mut padded = fraction.to_owned();
    padded.extend(std::iter::repeat_n('0', 5 - fraction.len()));
    let milli = whole
        .checked_mul(100_000)?
        .checked_add(padded.parse().ok()?)?;
    Some((if negative { -milli } else { milli }, fraction.len()))
}

/// Thousandths of a fen as yuan with five decimals, as a summary error shows a fee total.
pub fn milli_fen_to_yuan(milli: i64) -> String {
    let sign = if milli < 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:05}",
        milli.abs() / 100_000,
        milli.abs() % 100_000
    )
}

/// A bill row's time, `yyyy-MM-dd HH:mm:ss` in Beijing time, as both providers state it
/// (WeChat 交易时间, Alipay 完成时间).
pub fn beijing_time(text: &str) -> Option<Timestamp> {
    let local = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").ok()?;
    let at = FixedOffset::east_opt(8 * 3600)?
        .from_local_datetime(&local)
        .single()?;
    Some(Timestamp::new(at.with_timezone(&chrono::Utc)))
}

/// Why a header does not name a bill's columns exactly, for the provider to put in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misfit<'h> {
    /// A column that is not one of the bill's.
    Unknown(&'h str),
    /// A column named twice.
    Twice(&'h str),
    /// A column of the bill's that the header lacks.
    Missing(&'static str),
}

/// Where each of `names` is in a header (its column names in order, each perhaps refused
/// as it is read): every one present once, and nothing else, so that a bill of another
/// shape is never read by position. `misfit` puts a header that does not fit in words.
pub fn positions<'h, const N: usize>(
    names: &[&'static str; N],
    header: impl IntoIterator<Item = Result<&'h str, BillError>>,
    misfit: impl FnOnce(Misfit<'h>) -> BillError,
) -> Result<[usize; N], BillError> {
    let mut index = [usize::MAX; N];
    for (at, name) in header.into_iter().enumerate() {
        let name = name?;
        let Some(known) = names.iter().position(|n| *n == name) else {
            return Err(misfit(Misfit::Unknown(name)));
        };
        if index[known] != usize::MAX {
            return Err(misfit(Misfit::Twice(name)));
        }
        index[known] = at;
    }
    if let Some(missing) = index.iter().position(|i| *i == usize::MAX) {
        return Err(misfit(Misfit::Missing(names[missing])));
    }
    Ok(index)
}

/// What vouches for a bill file's content, besides its own summary agreeing with its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Integrity {
    /// WeChat: the file's SHA1 (of the decompressed bytes), given in the signed answer and
    /// checked before a row is read.
    SignedHash,
    /// Alipay: nothing. The URL comes in a signed answer and the file over HTTPS from a host
    /// of `alipay.bill_hosts`, but the file itself carries no hash or signature: whoever
    /// answers that URL writes the bill.
    None,
}

impl Integrity {
    /// What a channel's bills carry.
    pub fn of(channel: ChannelId) -> Self {
        match channel {
            ChannelId::Wechat => Self::SignedHash,
            ChannelId::Alipay => Self::None,
        }
    }
}

/// Why a bill could not be had or read. The report is `unavailable` with it, nothing is
/// acted upon, and the next run tries again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BillError {
    /// Asking for the bill gave no usable answer (unreachable, unsigned or wrongly signed,
    /// an error the provider does not document as "no bill").
    #[error("{}: {}", .0.label(), .0.detail())]
    Failed(Failure),
    /// The file could not be downloaded: no answer in time, an HTTP error, a redirect, a
    /// URL on another host, a file over the size limit.
    #[error("download: {0}")]
    Download(String),
    /// The file is not the one the signed answer described (WeChat's `hash_value`).
    #[error("hash: {0}")]
    Hash(String),
    /// A truncated or corrupt gzip or zip.
    #[error("archive: {0}")]
    Archive(String),
    /// A row or header that is not the bill's format: a missing column, an amount that is
    /// not yuan, bytes that are not the file's charset.
    #[error("format: {0}")]
    Format(String),
    /// The bill's own summary disagrees with its detail rows.
    #[error("summary: {0}")]
    Summary(String),
    /// A row of another merchant or app than the one asked for.
    #[error("other account: {0}")]
    OtherAccount(String),
}

impl BillError {
    /// A short name for logs and the report's `reason`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Failed(f) => f.label(),
            Self::Download(_) => "download",
            Self::Hash(_) => "hash",
            Self::Archive(_) => "archive",
            Self::Format(_) => "format",
            Self::Summary(_) => "summary",
            Self::OtherAccount(_) => "other_account",
        }
    }
}

impl From<Failure> for BillError {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

/// A downloaded bill, checked as far as it can be before it is read: read once, streaming.
pub trait BillFile: Send {
    /// Reads every detail row in order, handing each to `each` (which may stop the read
    /// with its own error), and checks the file's summary against the rows: their totals
    /// when they agree.
    fn read(
        self: Box<Self>,
        each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
    ) -> Result<BillTotals, BillError>;
}

/// What asking for a day's bill came to.
pub enum Fetched {
    /// The bill, downloaded and checked.
    Bill(Box<dyn BillFile>),
    /// The provider says there is no bill for that day (WeChat `NO_STATEMENT_EXIST`, Alipay
    /// `isp.bill_not_exist`): no trade that day, or an answer that cannot be told from one.
    /// It balances only a day the ledger has nothing for either.
    NoBill(String),
}

/// A provider whose daily bill can be fetched: its API client, for every account with API
/// credentials.
pub trait BillSource: Send + Sync + 'static {
    fn channel(&self) -> ChannelId;

    /// The merchants/apps whose bills can be fetched, in configuration order: one per bill
    /// the provider keeps (Alipay keeps one per seller, for all of its apps).
    fn accounts(&self) -> Vec<String>;

    /// The accounts whose payments and refunds the bill `account` fetches lists: itself, and
    /// every other account whose bill it is too (an Alipay seller's other apps).
    fn covers(&self, account: &str) -> Vec<String> {
        vec![account.to_owned()]
    }

    /// Fetches the bill of `date` (a provider-local day) for `account` into a temporary
    /// file and checks what can be checked before a row is read.
    /// The download may take `download_timeout` in all (a bill can be large; the API
    /// calls keep `provider_api.timeout_ms`).
    fn fetch<'a>(
        &'a self,
        account: &'a str,
        date: NaiveDate,
        download_timeout: Duration,
        now: Timestamp,
    ) -> ApiFuture<'a, Result<Fetched, BillError>>;
}

/// Downloads a bill file into an unnamed temporary file (gone when dropped), at most
/// [`MAX_BILL_BYTES`], within `timeout` (`bills.download_timeout_secs`, which replaces the
/// client's `provider_api.timeout_ms` for this request: a large bill takes longer than an API
/// answer); any answer but a 200 is [`BillError::Download`] (a redirect is not followed).
/// Returns the file rewound, and its size.
pub async fn download(
    plumbing: &Plumbing,
    request: reqwest::RequestBuilder,
    timeout: Duration,
) -> Result<(std::fs::File, u64), BillError> {
    use std::io::{Seek, Write};
    let too_slow = || {
        BillError::Download(format!(
            "not downloaded within {} s (bills.download_timeout_secs)",
            timeout.as_secs()
        ))
    };
    let failed = |e: &dyn std::fmt::Display| BillError::Download(e.to_string());
    let failed_request = |e: reqwest::Error| {
        if e.is_timeout() {
            too_slow()
        } else {
            failed(&e)
        }
    };
    let work = async {
        plumbing.acquire().await;
        // The request's own timeout outlasts the one below, which names the setting.
        let request = request.timeout(timeout + Duration::from_secs(1));
        let mut response = request.send().await.map_err(failed_request)?;
        let status = response.status().as_u16();
        if status != 200 {
            let location = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(|l| format!(" to {l}"))
                .unwrap_or_default();
            return Err(BillError::Download(format!(
                "HTTP {status}{location} (redirects are not followed)"
            )));
        }
        let mut file = tempfile::tempfile().map_err(|e| failed(&e))?;
        let mut size: u64 = 0;
        while let Some(chunk) = response.chunk().await.map_err(failed_request)? {
            size += chunk.len() as u64;
            if size > MAX_BILL_BYTES {
                return Err(BillError::Download(format!(
                    "larger than {MAX_BILL_BYTES} bytes"
                )));
            }
            file.write_all(&chunk).map_err(|e| failed(&e))?;
        }
        file.rewind().map_err(|e| failed(&e))?;
        Ok((file, size))
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| too_slow())?
}

/// The most a downloaded bill may take on disk, and decompressed: a larger one is refused
/// (a zip or gzip bomb), not read.
pub const MAX_BILL_BYTES: u64 = 4 << 30;

/// The longest line a bill may have (a row is a few hundred bytes): a parser holds one line
/// at a time, so this bounds its memory whatever the file.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// A reader that fails once [`MAX_LINE_BYTES`] pass without a line end: what a parser reads
/// its file through.
pub struct LineCap<R> {
    inner: R,
    since_newline: usize,
    line: u64,
}

impl<R> LineCap<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            since_newline: 0,
            line: 1,
        }
    }
}

/// [`LineCap`]'s refusal, inside the `io::Error` a parser sees: see [`line_too_long`].
#[derive(Debug)]
pub struct LineTooLong(u64);

impl std::fmt::Display for LineTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {} is longer than {MAX_LINE_BYTES} bytes", self.0)
    }
}

impl std::error::Error for LineTooLong {}

impl<R: std::io::Read> std::io::Read for LineCap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &b in &buf[..n] {
            if b == b'\n' {
                self.since_newline = 0;
                self.line += 1;
            } else {
                self.since_newline += 1;
                if self.since_newline > MAX_LINE_BYTES {
                    return Err(std::io::Error::other(LineTooLong(self.line)));
                }
            }
        }
        Ok(n)
    }
}

/// The format error of an `io::Error` that is [`LineCap`]'s refusal.
pub fn line_too_long(e: &std::io::Error) -> Option<BillError> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<LineTooLong>())
        .map(|too_long| BillError::Format(too_long.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_longer_than_the_cap_is_a_format_error() {
        use std::io::Read;
        let mut fine = format!("{}\n{}\n", "a".repeat(MAX_LINE_BYTES), "b".repeat(10)).into_bytes();
        let mut out = Vec::new();
        assert!(LineCap::new(fine.as_slice()).read_to_end(&mut out).is_ok());
        fine.truncate(MAX_LINE_BYTES);
        let long = [b"ok\n".as_slice(), &vec![b'x'; MAX_LINE_BYTES + 1]].concat();
        let e = LineCap::new(long.as_slice())
            .read_to_end(&mut out)
            .err()
            .and_then(|e| line_too_long(&e));
        assert_eq!(
            e,
            Some(BillError::Format(format!(
                "line 2 is longer than {MAX_LINE_BYTES} bytes"
            )))
        );
    }

    #[test]
    fn fees_keep_thousandths_of_a_fen() {
        assert_eq!(yuan_to_milli_fen("0.60"), Some((60_000, 2)));
        assert_eq!(yuan_to_milli_fen("-29.27000"), Some((-2_927_000, 5)));
        assert_eq!(yuan_to_milli_fen("0.00001"), Some((1, 5)));
        assert_eq!(yuan_to_milli_fen("7"), Some((700_000, 0)));
        assert_eq!(yuan_to_milli_fen("0.000001"), None);
        assert_eq!(yuan_to_milli_fen("--1"), None);
        assert_eq!(yuan_to_milli_fen("1."), None);
        assert_eq!(milli_fen_to_yuan(-42_006), "-0.42006");
    }

    #[test]
    fn fees_round_half_away_from_zero() {
        assert_eq!(round_milli_fen(0), 0);
        assert_eq!(round_milli_fen(499), 0);
        assert_eq!(round_milli_fen(500), 1);
        assert_eq!(round_milli_fen(1499), 1);
        assert_eq!(round_milli_fen(-499), 0);
        assert_eq!(round_milli_fen(-500), -1);
        assert_eq!(round_milli_fen(-1500), -2);
    }
}
