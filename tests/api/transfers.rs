//! Merchant transfers started through paynotify (`POST /transfers`): the contract's checks in
//! its order, the spending guard under concurrency, and nothing sent for a refused request.
//! The providers are the stand-ins (`support/provider.rs`).

use paynotify::config::Settings;
use paynotify::metrics::Metrics;
use paynotify::notice::{ChannelId, Outcome};
use paynotify::time::Clock;
use paynotify::transfer::{TransferSeen, TransferState};
use serde_json::{Value, json};

use crate::reconcile::{configure, fake};
use crate::support::helpers::{Backend, TestApp, spawn_app_with};
use crate::support::provider::FakeProvider;

crate::on_every_backend!(
    transfers_are_off_until_enabled,
    bad_bodies_are_refused_and_nothing_is_recorded,
    the_checks_run_in_the_contracts_order,
    the_caps_refuse_before_anything_is_sent,
    twenty_concurrent_transfers_send_exactly_the_ones_that_fit_the_day,
    failed_and_cancelled_transfers_free_the_day_and_midnight_resets_it,
);

pub(crate) const MCHID: &str = "1900000001";
pub(crate) const APPID: &str = "wx0000000000000001";

/// `[transfers]` caps in these tests.
pub(crate) const MAX_AMOUNT_FEN: i64 = 20_000;
pub(crate) const DAILY_LIMIT_FEN: i64 = 1_000;

pub(crate) async fn app_with(
    backend: Backend,
    fake: &FakeProvider,
    more: impl FnOnce(&mut Settings) + Send + 'static,
) -> TestApp {
    let url = fake.url.clone();
    spawn_app_with(backend, move |s: &mut Settings| {
        configure(s, &url);
        s.provider_api.timeout_ms = 1000;
        s.transfers.enabled = true;
        s.transfers.max_amount_fen = MAX_AMOUNT_FEN;
        s.transfers.daily_limit_fen = DAILY_LIMIT_FEN;
        more(s);
    })
    .await
}

/// A WeChat transfer of `fen` to one openid, as a caller asks for it.
pub(crate) fn wechat_body(no: &str, fen: i64) -> Value {
    json!({
        "out_bill_no": no,
        "channel": "wechat",
        "account": MCHID,
        "appid": APPID,
        "amount_fen": fen,
        "remark": "活动奖励",
        "payee": {"openid": "o-user-1"},
        "transfer_scene_id": "1000",
        "transfer_scene_report_infos": [
            {"info_type": "活动名称", "info_content": "新人礼"},
            {"info_type": "奖励说明", "info_content": "注册奖励"}
        ],
    })
}

pub(crate) async fn post(app: &TestApp, path: &str, body: &Value) -> (u16, Value) {
    let response = app
        .client
        .post(app.url(path))
        .bearer_auth(&app.api_token)
        .json(body)
        .send()
        .await
        .expect("POST");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn start(app: &TestApp, body: &Value) -> (u16, Value) {
    post(app, "/transfers", body).await
}

pub(crate) async fn get(app: &TestApp, no: &str) -> (u16, Value) {
    let response = app
        .client
        .get(app.url(&format!("/transfers/{no}")))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("GET transfer");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// How many transfers are recorded.
pub(crate) async fn recorded(app: &TestApp) -> usize {
    app.transfers.list(None, 1000).await.expect("list").len()
}

fn started(app: &TestApp, channel: &str) -> u64 {
    Metrics::count(&app.metrics.transfers_started, &[channel])
}

async fn transfers_are_off_until_enabled(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake, |s| s.transfers.enabled = false).await;
    // 403 first: before the body is even read.
    for body in [wechat_body("T1", 100), json!({"nonsense": true})] {
        let (status, answer) = start(&app, &body).await;
        assert_eq!(status, 403, "{answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap_or("")
                .contains("transfers.enabled"),
            "{answer}"
        );
    }
    let (status, _) = post(&app, "/transfers/T1/cancel", &json!({})).await;
    assert_eq!(status, 403);
    assert_eq!(recorded(&app).await, 0);
    assert_eq!(started(&app, "wechat"), 0);
    assert!(fake.state.calls().is_empty(), "{:?}", fake.state.calls());
}

async fn bad_bodies_are_refused_and_nothing_is_recorded(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake, |_| {}).await;
    let with = |change: fn(&mut Value)| {
        let mut body = wechat_body("TBAD1", 100);
        change(&mut body);
        body
    };
    let alipay = |payee: Value, fen: i64| {
        json!({"out_bill_no": "TBAD2", "channel": "alipay", "amount_fen": fen,
               "remark": "返利", "payee": payee})
    };
    let cases: Vec<(Value, &str)> = vec![
        (with(|b| b["out_bill_no"] = json!("T-1")), "out_bill_no"),
        (
            with(|b| b["out_bill_no"] = json!("T".repeat(33))),
            "out_bill_no",
        ),
        (with(|b| b["out_bill_no"] = json!("")), "out_bill_no"),
        (with(|b| b["amount_fen"] = json!(-1)), "amount_fen"),
        (with(|b| b["amount_fen"] = json!(0)), "amount_fen"),
        (with(|b| b["amount_fen"] = json!(10.5)), "amount_fen"),
        (with(|b| b["amount_fen"] = json!("100")), "amount_fen"),
        (with(|b| b["channel"] = json!("paypal")), "channel"),
        (with(|b| b["remark"] = json!("")), "remark"),
        (with(|b| b["remark"] = json!("奖".repeat(33))), "remark"),
        (
            with(|b| {
                b["amount_fen"] = json!(29);
                b["payee"] = json!({"openid": "o", "user_name": "张三"});
            }),
            "user_name",
        ),
        (
            with(|b| {
                b["amount_fen"] = json!(200_000);
            }),
            "user_name",
        ),
        (with(|b| b["payee"] = json!({})), "payee"),
        (
            with(|b| b["payee"] = json!({"identity": "x", "identity_type": "ALIPAY_USER_ID"})),
            "payee",
        ),
        (
            with(|b| {
                b.as_object_mut()
                    .map(|o| o.remove("transfer_scene_id"))
                    .map_or((), |_| ())
            }),
            "transfer_scene_id",
        ),
        (with(|b| b["order_title"] = json!("标题")), "order_title"),
        (with(|b| b["surprise"] = json!(1)), "surprise"),
        (
            alipay(
                json!({"identity": "a@example.com", "identity_type": "ALIPAY_LOGON_ID"}),
                100,
            ),
            "name",
        ),
        (
            alipay(
                json!({"identity": "2088", "identity_type": "ALIPAY_OPEN_ID"}),
                100,
            ),
            "identity_type",
        ),
        (alipay(json!({"openid": "o"}), 100), "payee"),
        (
            {
                let mut b = alipay(
                    json!({"identity": "2088", "identity_type": "ALIPAY_USER_ID"}),
                    100,
                );
                b["transfer_scene_id"] = json!("1000");
                b
            },
            "transfer_scene_id",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = start(&app, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let error = answer["error"].as_str().unwrap_or("");
        assert!(error.contains(field), "{body}: {error} should name {field}");
    }
    // Not JSON at all.
    let response = app
        .client
        .post(app.url("/transfers"))
        .bearer_auth(&app.api_token)
        .header("Content-Type", "application/json")
        .body("{\"out_bill_no\":")
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(recorded(&app).await, 0);
    assert!(fake.state.calls().is_empty(), "{:?}", fake.state.calls());
}

async fn the_checks_run_in_the_contracts_order(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake, |_| {}).await;
    let (status, first) = start(&app, &wechat_body("TORDER1", 100)).await;
    assert_eq!(status, 202, "{first}");
    // The same body again, its keys in another order: the same transfer, nothing sent.
    let calls = fake.state.calls().len();
    let mut reordered = serde_json::Map::new();
    let body = wechat_body("TORDER1", 100);
    let object = body.as_object().expect("object");
    for key in object.keys().rev() {
        reordered.insert(key.clone(), object[key].clone());
    }
    let (status, again) = start(&app, &Value::Object(reordered)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["out_bill_no"], "TORDER1");
    assert_eq!(fake.state.calls().len(), calls, "nothing sent for a repeat");
    // The number is looked up before the account: another body under it is 409, even naming
    // an account that does not exist.
    let mut other = wechat_body("TORDER1", 101);
    other["account"] = json!("1999999999");
    let (status, answer) = start(&app, &other).await;
    assert_eq!(status, 409, "{answer}");
    // The account before the caps: 404, not 422.
    let mut unknown = wechat_body("TORDER2", MAX_AMOUNT_FEN + 1);
    unknown["account"] = json!("1999999999");
    let (status, answer) = start(&app, &unknown).await;
    assert_eq!(status, 404, "{answer}");
    // The body before the number: a malformed body under a known number is 400.
    let mut malformed = wechat_body("TORDER1", 100);
    malformed["amount_fen"] = json!(-5);
    assert_eq!(start(&app, &malformed).await.0, 400);
    assert_eq!(recorded(&app).await, 1);
    // Names are never echoed.
    let (_, shown) = get(&app, "TORDER1").await;
    assert_eq!(shown["payee"], json!({"openid": "o-user-1"}));
    assert_eq!(get(&app, "TNOSUCH").await.0, 404);
}

async fn the_caps_refuse_before_anything_is_sent(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake, |_| {}).await;
    let (status, answer) = start(&app, &wechat_body("TCAP1", MAX_AMOUNT_FEN + 1)).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["code"], "OVER_MAX_AMOUNT");
    // A configured merchant without API credentials cannot transfer.
    let mut no_credentials = wechat_body("TCAP2", 100);
    no_credentials["account"] = json!("1900000002");
    no_credentials["appid"] = json!("wx0000000000000002");
    let (status, answer) = start(&app, &no_credentials).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["code"], "ACCOUNT_CANNOT_TRANSFER");
    // Over the day's limit at once.
    let (status, answer) = start(&app, &wechat_body("TCAP3", DAILY_LIMIT_FEN + 1)).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["code"], "OVER_DAILY_LIMIT");
    assert_eq!(recorded(&app).await, 0);
    assert!(fake.state.calls().is_empty(), "{:?}", fake.state.calls());
}

async fn twenty_concurrent_transfers_send_exactly_the_ones_that_fit_the_day(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake, |_| {}).await;
    // 20 of 100 fen against a limit of 1,000: ten fit.
    let (client, url, token) = (
        app.client.clone(),
        app.url("/transfers"),
        app.api_token.clone(),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (client, url, token) = (client.clone(), url.clone(), token.clone());
        tasks.spawn(async move {
            let response = client
                .post(url)
                .bearer_auth(token)
                .json(&wechat_body(&format!("TDAY{i:02}"), 100))
                .send()
                .await
                .expect("POST");
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        });
    }
    let answers: Vec<(u16, Value)> = tasks.join_all().await;
    let sent = answers.iter().filter(|(s, _)| *s == 202).count();
    let over = answers
        .iter()
        .filter(|(s, a)| *s == 422 && a["code"] == "OVER_DAILY_LIMIT")
        .count();
    assert_eq!((sent, over), (10, 10), "{answers:?}");
    assert_eq!(recorded(&app).await, 10);
    assert_eq!(started(&app, "wechat"), 10);
}

async fn failed_and_cancelled_transfers_free_the_day_and_midnight_resets_it(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake, |_| {}).await;
    let (status, answer) = start(&app, &wechat_body("TFREE1", DAILY_LIMIT_FEN)).await;
    assert_eq!(status, 202, "{answer}");
    let (status, answer) = start(&app, &wechat_body("TFREE2", 1)).await;
    assert_eq!((status, &answer["code"]), (422, &json!("OVER_DAILY_LIMIT")));
    // The first one failed at the provider (as its answer or notification would say): its
    // money never left, so the day has room again.
    let failed = TransferSeen {
        out_bill_no: "TFREE1".into(),
        provider_bill_no: Some("1330000071100999991182020050700019480001".into()),
        state: TransferState::Fail,
        provider_state: Some("FAIL".into()),
        amount_fen: Some(DAILY_LIMIT_FEN),
        account: MCHID.into(),
        package_info: None,
        fail_reason: Some("PAYEE_ACCOUNT_ABNORMAL".into()),
        occurred_at: None,
    };
    let outcome = app
        .store
        .apply_transfer(ChannelId::Wechat, &failed, true, app.clock.now())
        .await
        .expect("apply");
    assert_eq!(outcome, Outcome::Applied);
    let (status, answer) = start(&app, &wechat_body("TFREE3", DAILY_LIMIT_FEN)).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(start(&app, &wechat_body("TFREE4", 1)).await.0, 422);
    // Beijing midnight: a new day.
    let now = app.clock.now().as_datetime();
    let beijing = chrono::FixedOffset::east_opt(8 * 3600).expect("offset");
    let tomorrow = (now.with_timezone(&beijing).date_naive() + chrono::Days::new(1))
        .and_hms_opt(0, 0, 1)
        .and_then(|t| t.and_local_timezone(beijing).single())
        .expect("tomorrow");
    app.clock.set(tomorrow.to_utc());
    let (status, answer) = start(&app, &wechat_body("TFREE5", DAILY_LIMIT_FEN)).await;
    assert_eq!(status, 202, "{answer}");
}
