//! Service-provider mode, outbound: an order of a WeChat sub-merchant is queried, closed and
//! refunded through the partner paths, signed by its service provider; an order of a merchant
//! that authorized an ISV's Alipay app is asked with its `app_auth_token`. The sub-merchants
//! and authorized apps are added through `/admin/merchants`; the providers are the fakes of
//! `support/provider.rs` and `support/partner.rs`.

use std::sync::atomic::Ordering;

use paynotify::config::{Secret, Settings};
use reqwest::Method;
use serde_json::{Value, json};

use crate::reconcile::{APP_ID, MCHID, configure, fake, paid_at, post};
use crate::support::helpers::{Backend, TestApp, admin_json, spawn_app_with};
use crate::support::keys::{private_key_path, public_key_path, rsa_key};
use crate::support::provider::{FakeProvider, MERCHANT_KEY, Trade};

crate::on_every_backend!(
    partner_a_sub_merchant_s_order_is_queried_closed_and_refunded_through_its_service_provider,
    partner_an_answer_naming_another_sub_merchant_is_not_applied,
    partner_an_authorized_app_s_order_is_asked_with_its_app_auth_token,
    partner_a_rotation_of_the_service_provider_s_key_reaches_its_sub_merchant,
);

/// `secrets.master_key`: base64 of 32 bytes.
const MASTER_KEY: &str = "cGF5bm90aWZ5LW1lcmNoYW50LXRlc3RzLWtleS0zMmI=";
/// A sub-merchant of the file's merchant [`MCHID`], and its app.
const SUB: &str = "1900000201";
const SUB_APPID: &str = "wx0000000000000201";
/// A merchant that authorized the file's Alipay app [`APP_ID`], its PID and its token.
const AUTH_APP: &str = "2021000000000201";
const AUTH_SELLER: &str = "2088000000000201";
const TOKEN: &str = "202611BBa1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6";

async fn app(backend: Backend, fake: &FakeProvider) -> TestApp {
    let url = fake.url.clone();
    spawn_app_with(backend, move |s: &mut Settings| {
        configure(s, &url);
        s.secrets.master_key = Secret::new(MASTER_KEY);
    })
    .await
}

/// Adds an account through `POST /admin/merchants`, which must take it.
async fn added(app: &TestApp, body: Value) {
    let (status, view) = admin_json(app, Method::POST, "/admin/merchants", &body).await;
    assert_eq!(status, 201, "{body}: {view}");
}

fn wechat_sub(sub: &str, sp: &str) -> Value {
    json!({"channel": "wechat", "account": sub, "mode": "partner_sub", "sp_account": sp,
           "appids": [SUB_APPID]})
}

/// Creates order `no` of `fen` naming `field` = `account`.
async fn create(app: &TestApp, no: &str, fen: i64, field: &str, account: &str) {
    let body = json!({"order_no": no, "amount_fen": fen, "currency": "CNY", field: account});
    let (status, answer) = admin_json(app, Method::POST, "/orders", &body).await;
    assert_eq!(status, 201, "{answer}");
}

/// `POST /admin/orders/{no}/reconcile`: the order's status and the one provider answer.
async fn reconcile(app: &TestApp, no: &str) -> (String, Value) {
    let response = post(app, &format!("/admin/orders/{no}/reconcile")).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    let said = body["providers"].as_array().expect("providers");
    assert_eq!(said.len(), 1, "only the named account is asked: {body}");
    (
        body["status"].as_str().unwrap_or("").to_owned(),
        said[0].clone(),
    )
}

async fn partner_a_sub_merchant_s_order_is_queried_closed_and_refunded_through_its_service_provider(
    backend: Backend,
) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    added(&app, wechat_sub(SUB, MCHID)).await;

    create(&app, "PC-W-PAID", 300, "wechat_mchid", SUB).await;
    paid_at(&fake, "PC-W-PAID", 300, "wechat");
    let (status, said) = reconcile(&app, "PC-W-PAID").await;
    assert_eq!(status, "PAID", "{said}");
    assert_eq!(said["account"], SUB);
    assert_eq!(said["answer"], "paid");
    assert_eq!(said["ledger"], "applied");
    let calls = fake.state.partner_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].call, "wechat.query");
    assert_eq!(calls[0].signer, MCHID, "the service provider signs");
    assert_eq!(calls[0].sp_mchid.as_deref(), Some(MCHID));
    assert_eq!(calls[0].sub, SUB);
    assert_eq!(
        calls[0].request,
        format!(
            "/v3/pay/partner/transactions/out-trade-no/PC-W-PAID?sp_mchid={MCHID}&sub_mchid={SUB}"
        )
    );

    let refund = json!({"out_refund_no": "PC-W-R1", "amount_fen": 100});
    let (status, answer) =
        admin_json(&app, Method::POST, "/orders/PC-W-PAID/refunds", &refund).await;
    assert!((200..300).contains(&status), "{status} {answer}");
    let calls = fake.state.partner_calls();
    let sent = calls
        .iter()
        .find(|c| c.call == "wechat.refund")
        .unwrap_or_else(|| panic!("no partner refund: {calls:?}"));
    assert_eq!(sent.signer, MCHID);
    assert_eq!(sent.sub, SUB);
    assert_eq!(sent.no, "PC-W-R1");
    assert!(
        sent.request.starts_with("/v3/refund/domestic/refunds {"),
        "{}",
        sent.request
    );
    assert!(
        sent.request.contains(&format!("\"sub_mchid\":\"{SUB}\"")),
        "{}",
        sent.request
    );

    create(&app, "PC-W-OPEN", 200, "wechat_mchid", SUB).await;
    fake.state.set("PC-W-OPEN", Trade::NotPaid);
    let response = post(&app, "/orders/PC-W-OPEN/close").await;
    assert_eq!(response.status(), 200);
    assert_eq!(fake.state.trade("PC-W-OPEN"), Some(Trade::Closed));
    assert_eq!(app.status_of("PC-W-OPEN").await, "CLOSED");
    let calls = fake.state.partner_calls();
    let close = calls
        .iter()
        .find(|c| c.call == "wechat.close")
        .unwrap_or_else(|| panic!("no partner close: {calls:?}"));
    assert_eq!(close.signer, MCHID);
    assert_eq!(close.sp_mchid.as_deref(), Some(MCHID));
    assert_eq!(close.sub, SUB);
    assert_eq!(
        close.request,
        format!(
            "/v3/pay/partner/transactions/out-trade-no/PC-W-OPEN/close {{\"sp_mchid\":\"{MCHID}\",\"sub_mchid\":\"{SUB}\"}}"
        )
    );
    // Nothing of the sub-merchant's went to the direct merchant's paths.
    let direct = fake.state.calls();
    assert!(
        direct
            .iter()
            .all(|(call, _)| call != "wechat.query" && call != "wechat.close"),
        "{direct:?}"
    );
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);
}

async fn partner_an_answer_naming_another_sub_merchant_is_not_applied(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    added(&app, wechat_sub(SUB, MCHID)).await;
    create(&app, "PC-W-OTHER", 300, "wechat_mchid", SUB).await;
    paid_at(&fake, "PC-W-OTHER", 300, "wechat");
    // A signed answer about another sub-merchant's trade of the same number.
    fake.state.owned_by("PC-W-OTHER", "1900000999");
    let (status, said) = reconcile(&app, "PC-W-OTHER").await;
    assert_eq!(said["answer"], "unexpected", "{said}");
    assert_eq!(status, "WAIT_PAY");
    assert_eq!(app.messages("ORDER_PAID").await, 0);
}

async fn partner_an_authorized_app_s_order_is_asked_with_its_app_auth_token(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    added(
        &app,
        json!({"channel": "alipay", "account": AUTH_APP, "mode": "partner_sub",
               "sp_account": APP_ID, "seller_id": AUTH_SELLER,
               "keys": {"app_auth_token": TOKEN}}),
    )
    .await;
    fake.state.grant(TOKEN, AUTH_APP);
    create(&app, "PC-A-PAID", 300, "alipay_app_id", AUTH_APP).await;
    paid_at(&fake, "PC-A-PAID", 300, "alipay");
    let (status, said) = reconcile(&app, "PC-A-PAID").await;
    assert_eq!(status, "PAID", "{said}");
    assert_eq!(said["account"], AUTH_APP);
    assert_eq!(said["ledger"], "applied");
    let calls = fake.state.partner_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].call, "alipay.trade.query");
    assert_eq!(calls[0].signer, APP_ID, "the ISV's app calls");
    assert_eq!(calls[0].sub, TOKEN);
    assert!(
        !calls[0].request.contains("biz_content={\"app_auth_token"),
        "a common parameter, not in biz_content: {}",
        calls[0].request
    );
    // The fake verifies every parameter but `sign`: the token was signed.
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);

    // A token Alipay does not know: its signed refusal is no answer about the trade.
    let other = "2021000000000202";
    added(
        &app,
        json!({"channel": "alipay", "account": other, "mode": "partner_sub",
               "sp_account": APP_ID, "keys": {"app_auth_token": "revoked-token"}}),
    )
    .await;
    create(&app, "PC-A-REVOKED", 300, "alipay_app_id", other).await;
    paid_at(&fake, "PC-A-REVOKED", 300, "alipay");
    let (status, said) = reconcile(&app, "PC-A-REVOKED").await;
    assert_eq!(said["answer"], "unexpected", "{said}");
    assert!(
        said["detail"]
            .as_str()
            .is_some_and(|d| d.contains("aop.invalid-app-auth-token")),
        "{said}"
    );
    assert_eq!(status, "WAIT_PAY");
    assert_eq!(
        fake.state.partner_calls().last().map(|c| c.sub.clone()),
        Some("revoked-token".to_owned())
    );
}

async fn partner_a_rotation_of_the_service_provider_s_key_reaches_its_sub_merchant(
    backend: Backend,
) {
    const SP: &str = "1900000301";
    const SP_SUB: &str = "1900000302";
    const OLD_SERIAL: &str = "5157F09EFDC096DE15EBE81A47057A7200000301";
    const NEW_SERIAL: &str = "5157F09EFDC096DE15EBE81A47057A7200000302";
    const PLATFORM: &str = "PUB_KEY_ID_0000000000000000000000000000301A";
    let fake = fake().await;
    let app = app(backend, &fake).await;
    // A service provider added through the API, its answers signed with its own platform key.
    let platform = rsa_key("partner-platform");
    rsa_key(MERCHANT_KEY);
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).expect("PEM");
    added(
        &app,
        json!({"channel": "wechat", "account": SP, "mode": "direct",
               "appids": ["wx0000000000000301"], "api_base": fake.url, "certificates": "static",
               "keys": {"apiv3_key": "PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPP1",
                        "platform_keys": [{"serial": PLATFORM,
                                           "public_key_pem": read(public_key_path("partner-platform"))}],
                        "private_key_pem": read(private_key_path(MERCHANT_KEY)),
                        "merchant_serial": OLD_SERIAL}}),
    )
    .await;
    fake.state.also_provider(SP, OLD_SERIAL);
    fake.state.sign_as(PLATFORM, platform);
    added(&app, wechat_sub(SP_SUB, SP)).await;
    create(&app, "PC-ROT", 300, "wechat_mchid", SP_SUB).await;
    fake.state.set("PC-ROT", Trade::NotPaid);
    let (_, said) = reconcile(&app, "PC-ROT").await;
    assert_eq!(said["answer"], "unpaid", "{said}");

    // The provider's merchant API certificate is replaced: WeChat takes only the new serial.
    fake.state.also_provider(SP, NEW_SERIAL);
    let rotate = json!({"keys": {"merchant_serial": NEW_SERIAL}});
    let (status, view) = admin_json(
        &app,
        Method::PATCH,
        &format!("/admin/merchants/wechat/{SP}"),
        &rotate,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    let (_, said) = reconcile(&app, "PC-ROT").await;
    assert_eq!(
        said["answer"], "unpaid",
        "the sub-merchant's calls carry the new serial: {said}"
    );
    let calls = fake.state.partner_calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls.iter().all(|c| c.signer == SP && c.sub == SP_SUB),
        "{calls:?}"
    );
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);
}
