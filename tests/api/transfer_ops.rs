//! What operators watch of transfers: the age of the oldest one not final (the "stuck"
//! alert's gauge), per channel and status, as the transfer job reads it; the anomaly
//! counter's series from 0, and a transfer notification's anomaly counted apart from the
//! payments'. For the gauge, transfers are recorded straight into the store and moved
//! through the ledger path, so nothing depends on what a provider answers (its API is a
//! closed port); the anomalies arrive signed at `/notify/wechat/transfer` from the stand-in.

use paynotify::config::Settings;
use paynotify::metrics::Metrics;
use paynotify::notice::{ChannelId, Outcome};
use paynotify::time::Clock;
use paynotify::transfer::{
    AlipayPayee, Payee, TransferCall, TransferSeen, TransferState, TransferStatus, WechatPayee,
};
use paynotify::transfers::store::{NewTransfer, Recorded};

use crate::reconcile::{configure, fake};
use crate::support::helpers::{Backend, TestApp, post_delivery, spawn_app_with};
use crate::support::wechat_transfer;
use crate::transfers::{APPID, MCHID, start, wechat_body};

crate::on_every_backend!(the_oldest_open_transfer_per_channel_and_status_is_measured);

/// The Alipay app `configure` sets up.
pub(crate) const APP_ID: &str = "2021000000000001";

/// A local port nothing listens on: every provider call fails to connect, at once.
pub(crate) fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// Both channels with API credentials at a closed port; transfers on.
pub(crate) async fn app_with(
    backend: Backend,
    more: impl FnOnce(&mut Settings) + Send + 'static,
) -> TestApp {
    let url = closed_port();
    spawn_app_with(backend, move |s: &mut Settings| {
        configure(s, &url);
        s.provider_api.timeout_ms = 1000;
        s.transfers.enabled = true;
        more(s);
    })
    .await
}

/// Records a transfer as `POST /transfers` does, without sending it; `openid` (or Alipay
/// identity) is shown wherever the transfer is.
pub(crate) async fn record(app: &TestApp, no: &str, channel: ChannelId, fen: i64, payee: &str) {
    let (account, call_payee, shown) = match channel {
        ChannelId::Wechat => (
            MCHID,
            Payee::Wechat(WechatPayee {
                appid: APPID.into(),
                openid: payee.into(),
                user_name: None,
                transfer_scene_id: "1000".into(),
                transfer_scene_report_infos: vec![],
                user_recv_perception: None,
                notify_url: None,
            }),
            serde_json::json!({ "openid": payee }),
        ),
        ChannelId::Alipay => (
            APP_ID,
            Payee::Alipay(AlipayPayee {
                identity: payee.into(),
                identity_type: "ALIPAY_USER_ID".into(),
                name: None,
                order_title: "返利".into(),
            }),
            serde_json::json!({ "identity": payee, "identity_type": "ALIPAY_USER_ID" }),
        ),
    };
    let call = TransferCall {
        out_bill_no: no.into(),
        amount_fen: fen,
        remark: "返利".into(),
        payee: call_payee,
    };
    let now = app.clock.now();
    let recorded = app
        .store
        .record_transfer(&NewTransfer {
            out_bill_no: no,
            channel: channel.as_str(),
            account,
            amount_fen: fen,
            remark: "返利",
            payee: &shown.to_string(),
            request: &serde_json::to_string(&call).expect("call"),
            request_digest: &format!("{no:0>64}"),
            daily_limit_fen: i64::MAX,
            now,
            retry_at: now.plus_seconds(60),
        })
        .await
        .expect("record");
    assert!(matches!(recorded, Recorded::Send(_)), "{recorded:?}");
}

/// What a provider says about `no`: its own `state`, for `fen`, from `account`.
pub(crate) fn seen(
    no: &str,
    state: TransferState,
    provider_state: &str,
    fen: i64,
    account: &str,
    bill_no: &str,
) -> TransferSeen {
    TransferSeen {
        out_bill_no: no.into(),
        provider_bill_no: Some(bill_no.into()),
        state,
        provider_state: Some(provider_state.into()),
        amount_fen: Some(fen),
        account: account.into(),
        package_info: None,
        fail_reason: (state == TransferState::Fail).then(|| "PAYEE_ACCOUNT_ABNORMAL".into()),
        occurred_at: None,
    }
}

/// Applies `seen` through the ledger path, as a verified notification is.
pub(crate) async fn apply(app: &TestApp, channel: ChannelId, seen: &TransferSeen) -> Outcome {
    app.store
        .apply_transfer(channel, seen, true, app.clock.now())
        .await
        .expect("apply")
}

fn oldest(app: &TestApp, channel: &str, status: TransferStatus) -> i64 {
    app.metrics
        .transfers_open_oldest_seconds
        .get_metric_with_label_values(&[channel, status.as_str()])
        .map(|g| g.get())
        .unwrap_or(-1)
}

async fn the_oldest_open_transfer_per_channel_and_status_is_measured(backend: Backend) {
    let app = app_with(backend, |_| {}).await;
    record(&app, "TSTUCK1", ChannelId::Wechat, 100, "o-user-1").await;
    record(&app, "TSTUCK2", ChannelId::Alipay, 100, "2088000000000001").await;
    app.clock.advance(2 * 86_400);
    record(&app, "TSTUCK3", ChannelId::Wechat, 100, "o-user-2").await;
    let confirm = seen(
        "TSTUCK3",
        TransferState::WaitUserConfirm,
        "WAIT_USER_CONFIRM",
        100,
        MCHID,
        "1330000000000000000000000000000001",
    );
    assert_eq!(
        apply(&app, ChannelId::Wechat, &confirm).await,
        Outcome::Applied
    );
    app.clock.advance(60);
    app.transfers.drive_due().await.expect("the job");
    use TransferStatus::{Processing, WaitUserConfirm};
    assert_eq!(oldest(&app, "wechat", Processing), 2 * 86_400 + 60);
    assert_eq!(oldest(&app, "wechat", WaitUserConfirm), 60);
    assert_eq!(oldest(&app, "alipay", Processing), 2 * 86_400 + 60);
    assert_eq!(oldest(&app, "alipay", WaitUserConfirm), 0, "none: 0");

    // Final ones are not waiting: the gauge falls to the next oldest, or 0.
    let done = seen(
        "TSTUCK1",
        TransferState::Success,
        "SUCCESS",
        100,
        MCHID,
        "1330000000000000000000000000000002",
    );
    assert_eq!(
        apply(&app, ChannelId::Wechat, &done).await,
        Outcome::Applied
    );
    let failed = seen(
        "TSTUCK2",
        TransferState::Fail,
        "FAIL",
        100,
        APP_ID,
        "20250101110070000006000000000001",
    );
    assert_eq!(
        apply(&app, ChannelId::Alipay, &failed).await,
        Outcome::Applied
    );
    app.transfers.drive_due().await.expect("the job");
    assert_eq!(oldest(&app, "wechat", Processing), 0);
    assert_eq!(oldest(&app, "wechat", WaitUserConfirm), 60);
    assert_eq!(oldest(&app, "alipay", Processing), 0);
    let scrape = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(
        scrape.contains(
            r#"paynotify_transfers_open_oldest_seconds{channel="wechat",status="WAIT_USER_CONFIRM"} 60"#
        ),
        "{scrape}"
    );
    // The anomaly series exist from the start, at 0: the first UNKNOWN_TRANSFER is an
    // increase the alert sees.
    for channel in ["wechat", "alipay"] {
        let zero = format!(
            r#"paynotify_transfer_anomalies_total{{channel="{channel}",reason="UNKNOWN_TRANSFER"}} 0"#
        );
        assert!(scrape.contains(&zero), "{zero}: {scrape}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_notifications_anomaly_is_counted_apart_from_the_payments() {
    let fake = fake().await;
    let app = crate::transfers::app_with(Backend::Sqlite, &fake, |_| {}).await;
    assert_eq!(start(&app, &wechat_body("TCOUNT1", 100)).await.0, 202);
    let s = crate::wechat::sandbox('A');
    let now = app.clock.now().unix_seconds();
    let notify = |d| {
        let app = &app;
        async move { post_delivery(app, "/notify/wechat/transfer", &d).await.0 }
    };
    // Another amount, twice (the repeat is a duplicate), then money never started here.
    let other_amount =
        wechat_transfer::finished(&s, "TCOUNT1", "1330TCOUNT1", "SUCCESS", 101, None, now);
    assert_eq!(notify(other_amount.clone()).await, 204);
    assert_eq!(notify(other_amount).await, 204);
    let nobody =
        wechat_transfer::finished(&s, "TNOBODY9", "1330TNOBODY9", "SUCCESS", 5000, None, now);
    assert_eq!(notify(nobody).await, 204);
    let transfers =
        |reason: &str| Metrics::count(&app.metrics.transfer_anomalies, &["wechat", reason]);
    assert_eq!(transfers("AMOUNT_MISMATCH"), 1);
    assert_eq!(transfers("UNKNOWN_TRANSFER"), 1);
    // Not money in: the payments' counter (and its alert) stays quiet.
    assert_eq!(
        Metrics::count(&app.metrics.anomalies, &["wechat", "AMOUNT_MISMATCH"]),
        0
    );
    assert_eq!(
        Metrics::count(&app.metrics.notifications, &["wechat", "anomaly"]),
        2
    );
}
