//! Asking the providers: a lost notification recovered by query, expiry that closes at the
//! provider first, and answers that are not evidence (bad signature, forged, unreachable).
//! The providers are a fake on a local port (`provider.rs`) that checks every request's
//! signature and signs its answers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use paynotify::config::Settings;
use paynotify::metrics::Metrics;
use paynotify::time::Clock;

use crate::support::helpers::{Backend, TestApp, spawn_app_with};
use crate::support::keys::{private_key_path, rsa_key};
use crate::support::provider::{
    APP_KEY, FakeProvider, Lie, MERCHANT_KEY, MERCHANT_SERIAL, Signing, Trade,
};

pub(crate) const MCHID: &str = "1900000001";
pub(crate) const APP_ID: &str = "2021000000000001";
/// `[reconcile]` in these tests.
const AFTER_SECS: i64 = 300;
const EXPIRE_SECS: i64 = 1800;
const GRACE_SECS: i64 = 600;

/// Tests that run one check on one channel: `name => check("channel", more…)` is
/// `async fn name(backend)` running `check(backend, "channel", more…)`.
macro_rules! channel_tests {
    ($($name:ident => $check:ident($channel:literal $(, $more:expr)*)),* $(,)?) => {
        $(
            async fn $name(backend: Backend) {
                $check(backend, $channel $(, $more)*).await;
            }
        )*
    };
}

pub(crate) async fn fake() -> FakeProvider {
    let platform = crate::wechat::sandbox('A');
    FakeProvider::start(
        (
            &platform.mchid,
            &platform.appid,
            &platform.serial,
            platform.private_key,
        ),
        (APP_ID, "alipay"),
    )
    .await
}

/// WeChat merchant 1900000001 and Alipay app 2021000000000001 with API credentials at `url`.
pub(crate) fn configure(s: &mut Settings, url: &str) {
    s.wechat = crate::wechat::settings();
    let m = &mut s.wechat.merchants[0];
    rsa_key(MERCHANT_KEY);
    m.private_key_file = Some(private_key_path(MERCHANT_KEY));
    m.merchant_serial = Some(MERCHANT_SERIAL.into());
    m.api_base = Some(url.to_owned());
    s.alipay = crate::alipay::settings();
    let a = &mut s.alipay.apps[0];
    rsa_key(APP_KEY);
    a.app_private_key_file = Some(private_key_path(APP_KEY));
    a.gateway = Some(format!("{url}/gateway.do"));
    s.reconcile.after_secs = AFTER_SECS as u64;
    s.reconcile.close_grace_secs = GRACE_SECS as u64;
    s.provider_api.max_qps = 1000;
    s.provider_api.timeout_ms = 5000;
}

pub(crate) async fn app_with(backend: Backend, fake: &FakeProvider) -> TestApp {
    app_configured(backend, fake, |_| {}).await
}

/// [`app_with`], then `more` settings of the test's own.
async fn app_configured(
    backend: Backend,
    fake: &FakeProvider,
    more: impl FnOnce(&mut Settings),
) -> TestApp {
    let url = fake.url.clone();
    spawn_app_with(backend, move |s| {
        configure(s, &url);
        more(s);
    })
    .await
}

/// One reconcile run now: the payments it recovered.
async fn reconcile_now(app: &TestApp) -> usize {
    app.reconciler
        .reconcile_due(app.clock.now())
        .await
        .expect("reconcile")
}

/// Creates an order that only `channel`'s account is asked about.
pub(crate) async fn create(app: &TestApp, order_no: &str, fen: i64, channel: &str) {
    let named = match channel {
        "wechat" => serde_json::json!({ "wechat_mchid": MCHID }),
        _ => serde_json::json!({ "alipay_app_id": APP_ID }),
    };
    let mut body =
        serde_json::json!({ "order_no": order_no, "amount_fen": fen, "currency": "CNY" });
    if let (Some(body), serde_json::Value::Object(named)) = (body.as_object_mut(), named) {
        body.extend(named);
    }
    let response = app
        .client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .json(&body)
        .send()
        .await
        .expect("POST /orders");
    assert_eq!(response.status(), 201);
}

/// `order_no` paid at the fake `channel` provider, with `transaction_id(channel, order_no)`.
pub(crate) fn paid_at(fake: &FakeProvider, order_no: &str, fen: i64, channel: &str) {
    fake.state.set(
        order_no,
        Trade::Paid {
            transaction_id: transaction_id(channel, order_no),
            total: fen,
        },
    );
}

/// [`create`], and the order paid at the fake `channel` provider already.
async fn paid_at_provider(
    app: &TestApp,
    fake: &FakeProvider,
    order_no: &str,
    fen: i64,
    channel: &str,
) {
    create(app, order_no, fen, channel).await;
    paid_at(fake, order_no, fen, channel);
}

/// `POST path` with the API token.
pub(crate) async fn post(app: &TestApp, path: &str) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect(path)
}

/// Builds the service on a database of its own, its settings [`configure`]d for `url` and then
/// `change`d; what start-up said, if it stopped.
async fn start_up(url: &str, change: impl FnOnce(&mut Settings)) -> Result<(), String> {
    use paynotify::startup::{Application, Options};

    let db = crate::support::helpers::TestDb::create(Backend::Sqlite).await;
    let mut settings = crate::support::helpers::test_settings(db.url());
    configure(&mut settings, url);
    change(&mut settings);
    match settings.validate() {
        Err(e) => Err(e.to_string()),
        Ok(()) => Application::build(&settings, Options::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    }
}

fn calls(app: &TestApp, channel: &str, call: &str, result: &str) -> u64 {
    Metrics::count(&app.metrics.provider_calls, &[channel, call, result])
}

pub(crate) fn transaction_id(channel: &str, order_no: &str) -> String {
    match channel {
        "wechat" => format!("42{order_no}"),
        _ => format!("2026{order_no}"),
    }
}

/// The notification of the same payment, as the provider would send it late.
pub(crate) async fn notify_paid(app: &TestApp, channel: &str, order_no: &str, fen: i64) -> u16 {
    match channel {
        "wechat" => {
            let d = crate::wechat::paid(app, &crate::wechat::sandbox('A'), order_no, fen);
            crate::wechat::pay(app, &d).await.0
        }
        _ => {
            let fields = crate::alipay::pay_fields(order_no, fen, "TRADE_SUCCESS");
            crate::alipay::send(app, &crate::alipay::signed(fields))
                .await
                .0
        }
    }
}

async fn lost_notification_recovered(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RC-LOST-{channel}");
    paid_at_provider(&app, &fake, &no, 19900, channel).await;
    // Too young to ask about.
    app.clock.advance(AFTER_SECS - 1);
    assert_eq!(reconcile_now(&app).await, 0);
    assert!(fake.state.calls().is_empty());
    app.clock.advance(1);
    assert_eq!(reconcile_now(&app).await, 1);
    assert_eq!(app.status_of(&no).await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(calls(&app, channel, "query", "paid"), 1);
    assert_eq!(
        Metrics::count(&app.metrics.payments_recovered, &[channel]),
        1
    );
    // Only the account the order names was asked, with a request that verified.
    assert_eq!(fake.state.calls().len(), 1);
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);

    // The notification that comes after all is a plain duplicate: acknowledged, nothing new.
    let status = notify_paid(&app, channel, &no, 19900).await;
    assert_eq!(status, if channel == "wechat" { 204 } else { 200 });
    assert_eq!(
        Metrics::count(&app.metrics.notifications, &[channel, "duplicate"]),
        1
    );
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    // Paid: never asked about again.
    app.clock.advance(3600);
    assert_eq!(reconcile_now(&app).await, 0);
    assert_eq!(fake.state.calls().len(), 1);
}

async fn expiry_closes_at_the_provider_first(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let (unpaid, never_seen) = (format!("RC-OPEN-{channel}"), format!("RC-NONE-{channel}"));
    create(&app, &unpaid, 100, channel).await;
    create(&app, &never_seen, 100, channel).await;
    fake.state.set(&unpaid, Trade::NotPaid);
    // Queried shortly before expiry: the next query is due after it, the close is not held back.
    app.clock.advance(EXPIRE_SECS - 10);
    assert_eq!(reconcile_now(&app).await, 0);
    assert_eq!(calls(&app, channel, "query", "unpaid"), 1);
    assert_eq!(calls(&app, channel, "query", "not_found"), 1);
    app.clock.advance(11);
    // WeChat closes a trade it never saw (and says 204); Alipay creates page and QR trades
    // only when the buyer opens them, so "no such trade" there is no proof before the grace
    // period is over.
    let at_once = if channel == "wechat" { 2 } else { 1 };
    assert_eq!(app.expire_now().await, at_once);
    assert_eq!(fake.state.trade(&unpaid), Some(Trade::Closed));
    assert_eq!(app.status_of(&unpaid).await, "CLOSED");
    assert_eq!(
        Metrics::count(&app.metrics.expiry, &["closed_at_provider"]),
        at_once as u64
    );
    let closes = fake
        .state
        .calls()
        .iter()
        .filter(|(call, _)| call.ends_with("close"))
        .count();
    assert_eq!(closes, 2);
    if channel == "alipay" {
        assert_eq!(app.status_of(&never_seen).await, "WAIT_PAY");
        app.clock.advance(GRACE_SECS);
        assert_eq!(app.expire_now().await, 1);
        assert_eq!(
            Metrics::count(&app.metrics.expiry, &["closed_not_found"]),
            1
        );
    }
    assert_eq!(app.status_of(&never_seen).await, "CLOSED");
    assert_eq!(app.messages("ORDER_CLOSED").await, 2);
}

async fn expiry_of_a_trade_paid_at_the_provider_pays_the_order(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RC-LATE-{channel}");
    paid_at_provider(&app, &fake, &no, 500, channel).await;
    app.clock.advance(EXPIRE_SECS + 1);
    assert_eq!(app.expire_now().await, 0);
    assert_eq!(app.status_of(&no).await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.messages("ORDER_CLOSED").await, 0);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    assert_eq!(calls(&app, channel, "close", "not_closable"), 1);
    assert_eq!(Metrics::count(&app.metrics.expiry, &["paid"]), 1);
    // The late notification is a duplicate.
    notify_paid(&app, channel, &no, 500).await;
    assert_eq!(
        Metrics::count(&app.metrics.notifications, &[channel, "duplicate"]),
        1
    );
}

async fn provider_down_then_closed_after_the_grace_period(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RC-DOWN-{channel}");
    create(&app, &no, 100, channel).await;
    fake.state.set(&no, Trade::NotPaid);
    fake.state.down.store(true, Ordering::SeqCst);
    app.clock.advance(EXPIRE_SECS + 1);
    assert_eq!(app.expire_now().await, 0);
    assert_eq!(app.status_of(&no).await, "WAIT_PAY");
    assert_eq!(calls(&app, channel, "close", "unreachable"), 1);
    // Backing off: not asked again at once.
    assert_eq!(app.expire_now().await, 0);
    assert_eq!(calls(&app, channel, "close", "unreachable"), 1);
    app.clock.advance(60);
    app.expire_now().await;
    assert_eq!(calls(&app, channel, "close", "unreachable"), 2);
    assert_eq!(app.status_of(&no).await, "WAIT_PAY");
    assert_eq!(app.messages("ORDER_CLOSED").await, 0);
    // Past the grace period: closed here anyway.
    app.clock.advance(GRACE_SECS);
    assert_eq!(app.expire_now().await, 1);
    assert_eq!(app.status_of(&no).await, "CLOSED");
    assert_eq!(
        Metrics::count(&app.metrics.expiry, &["closed_after_grace"]),
        1
    );
}

channel_tests!(
    wechat_lost_notification_is_recovered_by_query => lost_notification_recovered("wechat"),
    alipay_lost_notification_is_recovered_by_query => lost_notification_recovered("alipay"),
    wechat_expiry_closes_at_the_provider_first => expiry_closes_at_the_provider_first("wechat"),
    alipay_expiry_closes_at_the_provider_first => expiry_closes_at_the_provider_first("alipay"),
    wechat_close_answered_already_paid_pays_the_order =>
        expiry_of_a_trade_paid_at_the_provider_pays_the_order("wechat"),
    alipay_close_answered_already_paid_pays_the_order =>
        expiry_of_a_trade_paid_at_the_provider_pays_the_order("alipay"),
    wechat_provider_down_keeps_the_order_open_until_the_grace_period =>
        provider_down_then_closed_after_the_grace_period("wechat"),
    alipay_provider_down_keeps_the_order_open_until_the_grace_period =>
        provider_down_then_closed_after_the_grace_period("alipay"),
);

crate::on_every_backend!(
    wechat_lost_notification_is_recovered_by_query,
    alipay_lost_notification_is_recovered_by_query,
    wechat_expiry_closes_at_the_provider_first,
    alipay_expiry_closes_at_the_provider_first,
    wechat_close_answered_already_paid_pays_the_order,
    alipay_close_answered_already_paid_pays_the_order,
    wechat_provider_down_keeps_the_order_open_until_the_grace_period,
    alipay_provider_down_keeps_the_order_open_until_the_grace_period,
    a_backlog_longer_than_the_answer_window_still_gets_verified_answers,
    a_reconcile_run_stops_at_its_bound_and_the_next_run_goes_on,
    an_expiry_run_stops_at_its_bound_and_the_next_run_goes_on,
    alipay_no_trade_at_expiry_keeps_the_order_payable_until_the_grace_period,
    wechat_a_close_answer_not_bound_to_the_order_closes_nothing,
    alipay_a_close_answer_not_bound_to_the_order_closes_nothing,
    wechat_unsigned_not_found_answers_close_nothing,
    wechat_a_closed_answer_about_another_merchant_closes_nothing,
    a_payment_recovered_through_one_app_is_the_same_as_another_apps_notification,
    an_alipay_payment_recorded_with_its_app_in_the_digest_still_has_duplicates,
    wechat_paid_then_refunded_at_the_provider_is_a_payment,
    alipay_paid_then_refunded_at_the_provider_is_a_payment,
);

/// A paid answer that does not verify (signed with another key, or not at all) is ignored
/// and counted; the order stays unpaid and the expiry does not close it on that word.
async fn unverified_answers_change_nothing(signing: Signing, result: &str) {
    for channel in ["wechat", "alipay"] {
        let fake = fake().await;
        let app = app_with(Backend::Sqlite, &fake).await;
        let no = format!("RC-FORGED-{channel}");
        paid_at_provider(&app, &fake, &no, 100, channel).await;
        fake.state.sign_with(signing);
        app.clock.advance(AFTER_SECS);
        assert_eq!(reconcile_now(&app).await, 0);
        assert_eq!(app.status_of(&no).await, "WAIT_PAY", "{channel}");
        assert_eq!(calls(&app, channel, "query", result), 1, "{channel}");
        assert_eq!(app.db.count("pay_callback").await, 0);
        assert_eq!(app.db.count("local_message").await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_a_bad_signature_is_ignored_and_counted() {
    unverified_answers_change_nothing(Signing::Forger, "bad_signature").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_paid_answer_without_the_providers_key_changes_nothing() {
    unverified_answers_change_nothing(Signing::Unsigned, "bad_signature").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_holds() {
    const QPS: u32 = 10;
    const ORDERS: usize = 12;
    let fake = fake().await;
    let url = fake.url.clone();
    let app = spawn_app_with(Backend::Sqlite, move |s| {
        configure(s, &url);
        s.provider_api.max_qps = QPS;
    })
    .await;
    for i in 0..ORDERS {
        create(&app, &format!("RC-QPS-{i:02}"), 100, "wechat").await;
    }
    app.clock.advance(AFTER_SECS);
    let started = Instant::now();
    reconcile_now(&app).await;
    let elapsed = started.elapsed();
    let arrivals = fake.state.arrivals.lock().expect("arrivals").clone();
    assert_eq!(arrivals.len(), ORDERS);
    // Twelve requests at ten a second: at least 1.1 s from the first to the last, and no
    // second-long window holds more than ten.
    assert!(elapsed >= Duration::from_millis(1050), "{elapsed:?}");
    for (i, first) in arrivals.iter().enumerate() {
        let within = arrivals[i..]
            .iter()
            .filter(|t| t.duration_since(*first) < Duration::from_millis(950))
            .count();
        assert!(within <= QPS as usize, "{within} requests within a second");
    }
    assert_eq!(fake.state.verified.load(Ordering::SeqCst), ORDERS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_through_the_api_asks_the_provider_first() {
    let fake = fake().await;
    let app = app_with(Backend::Sqlite, &fake).await;
    create(&app, "RC-API-OPEN", 100, "wechat").await;
    fake.state.set("RC-API-OPEN", Trade::NotPaid);
    let response = post(&app, "/orders/RC-API-OPEN/close").await;
    assert_eq!(response.status(), 200);
    assert_eq!(fake.state.trade("RC-API-OPEN"), Some(Trade::Closed));
    assert_eq!(app.status_of("RC-API-OPEN").await, "CLOSED");

    paid_at_provider(&app, &fake, "RC-API-PAID", 100, "wechat").await;
    let response = post(&app, "/orders/RC-API-PAID/close").await;
    assert_eq!(response.status(), 409);
    assert_eq!(app.status_of("RC-API-PAID").await, "PAID");

    create(&app, "RC-API-DOWN", 100, "wechat").await;
    fake.state.down.store(true, Ordering::SeqCst);
    let response = post(&app, "/orders/RC-API-DOWN/close").await;
    assert_eq!(response.status(), 503);
    assert_eq!(app.status_of("RC-API-DOWN").await, "WAIT_PAY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_asks_now_and_says_what_each_provider_answered() {
    let fake = fake().await;
    let app = app_with(Backend::Sqlite, &fake).await;
    // Names no account: every merchant and app with credentials is asked.
    app.create_order("RC-ADMIN", 300).await;
    paid_at(&fake, "RC-ADMIN", 300, "alipay");
    let response = post(&app, "/admin/orders/RC-ADMIN/reconcile").await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["status"], "PAID");
    let said = body["providers"].as_array().expect("providers");
    assert_eq!(said.len(), 2, "{body}");
    // The fake keeps one trade per number for both providers, so both say paid: the first
    // answer pays the order, the second is a second payment, raised as an anomaly.
    assert_eq!(said[0]["channel"], "wechat");
    assert_eq!(said[0]["account"], MCHID);
    assert_eq!(said[0]["answer"], "paid");
    assert_eq!(said[0]["ledger"], "applied");
    assert_eq!(said[1]["channel"], "alipay");
    assert_eq!(said[1]["account"], APP_ID);
    assert_eq!(said[1]["answer"], "paid");
    assert_eq!(said[1]["ledger"], "anomaly");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.anomalies("RC-ADMIN").await[0].0, "DUPLICATE_PAYMENT");

    let missing = post(&app, "/admin/orders/NOPE/reconcile").await;
    assert_eq!(missing.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_go_over_https_trusting_the_configured_ca() {
    use crate::support::provider::TlsFront;

    let fake = fake().await;
    let front = TlsFront::start(fake.port).await;
    let https = format!("https://127.0.0.1:{}", front.port);
    for (channel, no) in [("wechat", "RC-TLS-W"), ("alipay", "RC-TLS-A")] {
        paid_at(&fake, no, 100, channel);
    }

    // The system's roots do not know the test CA: no answer, nothing changes.
    let (url, ca) = (https.clone(), front.ca_file.clone());
    let untrusting = spawn_app_with(Backend::Sqlite, move |s| configure(s, &url)).await;
    create(&untrusting, "RC-TLS-W", 100, "wechat").await;
    untrusting.clock.advance(AFTER_SECS);
    reconcile_now(&untrusting).await;
    assert_eq!(untrusting.status_of("RC-TLS-W").await, "WAIT_PAY");
    assert_eq!(calls(&untrusting, "wechat", "query", "unreachable"), 1);
    assert!(fake.state.calls().is_empty(), "the handshake failed first");

    // With provider_api.ca_file: both providers over HTTPS.
    let url = https.clone();
    let app = spawn_app_with(Backend::Sqlite, move |s| {
        configure(s, &url);
        s.provider_api.ca_file = Some(ca);
    })
    .await;
    create(&app, "RC-TLS-W", 100, "wechat").await;
    create(&app, "RC-TLS-A", 100, "alipay").await;
    app.clock.advance(AFTER_SECS);
    assert_eq!(reconcile_now(&app).await, 2);
    assert_eq!(app.status_of("RC-TLS-W").await, "PAID");
    assert_eq!(app.status_of("RC-TLS-A").await, "PAID");
    assert_eq!(fake.state.verified.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_hangs_or_refuses_connections_is_unreachable() {
    let fake = fake().await;
    fake.state.stall.store(true, Ordering::SeqCst);
    let url = fake.url.clone();
    let app = spawn_app_with(Backend::Sqlite, move |s| {
        configure(s, &url);
        s.provider_api.timeout_ms = 300;
    })
    .await;
    paid_at_provider(&app, &fake, "RC-HANG", 100, "wechat").await;
    app.clock.advance(AFTER_SECS);
    let started = Instant::now();
    reconcile_now(&app).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(calls(&app, "wechat", "query", "unreachable"), 1);
    assert_eq!(app.status_of("RC-HANG").await, "WAIT_PAY");

    // Nothing listens on the port any more.
    let closed = crate::support::helpers::free_port();
    let url = format!("http://127.0.0.1:{closed}");
    let app = spawn_app_with(Backend::Sqlite, move |s| configure(s, &url)).await;
    create(&app, "RC-REFUSED", 100, "alipay").await;
    app.clock.advance(EXPIRE_SECS + 1);
    assert_eq!(app.expire_now().await, 0);
    assert_eq!(calls(&app, "alipay", "close", "unreachable"), 1);
    assert_eq!(app.status_of("RC-REFUSED").await, "WAIT_PAY");
}

/// Every mistake in the API credentials or `[reconcile]` stops start-up naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_credential_mistakes_stop_start_up_naming_the_key() {
    paynotify::telemetry::init_for_tests();
    let not_a_key = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        not_a_key.path(),
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .expect("write");
    let not_pem = not_a_key.path().to_path_buf();
    type Mistake = Box<dyn Fn(&mut Settings)>;
    let cases: Vec<(&str, Mistake)> = vec![
        (
            "wechat.merchants[0].merchant_serial",
            Box::new(|s| s.wechat.merchants[0].merchant_serial = None),
        ),
        (
            "wechat.merchants[0].private_key_file",
            Box::new(|s| s.wechat.merchants[0].private_key_file = None),
        ),
        (
            "wechat.merchants[0].private_key_file",
            Box::new({
                let p = not_pem.clone();
                move |s| s.wechat.merchants[0].private_key_file = Some(p.clone())
            }),
        ),
        (
            "wechat.merchants[0].api_base",
            Box::new(|s| s.wechat.merchants[0].api_base = Some("api.mch.weixin.qq.com".into())),
        ),
        (
            "alipay.apps[0].app_private_key_file",
            Box::new({
                let p = not_pem.clone();
                move |s| s.alipay.apps[0].app_private_key_file = Some(p.clone())
            }),
        ),
        (
            "alipay.apps[0].gateway",
            Box::new(|s| s.alipay.apps[0].gateway = Some("openapi.alipay.com".into())),
        ),
        (
            "alipay.apps[1].app_private_key_file",
            Box::new(|s| {
                s.alipay.apps[1].gateway = Some("https://openapi.alipay.com/gateway.do".into())
            }),
        ),
        (
            "provider_api.ca_file",
            Box::new({
                let p = not_pem.clone();
                move |s| s.provider_api.ca_file = Some(p.clone())
            }),
        ),
    ];
    for (key, mistake) in cases {
        let Err(err) = start_up("http://127.0.0.1:1", mistake).await else {
            panic!("{key}: start-up went on");
        };
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_queries_answer_with_what_the_refund_notification_would_carry() {
    use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
    use paynotify::channel::Inbound;
    use paynotify::channel::api::RefundAnswer;
    use paynotify::notice::ChannelId;

    use crate::support::provider::{RefundStatus, Refunded};

    paynotify::telemetry::init_for_tests();
    let fake = fake().await;
    let mut settings = Settings::default();
    configure(&mut settings, &fake.url);
    let now = paynotify::time::Timestamp::new(chrono::Utc::now());
    let mounted = paynotify::providers::mount_all(&settings, now).expect("providers");
    let api = |channel| {
        mounted
            .iter()
            .filter_map(|m| m.api.clone())
            .find(|a| a.channel() == channel)
            .expect("an API client")
    };
    let (wechat, alipay) = (api(ChannelId::Wechat), api(ChannelId::Alipay));
    for (no, transaction_id) in [("RC-RF-W", "42RC-RF-W"), ("RC-RF-A", "2026RC-RF-A")] {
        fake.state.refund(
            &format!("R-{no}"),
            Refunded {
                out_trade_no: no.into(),
                transaction_id: transaction_id.into(),
                refund_fen: 30,
                total: 100,
                status: RefundStatus::Success,
            },
        );
    }

    let RefundAnswer::Refunded(Some(queried)) = wechat
        .refund_query(MCHID, "RC-RF-W", "R-RC-RF-W", now)
        .await
    else {
        panic!("WeChat: a refunded answer with its notice");
    };
    // The REFUND.SUCCESS notification of the same refund has the same business content.
    let sandbox = crate::wechat::sandbox('A');
    let resource = paynotify::qa::forge::wechat::refund(
        &sandbox,
        "RC-RF-W",
        "42RC-RF-W",
        "R-RC-RF-W",
        30,
        100,
    );
    let d = sandbox
        .notification("REFUND.SUCCESS", &resource, now.unix_seconds())
        .expect("forge");
    let mut headers = HeaderMap::new();
    for (name, value) in &d.headers {
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    let provider = mounted
        .iter()
        .find(|m| m.provider.channel() == ChannelId::Wechat)
        .expect("wechat")
        .provider
        .clone();
    let notified = provider
        .admit(&Inbound {
            headers: &headers,
            body: &d.body,
            now,
            route: Some("/notify/wechat/refund"),
        })
        .expect("the notification verifies");
    assert_eq!(queried.digest(), notified.digest());
    assert_eq!(
        wechat.refund_query(MCHID, "RC-RF-W", "R-NONE", now).await,
        RefundAnswer::NotFound
    );

    // Alipay's answer carries this refund's amount, not the trade's running total its
    // notification is keyed on: done, without a notice.
    assert_eq!(
        alipay
            .refund_query(APP_ID, "RC-RF-A", "R-RC-RF-A", now)
            .await,
        RefundAnswer::Refunded(None)
    );
    assert_eq!(
        alipay.refund_query(APP_ID, "RC-RF-A", "R-NONE", now).await,
        RefundAnswer::NotFound
    );
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_may_name_only_a_configured_merchant_or_app() {
    let fake = fake().await;
    let app = app_with(Backend::Sqlite, &fake).await;
    for (body, field) in [
        (
            serde_json::json!({"wechat_mchid": "1999999999"}),
            "wechat_mchid",
        ),
        (
            serde_json::json!({"alipay_app_id": "2021999999999999"}),
            "alipay_app_id",
        ),
        (
            serde_json::json!({"wechat_mchid": "19000-00001"}),
            "wechat_mchid",
        ),
        (serde_json::json!({"alipay_app_id": ""}), "alipay_app_id"),
        // An Alipay app id is not a WeChat merchant.
        (serde_json::json!({"wechat_mchid": APP_ID}), "wechat_mchid"),
    ] {
        let mut order = serde_json::json!({"order_no": "RC-NAMED", "amount_fen": 100});
        if let (Some(order), serde_json::Value::Object(more)) = (order.as_object_mut(), body) {
            order.extend(more);
        }
        let response = app
            .client
            .post(app.url("/orders"))
            .bearer_auth(&app.api_token)
            .json(&order)
            .send()
            .await
            .expect("POST /orders");
        assert_eq!(response.status(), 400, "{order}");
        let error: serde_json::Value = response.json().await.expect("json");
        assert!(
            error["error"]
                .as_str()
                .is_some_and(|e| e.starts_with(field)),
            "{error}"
        );
    }
    assert_eq!(app.db.count("orders").await, 0);
    // A configured merchant without API credentials may be named: it is only not asked.
    let response = app
        .client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .json(&serde_json::json!({"order_no": "RC-NAMED", "amount_fen": 100, "wechat_mchid": "1900000002"}))
        .send()
        .await
        .expect("POST /orders");
    assert_eq!(response.status(), 201);
    app.clock.advance(AFTER_SECS);
    reconcile_now(&app).await;
    assert!(fake.state.calls().is_empty());
}

/// Orders `RC-{tag}-0..n`, all paid at the fake WeChat Pay, created and old enough to ask.
async fn paid_backlog(app: &TestApp, fake: &FakeProvider, tag: &str, n: usize) -> Vec<String> {
    let mut all = Vec::new();
    for i in 0..n {
        let no = format!("RC-{tag}-{i}");
        paid_at_provider(app, fake, &no, 100, "wechat").await;
        all.push(no);
    }
    all
}

async fn a_backlog_longer_than_the_answer_window_still_gets_verified_answers(backend: Backend) {
    let fake = fake().await;
    let app = app_configured(backend, &fake, |s| {
        s.reconcile.max_run_secs = 3600;
    })
    .await;
    let orders = paid_backlog(&app, &fake, "SLOW", 4).await;
    app.clock.advance(AFTER_SECS);
    // 160 s pass between two answers: the last one comes 480 s after the run began, well
    // outside WeChat's 300 s window around the run's start.
    fake.state.tick(app.clock.clone(), 160);
    assert_eq!(reconcile_now(&app).await, 4);
    assert_eq!(calls(&app, "wechat", "query", "bad_signature"), 0);
    for no in &orders {
        assert_eq!(app.status_of(no).await, "PAID", "{no}");
    }
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);
}

async fn a_reconcile_run_stops_at_its_bound_and_the_next_run_goes_on(backend: Backend) {
    let fake = fake().await;
    let app = app_configured(backend, &fake, |s| {
        s.reconcile.max_run_secs = 300;
    })
    .await;
    let orders = paid_backlog(&app, &fake, "BOUND", 4).await;
    app.clock.advance(AFTER_SECS);
    fake.state.tick(app.clock.clone(), 160);
    // Asked at +0 and +160 s; at +320 s the run is past its 300 s and stops.
    assert_eq!(reconcile_now(&app).await, 2);
    assert_eq!(fake.state.calls().len(), 2);
    assert_eq!(app.status_of(&orders[2]).await, "WAIT_PAY");
    assert_eq!(app.status_of(&orders[3]).await, "WAIT_PAY");
    assert_eq!(reconcile_now(&app).await, 2);
    for no in &orders {
        assert_eq!(app.status_of(no).await, "PAID", "{no}");
    }
    assert_eq!(calls(&app, "wechat", "query", "bad_signature"), 0);
}

async fn an_expiry_run_stops_at_its_bound_and_the_next_run_goes_on(backend: Backend) {
    let fake = fake().await;
    let app = app_configured(backend, &fake, |s| {
        s.reconcile.max_run_secs = 300;
    })
    .await;
    let mut orders = Vec::new();
    for i in 0..6 {
        let no = format!("RC-EXP-BOUND-{i}");
        create(&app, &no, 100, "wechat").await;
        fake.state.set(&no, Trade::NotPaid);
        orders.push(no);
    }
    app.clock.advance(EXPIRE_SECS + 1);
    fake.state.tick(app.clock.clone(), 110);
    let first = app.expire_now().await;
    assert!(0 < first && first < 6, "{first} closed in the first run");
    assert_eq!(calls(&app, "wechat", "close", "bad_signature"), 0);
    assert_eq!(calls(&app, "wechat", "query", "bad_signature"), 0);
    // The rest were not tried (no backoff): the next run closes them at once.
    let second = app.expire_now().await;
    let third = app.expire_now().await;
    assert_eq!(first + second + third, 6);
    for no in &orders {
        assert_eq!(app.status_of(no).await, "CLOSED", "{no}");
        assert_eq!(fake.state.trade(no), Some(Trade::Closed), "{no}");
    }
    assert_eq!(Metrics::count(&app.metrics.expiry, &["retried"]), 0);
}

/// Alipay creates a page, WAP or QR trade only when the buyer logs in or scans: at expiry
/// `ACQ.TRADE_NOT_EXIST` does not mean the buyer cannot pay any more.
async fn alipay_no_trade_at_expiry_keeps_the_order_payable_until_the_grace_period(
    backend: Backend,
) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let (late, never) = ("RC-NOTYET-PAID", "RC-NOTYET-NEVER");
    create(&app, late, 100, "alipay").await;
    create(&app, never, 100, "alipay").await;
    app.clock.advance(EXPIRE_SECS + 1);
    assert_eq!(app.expire_now().await, 0);
    assert_eq!(app.status_of(late).await, "WAIT_PAY");
    assert_eq!(app.status_of(never).await, "WAIT_PAY");
    assert_eq!(calls(&app, "alipay", "close", "not_found"), 2);
    assert_eq!(Metrics::count(&app.metrics.expiry, &["retried"]), 2);
    // The buyer opens the cashier page now and pays before Alipay's time_expire.
    paid_at(&fake, late, 100, "alipay");
    app.clock.advance(60);
    assert_eq!(app.expire_now().await, 0);
    assert_eq!(app.status_of(late).await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    assert_eq!(app.status_of(never).await, "WAIT_PAY");
    // Past expire_at + close_grace_secs no trade can be created any more: closed here.
    app.clock.advance(GRACE_SECS);
    assert_eq!(app.expire_now().await, 1);
    assert_eq!(app.status_of(never).await, "CLOSED");
    assert_eq!(
        Metrics::count(&app.metrics.expiry, &["closed_not_found"]),
        1
    );
    assert_eq!(
        Metrics::count(&app.metrics.expiry, &["closed_after_grace"]),
        0
    );
    assert_eq!(app.messages("ORDER_CLOSED").await, 1);
}

/// An answer a server in the middle can give (`lie`) never closes an order that is still
/// payable at the provider: at expiry and through `POST /orders/{no}/close`, the order stays
/// `WAIT_PAY` and the trade stays open there.
async fn a_lie_closes_nothing(backend: Backend, channel: &str, lie: Lie) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let (expiring, by_api) = (
        format!("RC-LIE-EXP-{channel}"),
        format!("RC-LIE-API-{channel}"),
    );
    create(&app, &expiring, 100, channel).await;
    create(&app, &by_api, 100, channel).await;
    fake.state.set(&expiring, Trade::NotPaid);
    fake.state.set(&by_api, Trade::NotPaid);
    fake.state.lie(lie);
    let response = post(&app, &format!("/orders/{by_api}/close")).await;
    assert_eq!(response.status(), 503, "{channel} {lie:?}");
    app.clock.advance(EXPIRE_SECS + 1);
    assert_eq!(app.expire_now().await, 0, "{channel} {lie:?}");
    for no in [&expiring, &by_api] {
        assert_eq!(app.status_of(no).await, "WAIT_PAY", "{no} {lie:?}");
        assert_eq!(fake.state.trade(no), Some(Trade::NotPaid), "{no} {lie:?}");
    }
    assert_eq!(app.messages("ORDER_CLOSED").await, 0);
    assert_eq!(
        Metrics::count(&app.metrics.expiry, &["closed_at_provider"]),
        0
    );
}

channel_tests!(
    wechat_a_close_answer_not_bound_to_the_order_closes_nothing =>
        a_lie_closes_nothing("wechat", Lie::CloseKeepsTrade),
    alipay_a_close_answer_not_bound_to_the_order_closes_nothing =>
        a_lie_closes_nothing("alipay", Lie::CloseKeepsTrade),
    wechat_unsigned_not_found_answers_close_nothing =>
        a_lie_closes_nothing("wechat", Lie::NotFoundUnsigned),
    wechat_a_closed_answer_about_another_merchant_closes_nothing =>
        a_lie_closes_nothing("wechat", Lie::OtherMerchant),
);

/// Plain `http://` lets anyone on the path answer for the provider: only a loopback stand-in
/// may use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_provider_url_off_loopback_stops_start_up_naming_the_key() {
    paynotify::telemetry::init_for_tests();
    type Change = Box<dyn Fn(&mut Settings)>;
    let build = async |change: Change| start_up("https://127.0.0.1:1", change).await;
    let refused: Vec<(&str, Change)> = vec![
        (
            "wechat.merchants[0].api_base",
            Box::new(|s| {
                s.wechat.merchants[0].api_base = Some("http://api.mch.weixin.qq.com".into())
            }),
        ),
        (
            "wechat.merchants[0].api_base",
            Box::new(|s| s.wechat.merchants[0].api_base = Some("http://10.0.0.7:8080".into())),
        ),
        (
            "alipay.apps[0].gateway",
            Box::new(|s| {
                s.alipay.apps[0].gateway = Some("http://openapi.alipay.com/gateway.do".into())
            }),
        ),
        (
            "alipay.apps[0].gateway",
            Box::new(|s| s.alipay.apps[0].gateway = Some("ftp://127.0.0.1/gateway.do".into())),
        ),
    ];
    for (key, change) in refused {
        let Err(err) = build(change).await else {
            panic!("{key}: start-up went on");
        };
        assert!(err.contains(key), "{key}: {err}");
        assert!(err.contains("https"), "{key}: {err}");
    }
    for local in ["http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1"] {
        let url = local.to_owned();
        let built = build(Box::new(move |s| configure(s, &url))).await;
        assert!(built.is_ok(), "{local}: {built:?}");
    }
}

/// A second app of the same seller (`2088000000000001`), with API credentials at the fake.
const APP_ID_B: &str = "2021000000000003";

/// Two apps under one seller: the query answer names neither (Alipay's `alipay.trade.query`
/// answer carries no `app_id` or `seller_id`), so the payment one app recovers must be the
/// same business content as the notification the other app's trade sends.
async fn a_payment_recovered_through_one_app_is_the_same_as_another_apps_notification(
    backend: Backend,
) {
    use paynotify::channel::alipay::AlipayApp;
    use paynotify::qa::forge::alipay::{Sandbox, payment};

    let fake = fake().await;
    fake.state.also_app(APP_ID_B);
    let url = fake.url.clone();
    let app = app_configured(backend, &fake, |s| {
        // Only the Alipay apps are asked.
        s.wechat.merchants[0].private_key_file = None;
        s.wechat.merchants[0].merchant_serial = None;
        s.alipay.apps.push(AlipayApp {
            app_id: APP_ID_B.into(),
            seller_id: "2088000000000001".into(),
            alipay_public_key_file: Some(crate::support::keys::public_key_path("alipay")),
            alipay_cert_file: None,
            app_cert_file: None,
            alipay_root_cert_file: None,
            app_private_key_file: Some(private_key_path(APP_KEY)),
            gateway: Some(format!("{url}/gateway.do")),
        });
    })
    .await;
    let no = "RC-TWO-APPS";
    app.create_order(no, 300).await;
    paid_at(&fake, no, 300, "alipay");
    let response = post(&app, &format!("/admin/orders/{no}/reconcile")).await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["status"], "PAID", "{body}");
    let said = body["providers"].as_array().expect("providers");
    assert_eq!(said.len(), 2, "{body}");
    assert_eq!(said[0]["account"], APP_ID);
    assert_eq!(said[0]["ledger"], "applied", "{body}");
    // The other app asks about the same trade: the same payment.
    assert_eq!(said[1]["account"], APP_ID_B);
    assert_eq!(said[1]["ledger"], "duplicate", "{body}");

    // The buyer paid through app B: its notification comes late, a plain duplicate.
    let sandbox = Sandbox {
        app_id: APP_ID_B.into(),
        seller_id: "2088000000000001".into(),
        private_key: rsa_key("alipay"),
    };
    let fields = payment(
        &sandbox,
        no,
        &transaction_id("alipay", no),
        300,
        "TRADE_SUCCESS",
    );
    let delivery = sandbox.notification(fields, false).expect("forge");
    assert_eq!(
        crate::alipay::send(&app, &delivery).await,
        (200, "success".to_owned())
    );
    assert_eq!(
        Metrics::count(&app.metrics.notifications, &["alipay", "duplicate"]),
        1
    );
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
}

/// Payments recorded before an Alipay payment's app left its content keep their digest: a
/// repeat of that notification (a retry, `TRADE_FINISHED` months later) is still a duplicate.
async fn an_alipay_payment_recorded_with_its_app_in_the_digest_still_has_duplicates(
    backend: Backend,
) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = "RC-EARLIER-DIGEST";
    app.create_order(no, 300).await;
    let txn = transaction_id("alipay", no);
    let delivery = crate::alipay::signed(crate::alipay::pay_fields(no, 300, "TRADE_SUCCESS"));
    assert_eq!(crate::alipay::send(&app, &delivery).await.0, 200);
    let earlier = serde_json::json!([
        "payment",
        "alipay",
        no,
        txn,
        300,
        "CNY",
        "2088000000000001",
        APP_ID
    ]);
    let earlier = paynotify::notice::Digest::of(earlier.to_string().as_bytes());
    app.db
        .execute(&format!(
            "UPDATE pay_callback SET digest = '{}' WHERE out_trade_no = '{no}'",
            earlier.as_str()
        ))
        .await;
    let finished = crate::alipay::signed(crate::alipay::pay_fields(no, 300, "TRADE_FINISHED"));
    assert_eq!(
        crate::alipay::send(&app, &finished).await,
        (200, "success".to_owned())
    );
    assert_eq!(
        Metrics::count(&app.metrics.notifications, &["alipay", "duplicate"]),
        1
    );
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
}

/// A trade paid and then fully refunded at the provider (its notifications lost) is a payment
/// that happened: WeChat says `REFUND`, Alipay `TRADE_CLOSED` with the payment in the answer
/// (`send_pay_date`, `buyer_pay_amount`). Expiry applies it instead of closing the order; an
/// Alipay trade closed unpaid still closes it.
async fn paid_then_refunded_at_the_provider_is_a_payment(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let (refunded, unpaid) = (
        format!("RC-REFUNDED-{channel}"),
        format!("RC-SHUT-{channel}"),
    );
    create(&app, &refunded, 500, channel).await;
    create(&app, &unpaid, 500, channel).await;
    fake.state.set(
        &refunded,
        Trade::Refunded {
            transaction_id: transaction_id(channel, &refunded),
            total: 500,
        },
    );
    fake.state.set(&unpaid, Trade::Closed);
    app.clock.advance(EXPIRE_SECS + 1);
    assert_eq!(app.expire_now().await, 1);
    assert_eq!(app.status_of(&refunded).await, "PAID");
    assert_eq!(app.status_of(&unpaid).await, "CLOSED");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.messages("ORDER_CLOSED").await, 1);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    assert_eq!(Metrics::count(&app.metrics.expiry, &["paid"]), 1);
    assert_eq!(calls(&app, channel, "query", "paid"), 1);
}

channel_tests!(
    wechat_paid_then_refunded_at_the_provider_is_a_payment =>
        paid_then_refunded_at_the_provider_is_a_payment("wechat"),
    alipay_paid_then_refunded_at_the_provider_is_a_payment =>
        paid_then_refunded_at_the_provider_is_a_payment("alipay"),
);

/// A paid answer whose payment is handed to a group that does not answer in time (it may
/// still commit): the admin endpoint says `undecided` instead of failing, and closing the
/// order waits for the payment rather than closing an order that is being paid. MySQL and
/// SQLite, where a lock wait outlasts the caller's deadline (see `commit.rs`).
async fn a_recovered_payment_not_decided_in_time_is_undecided_and_never_closed(backend: Backend) {
    let fake = fake().await;
    let app = app_configured(backend, &fake, |s| {
        s.database.acquire_timeout_ms = 100;
        s.database.statement_timeout_ms = 200;
    })
    .await;
    for no in ["RC-LATE-1", "RC-LATE-2"] {
        paid_at_provider(&app, &fake, no, 19900, "wechat").await;
    }
    let hold = std::time::Duration::from_millis(800);

    let lock = app.db.hold_write_lock("RC-LATE-1", hold).await;
    let response = post(&app, "/admin/orders/RC-LATE-1/reconcile").await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["providers"][0]["answer"], "paid", "{body}");
    assert_eq!(body["providers"][0]["ledger"], "undecided", "{body}");
    lock.await.expect("lock holder");
    let paid = crate::support::helpers::eventually(std::time::Duration::from_secs(5), || async {
        app.status_of("RC-LATE-1").await == "PAID"
    })
    .await;
    assert!(paid, "the group committed once the lock was gone");

    let lock = app.db.hold_write_lock("RC-LATE-2", hold).await;
    let closed = post(&app, "/orders/RC-LATE-2/close").await;
    assert_eq!(
        closed.status(),
        503,
        "not closed while its payment may be committing"
    );
    lock.await.expect("lock holder");
    let paid = crate::support::helpers::eventually(std::time::Duration::from_secs(5), || async {
        app.status_of("RC-LATE-2").await == "PAID"
    })
    .await;
    assert!(paid, "paid, never closed");
    assert_eq!(app.messages("ORDER_CLOSED").await, 0);
    assert_eq!(app.messages("ORDER_PAID").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_recovered_payment_not_decided_in_time_is_undecided_and_never_closed() {
    a_recovered_payment_not_decided_in_time_is_undecided_and_never_closed(Backend::Mysql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_recovered_payment_not_decided_in_time_is_undecided_and_never_closed() {
    a_recovered_payment_not_decided_in_time_is_undecided_and_never_closed(Backend::Sqlite).await
}
