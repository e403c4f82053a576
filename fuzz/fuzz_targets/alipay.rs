//! Alipay: the form decoder in both charsets.
//!
//! Three ways in: a whole body through `admit` (form parsing and the signature check), a
//! body taken as signed (charset handling and the field decoder), and fields given as text
//! that are form-encoded here in UTF-8 or GBK, so the decoder's reading of them can be
//! checked against what was encoded.
#![no_main]

use actix_web::http::header::HeaderMap;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use paynotify::channel::{Inbound, Rejection, admit};
use paynotify::notice::NoticeKind;
use paynotify_fuzz::{channels, now};

#[derive(Debug, Arbitrary)]
enum Input {
    Body(Vec<u8>),
    /// `app_id=<the sandbox app>&charset=<CHARSETS[charset]>&` and then the fuzzer's bytes.
    SignedBody {
        charset: u8,
        rest: Vec<u8>,
    },
    Fields {
        gbk: bool,
        fields: Vec<(String, String)>,
    },
}

const CHARSETS: [&str; 8] = [
    "utf-8", "UTF-8", "utf8", "gbk", "GBK", "gb2312", "gb18030", "latin1",
];

fn percent(bytes: &[u8], out: &mut Vec<u8>) {
    for b in bytes {
        if b.is_ascii_alphanumeric() || b"-_.*".contains(b) {
            out.push(*b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
}

fn check(result: &Result<paynotify::notice::Notice, Rejection>) {
    match result {
        Ok(notice) => {
            // Admitted means storable and within the lengths: checking again changes nothing.
            assert_eq!(notice.clone().checked().as_ref(), Ok(notice));
            match &notice.kind {
                // A gateway message this service does not act on: acknowledged, no amount.
                NoticeKind::Other { .. } if notice.out_trade_no.is_empty() => {}
                // A transfer's amount, when the message names one, is positive.
                NoticeKind::Transfer(t) => {
                    assert!(t.amount_fen.is_none_or(|fen| fen > 0), "{notice:?}");
                }
                _ => assert!(notice.amount_fen > 0, "{notice:?}"),
            }
            if let NoticeKind::Refunded(r) = &notice.kind {
                assert!(!r.out_refund_no.is_empty(), "{notice:?}");
            }
        }
        // Past the signature nothing is the key's fault: a bad form is a 400.
        Err(e) => assert_eq!(e.status(), 400, "{e:?}"),
    }
}

fuzz_target!(|input: Input| {
    let c = channels();
    match input {
        Input::Body(body) => {
            let headers = HeaderMap::new();
            let request = Inbound {
                headers: &headers,
                body: &body,
                now: now(),
                route: None,
            };
            let refused = admit(&c.alipay, &request).expect_err("an unsigned form admitted");
            assert!(matches!(refused.status(), 400 | 401), "{refused:?}");
        }
        Input::SignedBody { charset, rest } => {
            let mut body = format!(
                "app_id={}&charset={}&",
                c.alipay_app_id,
                CHARSETS[usize::from(charset) % CHARSETS.len()]
            )
            .into_bytes();
            body.extend_from_slice(&rest);
            check(&c.alipay.admit_signed_body(&body));
        }
        Input::Fields { gbk, fields } => {
            let charset = if gbk { "gbk" } else { "utf-8" };
            let mut all = vec![
                ("app_id".to_owned(), c.alipay_app_id.clone()),
                ("charset".to_owned(), charset.to_owned()),
            ];
            all.extend(fields);
            let mut body = Vec::new();
            for (key, value) in &all {
                let encode = |text: &str| -> Option<Vec<u8>> {
                    if gbk {
                        let (bytes, _, unmappable) = encoding_rs::GBK.encode(text);
                        (!unmappable).then(|| bytes.into_owned())
                    } else {
                        Some(text.as_bytes().to_vec())
                    }
                };
                let (Some(k), Some(v)) = (encode(key), encode(value)) else {
                    return;
                };
                if !body.is_empty() {
                    body.push(b'&');
                }
                percent(&k, &mut body);
                body.push(b'=');
                percent(&v, &mut body);
            }
            let result = c.alipay.admit_signed_body(&body);
            check(&result);
            // What was encoded is what is read, in either charset.
            if let Ok(notice) = &result {
                let given = |name: &str| all.iter().find(|(k, _)| k == name).map(|(_, v)| v);
                if given("msg_method").is_some() {
                    // An app gateway message: its business fields are in biz_content.
                    assert_eq!(Some(&notice.merchant.merchant_id), given("app_id"));
                    return;
                }
                assert_eq!(Some(&notice.out_trade_no), given("out_trade_no"));
                assert_eq!(Some(&notice.transaction_id), given("trade_no"));
                assert_eq!(Some(&notice.merchant.merchant_id), given("seller_id"));
            }
        }
    }
});
