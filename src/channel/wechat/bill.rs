//! WeChat Pay's trade bill (交易账单, type `ALL`): applied for with a signed call, downloaded
//! with a signed request (the file itself is unsigned), checked against the signed answer's
//! SHA1 of the decompressed bytes, then read streaming, by header name.
//!
//! WeChat Pay v3: `GET /v3/bill/tradebill?bill_date=…&bill_type=ALL&tar_type=GZIP` answers
//! `{hash_type, hash_value, download_url}`; `hash_value` is the SHA1 of the **decompressed**
//! file (wechatpay-java's `DigestBillEntity` over a `GZIPInputStream`).

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::time::Duration;

use chrono::{FixedOffset, NaiveDate, NaiveDateTime, TimeZone};
use ring::digest::{Context, SHA1_FOR_LEGACY_USE_ONLY};
use serde::Deserialize;

use super::api::{ApiMerchant, WechatApi};
use crate::channel::api::{ApiFuture, Failure};
use crate::channel::bill::{
    self, BillError, BillFile, BillLine, BillSource, BillTotals, Fetched, LineKind, MAX_BILL_BYTES,
};
use crate::money::yuan_to_fen;
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The detail columns of an `ALL` bill, in WeChat's order. A header must name each exactly
/// once, in any order, and nothing else: `SUCCESS` and `REFUND` bills have other sets, and a
/// bill of another shape is not read by position.
pub const ALL_COLUMNS: [&str; 27] = [
    "交易时间",
    "公众账号ID",
    "商户号",
    "特约商户号",
    "设备号",
    "微信订单号",
    "商户订单号",
    "用户标识",
    "交易类型",
    "交易状态",
    "付款银行",
    "货币种类",
    "应结订单金额",
    "代金券金额",
    "微信退款单号",
    "商户退款单号",
    "退款金额",
    "充值券退款金额",
    "退款类型",
    "退款状态",
    "商品名称",
    "商户数据包",
    "手续费",
    "费率",
    "订单金额",
    "申请退款金额",
    "费率备注",
];

/// The summary columns of an `ALL` bill, in WeChat's order.
pub const SUMMARY_COLUMNS: [&str; 7] = [
    "总交易单数",
    "应结订单总金额",
    "退款总金额",
    "充值券退款总金额",
    "手续费总金额",
    "订单总金额",
    "申请退款总金额",
];

/// Beijing time, in which WeChat states 交易时间.
const BEIJING_SECS: i32 = 8 * 3600;

/// The signed answer to the bill application.
#[derive(Deserialize)]
struct TradeBillAnswer {
    hash_type: String,
    hash_value: String,
    download_url: String,
}

impl BillSource for WechatApi {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn accounts(&self) -> Vec<String> {
        self.merchants.ids()
    }

    fn fetch<'a>(
        &'a self,
        account: &'a str,
        date: NaiveDate,
        download_timeout: Duration,
        now: Timestamp,
    ) -> ApiFuture<'a, Result<Fetched, BillError>> {
        Box::pin(async move {
            let m = self.merchants.get(account)?;
            let Some(answer) = self.apply(m, date, now).await? else {
                return Ok(Fetched::NoBill(format!(
                    "NO_STATEMENT_EXIST: WeChat has no bill of {date} for merchant {account}"
                )));
            };
            let (path, url) = same_origin(&m.base, &answer.download_url)?;
            // WeChat signs the download like any GET: the download URL's path and query.
            let authorization = Self::authorization(m, "GET", &path, "", now)?;
            let request = self
                .merchants
                .plumbing()
                .client()
                .get(url)
                .header("Authorization", authorization);
            let (file, _) =
                bill::download(self.merchants.plumbing(), request, download_timeout).await?;
            let mchid = m.merchant.mchid.clone();
            // Decompressing and hashing a large file is blocking work.
            let checked = tokio::task::spawn_blocking(move || {
                verified_tradebill(file, &answer.hash_value, &mchid)
            })
            .await
            .map_err(|e| BillError::Archive(format!("the hash check did not finish: {e}")))??;
            Ok(Fetched::Bill(checked))
        })
    }
}

impl WechatApi {
    /// Applies for the bill of `date`: its verified answer, or `None` when WeChat says there
    /// is none (`NO_STATEMENT_EXIST`).
    async fn apply(
        &self,
        m: &ApiMerchant,
        date: NaiveDate,
        now: Timestamp,
    ) -> Result<Option<TradeBillAnswer>, BillError> {
        let path = format!(
            "/v3/bill/tradebill?bill_date={}&bill_type=ALL&tar_type=GZIP",
            date.format("%Y-%m-%d")
        );
        let r = self.call(m, false, &path, "", now).await?;
        if !(200..300).contains(&r.status) {
            // An error body is unsigned: only its documented codes count.
            return match Self::error_code(&r)?.as_str() {
                "NO_STATEMENT_EXIST" => Ok(None),
                "STATEMENT_CREATING" => Err(Failure::Unreachable(format!(
                    "bill not ready yet (STATEMENT_CREATING): WeChat builds the bill of {date} from about 10:00 the next day"
                ))
                .into()),
                _ => Err(Self::unexpected(&r).into()),
            };
        }
        self.verify(m, &r, now)?;
        let answer: TradeBillAnswer = serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("tradebill answer: {e}")))?;
        if !answer.hash_type.eq_ignore_ascii_case("SHA1") {
            return Err(Failure::Unexpected(format!(
                "tradebill answer: hash_type {} (only SHA1 is known)",
                answer.hash_type
            ))
            .into());
        }
        Ok(Some(answer))
    }
}

/// The download URL, if it is on the merchant's API host (same scheme, host and port: our
/// signed `Authorization` header goes nowhere else), and the path and query to sign.
fn same_origin(base: &str, download_url: &str) -> Result<(String, reqwest::Url), BillError> {
    let elsewhere = |why: &str| {
        BillError::Download(format!(
            "download_url {download_url} refused: {why} (the API is at {base})"
        ))
    };
    let url = reqwest::Url::parse(download_url).map_err(|e| elsewhere(&e.to_string()))?;
    let api = reqwest::Url::parse(base).map_err(|e| elsewhere(&e.to_string()))?;
    if url.scheme() != api.scheme()
        || url.host_str() != api.host_str()
        || url.port_or_known_default() != api.port_or_known_default()
    {
        return Err(elsewhere("another scheme, host or port"));
    }
    let path = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    Ok((path, url))
}

/// A trade bill on disk whose decompressed bytes matched the signed `hash_value`.
struct TradeBill {
    file: File,
    mchid: String,
}

impl BillFile for TradeBill {
    fn read(
        self: Box<Self>,
        each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
    ) -> Result<BillTotals, BillError> {
        let mut file = self.file;
        file.rewind()
            .map_err(|e| BillError::Archive(format!("rewinding the bill: {e}")))?;
        read_tradebill(decompress(file, MAX_BILL_BYTES), &self.mchid, each)
    }
}

/// Checks a downloaded gzip bill before any row is read: the SHA1 of its decompressed bytes
/// against `hash_value` (hex, any case), decompressing the whole file streaming. A truncated
/// or corrupt gzip is [`BillError::Archive`], another digest [`BillError::Hash`]. The bill
/// of merchant `mchid`, ready to be read (what `fetch` hands over; public for the benchmark).
pub fn verified_tradebill(
    file: File,
    hash_value: &str,
    mchid: &str,
) -> Result<Box<dyn BillFile>, BillError> {
    verified_within(file, hash_value, mchid, MAX_BILL_BYTES)
}

fn verified_within(
    mut file: File,
    hash_value: &str,
    mchid: &str,
    limit: u64,
) -> Result<Box<dyn BillFile>, BillError> {
    file.rewind()
        .map_err(|e| BillError::Archive(format!("rewinding the bill: {e}")))?;
    let digest = sha1_hex(decompress(&file, limit))?;
    if !digest.eq_ignore_ascii_case(hash_value.trim()) {
        return Err(BillError::Hash(format!(
            "the decompressed bill's SHA1 is {digest}, the signed answer says {hash_value}"
        )));
    }
    Ok(Box::new(TradeBill {
        file,
        mchid: mchid.to_owned(),
    }))
}

/// The SHA1 of everything `input` gives, in lower-case hex.
fn sha1_hex(mut input: impl Read) -> Result<String, BillError> {
    let mut context = Context::new(&SHA1_FOR_LEGACY_USE_ONLY);
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = input.read(&mut buffer).map_err(archive)?;
        if n == 0 {
            break;
        }
        context.update(&buffer[..n]);
    }
    Ok(context
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The decompressed bytes of a gzip file, refused past `limit` (a gzip bomb).
fn decompress(
    file: impl Read,
    limit: u64,
) -> Capped<flate2::read::GzDecoder<BufReader<impl Read>>> {
    Capped {
        inner: flate2::read::GzDecoder::new(BufReader::with_capacity(64 * 1024, file)),
        left: limit,
        limit,
    }
}

/// A reader that fails once more than `limit` bytes came out of it.
struct Capped<R> {
    inner: R,
    left: u64,
    limit: u64,
}

/// The marker of [`Capped`]'s refusal, told apart from the gzip's own errors.
#[derive(Debug)]
struct TooLarge(u64);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the decompressed bill is larger than {} bytes", self.0)
    }
}

impl std::error::Error for TooLarge {}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        match self.left.checked_sub(n as u64) {
            Some(left) => {
                self.left = left;
                Ok(n)
            }
            None => Err(std::io::Error::other(TooLarge(self.limit))),
        }
    }
}

/// What reading the gzip came to: cut off, corrupt, or too large.
fn archive(e: std::io::Error) -> BillError {
    if let Some(too_long) = bill::line_too_long(&e) {
        return too_long;
    }
    if let Some(too_large) = e.get_ref().and_then(|i| i.downcast_ref::<TooLarge>()) {
        return BillError::Archive(too_large.to_string());
    }
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            BillError::Archive(format!("the gzip is truncated: {e}"))
        }
        _ => BillError::Archive(format!("the gzip is corrupt: {e}")),
    }
}

// The columns a row is read by, as positions in [`ALL_COLUMNS`].
const TIME: usize = 0;
const MCHID_COLUMN: usize = 2;
const TRANSACTION_ID: usize = 5;
const OUT_TRADE_NO: usize = 6;
const TRADE_STATE: usize = 9;
const CURRENCY: usize = 11;
const SETTLEMENT: usize = 12;
const OUT_REFUND_NO: usize = 15;
const REFUND: usize = 16;
const COUPON_REFUND: usize = 17;
const REFUND_STATUS: usize = 19;
const FEE: usize = 22;
const ORDER: usize = 24;
const APPLIED_REFUND: usize = 25;

/// Where each column of [`ALL_COLUMNS`] is in this bill's rows, found by name in its header.
struct Columns {
    index: [usize; ALL_COLUMNS.len()],
}

impl Columns {
    fn from_header(header: &csv::ByteRecord) -> Result<Self, BillError> {
        let mut index = [usize::MAX; ALL_COLUMNS.len()];
        for (at, raw) in header.iter().enumerate() {
            let name = header_name(raw, at, 1)?;
            let Some(known) = ALL_COLUMNS.iter().position(|c| *c == name) else {
                return Err(BillError::Format(format!(
                    "line 1: unknown column {name:?} in the header (not a column of an ALL bill)"
                )));
            };
            if index[known] != usize::MAX {
                return Err(BillError::Format(format!(
                    "line 1: column {name} appears twice in the header"
                )));
            }
            index[known] = at;
        }
        if let Some(missing) = index.iter().position(|i| *i == usize::MAX) {
            return Err(BillError::Format(format!(
                "line 1: the header lacks column {}",
                ALL_COLUMNS[missing]
            )));
        }
        Ok(Self { index })
    }

    /// The value of column `column` (of [`ALL_COLUMNS`]) in `row`, without the backtick.
    fn get<'r>(&self, row: &[&'r str], column: usize) -> &'r str {
        row.get(self.index[column]).map_or("", |v| value(v))
    }
}

/// A header name: UTF-8, without a byte-order mark or a backtick.
fn header_name(raw: &[u8], at: usize, line: u64) -> Result<&str, BillError> {
    let name = std::str::from_utf8(raw).map_err(|_| {
        BillError::Format(format!(
            "line {line}: header column {} is not UTF-8",
            at + 1
        ))
    })?;
    let name = name.strip_prefix('\u{feff}').unwrap_or(name);
    Ok(value(name).trim())
}

/// WeChat prefixes every value with a backtick (so that spreadsheets keep long numbers).
fn value(field: &str) -> &str {
    field.strip_prefix('`').unwrap_or(field)
}

/// The sums of the detail rows that the summary row states, in the units it states them.
#[derive(Default)]
struct Sums {
    rows: i64,
    settlement_fen: i64,
    refund_fen: i64,
    coupon_refund_fen: i64,
    fee_milli_fen: i64,
    order_fen: i64,
    applied_refund_fen: i64,
}

/// Reads a decompressed `ALL` trade bill of merchant `mchid` row by row, handing each detail
/// row to `each`, and checks the summary row against the detail rows. The totals returned
/// are the detail rows' ([`BillTotals::add`]).
///
/// Rows: `SUCCESS` is a payment of 订单金额; `REFUND` a refund (商户退款单号) of 申请退款金额,
/// the amount the merchant asked back, which the ledger records (退款金额 is that less the
/// non-recharge coupons' part, WeChat's settlement refund); the fee 手续费 is kept to
/// 0.00001 yuan (negative on a refund: fee given back). Any other 交易状态 is a format error:
/// WeChat documents only these two in a trade bill (a payment revoked after success shows
/// as the payment and a refund of it). A row of another 商户号 is [`BillError::OtherAccount`].
///
/// The summary (every column of it must match, by name): 总交易单数 is the number of detail
/// rows, payments and refunds; 应结订单总金额, 退款总金额, 充值券退款总金额, 订单总金额 and
/// 申请退款总金额 are the sums of 应结订单金额, 退款金额, 充值券退款金额, 订单金额 and 申请退款金额
/// over every detail row (a refund row states 0.00 as its 订单金额 and 应结订单金额, a payment
/// row 0.00 as its refund amounts); 手续费总金额 is the signed sum of 手续费, compared exactly
/// when stated with more than two decimals, else rounded half away from zero to the fen.
/// A mismatch is [`BillError::Summary`] naming the column and both values.
pub fn read_tradebill(
    input: impl Read,
    mchid: &str,
    each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
) -> Result<BillTotals, BillError> {
    let reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        // WeChat never quotes: a `"` inside 商户数据包 is data.
        .quoting(false)
        .buffer_capacity(64 * 1024)
        .from_reader(bill::LineCap::new(input));
    let mut rows = Records {
        reader,
        record: csv::ByteRecord::new(),
        line: 0,
    };
    if !rows.next()? {
        return Err(BillError::Format("the bill is empty: no header".into()));
    }
    let columns = Columns::from_header(&rows.record)?;
    let mut totals = BillTotals::default();
    let mut fee_milli_fen = 0;
    let mut sums = Sums::default();
    loop {
        if !rows.next()? {
            return Err(BillError::Format(
                "the bill ends without its summary (总交易单数…)".into(),
            ));
        }
        let line = rows.line;
        let text = utf8(&rows.record, line)?;
        if header_name(rows.record.get(0).unwrap_or_default(), 0, line)? == SUMMARY_COLUMNS[0] {
            break;
        }
        if text.len() != ALL_COLUMNS.len() {
            return Err(BillError::Format(format!(
                "line {line}: {} fields, the header has {}",
                text.len(),
                ALL_COLUMNS.len()
            )));
        }
        let bill_line = detail(&columns, &text, line, mchid, &mut sums)?;
        totals.add(&bill_line, &mut fee_milli_fen);
        each(bill_line)?;
    }
    check_summary(&mut rows, &sums)?;
    Ok(totals)
}

/// The bill's records in order, each with its line number (WeChat writes no blank lines).
struct Records<R> {
    reader: csv::Reader<R>,
    record: csv::ByteRecord,
    line: u64,
}

impl<R: Read> Records<R> {
    /// Reads the next record into `self.record`, if any; a read error is the archive's (the
    /// CSV has no quoting to fail).
    fn next(&mut self) -> Result<bool, BillError> {
        let more = self
            .reader
            .read_byte_record(&mut self.record)
            .map_err(|e| match e.into_kind() {
                csv::ErrorKind::Io(io) => archive(io),
                other => BillError::Format(format!("line {}: {other:?}", self.line + 1)),
            })?;
        if more {
            self.line += 1;
        }
        Ok(more)
    }
}

/// Every field of `record` as text, or the format error naming the line and column.
fn utf8(record: &csv::ByteRecord, line: u64) -> Result<Vec<&str>, BillError> {
    record
        .iter()
        .enumerate()
        .map(|(at, field)| {
            std::str::from_utf8(field).map_err(|_| {
                BillError::Format(format!(
                    "line {line}, field {}: bytes that are not UTF-8",
                    at + 1
                ))
            })
        })
        .collect()
}

/// One detail row, checked, and added to the sums the summary is checked against.
fn detail(
    columns: &Columns,
    row: &[&str],
    line: u64,
    mchid: &str,
    sums: &mut Sums,
) -> Result<BillLine, BillError> {
    let get = |column: usize| columns.get(row, column);
    let bad = |column: usize, why: &str| {
        BillError::Format(format!(
            "line {line}, column {}: {:?} {why}",
            ALL_COLUMNS[column],
            get(column)
        ))
    };
    let yuan = |column: usize| yuan_to_fen(get(column)).map_err(|_| bad(column, "is not yuan"));
    if get(MCHID_COLUMN) != mchid {
        return Err(BillError::OtherAccount(format!(
            "line {line}: 商户号 {} in the bill of merchant {mchid}",
            get(MCHID_COLUMN)
        )));
    }
    if get(CURRENCY) != "CNY" {
        return Err(bad(CURRENCY, "is not CNY"));
    }
    let (fee_milli_fen, _) =
        decimal(get(FEE)).ok_or_else(|| bad(FEE, "is not yuan with at most five decimals"))?;
    let order_fen = yuan(ORDER)?;
    let applied_refund_fen = yuan(APPLIED_REFUND)?;
    sums.rows += 1;
    sums.settlement_fen += yuan(SETTLEMENT)?;
    sums.refund_fen += yuan(REFUND)?;
    sums.coupon_refund_fen += yuan(COUPON_REFUND)?;
    sums.fee_milli_fen += fee_milli_fen;
    sums.order_fen += order_fen;
    sums.applied_refund_fen += applied_refund_fen;
    let (kind, amount_fen, amount_column, out_refund_no, status) = match get(TRADE_STATE) {
        "SUCCESS" => (LineKind::Payment, order_fen, ORDER, None, "SUCCESS"),
        "REFUND" => {
            let no = get(OUT_REFUND_NO);
            if no.is_empty() || no == "0" {
                return Err(bad(OUT_REFUND_NO, "is not a refund number"));
            }
            let status = get(REFUND_STATUS);
            let no = Some(no.to_owned());
            (
                LineKind::Refund,
                applied_refund_fen,
                APPLIED_REFUND,
                no,
                status,
            )
        }
        _ => return Err(bad(TRADE_STATE, "is neither SUCCESS nor REFUND")),
    };
    if amount_fen <= 0 {
        return Err(bad(amount_column, "is not a positive amount"));
    }
    for column in [OUT_TRADE_NO, TRANSACTION_ID] {
        if get(column).is_empty() {
            return Err(bad(column, "is empty"));
        }
    }
    let at = beijing(get(TIME)).ok_or_else(|| bad(TIME, "is not a time"))?;
    Ok(BillLine {
        kind,
        out_trade_no: get(OUT_TRADE_NO).to_owned(),
        transaction_id: get(TRANSACTION_ID).to_owned(),
        out_refund_no,
        amount_fen,
        fee_milli_fen,
        status: status.to_owned(),
        at: Some(at),
    })
}

/// `2021-01-28 17:07:11`, Beijing time.
fn beijing(text: &str) -> Option<Timestamp> {
    let local = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").ok()?;
    let offset = FixedOffset::east_opt(BEIJING_SECS)?;
    let at = offset.from_local_datetime(&local).single()?;
    Some(Timestamp::new(at.with_timezone(&chrono::Utc)))
}

/// A signed amount of yuan with at most five decimals, in thousandths of a fen (0.00001
/// yuan), and the number of decimals it was stated with.
fn decimal(text: &str) -> Option<(i64, usize)> {
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

/// Reads the summary row after its header (already in `record`) and checks every column
/// against `sums`; nothing may follow it.
fn check_summary<R: Read>(rows: &mut Records<R>, sums: &Sums) -> Result<(), BillError> {
    let header_line = rows.line;
    let mut index = [usize::MAX; SUMMARY_COLUMNS.len()];
    for (at, raw) in rows.record.iter().enumerate() {
        let name = header_name(raw, at, header_line)?;
        let Some(known) = SUMMARY_COLUMNS.iter().position(|c| *c == name) else {
            return Err(BillError::Format(format!(
                "line {header_line}: unknown column {name:?} in the summary header"
            )));
        };
        if index[known] != usize::MAX {
            return Err(BillError::Format(format!(
                "line {header_line}: summary column {name} appears twice"
            )));
        }
        index[known] = at;
    }
    if let Some(missing) = index.iter().position(|i| *i == usize::MAX) {
        return Err(BillError::Format(format!(
            "line {header_line}: the summary header lacks column {}",
            SUMMARY_COLUMNS[missing]
        )));
    }
    if !rows.next()? {
        return Err(BillError::Format(format!(
            "the summary header on line {header_line} has no summary row after it"
        )));
    }
    let line = rows.line;
    let text = utf8(&rows.record, line)?;
    if text.len() != SUMMARY_COLUMNS.len() {
        return Err(BillError::Format(format!(
            "line {line}: the summary row has {} fields, its header {}",
            text.len(),
            SUMMARY_COLUMNS.len()
        )));
    }
    let stated = |name: &str| {
        let at = SUMMARY_COLUMNS
            .iter()
            .position(|c| *c == name)
            .map_or(usize::MAX, |i| index[i]);
        text.get(at).map_or("", |v| value(v))
    };
    let count = stated("总交易单数");
    if count_of(count) != Some(sums.rows) {
        return Err(BillError::Summary(format!(
            "总交易单数 states {count}, the bill has {} detail rows",
            sums.rows
        )));
    }
    for (name, sum) in [
        ("应结订单总金额", sums.settlement_fen),
        ("退款总金额", sums.refund_fen),
        ("充值券退款总金额", sums.coupon_refund_fen),
        ("订单总金额", sums.order_fen),
        ("申请退款总金额", sums.applied_refund_fen),
    ] {
        let text = stated(name);
        let fen = yuan_to_fen(text).map_err(|_| {
            BillError::Format(format!("line {line}, column {name}: {text:?} is not yuan"))
        })?;
        if fen != sum {
            return Err(BillError::Summary(format!(
                "{name} states {text}, the detail rows sum to {}",
                fen_text(sum)
            )));
        }
    }
    let fee = stated("手续费总金额");
    let (milli, places) = decimal(fee).ok_or_else(|| {
        BillError::Format(format!(
            "line {line}, column 手续费总金额: {fee:?} is not yuan with at most five decimals"
        ))
    })?;
    let agrees = if places > 2 {
        milli == sums.fee_milli_fen
    } else {
        milli == bill::round_milli_fen(sums.fee_milli_fen) * 1000
    };
    if !agrees {
        return Err(BillError::Summary(format!(
            "手续费总金额 states {fee}, the detail rows sum to {}",
            milli_text(sums.fee_milli_fen)
        )));
    }
    if rows.next()? {
        return Err(BillError::Format(format!(
            "line {}: more after the summary row",
            rows.line
        )));
    }
    Ok(())
}

/// 总交易单数: a whole number (some bills state it as `45.0`).
fn count_of(text: &str) -> Option<i64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || !fraction.bytes().all(|b| b == b'0') {
        return None;
    }
    whole.parse().ok()
}

fn fen_text(fen: i64) -> String {
    let sign = if fen < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", fen.abs() / 100, fen.abs() % 100)
}

fn milli_text(milli: i64) -> String {
    let sign = if milli < 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:05}",
        milli.abs() / 100_000,
        milli.abs() % 100_000
    )
}

#[cfg(test)]
mod tests;
