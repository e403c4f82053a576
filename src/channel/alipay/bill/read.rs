//! Reading Alipay's two entries, GBK line by line: the details' rows by header name,
//! streamed, with their `#` total lines, and the summary's `合计` row.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek};

use encoding_rs::GBK;

use super::archive::{DETAILS, Opened, SUMMARY, archive, open};
use super::checks::{Details, Row, StatedTotal, Summary};
use crate::channel::bill::{
    self, BillError, BillLine, BillTotals, LineKind, MAX_BILL_BYTES, Misfit,
};
use crate::money::yuan_to_fen;

/// The details entry's columns (业务明细, `trade` bill), all of them required.
pub(super) const DETAIL_COLUMNS: [&str; 25] = [
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
pub(super) const SUMMARY_COLUMNS: [&str; 12] = [
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

pub(super) fn read_opened<R: Read + Seek>(
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
pub(super) fn fields(line: &str) -> Result<Vec<Cow<'_, str>>, String> {
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

/// Where each of `names` is in `header` ([`bill::positions`]), a misfit named by entry and line.
fn positions<const N: usize>(
    names: &[&'static str; N],
    header: &[Cow<'_, str>],
    entry: &str,
    line: u64,
) -> Result<[usize; N], BillError> {
    let header = header.iter().map(|name| Ok(name.as_ref()));
    bill::positions(names, header, |misfit| {
        BillError::Format(match misfit {
            Misfit::Unknown(name) => format!("{entry} line {line}: unknown column {name:?}"),
            Misfit::Twice(name) => format!("{entry} line {line}: column {name:?} twice"),
            Misfit::Missing(name) => format!("{entry} line {line}: missing column {name:?}"),
        })
    })
}

/// Yuan with an optional leading `-`, to fen, exactly.
pub(super) fn signed_fen(text: &str) -> Option<i64> {
    match text.strip_prefix('-') {
        Some(size) => yuan_to_fen(size).ok().map(|fen| -fen),
        None => yuan_to_fen(text).ok(),
    }
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
    let fee_stated = bill::yuan_to_milli_fen(value(FEE))
        .map(|(milli, _)| milli)
        .ok_or_else(|| format_error(n, &format!("服务费（元） {:?} is not yuan", value(FEE))))?;
    let fee_milli_fen = match kind {
        LineKind::Payment => fee_stated.abs(),
        LineKind::Refund => -fee_stated.abs(),
    };
    let at_text = value(DONE_AT);
    let at = if at_text.is_empty() {
        None
    } else {
        Some(bill::beijing_time(at_text).ok_or_else(|| {
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
            fee_milli_fen: bill::yuan_to_milli_fen(value(S_FEE))
                .map(|(milli, _)| milli)
                .ok_or_else(|| bad(n, &format!("服务费（元） {:?} is not yuan", value(S_FEE))))?,
        });
    }
    total.ok_or_else(|| BillError::Format(format!("{SUMMARY}: no 合计 row")))
}
