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
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::time::Duration;

use chrono::{FixedOffset, NaiveDate, NaiveDateTime, TimeZone};
use encoding_rs::GBK;
use zip::ZipArchive;

use super::AlipayApi;
use crate::channel::api::{ApiFuture, Failure};
use crate::channel::bill::{
    self, BillError, BillFile, BillLine, BillSource, BillTotals, Fetched, LineKind, MAX_BILL_BYTES,
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

    /// The first app (configuration order) of each seller: Alipay's bill is the seller's,
    /// the same file whichever of its apps asks.
    fn accounts(&self) -> Vec<String> {
        let mut sellers: Vec<&str> = Vec::new();
        let mut first = Vec::new();
        for a in self.apps.list() {
            if !sellers.contains(&a.app.seller_id.as_str()) {
                sellers.push(&a.app.seller_id);
                first.push(a.app.app_id.clone());
            }
        }
        first
    }

    /// Every app with API credentials of `account`'s seller, `account` first.
    fn covers(&self, account: &str) -> Vec<String> {
        let Ok(a) = self.apps.get(account) else {
            return vec![account.to_owned()];
        };
        let mut apps = vec![account.to_owned()];
        apps.extend(
            self.apps
                .list()
                .iter()
                .filter(|o| o.app.seller_id == a.app.seller_id && o.app.app_id != account)
                .map(|o| o.app.app_id.clone()),
        );
        apps
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
            let parsed = download_url(url, &self.bill_hosts)?;
            let plumbing = self.apps.plumbing();
            // The URL carries its own token: no Authorization header, nothing to sign.
            let (file, _size) =
                bill::download(plumbing, plumbing.client().get(parsed), download_timeout).await?;
            // Reading the zip's directory is blocking work.
            let opened = tokio::task::spawn_blocking(move || open(file))
                .await
                .map_err(|e| BillError::Archive(format!("the zip was not opened: {e}")))??;
            Ok(Fetched::Bill(Box::new(AlipayBill {
                opened,
                seller_id: a.app.seller_id.clone(),
            })))
        })
    }
}

/// Where a bill is downloaded from: `bill_download_url` when it names one of `hosts`
/// (`alipay.bill_hosts`), over HTTPS. The file carries no hash or signature, so whoever
/// answers that URL writes the bill: Alipay's documented `http://dwbillcenter.alipay.com/…`
/// is fetched as `https://…`, and plain HTTP is kept only for a loopback stand-in.
pub fn download_url(url: &str, hosts: &[String]) -> Result<reqwest::Url, BillError> {
    let refused = |why: &str| BillError::Download(format!("bill_download_url {url:?} {why}"));
    let mut parsed = reqwest::Url::parse(url).map_err(|e| refused(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(refused("is not http(s)"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(refused("carries credentials"));
    }
    let host = parsed.host_str().unwrap_or_default();
    if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        return Err(refused(&format!(
            "is not on a host of alipay.bill_hosts ({})",
            hosts.join(", ")
        )));
    }
    if parsed.scheme() == "http" && !crate::https::is_loopback(&parsed) {
        parsed
            .set_scheme("https")
            .map_err(|()| refused("cannot be made https"))?;
    }
    Ok(parsed)
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

/// The most entries a bill zip may have (Alipay's has two): the zip reader holds every
/// entry's name and metadata (about 200 bytes each), so a zip of empty entries would cost
/// memory by the hundred thousand.
pub const MAX_ZIP_ENTRIES: u16 = 16;

/// The largest central directory a bill zip may declare (Alipay's is a few hundred bytes).
pub const MAX_ZIP_DIRECTORY_BYTES: u32 = 64 * 1024;

/// Checks, before the zip reader reads it, the central directory every end record it could
/// take declares (a signature among the last 64 KiB + 26 bytes, whose comment fits): at
/// most [`MAX_ZIP_ENTRIES`] entries in at most [`MAX_ZIP_DIRECTORY_BYTES`], and no ZIP64
/// (over 65,535 entries or 4 GiB, never a bill).
fn check_directory<R: Read + Seek>(file: &mut R) -> Result<(), BillError> {
    const END: [u8; 4] = *b"PK\x05\x06";
    const END_BYTES: usize = 22;
    let len = file.seek(SeekFrom::End(0)).map_err(archive)?;
    let start = len.saturating_sub((END_BYTES + 4 + (1 << 16)) as u64);
    file.seek(SeekFrom::Start(start)).map_err(archive)?;
    let mut tail = Vec::new();
    file.by_ref()
        .take(len - start)
        .read_to_end(&mut tail)
        .map_err(archive)?;
    file.rewind().map_err(archive)?;
    for at in 0..tail.len().saturating_sub(END_BYTES - 1) {
        let record = &tail[at..];
        if record[..4] != END {
            continue;
        }
        let u16_at = |i: usize| u16::from_le_bytes([record[i], record[i + 1]]);
        let u32_at = |i: usize| u32::from(u16_at(i)) | (u32::from(u16_at(i + 2)) << 16);
        if usize::from(u16_at(20)) + END_BYTES > record.len() {
            // Its comment would run past the end: not an end record the reader takes.
            continue;
        }
        let entries = u16_at(8).max(u16_at(10));
        let size = u32_at(12);
        if entries == u16::MAX || size == u32::MAX || u32_at(16) == u32::MAX {
            return Err(BillError::Archive(
                "a ZIP64 directory (over 65,535 entries or 4 GiB): not an Alipay bill".into(),
            ));
        }
        if entries > MAX_ZIP_ENTRIES {
            return Err(BillError::Archive(format!(
                "{entries} entries: a bill zip has at most {MAX_ZIP_ENTRIES}"
            )));
        }
        if size > MAX_ZIP_DIRECTORY_BYTES {
            return Err(BillError::Archive(format!(
                "a central directory of {size} bytes: a bill zip's is at most {MAX_ZIP_DIRECTORY_BYTES}"
            )));
        }
    }
    Ok(())
}

/// Opens the zip and finds its details and summary entries by name (GBK, or UTF-8 when the
/// name is valid UTF-8). A truncated or corrupt zip, one with more entries or a larger
/// directory than a bill's, or one without both, is [`BillError::Archive`].
fn open<R: Read + Seek>(mut file: R) -> Result<Opened<R>, BillError> {
    check_directory(&mut file)?;
    let zip = ZipArchive::new(BufReader::new(file)).map_err(archive)?;
    if zip.len() > usize::from(MAX_ZIP_ENTRIES) {
        return Err(BillError::Archive(format!(
            "{} entries: a bill zip has at most {MAX_ZIP_ENTRIES}",
            zip.len()
        )));
    }
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
            (
                "订单金额（元）",
                self.order_fen,
                both(|k| k.order_fen),
                true,
            ),
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
    format!(
        "{sign}{}.{:05}",
        milli.abs() / 100_000,
        milli.abs() % 100_000
    )
}

/// The most blank or comment (`#`) lines an entry may have (Alipay writes fewer than ten):
/// lines that carry nothing cost as much to read as rows do, and a zip of a few hundred KiB
/// inflates to hundreds of millions of them.
pub const MAX_OTHER_LINES: u64 = 1000;

/// The lines of one entry, decoded from GBK one at a time (a GBK trail byte is never `\n`,
/// so a line is whole bytes of whole characters), numbered from 1.
struct Lines<R> {
    input: R,
    entry: &'static str,
    buf: Vec<u8>,
    number: u64,
    read: u64,
    /// Blank and comment lines so far.
    other: u64,
}

impl<R: BufRead> Lines<R> {
    fn new(input: R, entry: &'static str) -> Self {
        Self {
            input,
            entry,
            buf: Vec::with_capacity(512),
            number: 0,
            read: 0,
            other: 0,
        }
    }

    fn next(&mut self) -> Result<Option<(u64, Cow<'_, str>)>, BillError> {
        self.buf.clear();
        let n = (&mut self.input)
            .take(bill::MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| BillError::Archive(format!("{}: {e}", self.entry)))?;
        if n == 0 {
            return Ok(None);
        }
        if n > bill::MAX_LINE_BYTES && self.buf.last() != Some(&b'\n') {
            return Err(BillError::Format(format!(
                "{} line {} is longer than {} bytes",
                self.entry,
                self.number + 1,
                bill::MAX_LINE_BYTES
            )));
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
        let value = bytes.trim_ascii_start();
        if value.is_empty() || value[0] == b'#' {
            self.other += 1;
            if self.other > MAX_OTHER_LINES {
                return Err(BillError::Format(format!(
                    "{} line {}: more than {MAX_OTHER_LINES} blank or comment lines",
                    self.entry, self.number
                )));
            }
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
                &format!("订单金额（元） {:?} of a {} row", value(ORDER), value(KIND)),
            ));
        }
    };
    let fee_stated = signed_milli_fen(value(FEE))
        .ok_or_else(|| format_error(n, &format!("服务费（元） {:?} is not yuan", value(FEE))))?;
    let fee_milli_fen = match kind {
        LineKind::Payment => fee_stated.abs(),
        LineKind::Refund => -fee_stated.abs(),
    };
    let at_text = value(DONE_AT);
    let at = if at_text.is_empty() {
        None
    } else {
        Some(beijing_time(at_text).ok_or_else(|| {
            format_error(
                n,
                &format!("完成时间 {at_text:?} is not yyyy-MM-dd HH:mm:ss"),
            )
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
            fee_milli_fen: signed_milli_fen(value(S_FEE))
                .ok_or_else(|| bad(n, &format!("服务费（元） {:?} is not yuan", value(S_FEE))))?,
        });
    }
    total.ok_or_else(|| BillError::Format(format!("{SUMMARY}: no 合计 row")))
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Write};

    use super::*;

    const SELLER: &str = "2088000000000001";
    const DATE: &str = "20261130";

    /// A detail row as Alipay writes it: ids and texts padded with a tab.
    fn row(
        trade_no: &str,
        out_trade_no: &str,
        kind: &str,
        order: &str,
        refund_no: &str,
        fee: &str,
        done: &str,
    ) -> String {
        format!(
            "{trade_no}\t,{out_trade_no}\t,{kind}\t,商品{out_trade_no},2026-11-30 09:59:00,{done},\t,\t,\t,\t,*沙箱(159****3821)\t,{order},{order},0.00,0.00,0.00,0.00,0.00,,0.00\t,0.00,{refund_no}\t,{fee},0.00,\n"
        )
    }

    /// Two payments (one with a fee) and a partial refund of the first, with the lines
    /// Alipay writes around them.
    fn details() -> String {
        let mut text = format!(
            "#支付宝业务明细查询\n#账号：[{SELLER}0156]\n#起始日期：[2026年11月30日 00:00:00]   终止日期：[2026年12月01日 00:00:00]\n#-----------------------------------------业务明细列表----------------------------------------\n{}\n",
            DETAIL_COLUMNS.join(",")
        );
        text += &row(
            "2026113022001400000000000001",
            "ORD-1",
            "交易",
            "100.00",
            "",
            "-0.60",
            "2026-11-30 10:00:07",
        );
        text += &row(
            "2026113022001400000000000002",
            "ORD-2",
            "交易",
            "0.01",
            "",
            "0.00",
            "2026-11-30 23:59:59",
        );
        text += &row(
            "2026113022001400000000000001",
            "ORD-1",
            "退款",
            "-30.00",
            "R-1",
            "0.18",
            "2026-11-30 12:00:00",
        );
        text += "#-----------------------------------------业务明细列表结束------------------------------------\n";
        text += "#交易合计：2笔，商家实收共100.01元，商家优惠共0.00元\n";
        text += "#退款合计：1笔，商家实收退款共-30.00元，商家优惠退款共0.00元\n";
        text += "#导出时间：[2026年12月01日 06:27:10]\n";
        text
    }

    fn summary() -> String {
        format!(
            "#支付宝业务汇总查询\n#账号：[{SELLER}0156]\n#起始日期：[2026年11月30日 00:00:00]   终止日期：[2026年12月01日 00:00:00]\n#-----------------------------------------业务汇总列表----------------------------------------\n{}\n\t,\t,2,1,70.01,70.01,0.00,0.00,0.00,-0.42,0.00,69.59\n合计\t,\t,2,1,70.01,70.01,0.00,0.00,0.00,-0.42,0.00,69.59\n#----------------------------------------业务汇总列表结束-------------------------------------\n#导出时间：[2026年12月01日 06:27:10]\n",
            SUMMARY_COLUMNS.join(",")
        )
    }

    fn gbk(text: &str) -> Vec<u8> {
        GBK.encode(text).0.into_owned()
    }

    /// A zip of `entries` whose names are GBK bytes without the UTF-8 flag, as Alipay's: each
    /// is written under an ASCII stand-in of the same length, replaced in the bytes after.
    fn zip_of(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        let mut names = Vec::new();
        for (i, (name, content)) in entries.iter().enumerate() {
            if name.is_ascii() {
                zip.start_file(*name, options).expect("entry");
                zip.write_all(content).expect("write");
                continue;
            }
            let raw = gbk(name);
            let stand_in = format!("{i}{}", "~".repeat(raw.len() - 1));
            zip.start_file(stand_in.as_str(), options).expect("entry");
            zip.write_all(content).expect("write");
            names.push((stand_in.into_bytes(), raw));
        }
        let mut bytes = zip.finish().expect("zip").into_inner();
        for (stand_in, raw) in names {
            let mut at = 0;
            while let Some(i) = bytes[at..]
                .windows(stand_in.len())
                .position(|w| w == stand_in.as_slice())
            {
                bytes[at + i..at + i + raw.len()].copy_from_slice(&raw);
                at += i + raw.len();
            }
        }
        bytes
    }

    fn bill_zip(details: &str, summary: &str) -> Vec<u8> {
        zip_of(&[
            (&format!("{SELLER}0156_{DATE}_业务明细.csv"), gbk(details)),
            (
                &format!("{SELLER}0156_{DATE}_业务明细(汇总).csv"),
                gbk(summary),
            ),
        ])
    }

    fn read_zip(bytes: Vec<u8>) -> Result<(Vec<BillLine>, BillTotals), BillError> {
        let mut lines = Vec::new();
        let totals = read_opened(open(Cursor::new(bytes))?, SELLER, &mut |l| {
            lines.push(l);
            Ok(())
        })?;
        Ok((lines, totals))
    }

    fn read_text(details: &str) -> Result<Details, BillError> {
        read_details_bytes(&gbk(details))
    }

    fn read_details_bytes(bytes: &[u8]) -> Result<Details, BillError> {
        read_details(bytes, SELLER, &mut |_| Ok(()))
    }

    fn format_error(result: Result<impl std::fmt::Debug, BillError>, naming: &[&str]) {
        match result {
            Err(BillError::Format(m)) => {
                for n in naming {
                    assert!(m.contains(n), "{m:?} does not name {n:?}");
                }
            }
            other => panic!("not a format error: {other:?}"),
        }
    }

    #[test]
    fn a_good_bill_reads_back_payments_refunds_and_fees() {
        let (lines, totals) = read_zip(bill_zip(&details(), &summary())).expect("read");
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            BillLine {
                kind: LineKind::Payment,
                out_trade_no: "ORD-1".into(),
                transaction_id: "2026113022001400000000000001".into(),
                out_refund_no: None,
                amount_fen: 10000,
                fee_milli_fen: 60_000,
                status: "交易".into(),
                at: beijing_time("2026-11-30 10:00:07"),
            }
        );
        let at = lines[1].at.expect("at").as_datetime();
        assert_eq!(at.to_rfc3339(), "2026-11-30T15:59:59+00:00");
        assert_eq!(lines[2].kind, LineKind::Refund);
        assert_eq!(lines[2].out_refund_no.as_deref(), Some("R-1"));
        assert_eq!(lines[2].amount_fen, 3000);
        assert_eq!(lines[2].fee_milli_fen, -18_000);
        assert_eq!(
            totals,
            BillTotals {
                count: 2,
                amount_fen: 10001,
                refund_count: 1,
                refund_fen: 3000,
                fee_fen: 42,
            }
        );
    }

    #[test]
    fn the_account_is_the_pid_with_or_without_its_suffix() {
        let plain = details().replace(&format!("[{SELLER}0156]"), &format!("[{SELLER}]"));
        assert!(read_text(&plain).is_ok());
        for other in [
            "20880000000000020156",
            "2088000000000001015",
            "20880000000000010157",
        ] {
            let text = details().replace(&format!("{SELLER}0156"), other);
            assert!(
                matches!(read_text(&text), Err(BillError::OtherAccount(m)) if m.contains(other)),
                "{other}"
            );
        }
    }

    #[test]
    fn a_bill_of_another_seller_is_refused_in_either_entry() {
        let other = details().replace(SELLER, "2088999999999999");
        assert!(matches!(read_text(&other), Err(BillError::OtherAccount(_))));
        let other = summary().replace(SELLER, "2088999999999999");
        assert!(matches!(
            read_zip(bill_zip(&details(), &other)),
            Err(BillError::OtherAccount(_))
        ));
    }

    #[test]
    fn a_bill_without_its_account_line_is_refused() {
        let text = details().replace(&format!("#账号：[{SELLER}0156]\n"), "");
        format_error(read_text(&text), &["#账号"]);
    }

    #[test]
    fn a_missing_or_unknown_column_is_named() {
        let missing = details().replacen(",服务费（元）", "", 1);
        format_error(read_text(&missing), &["missing column", "服务费（元）"]);
        let unknown = details().replacen(",备注", ",备注,商户号", 1);
        format_error(read_text(&unknown), &["unknown column", "商户号"]);
        let summary = summary().replacen(",服务费（元）", "", 1);
        format_error(
            read_zip(bill_zip(&details(), &summary)),
            &["业务明细(汇总)", "服务费（元）"],
        );
    }

    #[test]
    fn columns_are_read_by_name_not_position() {
        // The same bill with 备注 first: every value moves, nothing else changes.
        let text: String = details()
            .lines()
            .map(|l| {
                if l.starts_with('#') {
                    format!("{l}\n")
                } else {
                    let (rest, last) = l.rsplit_once(',').expect("row");
                    format!("{last},{rest}\n")
                }
            })
            .collect();
        assert_eq!(read_text(&text), read_text(&details()));
    }

    #[test]
    fn a_summary_that_disagrees_with_the_rows_names_the_figure() {
        for (from, to, figure) in [
            ("#交易合计：2笔", "#交易合计：3笔", "#交易合计 笔 is 3"),
            (
                "商家实收共100.01元",
                "商家实收共100.02元",
                "商家实收 is 100.02",
            ),
            (
                "商家实收退款共-30.00元",
                "商家实收退款共-29.00元",
                "商家实收 is -29.00",
            ),
        ] {
            let text = details().replace(from, to);
            match read_text(&text) {
                Err(BillError::Summary(m)) => assert!(m.contains(figure), "{m}"),
                other => panic!("{from}: {other:?}"),
            }
        }
        for (from, to, figure) in [
            (
                "合计\t,\t,2,1",
                "合计\t,\t,3,1",
                "交易订单总笔数 is 3, the details add up to 2",
            ),
            (
                "合计\t,\t,2,1,70.01",
                "合计\t,\t,2,1,71.01",
                "订单金额（元） is 71.01, the details add up to 70.01",
            ),
            (
                "0.00,-0.42,0.00,69.59\n#",
                "0.00,-0.43,0.00,69.59\n#",
                "服务费（元） is -0.43000",
            ),
        ] {
            let summary = summary().replace(from, to);
            match read_zip(bill_zip(&details(), &summary)) {
                Err(BillError::Summary(m)) => assert!(m.contains(figure), "{m}"),
                other => panic!("{from}: {other:?}"),
            }
        }
        let text = details().replace(
            "#退款合计：1笔，商家实收退款共-30.00元，商家优惠退款共0.00元\n",
            "",
        );
        format_error(read_text(&text), &["#退款合计"]);
        let summary = summary().replace("合计\t", "总计\t");
        format_error(read_zip(bill_zip(&details(), &summary)), &["合计"]);
    }

    #[test]
    fn bytes_that_are_not_gbk_name_their_line() {
        let mut bytes = gbk(&details());
        let at = bytes.windows(5).position(|w| w == b"ORD-2").expect("ORD-2");
        bytes[at] = 0x81;
        bytes[at + 1] = 0x20;
        format_error(read_details_bytes(&bytes), &["line 7", "GBK"]);
    }

    #[test]
    fn an_amount_that_is_not_yuan_is_named() {
        for (from, to, named) in [
            ("0.01,0.01,", "0.011,0.01,", "订单金额（元） \"0.011\""),
            ("0.01,0.01,", "1e2,0.01,", "订单金额（元） \"1e2\""),
            ("0.01,0.01,", "0.01,0.01x,", "商家实收（元） \"0.01x\""),
            (
                "-30.00,-30.00,",
                "30.00,-30.00,",
                "订单金额（元） \"30.00\" of a 退款 row",
            ),
            ("\t,-0.60,", "\t,-0.6.0,", "服务费（元） \"-0.6.0\""),
            ("2026-11-30 23:59:59", "2026-11-30 24:00:00", "完成时间"),
        ] {
            let text = details().replacen(from, to, 1);
            assert_ne!(text, details(), "{from}");
            format_error(read_text(&text), &[named]);
        }
    }

    #[test]
    fn a_business_type_other_than_payment_or_refund_is_refused() {
        let text = details().replacen("退款\t,", "冻结\t,", 1);
        format_error(read_text(&text), &["业务类型", "冻结", "line 8"]);
    }

    #[test]
    fn a_truncated_or_incomplete_zip_is_an_archive_error() {
        let whole = bill_zip(&details(), &summary());
        for cut in [whole.len() / 2, whole.len() - 10, 0] {
            assert!(
                matches!(read_zip(whole[..cut].to_vec()), Err(BillError::Archive(_))),
                "cut at {cut}"
            );
        }
        let only_summary = zip_of(&[(
            &format!("{SELLER}0156_{DATE}_业务明细(汇总).csv"),
            gbk(&summary()),
        )]);
        assert!(
            matches!(read_zip(only_summary), Err(BillError::Archive(m)) if m.contains("业务明细.csv"))
        );
        let only_details = zip_of(&[(
            &format!("{SELLER}0156_{DATE}_业务明细.csv"),
            gbk(&details()),
        )]);
        assert!(matches!(read_zip(only_details), Err(BillError::Archive(_))));
        // A corrupt entry: its bytes changed after the zip was made.
        let mut corrupt = whole.clone();
        let at = corrupt.len() / 4;
        corrupt[at] ^= 0xff;
        corrupt[at + 1] ^= 0xff;
        assert!(matches!(
            read_zip(corrupt),
            Err(BillError::Archive(_) | BillError::Format(_))
        ));
    }

    #[test]
    fn utf8_entry_names_are_found_too() {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default();
        for (name, text) in [
            ("业务明细.csv", details()),
            ("业务明细(汇总).csv", summary()),
        ] {
            zip.start_file(format!("{SELLER}0156_{DATE}_{name}"), options)
                .expect("entry");
            zip.write_all(&gbk(&text)).expect("write");
        }
        let bytes = zip.finish().expect("zip").into_inner();
        assert_eq!(read_zip(bytes).expect("read").0.len(), 3);
    }

    #[test]
    fn a_bill_url_is_on_an_alipay_bill_host_over_https() {
        let hosts = ["dwbillcenter.alipay.com".to_owned(), "127.0.0.1".to_owned()];
        let url = |u: &str| download_url(u, &hosts).map(|u| u.to_string());
        // Alipay's documented URL is http: fetched over https.
        assert_eq!(
            url("http://dwbillcenter.alipay.com/downloadBillFile.resource?bizType=trade&token=t")
                .expect("upgraded"),
            "https://dwbillcenter.alipay.com/downloadBillFile.resource?bizType=trade&token=t"
        );
        assert_eq!(
            url("https://DWBILLCENTER.alipay.com/f?token=t").expect("https"),
            "https://dwbillcenter.alipay.com/f?token=t"
        );
        // A loopback stand-in keeps plain http.
        assert_eq!(
            url("http://127.0.0.1:9000/bill?date=x").expect("loopback"),
            "http://127.0.0.1:9000/bill?date=x"
        );
        for refused in [
            "http://evil.example/downloadBillFile.resource",
            "https://dwbillcenter.alipay.com.evil.example/f",
            "https://evil.example/dwbillcenter.alipay.com",
            "https://user:pw@dwbillcenter.alipay.com/f",
            "ftp://dwbillcenter.alipay.com/f",
            "http://localhost:9000/bill",
            "dwbillcenter.alipay.com/f",
        ] {
            assert!(
                matches!(url(refused), Err(BillError::Download(m)) if m.contains(refused)),
                "{refused}"
            );
        }
    }

    /// [`bill_zip`] with `more` entries (ASCII names) besides the two CSVs.
    fn bill_zip_with(more: &[(String, Vec<u8>)]) -> Vec<u8> {
        let details_name = format!("{SELLER}0156_{DATE}_业务明细.csv");
        let summary_name = format!("{SELLER}0156_{DATE}_业务明细(汇总).csv");
        let mut entries = vec![
            (details_name.as_str(), gbk(&details())),
            (summary_name.as_str(), gbk(&summary())),
        ];
        entries.extend(more.iter().map(|(n, c)| (n.as_str(), c.clone())));
        zip_of(&entries)
    }

    #[test]
    fn a_zip_of_many_entries_or_a_large_directory_is_refused_before_it_is_read() {
        let empty: Vec<(String, Vec<u8>)> = (0..5000)
            .map(|i| (format!("empty-{i}"), Vec::new()))
            .collect();
        let e = read_zip(bill_zip_with(&empty)).err();
        assert!(
            matches!(&e, Some(BillError::Archive(m)) if m.contains("5002 entries") && m.contains("at most 16")),
            "{e:?}"
        );
        // Three entries, but names that make the directory larger than a bill's.
        let long: Vec<(String, Vec<u8>)> = (0..3)
            .map(|i| (format!("{i}{}", "n".repeat(30_000)), Vec::new()))
            .collect();
        let e = read_zip(bill_zip_with(&long)).err();
        assert!(
            matches!(&e, Some(BillError::Archive(m)) if m.contains("central directory")),
            "{e:?}"
        );
        // A few more entries than the two are read as before.
        let few = vec![("readme.txt".to_owned(), b"hello".to_vec())];
        assert_eq!(read_zip(bill_zip_with(&few)).expect("read").0.len(), 3);
    }

    #[test]
    fn blank_lines_by_the_million_are_refused_at_once() {
        // What a zip of a few hundred KiB inflates to: tens of millions of line ends
        // between the rows and the end separator, streamed, never stored.
        let text = details();
        let (rows, tail) = text.split_at(text.rfind("#---").expect("end separator"));
        let (rows, tail) = (gbk(rows), gbk(tail));
        let bomb = rows
            .as_slice()
            .chain(std::io::repeat(b'\n').take(32 << 20))
            .chain(tail.as_slice());
        let started = std::time::Instant::now();
        let e = read_details(bomb, SELLER, &mut |_| Ok(())).err();
        assert!(
            matches!(&e, Some(BillError::Format(m)) if m.contains("more than 1000 blank or comment lines")),
            "{e:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // A few blank lines are read past as before.
        let text = details().replace("#交易合计", "\n\n\t\n#交易合计");
        assert!(read_text(&text).is_ok());
    }

    #[test]
    fn quoted_values_and_padding() {
        assert_eq!(
            fields("a\t, \"b,c\" ,\"d\"\"e\",").expect("fields"),
            ["a", "b,c", "d\"e", ""]
        );
        assert!(fields("\"open,").is_err());
        assert!(fields("\"a\"b,").is_err());
    }

    #[test]
    fn fees_keep_thousandths_of_a_fen() {
        assert_eq!(signed_milli_fen("0.60"), Some(60_000));
        assert_eq!(signed_milli_fen("-29.27000"), Some(-2_927_000));
        assert_eq!(signed_milli_fen("0.00001"), Some(1));
        assert_eq!(signed_milli_fen("0.000001"), None);
        assert_eq!(signed_milli_fen("--1"), None);
        assert_eq!(signed_fen("-0.01"), Some(-1));
        assert_eq!(signed_fen("-"), None);
    }
}
