//! WeChat Pay: the headers, the envelope and the decrypted resource.
//!
//! Three ways in: a whole request through `admit` (headers and signature check included; a
//! fresh timestamp and the real serial can be put in so the fuzzer gets past them), a body
//! taken as signed (envelope parsing and decryption), and a resource encrypted with the
//! merchant's real APIv3 key (the transaction and refund decoders).
#![no_main]

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use paynotify::channel::{Channel, Inbound, Rejection, admit};
use paynotify::notice::NoticeKind;
use paynotify::qa::forge::wechat::{encrypt, envelope};
use paynotify_fuzz::{channels, now};

#[derive(Debug, Arbitrary)]
enum Input {
    Request {
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        /// Adds `Wechatpay-Timestamp` this many seconds from now.
        skew: Option<i16>,
        real_serial: bool,
        body: Vec<u8>,
    },
    SignedBody(Vec<u8>),
    Resource {
        event: u8,
        aad: String,
        plaintext: Vec<u8>,
    },
}

const EVENTS: [&str; 5] = [
    "TRANSACTION.SUCCESS",
    "REFUND.SUCCESS",
    "REFUND.ABNORMAL",
    "REFUND.CLOSED",
    "TRANSACTION.OTHER",
];

fn check(result: Result<paynotify::notice::Notice, Rejection>, encrypted_here: bool) {
    match result {
        Ok(notice) => {
            // Admitted means storable and within the lengths: checking again changes nothing.
            assert_eq!(notice.clone().checked().as_ref(), Ok(&notice));
            match notice.kind {
                NoticeKind::Paid => assert!(notice.amount_fen > 0, "{notice:?}"),
                NoticeKind::Refunded(_) => assert!(notice.amount_fen > 0, "{notice:?}"),
                _ => {}
            }
        }
        Err(Rejection::Undecryptable(why)) => {
            assert!(
                !encrypted_here,
                "a resource sealed with the right key: {why}"
            )
        }
        Err(e) => assert!(matches!(e.status(), 400 | 401), "{e:?}"),
    }
}

fuzz_target!(|input: Input| {
    let c = channels();
    match input {
        Input::Request {
            headers,
            skew,
            real_serial,
            body,
        } => {
            let mut map = HeaderMap::new();
            for (name, value) in &headers {
                // What the HTTP layer cannot deliver never reaches the channel.
                if let (Ok(name), Ok(value)) =
                    (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
                {
                    map.append(name, value);
                }
            }
            let at = now();
            if let Some(skew) = skew {
                let stamp = (at.unix_seconds() + i64::from(skew)).to_string();
                if let Ok(value) = HeaderValue::from_str(&stamp) {
                    map.append(HeaderName::from_static("wechatpay-timestamp"), value);
                }
            }
            if real_serial && let Ok(value) = HeaderValue::from_str(&c.serial) {
                map.append(HeaderName::from_static("wechatpay-serial"), value);
            }
            let request = Inbound {
                headers: &map,
                body: &body,
                now: at,
                route: None,
            };
            // Nobody can sign for the sandbox platform key here: every request is refused,
            // and refused as the client's fault.
            let refused = admit(&c.wechat, &request).expect_err("an unsigned request admitted");
            assert!(matches!(refused.status(), 400 | 401), "{refused:?}");
            let _ = c.wechat.id();
        }
        Input::SignedBody(body) => check(c.wechat.admit_signed_body(&c.serial, &body), false),
        Input::Resource {
            event,
            aad,
            plaintext,
        } => {
            let event_type = EVENTS[usize::from(event) % EVENTS.len()];
            let nonce = "0123456789ab";
            let Ok(ciphertext) = encrypt(c.apiv3_key.as_bytes(), nonce, &aad, &plaintext) else {
                return;
            };
            let body = envelope(event_type, "transaction", &ciphertext, &aad, nonce);
            check(c.wechat.admit_signed_body(&c.serial, body.as_bytes()), true);
        }
    }
});
