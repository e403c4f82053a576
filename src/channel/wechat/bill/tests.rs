use std::io::Write;

use super::archive::sha1_hex;
use super::fetch::same_origin;
use super::read::{
    APPLIED_REFUND, COUPON_REFUND, CURRENCY, FEE, MCHID_COLUMN, ORDER, OUT_REFUND_NO, OUT_TRADE_NO,
    REFUND, REFUND_STATUS, SETTLEMENT, TIME, TRADE_STATE, TRANSACTION_ID,
};
use super::*;
use crate::channel::bill::LineKind;

const MCHID: &str = "1900000001";

/// One detail row of a bill in the real `ALL` shape.
struct Row {
    refund: bool,
    out_trade_no: &'static str,
    out_refund_no: &'static str,
    amount: &'static str,
    fee: &'static str,
    at: &'static str,
}

const PAID: Row = Row {
    refund: false,
    out_trade_no: "T-1",
    out_refund_no: "",
    amount: "100.00",
    fee: "0.60000",
    at: "2026-11-30 10:00:00",
};

fn row(r: &Row) -> Vec<String> {
    let zero = "0.00";
    let (settle, order, refund_id, refund_no, refund, kind, status, state) = if r.refund {
        (
            zero,
            zero,
            "50300000000000000001",
            r.out_refund_no,
            r.amount,
            "ORIGINAL",
            "SUCCESS",
            "REFUND",
        )
    } else {
        (r.amount, r.amount, "0", "0", zero, "", "", "SUCCESS")
    };
    [
        r.at,
        "wx0000000000000001",
        MCHID,
        "0",
        "",
        &format!("4200{}", r.out_trade_no),
        r.out_trade_no,
        "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o",
        "JSAPI",
        state,
        "OTHERS",
        "CNY",
        settle,
        zero,
        refund_id,
        refund_no,
        refund,
        zero,
        kind,
        status,
        "测试商品",
        "{\"k\":\"v\"}",
        r.fee,
        "0.60%",
        order,
        refund,
        "",
    ]
    .iter()
    .map(|v| format!("`{v}"))
    .collect()
}

/// A bill of `rows` with the summary row `summary` (the seven values, without backticks).
fn bill(rows: &[Row], summary: [&str; 7]) -> Vec<u8> {
    let mut out = ALL_COLUMNS.join(",");
    out.push_str("\r\n");
    for r in rows {
        out.push_str(&row(r).join(","));
        out.push_str("\r\n");
    }
    out.push_str(&SUMMARY_COLUMNS.join(","));
    out.push_str("\r\n");
    let summary: Vec<String> = summary.iter().map(|v| format!("`{v}")).collect();
    out.push_str(&summary.join(","));
    out.push_str("\r\n");
    out.into_bytes()
}

fn good_rows() -> Vec<Row> {
    vec![
        PAID,
        Row {
            out_trade_no: "T-2",
            amount: "0.01",
            fee: "0.00006",
            at: "2026-11-30 23:59:59",
            ..PAID
        },
        Row {
            refund: true,
            out_trade_no: "T-0",
            out_refund_no: "R-0",
            amount: "30.00",
            fee: "-0.18000",
            at: "2026-11-30 00:00:01",
        },
    ]
}

/// The summary of [`good_rows`]: 3 rows, 100.01 paid, 30.00 refunded, fees 0.42006.
const GOOD_SUMMARY: [&str; 7] = ["3", "100.01", "30.00", "0.00", "0.42006", "100.01", "30.00"];

fn read(bytes: &[u8]) -> Result<(Vec<BillLine>, BillTotals), BillError> {
    let mut lines = Vec::new();
    let totals = read_tradebill(bytes, MCHID, &mut |l| {
        lines.push(l);
        Ok(())
    })?;
    Ok((lines, totals))
}

fn format_error(bytes: &[u8]) -> String {
    match read(bytes) {
        Err(BillError::Format(e)) => e,
        other => panic!("a format error, not {other:?}"),
    }
}

fn summary_error(summary: [&str; 7]) -> String {
    match read(&bill(&good_rows(), summary)) {
        Err(BillError::Summary(e)) => e,
        other => panic!("a summary error, not {other:?}"),
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

fn file_of(bytes: &[u8]) -> File {
    let mut file = tempfile::tempfile().expect("tempfile");
    file.write_all(bytes).expect("write");
    file
}

fn sha1_of(bytes: &[u8]) -> String {
    sha1_hex(bytes).expect("sha1")
}

#[test]
fn the_column_positions_name_the_columns_read() {
    for (at, name) in [
        (TIME, "交易时间"),
        (MCHID_COLUMN, "商户号"),
        (TRANSACTION_ID, "微信订单号"),
        (OUT_TRADE_NO, "商户订单号"),
        (TRADE_STATE, "交易状态"),
        (CURRENCY, "货币种类"),
        (SETTLEMENT, "应结订单金额"),
        (OUT_REFUND_NO, "商户退款单号"),
        (REFUND, "退款金额"),
        (COUPON_REFUND, "充值券退款金额"),
        (REFUND_STATUS, "退款状态"),
        (FEE, "手续费"),
        (ORDER, "订单金额"),
        (APPLIED_REFUND, "申请退款金额"),
    ] {
        assert_eq!(ALL_COLUMNS[at], name);
    }
}

#[test]
fn a_good_bill_reads_payments_refunds_and_fees() {
    let (lines, totals) = read(&bill(&good_rows(), GOOD_SUMMARY)).expect("a good bill");
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0].kind, LineKind::Payment);
    assert_eq!(lines[0].out_trade_no, "T-1");
    assert_eq!(lines[0].transaction_id, "4200T-1");
    assert_eq!(lines[0].out_refund_no, None);
    assert_eq!(lines[0].amount_fen, 10000);
    assert_eq!(lines[0].fee_milli_fen, 60000);
    assert_eq!(lines[0].status, "SUCCESS");
    // 2026-11-30 10:00:00 in Beijing is 02:00:00 UTC.
    let at = lines[0].at.expect("at").as_datetime();
    assert_eq!(at.to_rfc3339(), "2026-11-30T02:00:00+00:00");
    assert_eq!(lines[1].amount_fen, 1);
    assert_eq!(lines[1].fee_milli_fen, 6);
    let refund = &lines[2];
    assert_eq!(refund.kind, LineKind::Refund);
    assert_eq!(refund.out_trade_no, "T-0");
    assert_eq!(refund.out_refund_no.as_deref(), Some("R-0"));
    assert_eq!(refund.amount_fen, 3000);
    assert_eq!(refund.fee_milli_fen, -18000);
    assert_eq!(
        totals,
        BillTotals {
            count: 2,
            amount_fen: 10001,
            refund_count: 1,
            refund_fen: 3000,
            // 0.42006 yuan = 42.006 fen.
            fee_fen: 42,
        }
    );
}

#[test]
fn headers_by_name_in_any_order_with_a_bom_and_backticks() {
    // The same bill with the columns in reverse order, the header names backticked and a
    // UTF-8 byte-order mark: read by name, the same lines.
    let text = String::from_utf8(bill(&good_rows(), GOOD_SUMMARY)).expect("utf8");
    let reversed: Vec<String> = text
        .split("\r\n")
        .enumerate()
        .map(|(n, l)| {
            let mut fields: Vec<String> = l.split(',').map(str::to_owned).collect();
            if n < 4 {
                fields.reverse();
            }
            if n == 0 {
                fields = fields.iter().map(|f| format!("`{f}")).collect();
            }
            fields.join(",")
        })
        .collect();
    let bytes = format!("\u{feff}{}", reversed.join("\n"));
    let (lines, _) = read(bytes.as_bytes()).expect("read by name");
    let (expected, _) = read(&bill(&good_rows(), GOOD_SUMMARY)).expect("good");
    assert_eq!(lines, expected);
}

#[test]
fn an_empty_day_has_a_header_and_a_zero_summary() {
    let (lines, totals) = read(&bill(
        &[],
        ["0", "0.00", "0.00", "0.00", "0.00000", "0.00", "0.00"],
    ))
    .expect("empty");
    assert!(lines.is_empty());
    assert_eq!(totals, BillTotals::default());
}

#[test]
fn a_missing_column_is_named() {
    let text = String::from_utf8(bill(&good_rows(), GOOD_SUMMARY)).expect("utf8");
    let without = text.replacen("商户订单号,", "", 1);
    let e = format_error(without.as_bytes());
    assert!(e.contains("lacks column 商户订单号"), "{e}");
}

#[test]
fn an_unknown_column_is_named() {
    let text = String::from_utf8(bill(&good_rows(), GOOD_SUMMARY)).expect("utf8");
    let more = text.replacen("费率备注", "费率备注,优惠标记", 1);
    let e = format_error(more.as_bytes());
    assert!(e.contains("unknown column \"优惠标记\""), "{e}");
}

#[test]
fn a_row_with_another_field_count_is_named() {
    let text = String::from_utf8(bill(&good_rows(), GOOD_SUMMARY)).expect("utf8");
    // A comma inside 商品名称 (WeChat does not quote) shifts the row.
    let shifted = text.replacen("测试商品", "测试,商品", 1);
    let e = format_error(shifted.as_bytes());
    assert!(e.contains("line 2: 28 fields"), "{e}");
}

#[test]
fn every_summary_column_is_checked() {
    for (at, name, off) in [
        (0, "总交易单数", "4"),
        (1, "应结订单总金额", "100.02"),
        (2, "退款总金额", "29.99"),
        (3, "充值券退款总金额", "0.01"),
        (4, "手续费总金额", "0.42007"),
        (5, "订单总金额", "101.01"),
        (6, "申请退款总金额", "30.01"),
    ] {
        let mut summary = GOOD_SUMMARY;
        summary[at] = off;
        let e = summary_error(summary);
        assert!(e.starts_with(name), "{name}: {e}");
        assert!(e.contains(off), "{name} names the stated value: {e}");
    }
    let e = summary_error(["4", "100.01", "30.00", "0.00", "0.42006", "100.01", "30.00"]);
    assert_eq!(e, "总交易单数 states 4, the bill has 3 detail rows");
    let e = summary_error(["3", "100.01", "30.00", "0.00", "0.42006", "101.01", "30.00"]);
    assert_eq!(e, "订单总金额 states 101.01, the detail rows sum to 100.01");
}

#[test]
fn a_fee_total_in_fen_is_compared_rounded() {
    let mut summary = GOOD_SUMMARY;
    summary[4] = "0.42";
    read(&bill(&good_rows(), summary)).expect("0.42006 rounds to 0.42");
    summary[4] = "0.43";
    let e = summary_error(summary);
    assert_eq!(
        e,
        "手续费总金额 states 0.43, the detail rows sum to 0.42006"
    );
}

#[test]
fn a_summary_count_may_be_stated_with_zero_decimals() {
    let mut summary = GOOD_SUMMARY;
    summary[0] = "3.0";
    read(&bill(&good_rows(), summary)).expect("3.0 rows");
}

#[test]
fn invalid_utf8_is_a_format_error_naming_the_line() {
    let mut bytes = bill(&good_rows(), GOOD_SUMMARY);
    let at = bytes
        .windows("测试商品".len())
        .rposition(|w| w == "测试商品".as_bytes())
        .expect("the name");
    bytes[at] = 0xff;
    let e = format_error(&bytes);
    assert!(e.starts_with("line 4, field 21: "), "{e}");
}

#[test]
fn a_row_of_another_merchant_is_refused() {
    let text = String::from_utf8(bill(&good_rows(), GOOD_SUMMARY)).expect("utf8");
    let other = text.replacen("`1900000001", "`1900009999", 1);
    match read(other.as_bytes()) {
        Err(BillError::OtherAccount(e)) => {
            assert_eq!(
                e,
                "line 2: 商户号 1900009999 in the bill of merchant 1900000001"
            );
        }
        other => panic!("another merchant: {other:?}"),
    }
}

#[test]
fn bad_amounts_are_named() {
    for (amount, fee, column) in [
        ("1.001", "0.00000", "订单金额"),
        ("-1.00", "0.00000", "订单金额"),
        ("1.0.0", "0.00000", "订单金额"),
        (" 1.00", "0.00000", "订单金额"),
        ("abc", "0.00000", "订单金额"),
        ("0.00", "0.00000", "订单金额"),
        ("1.00", "0.000001", "手续费"),
        ("1.00", "0.", "手续费"),
        ("1.00", "--0.1", "手续费"),
    ] {
        let rows = [Row {
            amount,
            fee,
            ..PAID
        }];
        let bytes = bill(&rows, GOOD_SUMMARY);
        let e = match read(&bytes) {
            Err(BillError::Format(e)) => e,
            other => panic!("{amount} {fee}: {other:?}"),
        };
        assert!(e.starts_with(&format!("line 2, column {column}: ")), "{e}");
    }
}

#[test]
fn an_unknown_status_is_refused() {
    let text = String::from_utf8(bill(&good_rows(), GOOD_SUMMARY)).expect("utf8");
    let revoked = text.replacen("`SUCCESS", "`REVOKED", 1);
    let e = format_error(revoked.as_bytes());
    assert_eq!(
        e,
        "line 2, column 交易状态: \"REVOKED\" is neither SUCCESS nor REFUND"
    );
}

#[test]
fn a_bill_without_its_summary_or_with_more_after_it_is_refused() {
    let text = String::from_utf8(bill(&good_rows(), GOOD_SUMMARY)).expect("utf8");
    let (details, _) = text.split_once("总交易单数").expect("summary");
    let e = format_error(details.as_bytes());
    assert!(e.contains("without its summary"), "{e}");
    let more = format!("{text}`1,`2\r\n");
    let e = format_error(more.as_bytes());
    assert_eq!(e, "line 7: more after the summary row");
    assert!(format_error(b"").contains("empty"));
}

#[test]
fn a_good_gzip_verifies_and_reads_again() {
    let csv = bill(&good_rows(), GOOD_SUMMARY);
    let hash = sha1_of(&csv).to_ascii_uppercase();
    let checked = verified_tradebill(file_of(&gzip(&csv)), &hash, MCHID).expect("verified");
    let mut count = 0;
    let totals = checked
        .read(&mut |_| {
            count += 1;
            Ok(())
        })
        .expect("read");
    assert_eq!(count, 3);
    assert_eq!(totals.amount_fen, 10001);
}

#[test]
fn a_wrong_hash_is_refused_before_a_row_is_read() {
    let csv = bill(&good_rows(), GOOD_SUMMARY);
    // The SHA1 of the compressed bytes (wechatpay-java #384) is not the one.
    let compressed = gzip(&csv);
    let e = verified_tradebill(file_of(&compressed), &sha1_of(&compressed), MCHID)
        .err()
        .expect("refused");
    assert!(matches!(e, BillError::Hash(_)), "{e:?}");
}

#[test]
fn a_truncated_or_corrupt_gzip_is_an_archive_error() {
    let csv = bill(&good_rows(), GOOD_SUMMARY);
    let hash = sha1_of(&csv);
    let compressed = gzip(&csv);
    let cut = &compressed[..compressed.len() / 2];
    match verified_tradebill(file_of(cut), &hash, MCHID).err() {
        Some(BillError::Archive(e)) => assert!(e.contains("truncated"), "{e}"),
        other => panic!("truncated: {other:?}"),
    }
    let mut flipped = compressed.clone();
    let last = flipped.len() - 6;
    flipped[last] ^= 0xff; // the CRC32 of the trailer
    assert!(matches!(
        verified_tradebill(file_of(&flipped), &hash, MCHID).err(),
        Some(BillError::Archive(_))
    ));
    assert!(matches!(
        verified_tradebill(file_of(b"not a gzip"), &hash, MCHID).err(),
        Some(BillError::Archive(_))
    ));
}

#[test]
fn a_bill_that_decompresses_past_the_limit_is_refused() {
    let csv = bill(&good_rows(), GOOD_SUMMARY);
    let hash = sha1_of(&csv);
    let limit = csv.len() as u64 - 1;
    match verified_within(file_of(&gzip(&csv)), &hash, MCHID, limit).err() {
        Some(BillError::Archive(e)) => assert!(e.contains("larger than"), "{e}"),
        other => panic!("too large: {other:?}"),
    }
    verified_within(file_of(&gzip(&csv)), &hash, MCHID, csv.len() as u64).expect("just fits");
}

#[test]
fn the_download_url_must_be_on_the_api_host() {
    let base = "https://api.mch.weixin.qq.com";
    let (path, _) = same_origin(
        base,
        "https://api.mch.weixin.qq.com/v3/billdownload/file?token=6XIv5T%2Fx",
    )
    .expect("same host");
    assert_eq!(path, "/v3/billdownload/file?token=6XIv5T%2Fx");
    let (path, _) = same_origin(
        base,
        "https://api.mch.weixin.qq.com:443/v3/billdownload/file",
    )
    .expect("the default port");
    assert_eq!(path, "/v3/billdownload/file");
    for elsewhere in [
        "http://api.mch.weixin.qq.com/v3/billdownload/file?token=x",
        "https://api.mch.weixin.qq.com:8443/v3/billdownload/file?token=x",
        "https://evil.example/v3/billdownload/file?token=x",
        "https://api.mch.weixin.qq.com.evil.example/v3/billdownload/file",
        "/v3/billdownload/file?token=x",
    ] {
        match same_origin(base, elsewhere) {
            Err(BillError::Download(e)) => assert!(e.contains(elsewhere), "{e}"),
            other => panic!("{elsewhere}: {other:?}"),
        }
    }
}
