//! The stand-in's WeChat Pay trade bill: `GET /v3/bill/tradebill` (signed request, signed
//! answer) and the download URL it hands out on the same host (signed request, unsigned
//! gzip), serving [`Fake::bills`] in the real `ALL` format, each [`BillFault`] applied as
//! WeChat (or a server in the middle) would get it wrong.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::Ordering;

use actix_web::{HttpRequest, HttpResponse};
use paynotify::qa::forge::alipay::yuan;
use serde_json::json;

use super::provider::{
    BillFault, Fake, FakeBill, Signing, wechat_error, wechat_request_verifies, wechat_signed_as,
};

/// The download path the stand-in hands out (WeChat's own, with its `token`).
pub const DOWNLOAD_PATH: &str = "/v3/billdownload/file";

/// The merchant every row names under [`BillFault::OtherMerchant`].
pub const OTHER_MCHID: &str = "1900009999";

/// An `ALL` bill's detail header, as WeChat writes it (names without backticks).
const DETAIL_HEADER: [&str; 27] = [
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

const SUMMARY_HEADER: &str =
    "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额";

/// A column `ALL` does not have ([`BillFault::UnknownColumn`]).
const UNKNOWN_COLUMN: &str = "优惠标记";

/// `fen` thousandths of a fen as WeChat states a fee: yuan with five decimals, signed.
fn fee(milli_fen: i64) -> String {
    let sign = if milli_fen < 0 { "-" } else { "" };
    let m = milli_fen.abs();
    format!("{sign}{}.{:05}", m / 100_000, m % 100_000)
}

/// The decompressed bill of `mchid`/`appid` for `bill`, faults in the content applied.
pub fn bill_file(mchid: &str, appid: &str, bill: &FakeBill) -> Vec<u8> {
    let fault = bill.fault.as_ref();
    let missing = match fault {
        Some(BillFault::MissingColumn(name)) => DETAIL_HEADER.iter().position(|c| c == name),
        _ => None,
    };
    let unknown = fault == Some(&BillFault::UnknownColumn);
    let row_mchid = match fault {
        Some(BillFault::OtherMerchant) => OTHER_MCHID,
        _ => mchid,
    };
    let mut out = Vec::new();
    let mut header: Vec<&str> = DETAIL_HEADER.to_vec();
    if unknown {
        header.push(UNKNOWN_COLUMN);
    }
    if let Some(at) = missing {
        header.remove(at);
    }
    out.extend_from_slice(header.join(",").as_bytes());
    out.extend_from_slice(b"\r\n");
    let (mut paid, mut refunded, mut fees) = (0i64, 0i64, 0i64);
    for (n, line) in bill.lines.iter().enumerate() {
        let zero = "0.00".to_owned();
        let amount = yuan(line.amount_fen);
        let (state, settle, order, refund_id, refund_no, refund, kind, status) =
            match &line.out_refund_no {
                Some(no) => {
                    refunded += line.amount_fen;
                    let id = format!("503000{:014}", n + 1);
                    (
                        "REFUND",
                        &zero,
                        &zero,
                        id,
                        no.clone(),
                        &amount,
                        "ORIGINAL",
                        "SUCCESS",
                    )
                }
                None => {
                    paid += line.amount_fen;
                    let none = "0".to_owned();
                    (
                        "SUCCESS",
                        &amount,
                        &amount,
                        none.clone(),
                        none,
                        &zero,
                        "",
                        "",
                    )
                }
            };
        fees += line.fee_milli_fen;
        let mut values: Vec<String> = vec![
            line.at.clone(),
            appid.to_owned(),
            row_mchid.to_owned(),
            "0".to_owned(),
            String::new(),
            line.transaction_id.clone(),
            line.out_trade_no.clone(),
            "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o".to_owned(),
            "JSAPI".to_owned(),
            state.to_owned(),
            "OTHERS".to_owned(),
            "CNY".to_owned(),
            settle.clone(),
            zero.clone(),
            refund_id,
            refund_no,
            refund.clone(),
            zero.clone(),
            kind.to_owned(),
            status.to_owned(),
            "测试商品".to_owned(),
            String::new(),
            fee(line.fee_milli_fen),
            "0.60%".to_owned(),
            order.clone(),
            refund.clone(),
            String::new(),
        ];
        if unknown {
            values.push("N".to_owned());
        }
        if let Some(at) = missing {
            values.remove(at);
        }
        let mut row: Vec<Vec<u8>> = values
            .iter()
            .map(|v| format!("`{v}").into_bytes())
            .collect();
        if n == 0 && fault == Some(&BillFault::BadCharset) {
            // 商品名称 with bytes that are not UTF-8 (GBK's 测试, as a wrongly encoded row has).
            row[20] = b"`\xb2\xe2\xca\xd4".to_vec();
        }
        out.extend_from_slice(&row.join(&b","[..]));
        out.extend_from_slice(b"\r\n");
    }
    let mut count = bill.lines.len() as i64;
    let mut stated_paid = paid;
    if fault == Some(&BillFault::SummaryOff) {
        // One more payment (of 1.00) than the details carry.
        count += 1;
        stated_paid += 100;
    }
    out.extend_from_slice(SUMMARY_HEADER.as_bytes());
    out.extend_from_slice(b"\r\n");
    let summary = [
        count.to_string(),
        yuan(stated_paid),
        yuan(refunded),
        "0.00".to_owned(),
        fee(fees),
        yuan(stated_paid),
        yuan(refunded),
    ];
    let summary: Vec<String> = summary.iter().map(|v| format!("`{v}")).collect();
    out.extend_from_slice(summary.join(",").as_bytes());
    out.extend_from_slice(b"\r\n");
    out
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

pub fn sha1_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, bytes);
    paynotify::text::hex(digest.as_ref())
}

fn query(req: &HttpRequest) -> HashMap<String, String> {
    form_urlencoded::parse(req.query_string().as_bytes())
        .into_owned()
        .collect()
}

fn bill_of(fake: &Fake, date: &str) -> Option<FakeBill> {
    fake.bills.lock().expect("bills").get(date).cloned()
}

/// `GET /v3/bill/tradebill` (its signature already verified): the signed answer with the
/// hash and a download URL on this host, or `NO_STATEMENT_EXIST`.
pub fn apply(req: &HttpRequest, fake: &Fake, timestamp: &str) -> HttpResponse {
    let q = query(req);
    let date = q.get("bill_date").cloned().unwrap_or_default();
    fake.calls
        .lock()
        .expect("calls")
        .push(("wechat.tradebill".to_owned(), date.clone()));
    if q.get("bill_type").map(String::as_str) != Some("ALL")
        || q.get("tar_type").map(String::as_str) != Some("GZIP")
    {
        return wechat_error(400, "PARAM_ERROR", "只支持 ALL 和 GZIP");
    }
    let bill = match bill_of(fake, &date) {
        Some(bill) if bill.fault != Some(BillFault::NoBill) => bill,
        _ => return wechat_error(400, "NO_STATEMENT_EXIST", "账单文件不存在"),
    };
    let mut file = bill_file(&fake.mchid, &fake.appid, &bill);
    if bill.fault == Some(BillFault::WrongHash) {
        file.push(b'\n');
    }
    let host = req.connection_info().host().to_owned();
    let answer = json!({
        "hash_type": "SHA1",
        "hash_value": sha1_hex(&file).to_ascii_uppercase(),
        "download_url": format!("http://{host}{DOWNLOAD_PATH}?token={date}%2FdTpB5sQ"),
    });
    let signing = match bill.fault {
        Some(BillFault::Unsigned) => Signing::Unsigned,
        Some(BillFault::WrongSignature) => Signing::Forger,
        _ => *fake.signing.lock().expect("signing"),
    };
    wechat_signed_as(fake, 200, timestamp, answer.to_string(), signing)
}

/// `GET /v3/billdownload/file?token=…`: the signature checked like any call, the gzip file
/// unsigned (WeChat does not sign it; the hash in the signed answer covers it).
pub async fn download(req: &HttpRequest, body: &[u8], fake: &Fake) -> HttpResponse {
    if wechat_request_verifies(req, body, fake).is_none() {
        fake.refused.fetch_add(1, Ordering::SeqCst);
        return wechat_error(401, "SIGN_ERROR", "签名错误");
    }
    fake.verified.fetch_add(1, Ordering::SeqCst);
    let token = query(req).get("token").cloned().unwrap_or_default();
    let date = token.split('/').next().unwrap_or_default().to_owned();
    let Some(bill) = bill_of(fake, &date) else {
        return wechat_error(404, "RESOURCE_NOT_EXISTS", "下载链接已失效");
    };
    fake.bill_downloads.lock().expect("downloads").push(date);
    match bill.fault {
        Some(BillFault::Hang) => {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        }
        Some(BillFault::Redirect) => {
            let port = req
                .connection_info()
                .host()
                .rsplit(':')
                .next()
                .unwrap_or("80")
                .to_owned();
            return HttpResponse::Found()
                .insert_header((
                    "Location",
                    format!("http://127.0.0.2:{port}{DOWNLOAD_PATH}?token={token}"),
                ))
                .finish();
        }
        _ => {}
    }
    let mut file = gzip(&bill_file(&fake.mchid, &fake.appid, &bill));
    if bill.fault == Some(BillFault::Truncated) {
        file.truncate(file.len() / 2);
    }
    if let Some(BillFault::Trickle(over)) = bill.fault {
        return super::provider::trickled(file, over);
    }
    HttpResponse::Ok()
        .content_type("application/octet-stream")
        .body(file)
}
