//! The Alipay bill (账单): `alipay.data.dataservice.bill.downloadurl.query` for a day's
//! `trade` bill, the download of the zip it names, and the streaming read of its two GBK CSVs.
//!
//! Alipay: the zip holds `<pid>_<date>_业务明细.csv` (one row per payment or refund) and
//! `<pid>_<date>_业务明细(汇总).csv` (one row per store and a `合计` row), entry names in GBK
//! without the zip's UTF-8 flag. Both start with `#` comment lines (`#账号：[…]` names the
//! seller's account: its PID, followed by the account suffix `0156` in the files Alipay
//! hands out), then a header row; values may carry trailing tabs. No hash is given: the
//! file's own totals are what it is checked against.
//!
//! What is checked, and how (the wording as Alipay writes it, and as the projects that parse
//! these bills read it):
//! - 业务明细, after its rows: `#交易合计：N笔，商家实收共X元，商家优惠共Y元` — N the number of
//!   `交易` rows, X and Y the sums of their 商家实收（元） and 商家优惠（元）; and
//!   `#退款合计：N笔，商家实收退款共X元，商家优惠退款共Y元` — the same over the `退款` rows (whose
//!   amounts are negative, so X and Y are too). Both lines are required; a figure with any
//!   other label is a format this reader does not know.
//! - 业务明细(汇总), its `合计` row (门店编号 `合计`): 交易订单总笔数 = the `交易` rows,
//!   退款订单总笔数 = the `退款` rows, and 订单金额（元）, 商家实收（元）, 服务费（元）= the sums of
//!   those columns over every detail row as stated (refunds negative).
//!
//! A payment's fee is what Alipay keeps and a refund's is what it gives back, whichever sign
//! the file gives 服务费（元）: [`BillLine::fee_milli_fen`] is its size, positive on a
//! payment and negative on a refund.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek};
use std::time::Duration;

use chrono::{FixedOffset, NaiveDate, NaiveDateTime, TimeZone};
use encoding_rs::GBK;
use zip::ZipArchive;

use super::AlipayApi;
use crate::channel::api::{ApiFuture, Failure};
use crate::channel::bill::{
    self, BillError, BillFile, BillLine, BillSource, BillTotals, Fetched, LineKind,
    MAX_BILL_BYTES,
};
use crate::money::yuan_to_fen;
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The OpenAPI method that hands out a bill's download URL.
pub const METHOD: &str = "alipay.data.dataservice.bill.downloadurl.query";

/// Alipay's answer for a day without a bill (no trade, or not generated yet).
const NO_BILL: &str = "isp.bill_not_exist";

/// The details entry's columns (业务明细, `trade` bill), all of them required.
const DETAIL_COLUMNS: [&str; 25] = [
    "支付宝交易号",
    "商户订单号",
    "业务类型",
    "商品名称",
    "创建时间",
    "完成时间",
    "门店编号",
    "门店名称",
    "操作员",
    "终端号",
    "对方账户",
    "订单金额（元）",
    "商家实收（元）",
    "支付宝红包（元）",
    "集分宝（元）",
    "支付宝优惠（元）",
    "商家优惠（元）",
    "券核销金额（元）",
    "券名称",
    "商家红包消费金额（元）",
    "卡消费金额（元）",
    "退款批次号/请求号",
    "服务费（元）",
    "分润（元）",
    "备注",
];
const TRADE_NO: usize = 0;
const OUT_TRADE_NO: usize = 1;
const KIND: usize = 2;
const DONE_AT: usize = 5;
const ORDER: usize = 11;
const RECEIVED: usize = 12;
const DISCOUNT: usize = 16;
const REFUND_NO: usize = 21;
const FEE: usize = 22;

/// The summary entry's columns (业务明细(汇总)), all of them required.
const SUMMARY_COLUMNS: [&str; 12] = [
    "门店编号",
    "门店名称",
    "交易订单总笔数",
    "退款订单总笔数",
    "订单金额（元）",
    "商家实收（元）",
    "支付宝优惠（元）",
    "商家优惠（元）",
    "卡消费金额（元）",
    "服务费（元）",
    "分润（元）",
    "实收净额（元）",
];
const STORE: usize = 0;
const PAYMENTS: usize = 2;
const REFUNDS: usize = 3;
const S_ORDER: usize = 4;
const S_RECEIVED: usize = 5;
const S_FEE: usize = 9;

const DETAILS: &str = "业务明细";
const SUMMARY: &str = "业务明细(汇总)";

impl BillSource for AlipayApi {
    fn channel(&self) -> ChannelId {
        ChannelId::Alipay
    }

    fn accounts(&self) -> Vec<String> {
        self.apps.ids()
    }

    /// `account` is an `app_id`; the bill is its seller's (`#账号` must name that PID).
    fn fetch<'a>(
        &'a self,
        account: &'a str,
        date: NaiveDate,
        download_timeout: Duration,
        now: Timestamp,
    ) -> ApiFuture<'a, Result<Fetched, BillError>> {
        Box::pin(async move {
            let a = self.apps.get(account)?;
            let biz = serde_json::json!({
                "bill_type": "trade",
                "bill_date": date.format("%Y-%m-%d").to_string(),
            });
            let r = self.call(a, METHOD, &biz, now).await?;
            if r.code != "10000" {
                return match r.sub_code.as_deref() {
                    Some(NO_BILL) => Ok(Fetched::NoBill(format!(
                        "{NO_BILL} {}",
                        r.sub_msg.as_deref().unwrap_or("")
                    ))),
                    _ => Err(r.failure().into()),
                };
            }
            let url = r
                .bill_download_url
                .as_deref()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| Failure::Unexpected("10000 without bill_download_url".into()))?;
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| BillError::Download(format!("bill_download_url {url:?}: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(BillError::Download(format!(
                    "bill_download_url {url:?} is not http(s)"
                )));
            }
            let plumbing = self.apps.plumbing();
            // The URL carries its own token: no Authorization header, nothing to sign.
            let (file, _size) =
                bill::download(plumbing, plumbing.client().get(parsed), download_timeout).await?;
            let opened = open(file)?;
            Ok(Fetched::Bill(Box::new(AlipayBill {
                opened,
                seller_id: a.app.seller_id.clone(),
            })))
        })
    }
}

/// A downloaded bill whose zip opened with both entries in it.
struct AlipayBill {
    opened: Opened<File>,
    seller_id: String,
}

impl BillFile for AlipayBill {
    fn read(
        self: Box<Self>,
        each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
    ) -> Result<BillTotals, BillError> {
        read_opened(self.opened, &self.seller_id, each)
    }
}

/// The bill's zip, and where its two entries are.
struct Opened<R> {
    zip: ZipArchive<BufReader<R>>,
    details: usize,
    summary: usize,
}

fn archive(e: impl std::fmt::Display) -> BillError {
    BillError::Archive(e.to_string())
}

/// Opens the zip and finds its details and summary entries by name (GBK, or UTF-8 when the
/// name is valid UTF-8). A truncated or corrupt zip, or one without both, is
/// [`BillError::Archive`].
fn open<R: Read + Seek>(file: R) -> Result<Opened<R>, BillError> {
    let zip = ZipArchive::new(BufReader::new(file)).map_err(archive)?;
    let (mut details, mut summary) = (None, None);
    for (i, raw) in zip.file_names_raw().enumerate() {
        let name = match std::str::from_utf8(raw) {
            Ok(name) => Cow::Borrowed(name),
            Err(_) => GBK.decode_without_bom_handling(raw).0,
        };
        let base = name.rsplit('/').next().unwrap_or(&name);
        let slot = if base.ends_with(&format!("_{DETAILS}.csv")) {
            &mut details
        } else if base.ends_with(&format!("_{SUMMARY}.csv"))
            || base.ends_with(&format!("_{DETAILS}（汇总）.csv"))
        {
            &mut summary
        } else {
            continue;
        };
        if slot.replace(i).is_some() {
            return Err(BillError::Archive(format!("two entries like {name}")));
        }
    }
    match (details, summary) {
        (Some(details), Some(summary)) => Ok(Opened {
            zip,
            details,
            summary,
        }),
        (None, _) => Err(BillError::Archive(format!("no …_{DETAILS}.csv entry"))),
        (_, None) => Err(BillError::Archive(format!("no …_{SUMMARY}.csv entry"))),
    }
}

/// Reads a downloaded bill zip: the summary entry, then every detail row streamed to `each`,
/// then the one checked against the other (see the module docs). What
/// [`BillFile::read`] of an Alipay bill does, on a file.
pub fn read_archive(
    file: File,
    seller_id: &str,
    each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
) -> Result<BillTotals, BillError> {
    read_opened(open(file)?, seller_id, each)
}

fn read_opened<R: Read + Seek>(
    mut opened: Opened<R>,
    seller_id: &str,
    each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
) -> Result<BillTotals, BillError> {
    let summary = {
        let entry = opened.zip.by_index(opened.summary).map_err(archive)?;
        read_summary(entry, seller_id)?
    };
    let entry = opened.zip.by_index(opened.details).map_err(archive)?;
    let details = read_details(entry, seller_id, each)?;
    summary.check(&details)?;
    Ok(details.totals)
}

/// The sums of one kind of detail row, as the file states them (refunds negative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindSums {
    pub count: i64,
    /// 订单金额（元）.
    pub order_fen: i64,
    /// 商家实收（元）.
    pub received_fen: i64,
    /// 商家优惠（元）.
    pub discount_fen: i64,
    /// 服务费（元）, in thousandths of a fen.
    pub fee_milli_fen: i64,
}

impl KindSums {
    fn add(&mut self, row: &Row) {
        self.count += 1;
        self.order_fen += row.order_fen;
        self.received_fen += row.received_fen;
        self.discount_fen += row.discount_fen;
        self.fee_milli_fen += row.fee_milli_fen;
    }
}

/// What the details entry came to: the neutral totals, and the sums its summary is checked
/// against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Details {
    pub totals: BillTotals,
    pub payments: KindSums,
    pub refunds: KindSums,
}

/// The 合计 row of 业务明细(汇总).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// 交易订单总笔数.
    pub payments: i64,
    /// 退款订单总笔数.
    pub refunds: i64,
    /// 订单金额（元）.
    pub order_fen: i64,
    /// 商家实收（元）.
    pub received_fen: i64,
    /// 服务费（元）, in thousandths of a fen.
    pub fee_milli_fen: i64,
}

impl Summary {
    /// The 合计 row against the detail rows: counts per kind, and 订单金额, 商家实收 and
    /// 服务费 over all rows as stated.
    pub fn check(&self, d: &Details) -> Result<(), BillError> {
        let both = |f: fn(&KindSums) -> i64| f(&d.payments) + f(&d.refunds);
        let figures = [
            ("交易订单总笔数", self.payments, d.payments.count, false),
            ("退款订单总笔数", self.refunds, d.refunds.count, false),
            ("订单金额（元）", self.order_fen, both(|k| k.order_fen), true),
            (
                "商家实收（元）",
                self.received_fen,
                both(|k| k.received_fen),
                true,
            ),
        ];
        for (name, stated, counted, yuan) in figures {
            if stated != counted {
                let show = |v| if yuan { fen_text(v) } else { v.to_string() };
                return Err(BillError::Summary(format!(
                    "{SUMMARY} 合计 {name} is {}, the details add up to {}",
                    show(stated),
                    show(counted)
                )));
            }
        }
        let fees = both(|k| k.fee_milli_fen);
        if self.fee_milli_fen != fees {
            return Err(BillError::Summary(format!(
                "{SUMMARY} 合计 服务费（元） is {}, the details add up to {}",
                milli_text(self.fee_milli_fen),
                milli_text(fees)
            )));
        }
        Ok(())
    }
}

fn fen_text(fen: i64) -> String {
    let sign = if fen < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", fen.abs() / 100, fen.abs() % 100)
}

fn milli_text(milli: i64) -> String {
    let sign = if milli < 0 { "-" } else { "" };
    format!("{sign}{}.{:05}", milli.abs() / 100_000, milli.abs() % 100_000)
}

/// The lines of one entry, decoded from GBK one at a time (a GBK trail byte is never `\n`,
/// so a line is whole bytes of whole characters), numbered from 1.
struct Lines<R> {
    input: R,
    entry: &'static str,
    buf: Vec<u8>,
    number: u64,
    read: u64,
}

impl<R: BufRead> Lines<R> {
    fn new(input: R, entry: &'static str) -> Self {
        Self {
            input,
            entry,
            buf: Vec::with_capacity(512),
            number: 0,
            read: 0,
        }
    }

    fn next(&mut self) -> Result<Option<(u64, Cow<'_, str>)>, BillError> {
        self.buf.clear();
        let n = self
            .input
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| BillError::Archive(format!("{}: {e}", self.entry)))?;
        if n == 0 {
            return Ok(None);
        }
        self.read += n as u64;
        if self.read > MAX_BILL_BYTES {
            return Err(BillError::Archive(format!(
                "{} is larger than {MAX_BILL_BYTES} bytes",
                self.entry
            )));
        }
        self.number += 1;
        let mut bytes = self.buf.as_slice();
        while let Some((b'\n' | b'\r', rest)) = bytes.split_last() {
            bytes = rest;
        }
        match GBK.decode_without_bom_handling_and_without_replacement(bytes) {
            Some(text) => Ok(Some((self.number, text))),
            None => Err(BillError::Format(format!(
                "{} line {}: bytes that are not GBK",
                self.entry, self.number
            ))),
        }
    }
}

/// A value without the tabs and spaces Alipay pads it with.
fn trim(value: &str) -> &str {
    value.trim_matches(|c| c == '\t' || c == ' ')
}

/// The comma-separated values of a line, trimmed; a value may be quoted (`""` is a quote).
fn fields(line: &str) -> Result<Vec<Cow<'_, str>>, String> {
    if !line.contains('"') {
        return Ok(line.split(',').map(|f| Cow::Borrowed(trim(f))).collect());
    }
    let mut out = Vec::new();
    let mut rest = line;
    loop {
        let Some(quoted) = rest.trim_start_matches([' ', '\t']).strip_prefix('"') else {
            match rest.split_once(',') {
                Some((value, more)) => {
                    out.push(Cow::Borrowed(trim(value)));
                    rest = more;
                    continue;
                }
                None => {
                    out.push(Cow::Borrowed(trim(rest)));
                    return Ok(out);
                }
            }
        };
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let after = loop {
            match chars.next() {
                Some((i, '"')) if quoted[i + 1..].starts_with('"') => {
                    chars.next();
                    value.push('"');
                }
                Some((i, '"')) => break &quoted[i + 1..],
                Some((_, c)) => value.push(c),
                None => return Err("a quoted value that does not end on its line".into()),
            }
        };
        out.push(Cow::Owned(value));
        let after = after.trim_start_matches([' ', '\t']);
        match after.strip_prefix(',') {
            Some(more) => rest = more,
            None if after.is_empty() => return Ok(out),
            None => return Err(format!("text after a quoted value: {after:?}")),
        }
    }
}

/// Where each of `names` is in `header`: every one present once, nothing else.
fn positions<const N: usize>(
    names: &[&str; N],
    header: &[Cow<'_, str>],
    entry: &str,
    line: u64,
) -> Result<[usize; N], BillError> {
    let mut at = [usize::MAX; N];
    for (i, name) in header.iter().enumerate() {
        let Some(k) = names.iter().position(|n| n == name) else {
            return Err(BillError::Format(format!(
                "{entry} line {line}: unknown column {name:?}"
            )));
        };
        if at[k] != usize::MAX {
            return Err(BillError::Format(format!(
                "{entry} line {line}: column {name:?} twice"
            )));
        }
        at[k] = i;
    }
    if let Some(k) = at.iter().position(|i| *i == usize::MAX) {
        return Err(BillError::Format(format!(
            "{entry} line {line}: missing column {:?}",
            names[k]
        )));
    }
    Ok(at)
}

/// Yuan with an optional leading `-`, to fen, exactly.
fn signed_fen(text: &str) -> Option<i64> {
    match text.strip_prefix('-') {
        Some(size) => yuan_to_fen(size).ok().map(|fen| -fen),
        None => yuan_to_fen(text).ok(),
    }
}

/// Yuan with an optional leading `-` and up to five decimals, to thousandths of a fen.
fn signed_milli_fen(text: &str) -> Option<i64> {
    let (negative, size) = match text.strip_prefix('-') {
        Some(size) => (true, size),
        None => (false, text),
    };
    let (whole, fraction) = size.split_once('.').unwrap_or((size, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (size.contains('.') && !digits(fraction)) || fraction.len() > 5 {
        return None;
    }
    let fraction: i64 = format!("{fraction:0<5}").parse().ok()?;
    let milli = whole
        .parse::<i64>()
        .ok()?
        .checked_mul(100_000)?
        .checked_add(fraction)?;
    Some(if negative { -milli } else { milli })
}

/// `#账号：[2088…0156]`: the seller's PID, with or without Alipay's account suffix `0156`.
fn check_account(comment: &str, seller_id: &str, entry: &str) -> Result<bool, BillError> {
    let Some(value) = comment.strip_prefix("#账号：") else {
        return Ok(false);
    };
    let value = trim(value);
    let account = value
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(value);
    if account == seller_id || account.strip_prefix(seller_id) == Some("0156") {
        Ok(true)
    } else {
        Err(BillError::OtherAccount(format!(
            "{entry} #账号 {account} is not seller {seller_id}"
        )))
    }
}

/// One detail row's amounts, as stated.
struct Row {
    order_fen: i64,
    received_fen: i64,
    discount_fen: i64,
    fee_milli_fen: i64,
}

/// Reads the details entry (业务明细) of a bill of `seller_id`, handing each row to `each`,
/// and checks its `#交易合计` / `#退款合计` lines against the rows (see the module docs).
pub fn read_details(
    input: impl Read,
    seller_id: &str,
    each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
) -> Result<Details, BillError> {
    let mut lines = Lines::new(BufReader::with_capacity(1 << 16, input), DETAILS);
    let mut account = false;
    let mut header: Option<[usize; 25]> = None;
    let mut width = 0;
    let mut ended = false;
    let mut d = Details::default();
    let mut fee_milli_fen = 0;
    let (mut payments_line, mut refunds_line) = (None, None);
    while let Some((n, line)) = lines.next()? {
        let line = trim(&line);
        if line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            if header.is_none() {
                account |= check_account(line, seller_id, DETAILS)?;
            } else {
                ended = true;
                if let Some(rest) = line.strip_prefix("#交易合计：") {
                    payments_line = Some((n, stated_total(rest, n, false)?));
                } else if let Some(rest) = line.strip_prefix("#退款合计：") {
                    refunds_line = Some((n, stated_total(rest, n, true)?));
                }
            }
            continue;
        }
        let values = fields(line).map_err(|e| format_error(n, &e))?;
        let Some(at) = header else {
            if !account {
                return Err(BillError::Format(format!(
                    "{DETAILS}: no #账号 line before the header (line {n})"
                )));
            }
            header = Some(positions(&DETAIL_COLUMNS, &values, DETAILS, n)?);
            width = values.len();
            continue;
        };
        if ended {
            return Err(format_error(n, "a row after the end of the details"));
        }
        if values.len() != width {
            return Err(format_error(
                n,
                &format!("{} values, the header has {width}", values.len()),
            ));
        }
        let (line, row) = detail_line(&values, &at, n)?;
        match line.kind {
            LineKind::Payment => d.payments.add(&row),
            LineKind::Refund => d.refunds.add(&row),
        }
        d.totals.add(&line, &mut fee_milli_fen);
        each(line)?;
    }
    if header.is_none() {
        return Err(BillError::Format(format!("{DETAILS}: no header row")));
    }
    for (name, stated, sums) in [
        ("#交易合计", payments_line, &d.payments),
        ("#退款合计", refunds_line, &d.refunds),
    ] {
        let Some((n, stated)) = stated else {
            return Err(BillError::Format(format!("{DETAILS}: no {name} line")));
        };
        stated.check(name, n, sums)?;
    }
    Ok(d)
}

fn format_error(line: u64, what: &str) -> BillError {
    BillError::Format(format!("{DETAILS} line {line}: {what}"))
}

/// One detail row as a [`BillLine`], and its amounts as stated.
fn detail_line(
    values: &[Cow<'_, str>],
    at: &[usize; 25],
    n: u64,
) -> Result<(BillLine, Row), BillError> {
    let value = |k: usize| values[at[k]].as_ref();
    let amount = |k: usize| {
        signed_fen(value(k)).ok_or_else(|| {
            format_error(
                n,
                &format!("{} {:?} is not yuan", DETAIL_COLUMNS[k], value(k)),
            )
        })
    };
    let kind = match value(KIND) {
        "交易" => LineKind::Payment,
        "退款" => LineKind::Refund,
        other => {
            return Err(format_error(
                n,
                &format!("业务类型 {other:?} is neither 交易 nor 退款"),
            ));
        }
    };
    let transaction_id = value(TRADE_NO);
    if transaction_id.is_empty() {
        return Err(format_error(n, "支付宝交易号 is empty"));
    }
    let order_fen = amount(ORDER)?;
    // A payment is money in, a refund money back: Alipay states refunds negative.
    let amount_fen = match kind {
        LineKind::Payment if order_fen > 0 => order_fen,
        LineKind::Refund if order_fen < 0 => -order_fen,
        _ => {
            return Err(format_error(
                n,
                &format!(
                    "订单金额（元） {:?} of a {} row",
                    value(ORDER),
                    value(KIND)
                ),
            ));
        }
    };
    let fee_stated = signed_milli_fen(value(FEE)).ok_or_else(|| {
        format_error(n, &format!("服务费（元） {:?} is not yuan", value(FEE)))
    })?;
    let fee_milli_fen = match kind {
        LineKind::Payment => fee_stated.abs(),
        LineKind::Refund => -fee_stated.abs(),
    };
    let at_text = value(DONE_AT);
    let at = if at_text.is_empty() {
        None
    } else {
        Some(beijing_time(at_text).ok_or_else(|| {
            format_error(n, &format!("完成时间 {at_text:?} is not yyyy-MM-dd HH:mm:ss"))
        })?)
    };
    let refund_no = value(REFUND_NO);
    let line = BillLine {
        kind,
        out_trade_no: value(OUT_TRADE_NO).to_owned(),
        transaction_id: transaction_id.to_owned(),
        out_refund_no: (kind == LineKind::Refund && !refund_no.is_empty())
            .then(|| refund_no.to_owned()),
        amount_fen,
        fee_milli_fen,
        status: value(KIND).to_owned(),
        at,
    };
    let row = Row {
        order_fen,
        received_fen: amount(RECEIVED)?,
        discount_fen: amount(DISCOUNT)?,
        fee_milli_fen: fee_stated,
    };
    Ok((line, row))
}

/// Alipay's times: `yyyy-MM-dd HH:mm:ss`, Beijing.
fn beijing_time(text: &str) -> Option<Timestamp> {
    let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").ok()?;
    let at = FixedOffset::east_opt(8 * 3600)?
        .from_local_datetime(&naive)
        .single()?;
    Some(Timestamp::new(at.with_timezone(&chrono::Utc)))
}

/// A `#交易合计` / `#退款合计` line: `N笔，商家实收共X元，商家优惠共Y元` (refunds:
/// `商家实收退款共`, `商家优惠退款共`).
struct StatedTotal {
    count: i64,
    received_fen: Option<i64>,
    discount_fen: Option<i64>,
}

fn stated_total(rest: &str, n: u64, refunds: bool) -> Result<StatedTotal, BillError> {
    let bad = |what: &str| format_error(n, &format!("{what} in {rest:?}"));
    let mut parts = rest.split('，').map(trim);
    let count = parts
        .next()
        .and_then(|c| c.strip_suffix('笔'))
        .and_then(|c| c.parse::<i64>().ok())
        .ok_or_else(|| bad("no count (N笔)"))?;
    let (received, discount) = if refunds {
        ("商家实收退款", "商家优惠退款")
    } else {
        ("商家实收", "商家优惠")
    };
    let mut stated = StatedTotal {
        count,
        received_fen: None,
        discount_fen: None,
    };
    for part in parts {
        let (label, amount) = part
            .split_once('共')
            .ok_or_else(|| bad(&format!("a figure {part:?} without 共")))?;
        let fen = amount
            .strip_suffix('元')
            .and_then(signed_fen)
            .ok_or_else(|| bad(&format!("{label} {amount:?} is not yuan")))?;
        let slot = if label == received {
            &mut stated.received_fen
        } else if label == discount {
            &mut stated.discount_fen
        } else {
            return Err(bad(&format!("an unknown figure {label:?}")));
        };
        *slot = Some(fen);
    }
    Ok(stated)
}

impl StatedTotal {
    fn check(&self, name: &str, n: u64, sums: &KindSums) -> Result<(), BillError> {
        let off = |figure: &str, stated: String, counted: String| {
            Err(BillError::Summary(format!(
                "{DETAILS} line {n} {name} {figure} is {stated}, the rows add up to {counted}"
            )))
        };
        if self.count != sums.count {
            return off("笔", self.count.to_string(), sums.count.to_string());
        }
        for (figure, stated, counted) in [
            ("商家实收", self.received_fen, sums.received_fen),
            ("商家优惠", self.discount_fen, sums.discount_fen),
        ] {
            if let Some(stated) = stated
                && stated != counted
            {
                return off(figure, fen_text(stated), fen_text(counted));
            }
        }
        Ok(())
    }
}

/// Reads the summary entry (业务明细(汇总)) of a bill of `seller_id`: its `合计` row.
pub fn read_summary(input: impl Read, seller_id: &str) -> Result<Summary, BillError> {
    let mut lines = Lines::new(BufReader::new(input), SUMMARY);
    let bad = |n: u64, what: &str| BillError::Format(format!("{SUMMARY} line {n}: {what}"));
    let mut header: Option<[usize; 12]> = None;
    let mut total = None;
    while let Some((n, line)) = lines.next()? {
        let line = trim(&line);
        if line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            check_account(line, seller_id, SUMMARY)?;
            continue;
        }
        let values = fields(line).map_err(|e| bad(n, &e))?;
        let Some(at) = header else {
            header = Some(positions(&SUMMARY_COLUMNS, &values, SUMMARY, n)?);
            continue;
        };
        if values.len() != SUMMARY_COLUMNS.len() {
            return Err(bad(
                n,
                &format!(
                    "{} values, the header has {}",
                    values.len(),
                    SUMMARY_COLUMNS.len()
                ),
            ));
        }
        let value = |k: usize| values[at[k]].as_ref();
        if value(STORE) != "合计" {
            continue;
        }
        if total.is_some() {
            return Err(bad(n, "a second 合计 row"));
        }
        let count = |k: usize| {
            value(k).parse::<i64>().map_err(|_| {
                bad(
                    n,
                    &format!("{} {:?} is not a count", SUMMARY_COLUMNS[k], value(k)),
                )
            })
        };
        let fen = |k: usize| {
            signed_fen(value(k)).ok_or_else(|| {
                bad(
                    n,
                    &format!("{} {:?} is not yuan", SUMMARY_COLUMNS[k], value(k)),
                )
            })
        };
        total = Some(Summary {
            payments: count(PAYMENTS)?,
            refunds: count(REFUNDS)?,
            order_fen: fen(S_ORDER)?,
            received_fen: fen(S_RECEIVED)?,
            fee_milli_fen: signed_milli_fen(value(S_FEE)).ok_or_else(|| {
                bad(n, &format!("服务费（元） {:?} is not yuan", value(S_FEE)))
            })?,
        });
    }
    total.ok_or_else(|| BillError::Format(format!("{SUMMARY}: no 合计 row")))
}
