//! Platform certificates that renew themselves: downloaded with `GET /v3/certificates` from a
//! stand-in WeChat API that encrypts and signs exactly as WeChat does, stored in
//! `platform_certificate`, refreshed when a notification names a serial not known, and never
//! added when anything about them is wrong.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use paynotify::config::Settings;
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat::{self, Sandbox};
use paynotify::time::Clock;
use serde_json::Value;

use crate::support::helpers::{
    Backend, TestApp, admin, metric, post_delivery, released_together, spawn_app_with,
    spawn_app_with_jobs,
};
use crate::support::keys::{ec_certificate, platform_certificate, private_key_path, rsa_key};
use crate::support::provider::{FakeProvider, MERCHANT_KEY, MERCHANT_SERIAL, Served, Signing};
use crate::wechat::APIV3_A;

const MCHID: &str = "1900000001";
const APPID: &str = "wx0000000000000001";
/// The platform certificate WeChat signs with first, and the one it rotates to.
const FIRST: &str = "6F1D2C3B4A5968778695A4B3C2D1E0F001020304";
const SECOND: &str = "7A2E3D4C5B6A79889706B5C4D3E2F10011121314";

/// A platform certificate valid from 2026-11-01 for five years (the tests' clock is
/// 2026-11-30), and the sandbox that signs notifications with it.
fn platform(name: &str, serial: &str) -> (String, Sandbox) {
    let (pem, key) = platform_certificate(name, serial, (2026, 11, 1), (2031, 11, 1));
    let sandbox = Sandbox {
        serial: serial.into(),
        private_key: key,
        mchid: MCHID.into(),
        appid: APPID.into(),
        apiv3_key: APIV3_A.into(),
    };
    (pem, sandbox)
}

/// The stand-in WeChat API serving `FIRST` and signing with it.
async fn wechat_api() -> (FakeProvider, Sandbox) {
    let (pem, first) = platform("platform-first", FIRST);
    let fake = FakeProvider::start(
        (MCHID, APPID, FIRST, first.private_key.clone()),
        ("2021000000000001", "alipay"),
    )
    .await;
    fake.state
        .serve_certificates(vec![Served::new(FIRST, &pem, APIV3_A)]);
    (fake, first)
}

/// Merchant 1900000001 with API credentials at `url`; certificates downloaded (the default
/// with credentials); `configured` keeps its configured keys (a public key and a
/// certificate) beside them, else it has none.
fn configure(s: &mut Settings, url: &str, configured: bool) {
    s.wechat = crate::wechat::settings();
    s.wechat.merchants.truncate(1);
    let m = &mut s.wechat.merchants[0];
    if !configured {
        m.platform_keys.clear();
    }
    rsa_key(MERCHANT_KEY);
    m.private_key_file = Some(private_key_path(MERCHANT_KEY));
    m.merchant_serial = Some(MERCHANT_SERIAL.into());
    m.api_base = Some(url.to_owned());
    s.provider_api.timeout_ms = 5000;
    s.provider_api.max_qps = 1000;
}

async fn app(backend: Backend, fake: &FakeProvider, configured: bool) -> TestApp {
    let url = fake.url.clone();
    spawn_app_with(backend, move |s| configure(s, &url, configured)).await
}

async fn refresh(app: &TestApp) -> (u16, Value) {
    admin(app, reqwest::Method::POST, "/admin/certificates/refresh").await
}

/// The serials `GET /admin/certificates` lists, with their source.
async fn listed(app: &TestApp) -> Vec<(String, String)> {
    let (status, keys) = admin(app, reqwest::Method::GET, "/admin/certificates").await;
    assert_eq!(status, 200, "{keys}");
    keys.as_array()
        .expect("a list")
        .iter()
        .map(|k| {
            assert_eq!(k["channel"], "wechat", "{k}");
            assert_eq!(k["mchid"], MCHID, "{k}");
            (
                k["serial"].as_str().expect("serial").to_owned(),
                k["source"].as_str().expect("source").to_owned(),
            )
        })
        .collect()
}

fn paid(app: &TestApp, s: &Sandbox, order_no: &str, total: i64) -> Delivery {
    let plaintext = wechat::transaction(s, order_no, &format!("42{order_no}"), total);
    s.notification(
        "TRANSACTION.SUCCESS",
        &plaintext,
        app.clock.now().unix_seconds(),
    )
    .expect("forge")
}

async fn pay(app: &TestApp, d: &Delivery) -> (u16, String) {
    post_delivery(app, "/notify/wechat/pay", d).await
}

async fn status_of(app: &TestApp, order_no: &str) -> String {
    let order: Value = app
        .client
        .get(app.url(&format!("/orders/{order_no}")))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("GET /orders")
        .json()
        .await
        .expect("JSON");
    order["status"].as_str().unwrap_or_default().to_owned()
}

crate::on_every_backend!(
    certificates_downloaded_at_start_verify_notifications_and_survive_a_restart_without_the_provider,
    a_rotation_mid_traffic_is_one_refresh_shared_by_fifty_notifications,
    configured_keys_and_downloaded_certificates_verify_side_by_side,
    nothing_wrong_in_a_download_adds_a_key,
    a_notification_refused_for_an_unknown_serial_is_reapplied_after_the_refresh,
);

async fn certificates_downloaded_at_start_verify_notifications_and_survive_a_restart_without_the_provider(
    backend: Backend,
) {
    let (fake, first) = wechat_api().await;
    let url = fake.url.clone();
    let app = spawn_app_with_jobs(backend, move |s| configure(s, &url, false)).await;
    // The jobs download once at start.
    let started = Instant::now();
    while app.db.count("platform_certificate").await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not downloaded at start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        listed(&app).await,
        [(FIRST.to_owned(), "downloaded".to_owned())]
    );
    assert_eq!(
        metric(
            &app,
            "paynotify_certificate_refresh_total",
            &["wechat", "ok"]
        ),
        1
    );
    assert!(
        app.metrics
            .render()
            .contains(&format!("paynotify_certificate_expiry_timestamp_seconds{{channel=\"wechat\",mchid=\"{MCHID}\",serial=\"{FIRST}\"}}")),
        "the expiry gauge of the downloaded certificate"
    );
    app.create_order("CERT-START-1", 500).await;
    let (status, body) = pay(&app, &paid(&app, &first, "CERT-START-1", 500)).await;
    assert_eq!(status, 204, "{body}");

    // Restarted while WeChat cannot be reached: the stored certificate verifies.
    fake.state.down.store(true, Ordering::SeqCst);
    let calls = fake.state.certificate_calls.load(Ordering::SeqCst);
    let url = fake.url.clone();
    let mut app = app;
    app.shutdown(Duration::from_secs(2)).await;
    let app = app.rebuild(move |s| configure(s, &url, false)).await;
    app.create_order("CERT-START-2", 700).await;
    let (status, body) = pay(&app, &paid(&app, &first, "CERT-START-2", 700)).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(status_of(&app, "CERT-START-2").await, "PAID");
    assert_eq!(
        fake.state.certificate_calls.load(Ordering::SeqCst),
        calls,
        "no download was needed"
    );
}

async fn a_rotation_mid_traffic_is_one_refresh_shared_by_fifty_notifications(backend: Backend) {
    let (fake, first) = wechat_api().await;
    let app = Arc::new(app(backend, &fake, false).await);
    let (status, body) = refresh(&app).await;
    assert_eq!(status, 200, "{body}");
    for i in 0..50 {
        app.create_order(&format!("ROT-{i}"), 100 + i).await;
    }
    for i in 0..5 {
        let (status, body) = pay(&app, &paid(&app, &first, &format!("ROT-{i}"), 100 + i)).await;
        assert_eq!(status, 204, "{body}");
    }
    // WeChat rotates: the list carries both, and it signs with the new one from now on.
    let (second_pem, second) = platform("platform-second", SECOND);
    let (first_pem, _) = platform("platform-first", FIRST);
    fake.state.serve_certificates(vec![
        Served::new(FIRST, &first_pem, APIV3_A),
        Served::new(SECOND, &second_pem, APIV3_A),
    ]);
    fake.state.sign_as(SECOND, second.private_key.clone());
    let before = fake.state.certificate_calls.load(Ordering::SeqCst);
    let deliveries: Vec<Delivery> = (0..50)
        .map(|i| paid(&app, &second, &format!("ROT-{i}"), 100 + i))
        .collect();
    let deliveries = Arc::new(deliveries);
    let answers = released_together(50, |i| {
        let (app, deliveries) = (Arc::clone(&app), Arc::clone(&deliveries));
        async move { pay(&app, &deliveries[i]).await }
    })
    .await;
    for (status, body) in &answers {
        assert_eq!(*status, 204, "{body}");
    }
    assert_eq!(
        fake.state.certificate_calls.load(Ordering::SeqCst) - before,
        1,
        "one download for fifty notifications naming the new serial"
    );
    // Each order paid once: five by the first certificate, the rest by the second; the
    // five repeats are duplicates.
    assert_eq!(app.db.count("pay_callback").await, 50);
    assert_eq!(
        app.db
            .count("local_message WHERE topic = 'ORDER_PAID'")
            .await,
        50
    );
    assert_eq!(app.db.count("platform_certificate").await, 2);
    let serials: Vec<String> = listed(&app).await.into_iter().map(|(s, _)| s).collect();
    assert_eq!(serials, [FIRST, SECOND]);
}

async fn configured_keys_and_downloaded_certificates_verify_side_by_side(backend: Backend) {
    let (fake, first) = wechat_api().await;
    let app = app(backend, &fake, true).await;
    let (status, body) = refresh(&app).await;
    assert_eq!(status, 200, "{body}");
    let mut sources = listed(&app).await;
    sources.sort();
    assert!(
        sources.contains(&(FIRST.to_owned(), "downloaded".to_owned())),
        "{sources:?}"
    );
    assert_eq!(
        sources.iter().filter(|(_, s)| s == "configured").count(),
        2,
        "the configured public key and certificate: {sources:?}"
    );
    // A public key does not expire: its gauge is +Inf (written `inf`, which Prometheus reads
    // as +Inf), so an expiry alert never fires on a merchant that has one.
    let rendered = app.metrics.render();
    let series = format!(
        "paynotify_certificate_expiry_timestamp_seconds{{channel=\"wechat\",mchid=\"{MCHID}\",serial=\"PUB_KEY_ID_0000000000000000000000000000000A\"}} "
    );
    let value: f64 = rendered
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .unwrap_or_else(|| panic!("no gauge for the public key: {rendered}"))
        .parse()
        .expect("a number");
    assert!(value.is_infinite() && value > 0.0, "{value}");
    // A notification signed with the configured WeChat Pay public key (PUB_KEY_ID_…), one
    // with the configured certificate, one with the downloaded certificate.
    for (i, sandbox) in [
        crate::wechat::sandbox('A'),
        crate::wechat::sandbox('C'),
        first,
    ]
    .iter()
    .enumerate()
    {
        let order_no = format!("BOTH-{i}");
        app.create_order(&order_no, 300).await;
        let (status, body) = pay(&app, &paid(&app, sandbox, &order_no, 300)).await;
        assert_eq!(status, 204, "{} {body}", sandbox.serial);
        assert_eq!(status_of(&app, &order_no).await, "PAID");
    }
}

async fn nothing_wrong_in_a_download_adds_a_key(backend: Backend) {
    let (fake, first) = wechat_api().await;
    let app = app(backend, &fake, false).await;
    let (status, body) = refresh(&app).await;
    assert_eq!(status, 200, "{body}");
    let known = listed(&app).await;
    const THIRD: &str = "0C1D2E3F405162738495A6B7C8D9EAFB0C1D2E3F";
    let (third_pem, _) = platform("platform-third", THIRD);
    let (expired_pem, _) =
        platform_certificate("platform-expired", THIRD, (2025, 1, 1), (2026, 1, 1));
    let mut tampered = Served::new(THIRD, &third_pem, APIV3_A);
    tampered.tampered = true;
    // Each list is signed with the known certificate: only the entry is wrong.
    let bad_entries = [
        (
            "encrypted with another APIv3 key",
            Served::new(THIRD, &third_pem, "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ1"),
        ),
        ("tampered ciphertext", tampered),
        (
            "serial differs from serial_no",
            Served::new(
                "0C1D2E3F405162738495A6B7C8D9EAFB0C1D2E40",
                &third_pem,
                APIV3_A,
            ),
        ),
        ("expired", Served::new(THIRD, &expired_pem, APIV3_A)),
        (
            "not an RSA key",
            Served::new(THIRD, &ec_certificate(THIRD), APIV3_A),
        ),
    ];
    let mut refused = 0;
    for (what, entry) in bad_entries {
        fake.state.serve_certificates(vec![entry]);
        let (status, body) = refresh(&app).await;
        assert_eq!(status, 200, "{what}: the answer verified: {body}");
        refused += 1;
        assert_eq!(
            metric(
                &app,
                "paynotify_certificate_refresh_total",
                &["wechat", "refused_certificate"]
            ),
            refused,
            "{what}: counted"
        );
        assert_eq!(listed(&app).await, known, "{what}: no key added");
        assert_eq!(app.db.count("platform_certificate").await, 1, "{what}");
    }
    // Answers that do not verify: signed by a key neither known nor carried, by a forger
    // with the known serial, not signed at all.
    fake.state
        .serve_certificates(vec![Served::new(THIRD, &third_pem, APIV3_A)]);
    let (_, stranger) = platform(
        "platform-stranger",
        "0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D",
    );
    fake.state.sign_as(
        "0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D0D",
        stranger.private_key.clone(),
    );
    let (status, body) = refresh(&app).await;
    assert_eq!(status, 503, "signed by an unknown key: {body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("bad_signature")),
        "{body}"
    );
    fake.state.sign_as(FIRST, first.private_key.clone());
    for signing in [Signing::Forger, Signing::Unsigned] {
        fake.state.sign_with(signing);
        let (status, body) = refresh(&app).await;
        assert_eq!(status, 503, "{signing:?}: {body}");
    }
    fake.state.sign_with(Signing::Provider);
    assert_eq!(
        metric(
            &app,
            "paynotify_certificate_refresh_total",
            &["wechat", "bad_signature"]
        ),
        3
    );
    // A provider that is down.
    fake.state.down.store(true, Ordering::SeqCst);
    let (status, _) = refresh(&app).await;
    assert_eq!(status, 503, "unreachable");
    assert_eq!(
        metric(
            &app,
            "paynotify_certificate_refresh_total",
            &["wechat", "unreachable"]
        ),
        1
    );
    fake.state.down.store(false, Ordering::SeqCst);
    assert_eq!(listed(&app).await, known, "no key added by any of them");
    assert_eq!(app.db.count("platform_certificate").await, 1);

    // A provider that hangs: a notification naming a serial not known waits at most the
    // bounded wait, and is answered 503 so WeChat retries; the download goes on, and the
    // retry is applied.
    let (second_pem, second) = platform("platform-second", SECOND);
    fake.state
        .serve_certificates(vec![Served::new(SECOND, &second_pem, APIV3_A)]);
    fake.state.sign_as(SECOND, second.private_key.clone());
    fake.state.stall.store(true, Ordering::SeqCst);
    app.create_order("HANG-1", 900).await;
    let delivery = paid(&app, &second, "HANG-1", 900);
    let started = Instant::now();
    let (status, body) = pay(&app, &delivery).await;
    let waited = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(waited >= Duration::from_millis(1900), "waited {waited:?}");
    assert!(waited < Duration::from_millis(2900), "waited {waited:?}");
    assert_eq!(app.db.count("pay_callback").await, 0);
    fake.state.stall.store(false, Ordering::SeqCst);
    let started = Instant::now();
    while app.db.count("platform_certificate").await < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the download never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = pay(&app, &delivery).await;
    assert_eq!(status, 204, "the retry: {body}");
    // The first certificate keeps working throughout.
    app.create_order("KEEP-1", 400).await;
    let (status, body) = pay(&app, &paid(&app, &first, "KEEP-1", 400)).await;
    assert_eq!(status, 204, "{body}");
}

async fn a_notification_refused_for_an_unknown_serial_is_reapplied_after_the_refresh(
    backend: Backend,
) {
    let (fake, _first) = wechat_api().await;
    let app = app(backend, &fake, false).await;
    let (status, body) = refresh(&app).await;
    assert_eq!(status, 200, "{body}");
    // Notifications signed with a certificate the list does not carry yet: the refresh it
    // triggers finds nothing new, so 401 unknown_serial, and a receipt is kept.
    let (second_pem, second) = platform("platform-second", SECOND);
    app.create_order("LATE-1", 800).await;
    let (status, body) = pay(&app, &paid(&app, &second, "LATE-1", 800)).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("unknown serial"), "{body}");
    assert_eq!(
        metric(
            &app,
            "paynotify_notify_rejections_total",
            &["wechat", "unknown_serial"]
        ),
        1
    );
    assert_eq!(
        fake.state.certificate_calls.load(Ordering::SeqCst),
        2,
        "one refresh for it"
    );
    // A second one within on_unknown_serial_secs does not ask again.
    let (status, _) = pay(&app, &paid(&app, &second, "LATE-1", 800)).await;
    assert_eq!(status, 401);
    assert_eq!(fake.state.certificate_calls.load(Ordering::SeqCst), 2);
    app.receipts_stored(2).await;
    let (_, receipts) = admin(
        &app,
        reqwest::Method::GET,
        "/admin/receipts?outcome=unknown_serial",
    )
    .await;
    let receipts = receipts.as_array().expect("receipts").clone();
    assert_eq!(receipts.len(), 2, "{receipts:?}");

    // What explain says of it.
    let settings = {
        let mut s = paynotify::config::Settings::default();
        configure(&mut s, &fake.url, false);
        s
    };
    let mut providers = Vec::new();
    let mut sources = Vec::new();
    for mounted in paynotify::providers::mount_all(&settings, app.clock.now()).expect("keys") {
        providers.push(mounted.provider);
        sources.extend(mounted.keys);
    }
    paynotify::certificates::load_stored(&sources, &app.store, app.clock.now())
        .await
        .expect("stored certificates");
    let stored = app
        .store
        .receipt(receipts[0]["id"].as_i64().expect("id"))
        .await
        .expect("receipt")
        .expect("receipt");
    let report = paynotify::receipts::explain::explain(
        &providers,
        paynotify::receipts::explain::Request::from_receipt(&stored).expect("request"),
    )
    .expect("explain");
    let failure = report.first_failure().expect("a failing check").clone();
    assert_eq!(failure.name, "serial");
    assert!(
        failure.detail.contains(&format!(
            "serial {SECOND} is not among the known certificates of merchant {MCHID} (known: {FIRST}; last refresh at "
        )),
        "{}",
        failure.detail
    );

    // WeChat's list carries it now; an operator refreshes and re-applies.
    let (first_pem, _) = platform("platform-first", FIRST);
    fake.state.serve_certificates(vec![
        Served::new(FIRST, &first_pem, APIV3_A),
        Served::new(SECOND, &second_pem, APIV3_A),
    ]);
    let (status, body) = refresh(&app).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin(
        &app,
        reqwest::Method::POST,
        "/admin/receipts/reapply?outcome=unknown_serial",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcomes"]["applied"], 1, "{body}");
    assert_eq!(body["outcomes"]["duplicate"], 1, "{body}");
    assert_eq!(status_of(&app, "LATE-1").await, "PAID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_answer_signed_with_a_rotated_certificate_is_verified_after_one_refresh() {
    let (fake, _first) = wechat_api().await;
    let app = app(Backend::Sqlite, &fake, false).await;
    let (status, body) = refresh(&app).await;
    assert_eq!(status, 200, "{body}");
    let (second_pem, second) = platform("platform-second", SECOND);
    fake.state
        .serve_certificates(vec![Served::new(SECOND, &second_pem, APIV3_A)]);
    fake.state.sign_as(SECOND, second.private_key.clone());
    let body = serde_json::json!({"order_no": "Q-ROT-1", "amount_fen": 600, "currency": "CNY", "wechat_mchid": MCHID});
    let created = app
        .client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .json(&body)
        .send()
        .await
        .expect("POST /orders");
    assert_eq!(created.status(), 201);
    fake.state.set(
        "Q-ROT-1",
        crate::support::provider::Trade::Paid {
            transaction_id: "4200Q-ROT-1".into(),
            total: 600,
        },
    );
    let (status, said) = admin(
        &app,
        reqwest::Method::POST,
        "/admin/orders/Q-ROT-1/reconcile",
    )
    .await;
    assert_eq!(status, 200, "{said}");
    assert_eq!(said["providers"][0]["answer"], "paid", "{said}");
    assert_eq!(said["status"], "PAID", "{said}");
    assert_eq!(fake.state.certificate_calls.load(Ordering::SeqCst), 2);
}

#[test]
fn download_without_api_credentials_is_a_start_up_error_naming_the_key() {
    let mut s = paynotify::config::Settings {
        wechat: crate::wechat::settings(),
        ..Default::default()
    };
    s.wechat.merchants[0].certificates =
        Some(paynotify::channel::wechat::CertificateMode::Download);
    let error = s.validate().expect_err("refused").to_string();
    assert!(
        error.contains("wechat.merchants[0].certificates"),
        "{error}"
    );
    let mut s = paynotify::config::Settings::default();
    s.certificates.on_unknown_serial_secs = 0;
    let error = s.validate().expect_err("refused").to_string();
    assert!(
        error.contains("certificates.on_unknown_serial_secs"),
        "{error}"
    );
}
