//! The fake Alipay gateway's bills: the answer to `alipay.data.dataservice.bill.downloadurl.query`
//! and the zip its `bill_download_url` serves, in the real format — two GBK CSVs
//! (`<pid>_<date>_业务明细.csv`, `<pid>_<date>_业务明细(汇总).csv`, names in GBK without the
//! zip's UTF-8 flag) with Alipay's comment lines, every detail column, values padded with
//! tabs, refund rows negative, and both summaries consistent with the rows — then each
//! [`BillFault`] that concerns Alipay applied to it.

use std::io::{Cursor, Write};
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse};
use encoding_rs::GBK;
use serde_json::{Value, json};

use super::provider::{BillFault, Fake, FakeBill, FakeLine, Signing};

/// The seller (PID) of the test configuration's Alipay apps (`tests/api/alipay.rs`).
pub const SELLER_ID: &str = "2088000000000001";
/// Another seller's PID (`BillFault::OtherMerchant`).
const OTHER_SELLER_ID: &str = "2088000000009999";
/// Where the fake serves bill files.
pub const DOWNLOAD_PATH: &str = "/alipay/bill/download";

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

const SUMMARY_HEADER: &str = "门店编号,门店名称,交易订单总笔数,退款订单总笔数,订单金额（元）,商家实收（元）,支付宝优惠（元）,商家优惠（元）,卡消费金额（元）,服务费（元）,分润（元）,实收净额（元）";

/// What the bill call answers, and how that answer is signed: a date without a bill (or
/// with `NoBill`) is `isp.bill_not_exist`; `Unsigned` and `WrongSignature` sign it so.
pub fn answer(fake: &Fake, biz: &Value, host: &str, signing: Signing) -> (Value, Signing) {
    let date = biz["bill_date"].as_str().unwrap_or("").to_owned();
    let bill = fake.bills.lock().expect("bills").get(&date).cloned();
    let no_bill = json!({"code": "40004", "msg": "Business Failed", "sub_code": "isp.bill_not_exist", "sub_msg": "账单不存在"});
    let Some(bill) = bill else {
        return (no_bill, signing);
    };
    if biz["bill_type"] != "trade" {
        return (
            json!({"code": "40004", "msg": "Business Failed", "sub_code": "isp.bill_type_error", "sub_msg": "账单类型错误"}),
            signing,
        );
    }
    let signing = match bill.fault {
        Some(BillFault::NoBill) => return (no_bill, signing),
        Some(BillFault::Unsigned) => Signing::Unsigned,
        Some(BillFault::WrongSignature) => Signing::Forger,
        _ => signing,
    };
    // Alipay's URL is http with its own token in the query; the file is not signed.
    let host = match bill.fault {
        Some(BillFault::ForeignHost) => host.replace("127.0.0.1", "localhost"),
        _ => host.to_owned(),
    };
    let url = format!(
        "http://{host}{DOWNLOAD_PATH}?date={date}&downloadFileName={}_{}.csv.zip&bizType=trade",
        SELLER_ID,
        date.replace('-', "")
    );
    (
        json!({"code": "10000", "msg": "Success", "bill_download_url": url}),
        signing,
    )
}

/// `GET /alipay/bill/download?date=…`: the zip, or what the date's fault makes of it.
pub async fn download(req: &HttpRequest, fake: &Fake) -> HttpResponse {
    let date = form_urlencoded::parse(req.query_string().as_bytes())
        .find(|(k, _)| k == "date")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let Some(bill) = fake.bills.lock().expect("bills").get(&date).cloned() else {
        return HttpResponse::NotFound().body("no such bill");
    };
    fake.bill_downloads
        .lock()
        .expect("downloads")
        .push(date.clone());
    match bill.fault {
        Some(BillFault::Hang) => tokio::time::sleep(Duration::from_secs(30)).await,
        Some(BillFault::Redirect) => {
            return HttpResponse::Found()
                .insert_header((
                    "Location",
                    format!("http://dwbillcenter.example.invalid{DOWNLOAD_PATH}?date={date}"),
                ))
                .finish();
        }
        Some(BillFault::Trickle(over)) => {
            return super::provider::trickled(bill_zip(&date, &bill), over);
        }
        _ => {}
    }
    HttpResponse::Ok()
        .content_type("application/oct-stream")
        .insert_header((
            "Content-Disposition",
            format!(
                "attachment; filename={SELLER_ID}_{}.csv.zip",
                date.replace('-', "")
            ),
        ))
        .body(bill_zip(&date, &bill))
}

/// The bill of `date` as Alipay zips it, with its fault applied.
pub fn bill_zip(date: &str, bill: &FakeBill) -> Vec<u8> {
    let pid = match bill.fault {
        Some(BillFault::OtherMerchant) => OTHER_SELLER_ID,
        _ => SELLER_ID,
    };
    let compact = date.replace('-', "");
    let mut entries = vec![
        (
            format!("{pid}0156_{compact}_业务明细.csv"),
            details(pid, date, bill),
        ),
        (
            format!("{pid}0156_{compact}_业务明细(汇总).csv"),
            summary(pid, date, bill),
        ),
    ];
    if bill.fault == Some(BillFault::ManyEntries) {
        entries.extend((0..1000).map(|i| (format!("empty-{i}"), Vec::new())));
    }
    let zip = zip_of(&entries);
    match bill.fault {
        Some(BillFault::Truncated) => zip[..zip.len() / 2].to_vec(),
        _ => zip,
    }
}

/// Yuan with two decimals, negative when `fen` is.
fn yuan(fen: i64) -> String {
    let sign = if fen < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", fen.abs() / 100, fen.abs() % 100)
}

/// Thousandths of a fen as yuan: two decimals when whole fen, else five.
fn fee_yuan(milli: i64) -> String {
    if milli % 1000 == 0 {
        return yuan(milli / 1000);
    }
    let sign = if milli < 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:05}",
        milli.abs() / 100_000,
        milli.abs() % 100_000
    )
}

/// The comment lines both entries start with.
fn head(title: &str, pid: &str, date: &str, list: &str) -> String {
    let (y, m, d) = (&date[0..4], &date[5..7], &date[8..10]);
    format!(
        "#支付宝{title}查询\n#账号：[{pid}0156]\n#起始日期：[{y}年{m}月{d}日 00:00:00]   终止日期：[{y}年{m}月{d}日 23:59:59]\n#-----------------------------------------{list}----------------------------------------\n"
    )
}

/// A line's stated amounts: refund rows negative.
struct Stated {
    order: i64,
    fee: i64,
}

fn stated(line: &FakeLine) -> Stated {
    match line.out_refund_no {
        None => Stated {
            order: line.amount_fen,
            fee: line.fee_milli_fen.abs(),
        },
        Some(_) => Stated {
            order: -line.amount_fen,
            fee: -line.fee_milli_fen.abs(),
        },
    }
}

/// 业务明细: header, one row per line, the end separator and the two 合计 lines.
fn details(pid: &str, date: &str, bill: &FakeBill) -> Vec<u8> {
    let mut columns: Vec<&str> = DETAIL_COLUMNS.to_vec();
    if let Some(BillFault::UnknownColumn) = bill.fault {
        columns.push("交易渠道");
    }
    let dropped = match bill.fault {
        Some(BillFault::MissingColumn(name)) => columns.iter().position(|c| *c == name),
        _ => None,
    };
    let keep = |values: Vec<String>| -> String {
        values
            .into_iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != dropped)
            .map(|(_, v)| v)
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut out = GBK
        .encode(&head("业务明细", pid, date, "业务明细列表"))
        .0
        .into_owned();
    let mut text = keep(columns.iter().map(|c| c.to_string()).collect());
    text.push('\n');
    let (mut payments, mut refunds) = ((0, 0), (0, 0));
    for (n, line) in bill.lines.iter().enumerate() {
        let s = stated(line);
        let kind = match line.out_refund_no {
            None => {
                payments = (payments.0 + 1, payments.1 + s.order);
                "交易"
            }
            Some(_) => {
                refunds = (refunds.0 + 1, refunds.1 + s.order);
                "退款"
            }
        };
        // BadCharset: the first row's 商品名称 is not GBK.
        let goods = if n == 0 && bill.fault == Some(BillFault::BadCharset) {
            "\u{FFFD}BAD".to_owned()
        } else {
            format!("商品{}", line.out_trade_no)
        };
        let mut values = vec![
            format!("{}\t", line.transaction_id),
            format!("{}\t", line.out_trade_no),
            format!("{kind}\t"),
            goods,
            line.at.clone(),
            line.at.clone(),
            "\t".into(),
            "\t".into(),
            "\t".into(),
            "\t".into(),
            "*沙箱(159****3821)\t".into(),
            yuan(s.order),
            yuan(s.order),
            "0.00".into(),
            "0.00".into(),
            "0.00".into(),
            "0.00".into(),
            "0.00".into(),
            String::new(),
            "0.00\t".into(),
            "0.00".into(),
            format!("{}\t", line.out_refund_no.as_deref().unwrap_or("")),
            fee_yuan(s.fee),
            "0.00".into(),
            String::new(),
        ];
        if bill.fault == Some(BillFault::UnknownColumn) {
            values.push("\t".into());
        }
        text += &keep(values);
        text.push('\n');
    }
    let off = match bill.fault {
        Some(BillFault::SummaryOff) => (1, 100),
        _ => (0, 0),
    };
    if bill.fault == Some(BillFault::BlankLines) {
        text += &"\n".repeat(100_000);
    }
    text += "#-----------------------------------------业务明细列表结束------------------------------------\n";
    text += &format!(
        "#交易合计：{}笔，商家实收共{}元，商家优惠共0.00元\n#退款合计：{}笔，商家实收退款共{}元，商家优惠退款共0.00元\n#导出时间：[{date} 06:27:10]\n",
        payments.0 + off.0,
        yuan(payments.1 + off.1),
        refunds.0,
        yuan(refunds.1)
    );
    let mut encoded = GBK.encode(&text).0.into_owned();
    // encoding_rs writes U+FFFD as the HTML entity `&#65533;`: put bytes that are not GBK
    // in its place (0x81 0x20: a lead byte without a trail byte).
    if let Some(at) = encoded.windows(8).position(|w| w == b"&#65533;") {
        encoded.splice(at..at + 8, [0x81, 0x20]);
    }
    out.extend(encoded);
    out
}

/// 业务明细(汇总): one store row and the 合计 row, both over every line.
fn summary(pid: &str, date: &str, bill: &FakeBill) -> Vec<u8> {
    let (mut payments, mut refunds, mut order, mut fee) = (0, 0, 0, 0);
    for line in &bill.lines {
        let s = stated(line);
        match line.out_refund_no {
            None => payments += 1,
            Some(_) => refunds += 1,
        }
        order += s.order;
        fee += s.fee;
    }
    if bill.fault == Some(BillFault::SummaryOff) {
        payments += 1;
        order += 100;
    }
    let row = |store: &str| {
        format!(
            "{store}\t,\t,{payments},{refunds},{},{},0.00,0.00,0.00,{},0.00,{}\n",
            yuan(order),
            yuan(order),
            fee_yuan(fee),
            fee_yuan(order * 1000 - fee)
        )
    };
    let text = format!(
        "{}{SUMMARY_HEADER}\n{}{}#----------------------------------------业务汇总列表结束-------------------------------------\n#导出时间：[{date} 06:27:10]\n",
        head("业务汇总", pid, date, "业务汇总列表"),
        row(""),
        row("合计"),
    );
    GBK.encode(&text).0.into_owned()
}

/// A zip of `entries` whose names are GBK bytes without the UTF-8 flag, as Alipay writes
/// them: each entry is written under an ASCII stand-in of the same length, replaced in the
/// finished bytes (local header and central directory; no checksum covers a name).
fn zip_of(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let mut names = Vec::new();
    for (i, (name, content)) in entries.iter().enumerate() {
        if name.is_ascii() {
            zip.start_file(name.as_str(), options).expect("entry");
            zip.write_all(content).expect("write");
            continue;
        }
        let raw = GBK.encode(name).0.into_owned();
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
