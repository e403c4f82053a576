//! Reading a decompressed `ALL` trade bill: its detail rows by header name, streamed, then
//! its summary row, whose figures `checks.rs` compares with the rows'.

use std::io::Read;

use super::archive::archive;
use super::checks::{self, Sums};
use crate::channel::bill::{self, BillError, BillLine, BillTotals, LineKind, Misfit};
use crate::money::yuan_to_fen;

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
// The columns a row is read by, as positions in [`ALL_COLUMNS`].
pub(super) const TIME: usize = 0;
pub(super) const MCHID_COLUMN: usize = 2;
pub(super) const TRANSACTION_ID: usize = 5;
pub(super) const OUT_TRADE_NO: usize = 6;
pub(super) const TRADE_STATE: usize = 9;
pub(super) const CURRENCY: usize = 11;
pub(super) const SETTLEMENT: usize = 12;
pub(super) const OUT_REFUND_NO: usize = 15;
pub(super) const REFUND: usize = 16;
pub(super) const COUPON_REFUND: usize = 17;
pub(super) const REFUND_STATUS: usize = 19;
pub(super) const FEE: usize = 22;
pub(super) const ORDER: usize = 24;
pub(super) const APPLIED_REFUND: usize = 25;

/// Where each column of [`ALL_COLUMNS`] is in this bill's rows, found by name in its header.
struct Columns {
    index: [usize; ALL_COLUMNS.len()],
}

impl Columns {
    fn from_header(header: &csv::ByteRecord) -> Result<Self, BillError> {
        let names = (header.iter().enumerate()).map(|(at, raw)| header_name(raw, at, 1));
        let index = bill::positions(&ALL_COLUMNS, names, |misfit| {
            BillError::Format(match misfit {
                Misfit::Unknown(name) => format!(
                    "line 1: unknown column {name:?} in the header (not a column of an ALL bill)"
                ),
                Misfit::Twice(name) => {
                    format!("line 1: column {name} appears twice in the header")
                }
                Misfit::Missing(name) => format!("line 1: the header lacks column {name}"),
            })
        })?;
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
    summary(&mut rows, &sums)?;
    Ok(totals)
}

/// Reads the summary row after its header (already in `record`), has `checks.rs` compare
/// every column with `sums`; nothing may follow it.
fn summary<R: Read>(rows: &mut Records<R>, sums: &Sums) -> Result<(), BillError> {
    let header_line = rows.line;
    let names = (rows.record.iter().enumerate()).map(|(at, raw)| header_name(raw, at, header_line));
    let index = bill::positions(&SUMMARY_COLUMNS, names, |misfit| {
        BillError::Format(match misfit {
            Misfit::Unknown(name) => {
                format!("line {header_line}: unknown column {name:?} in the summary header")
            }
            Misfit::Twice(name) => {
                format!("line {header_line}: summary column {name} appears twice")
            }
            Misfit::Missing(name) => {
                format!("line {header_line}: the summary header lacks column {name}")
            }
        })
    })?;
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
    checks::summary(stated, line, sums)?;
    if rows.next()? {
        return Err(BillError::Format(format!(
            "line {}: more after the summary row",
            rows.line
        )));
    }
    Ok(())
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
    let (fee_milli_fen, _) = bill::yuan_to_milli_fen(get(FEE))
        .ok_or_else(|| bad(FEE, "is not yuan with at most five decimals"))?;
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
    let at = bill::beijing_time(get(TIME)).ok_or_else(|| bad(TIME, "is not a time"))?;
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
