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

// Once a combination is recorded, on every backend: the real notification over HTTP, to two
// instances at once.

crate::on_every_backend!(
    twenty_concurrent_deliveries_to_two_instances_make_one_transition_per_sub_order,
    a_recorded_combination_answers_204_and_a_conflicting_copy_409,
);

/// Combination `no` of merchant A recorded here with `subs` sub-orders of 100 fen, half of
/// them settled to merchant B.
async fn recorded(app: &TestApp, s: &Sandbox, no: &str, subs: usize) -> Combined {
    let c = Combined::new(
        s,
        no,
        (1..=subs)
            .map(|i| {
                let mchid = if i % 2 == 0 {
                    "1900000002"
                } else {
                    s.mchid.as_str()
                };
                CombinedSub::paid(&format!("{no}-{i}"), 100, mchid)
            })
            .collect(),
    );
    let body = serde_json::json!({
        "combine_out_trade_no": no, "channel": "wechat", "account": s.mchid,
        "sub_orders": c.subs.iter().map(|sub| serde_json::json!({
            "order_no": sub.out_trade_no, "amount_fen": sub.total_amount, "account": sub.mchid,
        })).collect::<Vec<_>>(),
    });
    let response = app
        .client
        .post(app.url("/combined-orders"))
        .bearer_auth(&app.api_token)
        .json(&body)
        .send()
        .await
        .expect("POST /combined-orders");
    assert_eq!(response.status(), 201);
    c
}

async fn twenty_concurrent_deliveries_to_two_instances_make_one_transition_per_sub_order(
    backend: Backend,
) {
    let first = spawn_app_with(backend, |s| s.wechat = settings()).await;
    let second = first.spawn_beside(|s| s.wechat = settings()).await;
    let s = sandbox('A');
    let c = recorded(&first, &s, "CN-TWENTY", 50).await;
    // Twenty deliveries of the same notification, each re-encrypted and re-signed as
    // WeChat's retries are, half to each instance, released together.
    let deliveries: Vec<Delivery> = (0..20).map(|_| c.delivery(&s, now(&first))).collect();
    let answers = crate::support::helpers::released_together(20, |i| {
        let app = if i % 2 == 0 { &first } else { &second };
        let (client, url) = (app.client.clone(), app.url("/notify/wechat/pay"));
        let d = deliveries[i].clone();
        async move {
            let mut request = client.post(url).body(d.body.clone());
            for (name, value) in &d.headers {
                request = request.header(name.as_str(), value.as_str());
            }
            let response = request.send().await.expect("notify request");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
    })
    .await;
    for (status, body) in &answers {
        assert_eq!(*status, 204, "every delivery acknowledged: {body}");
    }
    assert_eq!(
        first.messages("ORDER_PAID").await,
        50,
        "one event per sub-order"
    );
    assert_eq!(first.db.count("local_message").await, 50);
    assert_eq!(first.db.count("pay_callback").await, 50);
    assert_eq!(first.db.count("orders WHERE status = 'PAID'").await, 50);
    assert_eq!(first.db.count("payment_anomaly").await, 0);
}

async fn a_recorded_combination_answers_204_and_a_conflicting_copy_409(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.wechat = settings()).await;
    let s = sandbox('A');
    let c = recorded(&app, &s, "CN-REC", 3).await;
    let (status, body) = pay(&app, &c.delivery(&s, now(&app))).await;
    assert_eq!(status, 204, "{body}");
    for sub in &c.subs {
        let order = app.get_order(&sub.out_trade_no).await;
        assert_eq!(order["status"], "PAID");
        assert_eq!(order["transaction_id"], sub.transaction_id);
        assert_eq!(order["combine_out_trade_no"], "CN-REC");
    }
    // WeChat's retry: a duplicate, answered alike.
    app.clock.advance(15);
    assert_eq!(pay(&app, &c.delivery(&s, now(&app))).await.0, 204);
    assert_eq!(app.messages("ORDER_PAID").await, 3);
    // The same transaction with another amount: the whole notification is 409, nothing
    // written.
    let mut other = c.clone();
    other.subs[2].total_amount += 1;
    let (status, body) = pay(&app, &other.delivery(&s, now(&app))).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(app.db.count("local_message").await, 3);
    assert_eq!(app.db.count("payment_anomaly").await, 0);
}

/// With the Redis gate, keyed by the combination: a repeat of an applied combined
/// notification is answered from Redis (or this instance's memory) without the database,
/// and the twenty deliveries to two instances still make one transition per sub-order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_answers_a_repeated_combination_and_keeps_it_exactly_once() {
    let prefix = format!(
        "pn-test-combined-{}:",
        paynotify::random::token(b"abcdefghijklmnopqrstuvwxyz", 10).expect("random")
    );
    let gated = |s: &mut paynotify::config::Settings| {
        s.wechat = settings();
        s.redis.url = paynotify::config::Secret::new("redis://127.0.0.1:6379");
        s.redis.key_prefix = prefix.clone();
        s.redis.timeout_ms = 1000;
    };
    let first = spawn_app_with(Backend::Postgres, gated).await;
    let second = first.spawn_beside(gated).await;
    let s = sandbox('A');
    let c = recorded(&first, &s, "CN-GATE", 10).await;
    let (status, body) = pay(&first, &c.delivery(&s, now(&first))).await;
    assert_eq!(status, 204, "{body}");
    let cached = |app: &TestApp| {
        ["hit", "hit_local"]
            .iter()
            .map(|r| crate::support::helpers::metric(app, "paynotify_gate_total", &[r]))
            .sum::<u64>()
    };
    // The repeat on the other instance: Redis's cached answer for the combination.
    let (status, _) = pay(&second, &c.delivery(&s, now(&first))).await;
    assert_eq!(status, 204);
    assert_eq!(cached(&second), 1, "answered from the gate");
    // And on the same instance: its own memory.
    let (status, _) = pay(&first, &c.delivery(&s, now(&first))).await;
    assert_eq!(status, 204);
    assert_eq!(cached(&first), 1, "answered from memory");
    assert_eq!(first.messages("ORDER_PAID").await, 10);
    crate::gate::flush(&prefix).await;
}
