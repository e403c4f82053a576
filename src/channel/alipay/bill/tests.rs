use std::io::{Cursor, Read, Write};

use encoding_rs::GBK;

use super::archive::open;
use super::read::{DETAIL_COLUMNS, SUMMARY_COLUMNS, fields, read_opened, signed_fen};
use super::*;
use crate::channel::bill::{LineKind, beijing_time};

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
fn signed_amounts_are_fen() {
    assert_eq!(signed_fen("-0.01"), Some(-1));
    assert_eq!(signed_fen("-"), None);
}
