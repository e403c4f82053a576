//! Decoding a combined payment (合单支付), on a channel and merchant built here: what the
//! notice says, what is refused, and which deliveries are the same.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::{Value, json};

use super::wire::{CombinedTransaction, combined_notice};
use super::{Book, Merchant, PAY_ROUTE, Verified, WechatPay};
use crate::channel::{Channel, Halt, Rejection};
use crate::notice::{
    ChannelId, Combination, MAX_SUB_ORDERS, MerchantIds, Notice, NoticeKind, SubPayment,
};
use crate::qa::forge::wechat::{encrypt, envelope};
use crate::time::Timestamp;

const MCHID: &str = "1900000001";
const APPID: &str = "wx0000000000000001";
/// A second app bound to [`MCHID`].
const OTHER_APPID: &str = "wx0000000000000003";
const APIV3: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA1";

fn merchant() -> Arc<Merchant> {
    Arc::new(
        Merchant::new(
            MCHID.into(),
            vec![APPID.into(), OTHER_APPID.into()],
            APIV3.as_bytes(),
        )
        .expect("a 32-byte key"),
    )
}

fn channel() -> WechatPay {
    let m = merchant();
    WechatPay {
        book: RwLock::new(Arc::new(Book {
            merchants: HashMap::from([(m.mchid.clone(), m)]),
            ..Book::default()
        })),
        file: vec![MCHID.into()],
        refreshed: RwLock::default(),
    }
}

/// One sub-order as WeChat lists it, its keys in the doc sample's order.
fn sub_order(out_trade_no: &str, mchid: &str, total: i64, success_time: &str) -> String {
    format!(
        r#"{{"mchid":"{mchid}","trade_type":"JSAPI","trade_state":"SUCCESS","bank_type":"CMC","attach":"深圳分店","amount":{{"total_amount":{total},"currency":"CNY","payer_amount":{total},"payer_currency":"CNY"}},"success_time":"{success_time}","transaction_id":"42{out_trade_no}","out_trade_no":"{out_trade_no}"}}"#
    )
}

/// The decrypted resource of a combined notification, in the doc sample's key order.
fn combination(combine_mchid: &str, combine_appid: &str, subs: &[String]) -> String {
    format!(
        r#"{{"combine_appid":"{combine_appid}","combine_out_trade_no":"C20261130001","combine_mchid":"{combine_mchid}","scene_info":{{"device_id":"POS1:1"}},"sub_orders":[{}],"combine_payer_info":{{"openid":"oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"}}}}"#,
        subs.join(",")
    )
}

/// Two sub-orders, of two merchants, paid five seconds apart.
fn two_subs() -> Vec<String> {
    vec![
        sub_order("S-1", MCHID, 1000, "2026-11-30T10:00:00+08:00"),
        sub_order("S-2", "1900000002", 2500, "2026-11-30T10:00:05+08:00"),
    ]
}

fn verified(plaintext: &[u8], account: Option<&str>) -> Verified {
    Verified {
        merchant: merchant(),
        event_type: "TRANSACTION.SUCCESS".into(),
        plaintext: plaintext.to_vec(),
        account: account.map(str::to_owned),
    }
}

fn decode(plaintext: &[u8]) -> Result<Notice, Rejection> {
    channel().decode(verified(plaintext, None))
}

fn at(rfc3339: &str) -> Option<Timestamp> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| Timestamp::new(t.with_timezone(&chrono::Utc)))
}

#[test]
fn a_combined_payment_decodes_to_the_combination_and_its_sub_orders_in_order() {
    let plaintext = combination(MCHID, APPID, &two_subs());
    let notice = decode(plaintext.as_bytes()).expect("decodes");
    let sub = |no: &str, mchid: &str, fen, paid_at| SubPayment {
        out_trade_no: no.into(),
        transaction_id: format!("42{no}"),
        amount_fen: fen,
        currency: "CNY".into(),
        mchid: mchid.into(),
        trade_state: "SUCCESS".into(),
        occurred_at: at(paid_at),
    };
    assert_eq!(
        notice,
        Notice {
            channel: ChannelId::Wechat,
            kind: NoticeKind::Combined(Box::new(Combination {
                subs: vec![
                    sub("S-1", MCHID, 1000, "2026-11-30T10:00:00+08:00"),
                    sub("S-2", "1900000002", 2500, "2026-11-30T10:00:05+08:00"),
                ]
            })),
            out_trade_no: "C20261130001".into(),
            transaction_id: String::new(),
            amount_fen: 3500,
            currency: "CNY".into(),
            merchant: MerchantIds {
                merchant_id: MCHID.into(),
                app_id: Some(APPID.into()),
            },
            merchant_matches: true,
            occurred_at: at("2026-11-30T10:00:05+08:00"),
        }
    );
    // Storable and within the lengths as it is.
    assert_eq!(notice.clone().checked(), Ok(notice));
}

#[test]
fn the_combine_merchant_and_app_must_be_the_verifying_merchant_s() {
    let matches = |mchid: &str, appid: &str| {
        decode(combination(mchid, appid, &two_subs()).as_bytes())
            .expect("decodes")
            .merchant_matches
    };
    assert!(matches(MCHID, APPID));
    assert!(matches(MCHID, OTHER_APPID), "any app bound to the mchid");
    assert!(!matches("1900000002", APPID), "another combine_mchid");
    assert!(
        !matches(MCHID, "wx0000000000000002"),
        "an app not configured"
    );
}

#[test]
fn a_per_account_path_must_name_the_combine_merchant() {
    let plaintext = combination(MCHID, APPID, &two_subs());
    let on = |account| channel().decode(verified(plaintext.as_bytes(), Some(account)));
    assert!(on(MCHID).is_ok());
    assert!(
        matches!(on("1900000002"), Err(Rejection::UnknownMerchant(_))),
        "{:?}",
        on("1900000002")
    );
}

/// The two-sub-order combination as JSON, for a test to break.
fn value() -> Value {
    serde_json::from_str(&combination(MCHID, APPID, &two_subs())).expect("json")
}

fn with_subs(count: usize) -> Value {
    let subs: Vec<String> = (0..count)
        .map(|i| sub_order(&format!("S-{i}"), MCHID, 100, "2026-11-30T10:00:00+08:00"))
        .collect();
    serde_json::from_str(&combination(MCHID, APPID, &subs)).expect("json")
}

#[test]
fn a_malformed_combination_is_a_bad_request() {
    let removed = |path: &[&str]| {
        let mut v = value();
        let (last, parents) = path.split_last().expect("a path");
        let mut at = &mut v;
        for key in parents {
            at = match key.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*key],
            };
        }
        at.as_object_mut().expect("object").remove(*last);
        v
    };
    let changed = |path: &[&str], to: Value| {
        let mut v = value();
        let mut at = &mut v;
        for key in path {
            at = match key.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*key],
            };
        }
        *at = to;
        v
    };
    let mut duplicate = value();
    duplicate["sub_orders"][1]["out_trade_no"] = "S-1".into();
    let cases = [
        ("no sub-orders", changed(&["sub_orders"], json!([]))),
        ("51 sub-orders", with_subs(MAX_SUB_ORDERS + 1)),
        (
            "a zero amount",
            changed(&["sub_orders", "0", "amount", "total_amount"], json!(0)),
        ),
        (
            "a negative amount",
            changed(&["sub_orders", "1", "amount", "total_amount"], json!(-100)),
        ),
        (
            "a fractional amount",
            changed(&["sub_orders", "0", "amount", "total_amount"], json!(10.5)),
        ),
        (
            "an amount in a string",
            changed(
                &["sub_orders", "0", "amount", "total_amount"],
                json!("1000"),
            ),
        ),
        (
            "an amount beyond 64 bits",
            changed(
                &["sub_orders", "0", "amount", "total_amount"],
                json!(u64::MAX),
            ),
        ),
        (
            "amounts whose sum is beyond 64 bits",
            changed(
                &["sub_orders", "0", "amount", "total_amount"],
                json!(i64::MAX),
            ),
        ),
        ("an out_trade_no twice", duplicate),
        (
            "an empty combine_out_trade_no",
            changed(&["combine_out_trade_no"], json!("")),
        ),
        (
            "a combine_out_trade_no of 33",
            changed(&["combine_out_trade_no"], json!("C".repeat(33))),
        ),
        ("no combine_appid", removed(&["combine_appid"])),
        ("no combine_mchid", removed(&["combine_mchid"])),
        ("no sub_orders", removed(&["sub_orders"])),
        ("no sub-order mchid", removed(&["sub_orders", "0", "mchid"])),
        (
            "no sub-order out_trade_no",
            removed(&["sub_orders", "1", "out_trade_no"]),
        ),
        (
            "no sub-order transaction_id",
            removed(&["sub_orders", "0", "transaction_id"]),
        ),
        (
            "no sub-order trade_state",
            removed(&["sub_orders", "0", "trade_state"]),
        ),
        (
            "no sub-order amount",
            removed(&["sub_orders", "0", "amount"]),
        ),
        (
            "no total_amount",
            removed(&["sub_orders", "0", "amount", "total_amount"]),
        ),
        (
            "a partner-mode sub-order",
            changed(&["sub_orders", "0", "sub_mchid"], json!("1900000109")),
        ),
    ];
    for (name, plaintext) in cases {
        let decoded = decode(plaintext.to_string().as_bytes());
        assert!(
            matches!(decoded, Err(Rejection::BadRequest(_))),
            "{name}: {decoded:?}"
        );
    }
    // At the limits.
    assert!(decode(with_subs(MAX_SUB_ORDERS).to_string().as_bytes()).is_ok());
    let longest = changed(&["combine_out_trade_no"], json!("C".repeat(32)));
    assert!(decode(longest.to_string().as_bytes()).is_ok());
}

#[test]
fn a_partner_mode_combination_says_it_is_not_supported() {
    let mut v = value();
    v["sub_orders"][0]["sub_mchid"] = "1900000109".into();
    match decode(v.to_string().as_bytes()) {
        Err(Rejection::BadRequest(why)) => assert!(why.contains("partner"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_sub_order_id_longer_than_the_columns_is_refused_when_admitted() {
    let mut v = value();
    v["sub_orders"][1]["transaction_id"] = "4".repeat(65).into();
    let notice = decode(v.to_string().as_bytes()).expect("decodes");
    assert!(notice.checked().is_err());
}

/// The notification around `plaintext`, encrypted with `nonce` as WeChat does.
fn sealed(plaintext: &str, nonce: &str) -> Vec<u8> {
    let ciphertext =
        encrypt(APIV3.as_bytes(), nonce, "transaction", plaintext.as_bytes()).expect("seal");
    envelope(
        "TRANSACTION.SUCCESS",
        "transaction",
        &ciphertext,
        "transaction",
        nonce,
    )
    .into_bytes()
}

fn opened(body: &[u8]) -> Notice {
    let wechat = channel();
    let verified = wechat
        .open(&[merchant()], "SERIAL", body, Some(PAY_ROUTE), &mut Halt)
        .expect("opens");
    wechat.decode(verified).expect("decodes")
}

#[test]
fn a_redelivery_re_encrypted_and_re_ordered_is_the_same_content() {
    let first = combination(MCHID, APPID, &two_subs());
    // WeChat's retry: another nonce, another key order and layout, later timestamps.
    let mut later = value();
    for sub in later["sub_orders"].as_array_mut().expect("array") {
        sub["success_time"] = "2026-11-30T10:30:00+08:00".into();
    }
    let retry = serde_json::to_string_pretty(&later).expect("json");
    assert_ne!(first, retry);
    let (a, b) = (
        opened(&sealed(&first, "aaaaaaaaaaaa")),
        opened(&sealed(&retry, "bbbbbbbbbbbb")),
    );
    assert_eq!(a.digest(), b.digest());

    // Business content is not: an amount, a transaction, a merchant, the sub-orders' order.
    let mut other = value();
    other["sub_orders"][0]["amount"]["total_amount"] = 1001.into();
    let mut swapped = value();
    swapped["sub_orders"]
        .as_array_mut()
        .expect("array")
        .swap(0, 1);
    let mut another_mchid = value();
    another_mchid["sub_orders"][1]["mchid"] = "1900000003".into();
    for changed in [other, swapped, another_mchid] {
        let changed = opened(&sealed(&changed.to_string(), "cccccccccccc"));
        assert_ne!(a.digest(), changed.digest(), "{changed:?}");
    }
}

#[test]
fn a_sub_order_s_digest_is_its_business_content_not_its_timestamps() {
    let first = decode(combination(MCHID, APPID, &two_subs()).as_bytes()).expect("decodes");
    let later = decode(
        combination(
            MCHID,
            APPID,
            &[
                sub_order("S-1", MCHID, 1000, "2026-12-01T09:00:00+08:00"),
                sub_order("S-2", "1900000002", 2500, "2026-12-01T09:00:00+08:00"),
            ],
        )
        .as_bytes(),
    )
    .expect("decodes");
    let subs = |n: &Notice| match &n.kind {
        NoticeKind::Combined(c) => c.subs.clone(),
        other => panic!("{other:?}"),
    };
    let (before, after) = (subs(&first), subs(&later));
    assert_ne!(before[0].occurred_at, after[0].occurred_at);
    for (x, y) in before.iter().zip(&after) {
        assert_eq!(first.sub_digest(x), later.sub_digest(y));
    }
    assert_ne!(first.sub_digest(&before[0]), first.sub_digest(&before[1]));
    let mut more = before[0].clone();
    more.amount_fen += 1;
    assert_ne!(first.sub_digest(&before[0]), first.sub_digest(&more));
}

#[test]
fn a_combine_query_answer_may_list_unpaid_sub_orders_without_a_transaction() {
    let mut v = value();
    v["sub_orders"][1]["trade_state"] = "NOTPAY".into();
    let sub = v["sub_orders"][1].as_object_mut().expect("object");
    sub.remove("transaction_id");
    sub.remove("success_time");
    let t: CombinedTransaction = serde_json::from_value(v.clone()).expect("parses");
    assert_eq!(t.check(), Ok(()));
    let notice = combined_notice(&merchant(), t);
    let NoticeKind::Combined(c) = &notice.kind else {
        panic!("{notice:?}");
    };
    assert_eq!(
        (
            c.subs[1].trade_state.as_str(),
            c.subs[1].transaction_id.as_str()
        ),
        ("NOTPAY", "")
    );
    assert!(!c.subs[1].is_paid());
    // A notification says only paid sub-orders, each with its transaction.
    assert!(matches!(
        decode(v.to_string().as_bytes()),
        Err(Rejection::BadRequest(_))
    ));
}

/// The channel of [`merchant`] that knows `serial` as its platform key, and WeChat's side
/// of that key: what `paynotify replay` signs with.
fn signed_channel(serial: &str) -> (WechatPay, crate::qa::forge::wechat::Sandbox) {
    use rsa::Generate;
    use rsa::pkcs8::{EncodePublicKey, LineEnding};
    let private_key = rsa::PrivateKey::try_generate().expect("key");
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("platform.pem");
    let pem = private_key
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("pem");
    std::fs::write(&path, pem).expect("write");
    let key = crate::channel::keys::public_key_file("test", &path).expect("public key");
    let m = merchant();
    let platform = Arc::new(super::PlatformVerifier {
        key,
        merchant: m.clone(),
        origin: crate::channel::platform::KeyOrigin::Configured,
        effective_at: None,
        expire_at: None,
        fetched_at: None,
    });
    let wechat = WechatPay {
        book: RwLock::new(Arc::new(Book {
            merchants: HashMap::from([(m.mchid.clone(), m)]),
            keys: HashMap::from([(serial.to_uppercase(), Arc::new(vec![platform]))]),
            ..Book::default()
        })),
        file: vec![MCHID.into()],
        refreshed: RwLock::default(),
    };
    let sandbox = crate::qa::forge::wechat::Sandbox {
        serial: serial.into(),
        private_key,
        mchid: MCHID.into(),
        appid: APPID.into(),
        apiv3_key: APIV3.into(),
    };
    (wechat, sandbox)
}

#[test]
fn the_qa_forge_s_combined_notification_is_wechat_s_and_verifies_as_the_combination() {
    use crate::qa::forge::wechat::{CombinedSub, combined};

    let subs = [
        CombinedSub::paid("S-1", 1000, MCHID),
        CombinedSub::paid("S-2", 2500, MCHID),
    ];
    let success_time = "2026-11-30T10:00:00+08:00";
    let plaintext = combined(APPID, "C1", MCHID, &subs, "附言", success_time).expect("forged");
    // Every key where WeChat's doc sample has it (read off the text: a parsed map sorts).
    let order = |text: &str, names: &[&str]| {
        let at: Vec<usize> = names
            .iter()
            .map(|n| text.find(&format!("\"{n}\":")).expect(n))
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{names:?} in {text}");
    };
    order(
        &plaintext,
        &[
            "combine_appid",
            "combine_out_trade_no",
            "combine_mchid",
            "scene_info",
            "sub_orders",
            "combine_payer_info",
        ],
    );
    let first = &plaintext[plaintext.find("\"sub_orders\"").expect("subs")..];
    let first = &first[..first.find("},{").expect("two sub-orders")];
    order(
        first,
        &[
            "mchid",
            "trade_type",
            "trade_state",
            "bank_type",
            "attach",
            "amount",
            "total_amount",
            "currency",
            "payer_amount",
            "payer_currency",
            "success_time",
            "transaction_id",
            "out_trade_no",
        ],
    );
    assert!(plaintext.starts_with(r#"{"combine_appid":"wx0000000000000001","combine_out_trade_no":"C1","combine_mchid":"1900000001","scene_info":{"device_id":"POS1:1"},"sub_orders":[{"mchid":"1900000001","trade_type":"JSAPI","trade_state":"SUCCESS","bank_type":"OTHERS","attach":"附言","amount":{"total_amount":1000,"currency":"CNY","payer_amount":1000,"payer_currency":"CNY"},"success_time":"2026-11-30T10:00:00+08:00","transaction_id":"42S-1","out_trade_no":"S-1"}"#), "{plaintext}");
    assert!(
        plaintext.ends_with(r#""combine_payer_info":{"openid":"oSandboxOpenId0000000000000"}}"#)
    );

    // Sealed and signed, the service's own channel verifies and decodes it.
    let (wechat, sandbox) = signed_channel("PUB_KEY_ID_0000000000000000000000000000000001");
    let now = Timestamp::new(chrono::Utc::now());
    let delivery = sandbox
        .sealed(
            "TRANSACTION.SUCCESS",
            plaintext.as_bytes(),
            now.unix_seconds(),
        )
        .expect("sealed");
    let mut headers = actix_web::http::header::HeaderMap::new();
    for (name, value) in &delivery.headers {
        headers.insert(name.parse().expect("name"), value.parse().expect("value"));
    }
    let request = crate::channel::Inbound {
        headers: &headers,
        body: &delivery.body,
        now,
        route: Some(PAY_ROUTE),
    };
    let notice = crate::channel::admit(&wechat, &request).expect("admitted");
    assert_eq!(notice.out_trade_no, "C1");
    assert_eq!(notice.amount_fen, 3500);
    let NoticeKind::Combined(c) = notice.kind else {
        panic!("a combination: {notice:?}");
    };
    let seen: Vec<_> = c
        .subs
        .iter()
        .map(|s| {
            (
                s.out_trade_no.as_str(),
                s.transaction_id.as_str(),
                s.amount_fen,
                s.mchid.as_str(),
                s.trade_state.as_str(),
                s.occurred_at,
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("S-1", "42S-1", 1000, MCHID, "SUCCESS", at(success_time)),
            ("S-2", "42S-2", 2500, MCHID, "SUCCESS", at(success_time)),
        ]
    );
    // A byte changed after signing is refused.
    let mut tampered = delivery.body.clone();
    if let Some(b) = tampered.iter_mut().rev().find(|b| b.is_ascii_digit()) {
        *b = if *b == b'0' { b'1' } else { b'0' };
    }
    let request = crate::channel::Inbound {
        body: &tampered,
        ..request
    };
    assert!(crate::channel::admit(&wechat, &request).is_err());
}

/// Merchants holding one platform certificate: the resource opens with one APIv3 key only,
/// and that key's merchant is the notification's, whichever order they are tried in.
#[test]
fn a_shared_certificate_opens_with_the_one_merchant_whose_key_fits() {
    let wechat = channel();
    let other = Arc::new(
        Merchant::new("1900000002".into(), vec![APPID.into()], &[b'B'; 32]).expect("32 bytes"),
    );
    let plaintext = r#"{"out_trade_no":"S-1"}"#;
    let ciphertext = encrypt(
        &[b'B'; 32],
        "0123456789ab",
        "transaction",
        plaintext.as_bytes(),
    )
    .expect("seal");
    let body = envelope(
        "TRANSACTION.SUCCESS",
        "transaction",
        &ciphertext,
        "transaction",
        "0123456789ab",
    );
    for holders in [
        vec![merchant(), Arc::clone(&other)],
        vec![Arc::clone(&other), merchant()],
    ] {
        let verified = wechat
            .open(
                &holders,
                "SERIAL",
                body.as_bytes(),
                Some(PAY_ROUTE),
                &mut Halt,
            )
            .expect("opens");
        assert_eq!(verified.merchant.mchid, "1900000002");
        assert_eq!(verified.plaintext(), plaintext.as_bytes());
    }
    let why = wechat
        .open(
            &[merchant(), merchant()],
            "SERIAL",
            body.as_bytes(),
            Some(PAY_ROUTE),
            &mut Halt,
        )
        .expect_err("neither key fits");
    assert!(
        matches!(&why, Rejection::Undecryptable(m) if m.contains("any of the 2 merchants")),
        "{why:?}"
    );
}

/// A platform certificate downloaded by two merchants: each holds its own entry, a download
/// replaces only the downloading merchant's, a configured entry is never replaced by one, and
/// taking a merchant out leaves the other's.
#[test]
fn each_merchant_holds_its_own_entry_of_a_shared_certificate() {
    use crate::channel::platform::KeyOrigin;
    let (wechat, _) = signed_channel("CERT");
    let a = wechat.key_of("CERT", MCHID).expect("A's configured entry");
    let b = Arc::new(Merchant::new("1900000002".into(), vec![], &[b'B'; 32]).expect("32 bytes"));
    let entry = |merchant: &Arc<Merchant>, origin| super::PlatformVerifier {
        key: a.key.clone(),
        merchant: Arc::clone(merchant),
        origin,
        effective_at: None,
        expire_at: None,
        fetched_at: None,
    };
    assert!(
        !wechat.learn("cert", entry(&b, KeyOrigin::Downloaded)),
        "B is not a merchant here yet"
    );
    assert_eq!(wechat.holders("CERT").expect("A's").len(), 1);
    wechat.change(|book| book.merchants.insert(b.mchid.clone(), Arc::clone(&b)));
    assert!(
        wechat.learn("cert", entry(&b, KeyOrigin::Downloaded)),
        "new for B"
    );
    assert!(
        !wechat.learn("CERT", entry(&b, KeyOrigin::Downloaded)),
        "B's again"
    );
    assert!(!wechat.learn("CERT", entry(&a.merchant, KeyOrigin::Downloaded)));
    let held = wechat.holders("CERT").expect("held");
    let mut owners: Vec<(&str, KeyOrigin)> = held
        .iter()
        .map(|p| (p.merchant.mchid.as_str(), p.origin))
        .collect();
    owners.sort_by_key(|(m, _)| *m);
    assert_eq!(
        owners,
        [
            (MCHID, KeyOrigin::Configured),
            ("1900000002", KeyOrigin::Downloaded)
        ]
    );
    wechat.change(|book| {
        let taken = book.take_keys_of(MCHID);
        assert_eq!(taken.len(), 1);
    });
    let held = wechat.holders("CERT").expect("B's stays");
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].merchant.mchid, "1900000002");
}
