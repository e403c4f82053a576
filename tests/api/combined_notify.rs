//! WeChat's combined payment notification (合单支付) over HTTP, before any combination is
//! recorded here: verified, decrypted and decoded as one notification, refused as any other
//! when forged or malformed, and answered `404` (unknown, WeChat retries) with nothing
//! written when it arrives intact.

use chrono::TimeZone;
use paynotify::channel::wechat::WechatPay;
use paynotify::channel::{Inbound, Provider, Verdict};
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat::Sandbox;
use paynotify::time::{Clock, Timestamp};
use serde_json::Value;

use crate::support::agree::{assert_agree, header_map};
use crate::support::combined::{Combined, CombinedSub, sealed};
use crate::support::helpers::{Backend, TestApp, post_delivery, spawn_app_with};
use crate::support::keys::rsa_key;
use crate::wechat::{sandbox, settings};

// None of these reaches a recorded combination, so one backend is enough.

async fn app() -> TestApp {
    spawn_app_with(Backend::Sqlite, |s| s.wechat = settings()).await
}

fn now(app: &TestApp) -> i64 {
    app.clock.now().unix_seconds()
}

async fn pay(app: &TestApp, d: &Delivery) -> (u16, String) {
    post_delivery(app, "/notify/wechat/pay", d).await
}

/// Two sub-orders of merchant A, which are also ordinary orders here (so a wrong write would
/// show on them).
async fn two_orders(app: &TestApp, s: &Sandbox, combine_out_trade_no: &str) -> Combined {
    let subs = vec![
        CombinedSub::paid(&format!("{combine_out_trade_no}-1"), 1000, &s.mchid),
        CombinedSub::paid(&format!("{combine_out_trade_no}-2"), 2500, &s.mchid),
    ];
    for sub in &subs {
        app.create_order(&sub.out_trade_no, sub.total_amount).await;
    }
    Combined::new(s, combine_out_trade_no, subs)
}

/// Answered `status` in WeChat's failure shape, and nothing written: every order still
/// unpaid, no callback row, no outbox message.
async fn assert_refused_untouched(app: &TestApp, d: &Delivery, status: u16) {
    let (got, body) = pay(app, d).await;
    assert_eq!(got, status, "{body}");
    let body: Value = serde_json::from_str(&body).expect("FAIL body is JSON");
    assert_eq!(body["code"], "FAIL", "{body}");
    assert!(body["message"].is_string(), "{body}");
    assert_eq!(
        app.db
            .count("orders WHERE status <> 'WAIT_PAY' OR transaction_id IS NOT NULL")
            .await,
        0
    );
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combination_nobody_created_is_404_and_nothing_is_written() {
    let app = app().await;
    let s = sandbox('A');
    let c = two_orders(&app, &s, "CN-UNKNOWN").await;
    assert_refused_untouched(&app, &c.delivery(&s, now(&app)), 404).await;
    // WeChat's retry, re-encrypted and re-signed: the same answer.
    app.clock.advance(15);
    assert_refused_untouched(&app, &c.delivery(&s, now(&app)), 404).await;
    // On the combine merchant's own path too.
    let (status, body) = post_delivery(
        &app,
        "/notify/wechat/pay/1900000001",
        &c.delivery(&s, now(&app)),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_combined_notification_is_401() {
    let app = app().await;
    let s = sandbox('A');
    let c = two_orders(&app, &s, "CN-FORGED").await;
    // Merchant B's platform key signing under merchant A's serial.
    let forger = Sandbox {
        private_key: rsa_key("wechat-b"),
        ..sandbox('A')
    };
    assert_refused_untouched(&app, &c.delivery(&forger, now(&app)), 401).await;
    // Merchant A's key on the path of merchant B.
    let (status, _) = post_delivery(
        &app,
        "/notify/wechat/pay/1900000002",
        &c.delivery(&s, now(&app)),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(app.db.count("pay_callback").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_combined_notification_is_401() {
    let app = app().await;
    let s = sandbox('A');
    let c = two_orders(&app, &s, "CN-TAMPERED").await;
    let good = c.delivery(&s, now(&app));

    let mut one_byte = good.clone();
    let at = one_byte
        .body
        .iter()
        .position(|b| *b == b'T')
        .expect("a T in the body");
    one_byte.body[at] = b'X';
    assert_refused_untouched(&app, &one_byte, 401).await;

    let mut pretty = good.clone();
    let value: Value = serde_json::from_slice(&good.body).expect("json");
    pretty.body = serde_json::to_vec_pretty(&value).expect("json");
    assert_refused_untouched(&app, &pretty, 401).await;

    // The untouched one is verified (and unknown).
    assert_refused_untouched(&app, &good, 404).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sub_orders_or_more_than_fifty_is_400() {
    let app = app().await;
    let s = sandbox('A');
    let none = Combined::new(&s, "CN-NONE", Vec::new());
    assert_refused_untouched(&app, &none.delivery(&s, now(&app)), 400).await;
    let many = Combined::of(&s, "CN-MANY", 51, 100);
    assert_refused_untouched(&app, &many.delivery(&s, now(&app)), 400).await;

    // Signed and encrypted, but not a combination WeChat would send.
    let mut twice = Combined::of(&s, "CN-TWICE", 2, 100);
    twice.subs[1].out_trade_no = twice.subs[0].out_trade_no.clone();
    assert_refused_untouched(&app, &twice.delivery(&s, now(&app)), 400).await;
    let mut free = Combined::of(&s, "CN-FREE", 2, 100);
    free.subs[1].total_amount = 0;
    assert_refused_untouched(&app, &free.delivery(&s, now(&app)), 400).await;
    let no_appid = Combined::of(&s, "CN-NOAPP", 1, 100).plaintext().replacen(
        "\"combine_appid\"",
        "\"appid\"",
        1,
    );
    let (status, _) = pay(&app, &sealed(&s, &no_appid, now(&app))).await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_sub_orders_with_128_character_attach_fit_the_body_limit() {
    let app = app().await;
    let s = sandbox('A');
    let mut c = Combined::of(&s, "CN-FIFTY", 50, 100).attach(128);
    // WeChat's longest ids: a 32-character out_trade_no, a 28-digit transaction_id.
    for (i, sub) in c.subs.iter_mut().enumerate() {
        sub.out_trade_no = format!("CN-FIFTY-{i:0>23}");
        sub.transaction_id = format!("42000000002026113{i:0>11}");
    }
    let d = c.delivery(&s, now(&app));
    assert!(
        (40_000..65_536).contains(&d.body.len()),
        "about 47 KB: {}",
        d.body.len()
    );
    assert_refused_untouched(&app, &d, 404).await;
}

/// `explain` of a combined notification shows the combination, each sub-order and the
/// merchant check, and agrees with `verify` and `admit`.
#[test]
fn explain_shows_the_combination_and_each_sub_order() {
    let at = 1_794_967_525;
    let now = Timestamp::new(chrono::Utc.timestamp_opt(at, 0).single().expect("time"));
    let channel = WechatPay::from_settings(&settings(), now).expect("keys load");
    let s = sandbox('A');
    let ours = Combined::of(&s, "CN-EXPLAIN", 2, 700);
    let mut theirs = ours.clone();
    theirs.combine_mchid = "1900000002".into();
    for (c, merchant) in [(ours, Verdict::Pass), (theirs, Verdict::Fail)] {
        let d = c.delivery(&s, at);
        let headers: Vec<(String, Vec<u8>)> = d
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
            .collect();
        let headers = header_map(&headers);
        let request = Inbound {
            headers: &headers,
            body: &d.body,
            now,
            route: Some("/notify/wechat/pay"),
        };
        assert_eq!(assert_agree(&channel, &request, "combined"), None);
        let e = channel.explain(&request);
        let detail = |name: &str| {
            e.checks
                .iter()
                .find(|check| check.name == name)
                .map(|check| (check.verdict, check.detail.clone()))
                .unwrap_or_else(|| panic!("no check {name}: {:?}", e.checks))
        };
        let (_, decoded) = detail("decoded fields");
        for shown in [
            "combine_out_trade_no CN-EXPLAIN",
            &format!("combine_mchid {}", c.combine_mchid),
            "combine_appid wx0000000000000001",
            "2 sub-orders",
        ] {
            assert!(decoded.contains(shown), "{shown}: {decoded}");
        }
        for (i, sub) in c.subs.iter().enumerate() {
            let (verdict, line) = detail(&format!("sub-order {}", i + 1));
            assert_eq!(verdict, Verdict::Info);
            for shown in [
                format!("out_trade_no {}", sub.out_trade_no),
                format!("transaction_id {}", sub.transaction_id),
                "total_amount 700".to_owned(),
                format!("mchid {}", sub.mchid),
                "trade_state SUCCESS".to_owned(),
            ] {
                assert!(line.contains(&shown), "{shown}: {line}");
            }
        }
        assert_eq!(detail("merchant").0, merchant);
    }
}
