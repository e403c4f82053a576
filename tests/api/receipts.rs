//! Receipts: what arrived at a notify URL is kept when it was refused (or always, or never),
//! written off the hot path, never holding a configured secret; re-applied once fixed.

use std::time::{Duration, Instant};

use paynotify::config::{ReceiptMode, Secret};
use paynotify::metrics::Metrics;
use paynotify::qa::forge::Delivery;
use paynotify::receipts::store::{NewReceipt, ReceiptFilter, StoredReceipt};
use serde_json::Value;

use crate::support::helpers::{Backend, TestApp, admin, metric, spawn_app_with};
use crate::wechat::{APIV3_A, paid, pay, sandbox, settings};

use std::sync::Arc;

use paynotify::channel::Provider;
use paynotify::receipts::explain::{Report, Request};
use paynotify::time::Clock;

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.wechat = settings()).await
}

/// A "proxy" that parses the JSON body and pretty-prints it before passing it on.
fn reserialised(d: &Delivery) -> Delivery {
    let value: serde_json::Value = serde_json::from_slice(&d.body).expect("JSON body");
    let mut d = d.clone();
    d.body = serde_json::to_vec_pretty(&value).expect("pretty");
    d
}

/// A payment notification for `order_no` (100 fen) whose signature does not verify.
fn badly_signed(app: &TestApp, order_no: &str) -> Delivery {
    let mut forged = paid(app, &sandbox('A'), order_no, 100);
    forged.set_header("Wechatpay-Signature", "AAAA");
    forged
}

/// Blocks every receipt insert for `hold`: SQLite's one writer, elsewhere the table.
async fn hold_receipt_writes(
    app: &TestApp,
    backend: Backend,
    hold: Duration,
) -> tokio::task::JoinHandle<()> {
    match backend {
        Backend::Sqlite => app.db.hold_write_lock("none", hold).await,
        _ => app.db.hold_table_lock("notify_receipt", hold).await,
    }
}

async fn all_receipts(app: &TestApp) -> Vec<StoredReceipt> {
    app.store
        .receipts(&ReceiptFilter {
            limit: 1000,
            ..ReceiptFilter::default()
        })
        .await
        .expect("receipts")
}

crate::on_every_backend!(
    a_body_reserialised_by_a_proxy_is_refused_and_kept_as_it_arrived,
    accepted_notifications_leave_no_receipt_unless_store_is_all,
    receipts_never_contain_configured_secrets,
    a_full_receipt_queue_drops_and_counts_while_notify_still_answers,
    a_wrong_apiv3_key_fixed_then_bulk_reapply_pays_each_order_once,
    the_admin_api_lists_shows_and_reapplies_one_receipt,
    explain_names_the_reserialised_body_as_the_failing_check,
    explain_names_an_alipay_body_reencoded_from_gbk_to_utf8,
    the_retention_job_purges_receipts_after_receipts_keep_days,
    a_nul_in_refused_requests_is_stored_escaped_and_sinks_no_batch,
    a_signed_notification_with_a_nul_is_stored_escaped_in_its_callback_and_anomaly,
    a_receipt_the_database_refuses_is_counted_and_the_rest_of_its_batch_stored,
    a_junk_flood_from_many_peers_stays_within_the_budget_and_a_genuine_refusal_is_kept_whole,
    identical_junk_bodies_are_stored_once_as_a_prefix_and_a_hash,
    a_misrouted_notification_is_kept_with_its_route_and_refused_again_on_reapply,
    a_repeated_bulk_reapply_goes_on_to_the_receipts_not_reapplied_yet,
    a_flood_naming_a_configured_app_is_kept_whole_only_within_its_budget,
);

async fn a_body_reserialised_by_a_proxy_is_refused_and_kept_as_it_arrived(backend: Backend) {
    let app = app(backend).await;
    app.create_order("RC-1", 19900).await;
    let proxied = reserialised(&paid(&app, &sandbox('A'), "RC-1", 19900));
    let (status, _) = pay(&app, &proxied).await;
    assert_eq!(status, 401);
    assert_eq!(app.receipts_stored(1).await, 1);
    let receipt = &all_receipts(&app).await[0];
    assert_eq!(receipt.channel, "wechat");
    assert_eq!(
        (receipt.status, receipt.outcome.as_str()),
        (401, "bad_signature")
    );
    assert_eq!(
        paynotify::receipts::decode_body(&receipt.body_b64).as_deref(),
        Some(proxied.body.as_slice()),
        "the raw body, byte for byte"
    );
    assert_eq!(receipt.body_bytes as usize, proxied.body.len());
    let headers = &receipt.headers.0;
    assert_eq!(
        headers["wechatpay-serial"][0],
        proxied.header("Wechatpay-Serial").expect("serial")
    );
    assert_eq!(headers["content-type"][0], "application/json");
    assert!(receipt.request_id.is_some() && receipt.peer.is_some());
    // The writer counts a batch once its insert returned, which is just after the row can
    // be seen: wait (bounded) for the count too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&app, "paynotify_receipts_total", &["written"]) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&app, "paynotify_receipts_total", &["written"]), 1);
}

async fn accepted_notifications_leave_no_receipt_unless_store_is_all(backend: Backend) {
    let app = app(backend).await;
    crate::wechat::paid_order(&app, "RC-2", 100).await;
    // A refused one after it: once it is stored, the accepted one would have been too.
    let forged = badly_signed(&app, "RC-2");
    assert_eq!(pay(&app, &forged).await.0, 401);
    assert_eq!(app.receipts_stored(1).await, 1);
    assert_eq!(all_receipts(&app).await[0].outcome, "bad_signature");

    let all = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.store = ReceiptMode::All;
    })
    .await;
    crate::wechat::paid_order(&all, "RC-3", 100).await;
    assert_eq!(all.receipts_stored(1).await, 1);
    let receipt = &all_receipts(&all).await[0];
    assert_eq!(
        (
            receipt.status,
            receipt.outcome.as_str(),
            receipt.out_trade_no.as_deref()
        ),
        (204, "applied", Some("RC-3"))
    );

    let off = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.store = ReceiptMode::Off;
    })
    .await;
    assert_eq!(pay(&off, &forged).await.0, 401);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(off.db.count("notify_receipt").await, 0);
}

async fn receipts_never_contain_configured_secrets(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.store = ReceiptMode::All;
    })
    .await;
    app.create_order("RC-S", 100).await;
    let s = sandbox('A');
    let mut sent = vec![paid(&app, &s, "RC-S", 100)];
    sent.push(reserialised(&paid(&app, &s, "RC-S", 100)));
    let mut bearer = paid(&app, &s, "RC-S", 100);
    // A caller that sends the API token along: the Authorization header is not kept.
    bearer.set_header("Authorization", format!("Bearer {}", app.api_token));
    sent.push(bearer);
    for d in &sent {
        pay(&app, d).await;
    }
    assert_eq!(app.receipts_stored(3).await, 3);
    let secrets = [APIV3_A.to_owned(), app.api_token.clone()];
    for receipt in all_receipts(&app).await {
        let row = serde_json::to_string(&receipt).expect("row as JSON");
        let body = paynotify::receipts::decode_body(&receipt.body_b64).expect("body");
        let body = String::from_utf8_lossy(&body);
        for secret in &secrets {
            assert!(
                !row.contains(secret.as_str()),
                "receipt row holds a secret: {row}"
            );
            assert!(
                !body.contains(secret.as_str()),
                "receipt body holds a secret"
            );
        }
    }
}

async fn a_full_receipt_queue_drops_and_counts_while_notify_still_answers(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.queue = 2;
    })
    .await;
    // The writer's insert waits behind this lock, so nothing leaves the queue.
    let hold = Duration::from_secs(3);
    let lock = hold_receipt_writes(&app, backend, hold).await;
    let forged = badly_signed(&app, "RC-Q");
    assert_eq!(pay(&app, &forged).await.0, 401);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    for _ in 0..20 {
        let one = Instant::now();
        assert_eq!(pay(&app, &forged).await.0, 401);
        assert!(
            one.elapsed() < Duration::from_millis(500),
            "notify waited on receipts"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered while the lock was held"
    );
    assert!(
        metric(&app, "paynotify_receipts_total", &["dropped"]) >= 17,
        "dropped: {}",
        metric(&app, "paynotify_receipts_total", &["dropped"])
    );
    lock.await.expect("lock task");
    assert!(app.receipts_stored(3).await >= 1);
}

async fn post_admin(app: &TestApp, path: &str) -> (u16, Value) {
    admin(app, reqwest::Method::POST, path).await
}

async fn get_admin(app: &TestApp, path: &str) -> (u16, Value) {
    admin(app, reqwest::Method::GET, path).await
}

/// 32 bytes, but not the key WeChat encrypts with.
const WRONG_APIV3: &str = "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ1";

async fn a_wrong_apiv3_key_fixed_then_bulk_reapply_pays_each_order_once(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.wechat.merchants[0].apiv3_key = Secret::new(WRONG_APIV3);
    })
    .await;
    let orders: Vec<String> = (1..=5).map(|i| format!("RK-{i}")).collect();
    for order_no in &orders {
        app.create_order(order_no, 300).await;
        let (status, _) = pay(&app, &paid(&app, &sandbox('A'), order_no, 300)).await;
        assert_eq!(status, 500, "undecryptable: WeChat retries");
    }
    assert_eq!(app.receipts_stored(5).await, 5);

    // The key is fixed and the service restarted, hours later: past WeChat's 5-minute
    // window, which a re-apply does not apply (the receipt proves when it arrived).
    let app = app.rebuild(|s| s.wechat = settings()).await;
    app.clock.advance(3 * 3600);
    let bulk = "/admin/receipts/reapply?outcome=undecryptable&since=2026-11-30T00:00:00Z&limit=100";
    let (status, first) = post_admin(&app, bulk).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["count"], 5, "{first}");
    assert_eq!(
        first["outcomes"],
        serde_json::json!({ "applied": 5 }),
        "{first}"
    );
    for order_no in &orders {
        assert_eq!(app.status_of(order_no).await, "PAID");
    }
    assert_eq!(app.messages("ORDER_PAID").await, 5);

    // The bulk re-apply again: every receipt was re-applied, none is taken again.
    let (status, second) = post_admin(&app, bulk).await;
    assert_eq!(status, 200);
    assert_eq!(second["count"], 0, "{second}");
    // One re-applied again by its id is a duplicate.
    let id = all_receipts(&app).await[0].id;
    let (status, again) = post_admin(&app, &format!("/admin/receipts/{id}/reapply")).await;
    assert_eq!(
        (status, &again["outcome"]),
        (200, &Value::from("duplicate"))
    );
    assert_eq!(
        app.messages("ORDER_PAID").await,
        5,
        "each order paid exactly once"
    );
    assert_eq!(app.db.count("pay_callback").await, 5);
    assert_eq!(
        app.db
            .count("notify_receipt WHERE reapply_outcome = 'applied'")
            .await,
        4
    );
}

/// The bulk re-apply takes the oldest receipts no re-apply has touched yet: repeated with a
/// `limit`, it goes on to the next ones instead of taking the same oldest again.
async fn a_repeated_bulk_reapply_goes_on_to_the_receipts_not_reapplied_yet(backend: Backend) {
    let app = app(backend).await;
    let orders: Vec<String> = (1..=5).map(|i| format!("RN-{i}")).collect();
    for order_no in &orders {
        app.create_order(order_no, 300).await;
        let (status, _) = pay(&app, &badly_signed(&app, order_no)).await;
        assert_eq!(status, 401);
    }
    assert_eq!(app.receipts_stored(5).await, 5);
    let mut ids: Vec<i64> = all_receipts(&app).await.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    let bulk = "/admin/receipts/reapply?outcome=bad_signature&limit=2";
    let mut taken = Vec::new();
    for expected in [2, 2, 1, 0] {
        let (status, body) = post_admin(&app, bulk).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["count"], expected, "{body}");
        taken.extend(
            body["results"]
                .as_array()
                .expect("results")
                .iter()
                .map(|r| r["id"].as_i64().expect("id")),
        );
    }
    assert_eq!(taken, ids, "each once, oldest first");
    assert_eq!(
        app.db
            .count("notify_receipt WHERE reapplied_at IS NOT NULL")
            .await,
        5
    );
}

async fn the_admin_api_lists_shows_and_reapplies_one_receipt(backend: Backend) {
    let app = app(backend).await;
    app.create_order("RA-1", 100).await;
    let proxied = reserialised(&paid(&app, &sandbox('A'), "RA-1", 100));
    assert_eq!(pay(&app, &proxied).await.0, 401);
    app.receipts_stored(1).await;

    let (status, list) =
        get_admin(&app, "/admin/receipts?channel=wechat&outcome=bad_signature").await;
    assert_eq!(status, 200);
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    let id = list[0]["id"].as_i64().expect("id");
    let (status, none) = get_admin(&app, "/admin/receipts?outcome=applied").await;
    assert_eq!((status, none.as_array().map(Vec::len)), (200, Some(0)));
    let (status, _) = get_admin(&app, "/admin/receipts?since=yesterday").await;
    assert_eq!(status, 400);

    let (status, one) = get_admin(&app, &format!("/admin/receipts/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        one["body_text"].as_str().map(str::as_bytes),
        Some(proxied.body.as_slice())
    );
    assert_eq!(
        one["headers"]["wechatpay-nonce"][0],
        proxied.header("Wechatpay-Nonce").expect("nonce")
    );

    // The re-serialised body still does not verify: re-apply says so and changes nothing.
    let (status, again) = post_admin(&app, &format!("/admin/receipts/{id}/reapply")).await;
    assert_eq!(status, 200);
    assert_eq!(again["outcome"], "bad_signature", "{again}");
    assert_eq!(app.status_of("RA-1").await, "WAIT_PAY");
    let (status, _) = post_admin(&app, "/admin/receipts/999999/reapply").await;
    assert_eq!(status, 404);
    let unauthorised = app.get_without_token("/admin/receipts").await;
    assert_eq!(unauthorised.status(), 401);
}

/// Every provider of `settings`, as `paynotify explain` builds them.
fn providers(settings: &paynotify::config::Settings, app: &TestApp) -> Vec<Arc<dyn Provider>> {
    paynotify::providers::mount_all(settings, app.clock.now())
        .expect("keys load")
        .into_iter()
        .map(|m| m.provider)
        .collect()
}

/// `paynotify explain --receipt` on the last receipt, as a library call.
async fn explain_last(app: &TestApp, settings: &paynotify::config::Settings) -> Report {
    let receipt = all_receipts(app)
        .await
        .into_iter()
        .next()
        .expect("a receipt");
    let mut report = paynotify::receipts::explain::explain(
        &providers(settings, app),
        Request::from_receipt(&receipt).expect("request"),
    )
    .expect("explain");
    paynotify::receipts::explain::check_order(&mut report, &app.store)
        .await
        .expect("order checks");
    report
}

async fn explain_names_the_reserialised_body_as_the_failing_check(backend: Backend) {
    let app = app(backend).await;
    app.create_order("RE-1", 100).await;
    let original = paid(&app, &sandbox('A'), "RE-1", 100);
    assert_eq!(pay(&app, &reserialised(&original)).await.0, 401);
    app.receipts_stored(1).await;
    let mut config = crate::support::helpers::test_settings(app.db.url());
    config.wechat = settings();
    let report = explain_last(&app, &config).await;
    let text = report.to_string();
    let failed = report.first_failure().expect("a failed check");
    assert_eq!(failed.name, "signature", "{text}");
    assert!(
        failed.detail.contains(
            "the body is not the bytes WeChat signed: it was re-serialised (whitespace differs)"
        ),
        "{text}"
    );
    for line in [
        "header Wechatpay-Serial: present once",
        "timestamp skew: 0 s",
        "string to sign: ",
        "SHA-256 ",
        "decryption: decrypts",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    // The checks after the signature still run: the order is there, the amount matches.
    assert!(
        text.contains("amount: 100 CNY as the order") || !text.contains("decoded fields: event"),
        "{text}"
    );

    // The same request unchanged passes every check, order checks included.
    assert_eq!(
        pay(&app, &paid(&app, &sandbox('A'), "RE-2", 100)).await.0,
        404
    );
    app.receipts_stored(2).await;
    app.create_order("RE-2", 100).await;
    let report = explain_last(&app, &config).await;
    assert!(report.first_failure().is_none(), "{report}");
    assert!(
        report.to_string().contains("amount: 100 CNY as the order"),
        "{report}"
    );
}

async fn explain_names_an_alipay_body_reencoded_from_gbk_to_utf8(backend: Backend) {
    use crate::alipay::{pay_fields, set};
    let app = spawn_app_with(backend, |s| s.alipay = crate::alipay::settings()).await;
    app.create_order("RG-1", 100).await;
    let mut fields = pay_fields("RG-1", 100, "TRADE_SUCCESS");
    set(&mut fields, "charset", "gbk");
    set(&mut fields, "subject", "年货礼盒 A+B");
    let content = paynotify::qa::forge::alipay::sign_content(&fields, false);
    let (content, _, _) = encoding_rs::GBK.encode(&content);
    let sign = paynotify::qa::forge::rsa_sign(&crate::support::keys::rsa_key("alipay"), &content)
        .expect("sign");
    fields.push(("sign".into(), sign));
    fields.push(("sign_type".into(), "RSA2".into()));
    // A framework decoded the GBK body and encoded it again as UTF-8.
    let d = Delivery {
        headers: vec![(
            "Content-Type".into(),
            "application/x-www-form-urlencoded; charset=utf-8".into(),
        )],
        body: paynotify::qa::forge::alipay::encode_form(&fields),
    };
    let (status, body) = crate::alipay::send(&app, &d).await;
    assert_eq!((status, body.as_str()), (401, "fail"));
    app.receipts_stored(1).await;
    let mut config = crate::support::helpers::test_settings(app.db.url());
    config.alipay = crate::alipay::settings();
    let report = explain_last(&app, &config).await;
    let failed = report.first_failure().expect("a failed check");
    assert_eq!(failed.name, "signature", "{report}");
    assert!(
        failed.detail.contains("re-encoded from GBK to UTF-8"),
        "{report}"
    );
}

/// `paynotify explain` as an operator runs it: on a receipt in the service's database, and
/// on a raw HTTP request saved to a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_explain_command_names_the_failing_check_for_a_receipt_and_a_saved_request() {
    let app = app(Backend::Sqlite).await;
    app.create_order("RX-1", 100).await;
    let proxied = reserialised(&paid(&app, &sandbox('A'), "RX-1", 100));
    assert_eq!(pay(&app, &proxied).await.0, 401);
    app.receipts_stored(1).await;
    let id = all_receipts(&app).await[0].id;

    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("paynotify.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"{}\"\n\n[[wechat.merchants]]\nmchid = \"1900000001\"\n\
             appid = \"wx0000000000000001\"\napiv3_key = \"{APIV3_A}\"\n\n\
             [[wechat.merchants.platform_keys]]\nserial = \"PUB_KEY_ID_0000000000000000000000000000000A\"\n\
             public_key_file = \"{}\"\n",
            app.db.url(),
            crate::support::keys::public_key_path("wechat-a").display()
        ),
    )
    .expect("config");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_paynotify"))
            .arg("explain")
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .expect("paynotify explain runs")
    };
    let expected = "first failing check: signature: the body is not the bytes WeChat signed: \
                    it was re-serialised (whitespace differs)";

    // A run that succeeds and names the failing check; its output.
    let explains = |args: &[&str]| {
        let out = run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(expected), "{stdout}");
        stdout
    };

    let stdout = explains(&["--receipt", &id.to_string()]);
    assert!(stdout.contains("amount: 100 CNY as the order"), "{stdout}");

    let mut raw = b"POST /notify/wechat/pay HTTP/1.1\r\nHost: pay.example.com\r\n".to_vec();
    for (name, value) in &proxied.headers {
        raw.extend(format!("{name}: {value}\r\n").bytes());
    }
    raw.extend(b"\r\n");
    raw.extend(&proxied.body);
    let file = dir.path().join("request.http");
    std::fs::write(&file, &raw).expect("request file");
    let file = file.display().to_string();
    let stdout = explains(&["--file", &file, "--at", "2026-11-30T08:00:10Z"]);
    assert!(stdout.contains("timestamp skew: 10 s"), "{stdout}");

    let out = run(&["--receipt", "999999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no receipt 999999"));
}

async fn the_retention_job_purges_receipts_after_receipts_keep_days(backend: Backend) {
    let app = app(backend).await;
    let forged = badly_signed(&app, "RP-1");
    assert_eq!(pay(&app, &forged).await.0, 401);
    assert_eq!(app.receipts_stored(1).await, 1);

    app.clock.advance(3 * 86_400);
    paynotify::jobs::purge(&app.store, app.clock.as_ref(), 7, 7)
        .await
        .expect("purge");
    assert_eq!(
        app.db.count("notify_receipt").await,
        1,
        "inside receipts.keep_days"
    );
    paynotify::jobs::purge(&app.store, app.clock.as_ref(), 7, 2)
        .await
        .expect("purge");
    assert_eq!(
        app.db.count("notify_receipt").await,
        0,
        "older than receipts.keep_days"
    );
}

/// An Alipay payment form for `order_no` with a signature that does not verify.
fn alipay_badly_signed(order_no: &str) -> Delivery {
    let mut fields = crate::alipay::pay_fields(order_no, 100, "TRADE_SUCCESS");
    fields.push(("sign".into(), "AAAA".into()));
    fields.push(("sign_type".into(), "RSA2".into()));
    alipay_form(paynotify::qa::forge::alipay::encode_form(&fields))
}

fn alipay_form(body: Vec<u8>) -> Delivery {
    Delivery {
        headers: vec![(
            "Content-Type".into(),
            "application/x-www-form-urlencoded; charset=utf-8".into(),
        )],
        body,
    }
}

async fn a_nul_in_refused_requests_is_stored_escaped_and_sinks_no_batch(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.alipay = crate::alipay::settings()).await;
    // The writer's first insert waits behind this lock, so the requests after it reach the
    // database together, in one batch.
    let hold = Duration::from_secs(2);
    let lock = hold_receipt_writes(&app, backend, hold).await;
    let poisoned = |i: usize| {
        alipay_form(
            format!("app_id=%00&notify_type=trade_status_sync&out_trade_no=RN-{i}&sign=AAAA")
                .into_bytes(),
        )
    };
    for i in 0..200 {
        let d = if i % 20 == 0 {
            poisoned(i)
        } else {
            alipay_badly_signed(&format!("RN-{i}"))
        };
        assert_eq!(crate::alipay::send(&app, &d).await.0, 401);
    }
    lock.await.expect("lock task");
    assert_eq!(app.receipts_stored(200).await, 200, "every receipt stored");
    let receipts = all_receipts(&app).await;
    let unknown: Vec<&StoredReceipt> = receipts
        .iter()
        .filter(|r| {
            r.detail
                .as_deref()
                .is_some_and(|d| d.contains("unknown app_id"))
        })
        .collect();
    assert_eq!(unknown.len(), 10);
    for r in unknown {
        let detail = r.detail.as_deref().unwrap_or_default();
        let body = paynotify::receipts::decode_body(&r.body_b64).unwrap_or_default();
        // Naming no configured app, it is anonymous: what was kept of it follows the reason.
        let n = body.len();
        let expected = format!(
            "bad signature: unknown app_id \\x00; signature not verified: its first {n} of {n} \
             bytes kept, SHA-256 {}",
            paynotify::channel::sha256_hex(&body)
        );
        assert!(detail == expected && !detail.contains('\0'), "{detail:?}");
        assert!(
            body.starts_with(b"app_id=%00&") && body.len() == r.body_bytes as usize,
            "the body as it arrived"
        );
    }
    assert_eq!(metric(&app, "paynotify_receipts_total", &["refused"]), 0);
}

async fn a_signed_notification_with_a_nul_is_stored_escaped_in_its_callback_and_anomaly(
    backend: Backend,
) {
    use crate::alipay::{pay_fields, set, signed};
    let app = spawn_app_with(backend, |s| s.alipay = crate::alipay::settings()).await;
    app.create_order("RN-P", 100).await;
    // Signed by Alipay's key: the provider's word, NUL and all.
    let mut fields = pay_fields("RN-P", 100, "TRADE_SUCCESS");
    set(&mut fields, "trade_no", "2026\u{0}RN-P");
    assert_eq!(crate::alipay::send(&app, &signed(fields)).await.0, 200);
    assert_eq!(app.status_of("RN-P").await, "PAID");
    let trade = text_literal(backend, "2026\\x00RN-P");
    assert_eq!(
        app.db
            .count(&format!("pay_callback WHERE transaction_id = {trade}"))
            .await,
        1,
        "the callback row holds the NUL escaped"
    );
    // A first delivery over the wrong amount: an anomaly, its message naming the trade.
    app.create_order("RN-A", 100).await;
    let mut fields = pay_fields("RN-A", 200, "TRADE_SUCCESS");
    set(&mut fields, "trade_no", "2027\u{0}\u{7}RN-A");
    assert_eq!(crate::alipay::send(&app, &signed(fields)).await.0, 200);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 1);
    let key = text_literal(backend, "RN-A:alipay:2027\\x00\\x07RN-A");
    assert_eq!(
        app.db
            .count(&format!("local_message WHERE biz_key = {key}"))
            .await,
        1,
        "the anomaly holds the control bytes escaped"
    );
}

/// `text` as an SQL string literal (MySQL reads a backslash in one as an escape).
fn text_literal(backend: Backend, text: &str) -> String {
    match backend {
        Backend::Mysql => format!("'{}'", text.replace('\\', "\\\\")),
        _ => format!("'{text}'"),
    }
}

async fn a_receipt_the_database_refuses_is_counted_and_the_rest_of_its_batch_stored(
    backend: Backend,
) {
    use paynotify::receipts::Receipts;
    let app = app(backend).await;
    let metrics = Arc::new(paynotify::metrics::Metrics::new());
    let receipts = Receipts::start(
        &paynotify::config::ReceiptSettings::default(),
        app.store.clone(),
        Arc::clone(&metrics),
    );
    let arrival = |detail: &str| NewReceipt {
        channel: "wechat".into(),
        route: None,
        received_at: app.clock.now(),
        peer: None,
        request_id: None,
        headers: paynotify::store::types::Payload(serde_json::json!({})),
        body_b64: String::new(),
        body_bytes: 0,
        status: 401,
        outcome: "bad_signature".into(),
        detail: Some(detail.into()),
        out_trade_no: None,
    };
    // A row each backend refuses, written past the escaping: PostgreSQL takes no NUL in
    // text, MySQL (strict) no channel longer than its column. SQLite takes both.
    let mut bad = arrival("unknown app_id \0");
    bad.channel = "w".repeat(40);
    let hold = Duration::from_secs(1);
    let lock = hold_receipt_writes(&app, backend, hold).await;
    receipts.submit(arrival("first"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..48 {
        receipts.submit(arrival(&format!("good {i}")));
        if i == 20 {
            receipts.submit(bad.clone());
        }
    }
    lock.await.expect("lock task");
    let refusable = backend != Backend::Sqlite;
    let expected = if refusable { 49 } else { 50 };
    assert_eq!(app.receipts_stored(expected).await, expected);
    let deadline = Instant::now() + Duration::from_secs(10);
    let count = |label| Metrics::count(&metrics.receipts, &[label]);
    while count("written") < expected as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count("written"), expected as u64);
    assert_eq!(count("refused"), u64::from(refusable));
    assert_eq!(count("dropped"), 0);
}

/// A client whose requests come from `ip` (any 127.0.0.0/8 address is loopback on Linux).
fn client_from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .build()
        .expect("client")
}

/// `len` bytes no provider would send, different for each `seed`.
fn junk(seed: u32, len: usize) -> Vec<u8> {
    let mut body = format!("junk {seed} ").into_bytes();
    body.resize(len, b'x');
    body
}

/// What a receipt takes in the table, near enough: its text columns.
fn stored_bytes(r: &StoredReceipt) -> usize {
    r.body_b64.len() + r.headers.0.to_string().len() + r.detail.as_deref().map_or(0, str::len)
}

const BUDGET: usize = 16 * 1024;

async fn a_junk_flood_from_many_peers_stays_within_the_budget_and_a_genuine_refusal_is_kept_whole(
    backend: Backend,
) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.anonymous_bytes_per_minute = BUDGET;
        s.receipts.anonymous_per_peer_per_minute = 5;
    })
    .await;
    app.create_order("RF-1", 100).await;
    let max = paynotify::config::Settings::default().server.max_body_bytes;
    let url = app.url("/notify/wechat/pay");
    let flood: Vec<_> = (0..20u8)
        .map(|peer| {
            let client = client_from([127, 0, 0, 10 + peer]);
            let url = url.clone();
            tokio::spawn(async move {
                for i in 0..10u32 {
                    let status = client
                        .post(&url)
                        .header("Content-Type", "application/json")
                        .body(junk(u32::from(peer) * 100 + i, max))
                        .send()
                        .await
                        .expect("junk request")
                        .status();
                    assert_eq!(status.as_u16(), 400);
                }
            })
        })
        .collect();
    let genuine = reserialised(&paid(&app, &sandbox('A'), "RF-1", 100));
    let during = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        pay(&app, &genuine).await.0
    };
    assert_eq!(during.await, 401);
    for peer in flood {
        peer.await.expect("junk peer");
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    let genuine_kept = loop {
        let kept = all_receipts(&app)
            .await
            .into_iter()
            .find(|r| r.outcome == "bad_signature");
        if kept.is_some() || Instant::now() > deadline {
            break kept;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let genuine_kept = genuine_kept.expect("the genuine refusal is stored");
    assert_eq!(
        paynotify::receipts::decode_body(&genuine_kept.body_b64).as_deref(),
        Some(genuine.body.as_slice()),
        "stored whole"
    );
    // Let the writer finish whatever else was queued.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let junk_kept: Vec<StoredReceipt> = all_receipts(&app)
        .await
        .into_iter()
        .filter(|r| r.outcome != "bad_signature")
        .collect();
    let bytes: usize = junk_kept.iter().map(stored_bytes).sum();
    assert!(
        bytes <= BUDGET,
        "{} junk receipts took {bytes} bytes, over the budget of {BUDGET}",
        junk_kept.len()
    );
    let mut per_peer = std::collections::HashMap::new();
    for r in &junk_kept {
        let ip = r
            .peer
            .as_deref()
            .and_then(|p| p.rsplit_once(':'))
            .map(|(ip, _)| ip.to_owned());
        *per_peer.entry(ip).or_insert(0) += 1;
    }
    assert!(
        per_peer.values().all(|n| *n <= 5),
        "at most 5 a peer: {per_peer:?}"
    );
    assert_eq!(
        metric(&app, "paynotify_receipts_total", &["limited"]),
        200 - junk_kept.len() as u64
    );
}

async fn identical_junk_bodies_are_stored_once_as_a_prefix_and_a_hash(backend: Backend) {
    let app = app(backend).await;
    let body = junk(7, 10_000);
    for _ in 0..5 {
        let status = app
            .client
            .post(app.url("/notify/wechat/pay"))
            .body(body.clone())
            .send()
            .await
            .expect("junk request")
            .status();
        assert_eq!(status.as_u16(), 400);
    }
    // A refusal after them that is kept: once it is stored, the junk would have been.
    let forged = badly_signed(&app, "RJ-1");
    assert_eq!(pay(&app, &forged).await.0, 401);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_receipts(&app)
        .await
        .iter()
        .any(|r| r.outcome == "bad_signature")
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let junk_kept: Vec<StoredReceipt> = all_receipts(&app)
        .await
        .into_iter()
        .filter(|r| r.outcome != "bad_signature")
        .collect();
    assert_eq!(junk_kept.len(), 1, "identical bodies stored once");
    let r = &junk_kept[0];
    assert_eq!(
        paynotify::receipts::decode_body(&r.body_b64).as_deref(),
        Some(&body[..256]),
        "a short prefix"
    );
    assert_eq!(r.body_bytes, 10_000, "the length as it arrived");
    let detail = r.detail.as_deref().unwrap_or_default();
    assert!(
        detail.contains(&paynotify::channel::sha256_hex(&body)),
        "{detail}"
    );
    assert_eq!(metric(&app, "paynotify_receipts_total", &["limited"]), 4);
}

async fn a_misrouted_notification_is_kept_with_its_route_and_refused_again_on_reapply(
    backend: Backend,
) {
    let app = app(backend).await;
    app.create_order("RW-1", 100).await;
    let payment = paid(&app, &sandbox('A'), "RW-1", 100);
    let (status, _) =
        crate::support::helpers::post_delivery(&app, "/notify/wechat/refund", &payment).await;
    assert_eq!(status, 400);
    assert_eq!(app.receipts_stored(1).await, 1);
    let receipt = all_receipts(&app).await.remove(0);
    assert_eq!(
        (
            receipt.status,
            receipt.outcome.as_str(),
            receipt.route.as_deref()
        ),
        (400, "wrong_event_type", Some("/notify/wechat/refund"))
    );
    assert_eq!(
        paynotify::receipts::decode_body(&receipt.body_b64).as_deref(),
        Some(payment.body.as_slice()),
        "kept whole: it is signed"
    );
    let (status, shown) = get_admin(&app, &format!("/admin/receipts/{}", receipt.id)).await;
    assert_eq!(status, 200);
    assert_eq!(shown["route"], "/notify/wechat/refund", "{shown}");

    // Re-applied, it came to the same route: refused alike, nothing written.
    let (status, again) =
        post_admin(&app, &format!("/admin/receipts/{}/reapply", receipt.id)).await;
    assert_eq!(status, 200);
    assert_eq!(again["outcome"], "wrong_event_type", "{again}");
    assert_eq!(app.status_of("RW-1").await, "WAIT_PAY");
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);

    let mut config = crate::support::helpers::test_settings(app.db.url());
    config.wechat = settings();
    let report = explain_last(&app, &config).await;
    let failed = report.first_failure().expect("a failed check");
    assert_eq!(failed.name, "event type", "{report}");
    assert!(
        failed.detail.contains(
            "this request came to /notify/wechat/refund, which takes REFUND.*; the notify URL \
             registered for payments (the notify_url of the order request) must end in \
             /notify/wechat/pay"
        ),
        "{report}"
    );

    // A receipt stored before routes were kept names none: every event type is taken.
    let mut old = NewReceipt {
        channel: receipt.channel.clone(),
        route: None,
        received_at: receipt.received_at,
        peer: None,
        request_id: None,
        headers: receipt.headers.clone(),
        body_b64: receipt.body_b64.clone(),
        body_bytes: receipt.body_bytes,
        status: 404,
        outcome: "unknown_order".into(),
        detail: None,
        out_trade_no: Some("RW-1".into()),
    };
    app.store
        .insert_receipts(std::slice::from_ref(&old))
        .await
        .expect("insert");
    let stored = all_receipts(&app).await.remove(0);
    assert_eq!(stored.route, None);
    let (status, applied) =
        post_admin(&app, &format!("/admin/receipts/{}/reapply", stored.id)).await;
    assert_eq!(
        (status, &applied["outcome"]),
        (200, &Value::from("applied")),
        "{applied}"
    );
    assert_eq!(app.status_of("RW-1").await, "PAID");
    // And one that came to the payment route re-applies as what it is: a duplicate now.
    old.route = Some("/notify/wechat/pay".into());
    app.store
        .insert_receipts(std::slice::from_ref(&old))
        .await
        .expect("insert");
    let stored = all_receipts(&app).await.remove(0);
    let (status, duplicate) =
        post_admin(&app, &format!("/admin/receipts/{}/reapply", stored.id)).await;
    assert_eq!(
        (status, &duplicate["outcome"]),
        (200, &Value::from("duplicate")),
        "{duplicate}"
    );
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

const KEYED_BUDGET: usize = 200 * 1024;

/// Whether a receipt holds its whole body.
fn whole(r: &StoredReceipt) -> bool {
    paynotify::receipts::decode_body(&r.body_b64).map(|b| b.len())
        == usize::try_from(r.body_bytes).ok()
}

/// An Alipay form that names the configured app and carries a `sign` is what anyone can
/// post (the app_id is in every order string a buyer sees): unless it verifies, it is kept
/// whole only within `receipts.keyed_bytes_per_minute`, then as a prefix and a hash within
/// the anonymous limits. A refusal whose signature verified (an amount Alipay never sends)
/// is kept whole whatever came before, and so is a WeChat notification naming a serial not
/// known yet, within a budget no other flood counts against.
async fn a_flood_naming_a_configured_app_is_kept_whole_only_within_its_budget(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.alipay = crate::alipay::settings();
        s.receipts.keyed_bytes_per_minute = KEYED_BUDGET;
        s.receipts.anonymous_bytes_per_minute = BUDGET;
        s.receipts.anonymous_per_peer_per_minute = 5;
        s.receipts.unknown_key_bytes_per_minute = BUDGET;
    })
    .await;
    const FLOOD: u64 = 30;
    for i in 0..FLOOD {
        let mut fields = crate::alipay::pay_fields(&format!("RF-{i}"), 100, "TRADE_SUCCESS");
        fields.push(("pad".into(), "x".repeat(40_000)));
        fields.push(("sign".into(), "AAAA".into()));
        fields.push(("sign_type".into(), "RSA2".into()));
        let forged = alipay_form(paynotify::qa::forge::alipay::encode_form(&fields));
        assert_eq!(crate::alipay::send(&app, &forged).await.0, 401);
    }
    // Junk from the same peer: past its anonymous limit by now.
    for i in 0..5 {
        let status = app
            .client
            .post(app.url("/notify/wechat/pay"))
            .body(junk(i, 1000))
            .send()
            .await
            .expect("junk request")
            .status();
        assert_eq!(status.as_u16(), 400);
    }
    // After the flood, from the same peer: a genuine notification refused for its amount,
    // and a WeChat one naming a serial not known yet (a certificate rotated).
    let mut fields = crate::alipay::pay_fields("RF-SIGNED", 100, "TRADE_SUCCESS");
    crate::alipay::set(&mut fields, "total_amount", "1.001");
    let genuine = crate::alipay::signed(fields);
    assert_eq!(crate::alipay::send(&app, &genuine).await.0, 400);
    app.create_order("RF-W", 100).await;
    let mut rotated = paid(&app, &sandbox('A'), "RF-W", 100);
    rotated.set_header(
        "Wechatpay-Serial",
        "5157F09EFDC096DE15EBE81A47057A7200000000",
    );
    assert_eq!(pay(&app, &rotated).await.0, 401);

    let deadline = Instant::now() + Duration::from_secs(10);
    let find = |receipts: &[StoredReceipt], outcome: &str| {
        receipts.iter().find(|r| r.outcome == outcome).cloned()
    };
    let (signed, unknown) = loop {
        let receipts = all_receipts(&app).await;
        let (signed, unknown) = (
            find(&receipts, "bad_request"),
            find(&receipts, "unknown_serial"),
        );
        if (signed.is_some() && unknown.is_some()) || Instant::now() > deadline {
            break (signed, unknown);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let signed = signed.expect("the signed refusal is stored");
    assert_eq!(
        paynotify::receipts::decode_body(&signed.body_b64).as_deref(),
        Some(genuine.body.as_slice()),
        "signed: kept whole"
    );
    let unknown = unknown.expect("the unknown serial's receipt is stored");
    assert_eq!(
        paynotify::receipts::decode_body(&unknown.body_b64).as_deref(),
        Some(rotated.body.as_slice()),
        "an unknown serial: kept whole, re-applied after a refresh"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let flood: Vec<StoredReceipt> = all_receipts(&app)
        .await
        .into_iter()
        .filter(|r| r.outcome == "bad_signature")
        .collect();
    let (kept_whole, prefixed): (Vec<_>, Vec<_>) = flood.iter().partition(|r| whole(r));
    let whole_bytes: usize = kept_whole.iter().map(|r| stored_bytes(r)).sum();
    assert!(
        !kept_whole.is_empty() && whole_bytes <= KEYED_BUDGET,
        "{} kept whole, {whole_bytes} bytes, over the budget of {KEYED_BUDGET}",
        kept_whole.len()
    );
    for r in &prefixed {
        assert_eq!(
            paynotify::receipts::decode_body(&r.body_b64).map(|b| b.len()),
            Some(256),
            "a prefix"
        );
        let detail = r.detail.as_deref().unwrap_or_default();
        assert!(
            detail.contains("signature not verified: its first 256 of"),
            "{detail}"
        );
    }
    assert_eq!(prefixed.len(), 5, "the anonymous limit of one peer");
    let prefixed_bytes: usize = prefixed.iter().map(|r| stored_bytes(r)).sum();
    assert!(prefixed_bytes <= BUDGET, "{prefixed_bytes}");
    let junk_kept = all_receipts(&app)
        .await
        .iter()
        .filter(|r| r.channel == "wechat" && r.outcome == "bad_request")
        .count();
    assert_eq!(
        junk_kept, 0,
        "the peer's anonymous limit was taken by the flood"
    );
    assert_eq!(
        metric(&app, "paynotify_receipts_total", &["limited"]),
        FLOOD - flood.len() as u64 + 5
    );
}
