//! Provider accounts added, rotated and disabled through `/admin/merchants` (direct mode),
//! seen from outside: the answers of the admin API, the notifications the accounts verify
//! without a restart, a second instance on the same database, and no key in any answer.

use paynotify::config::{Secret, Settings};
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::{alipay, wechat};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::helpers::{Backend, TestApp, eventually, post_delivery, spawn_app_with};
use crate::support::keys::{platform_certificate, private_key_path, public_key_path, rsa_key};

crate::on_every_backend!(
    writes_without_a_master_key_are_503_and_the_file_accounts_are_still_listed,
    every_merchants_route_wants_the_bearer_token,
    a_wechat_merchant_added_through_the_api_verifies_its_next_notification,
    one_account_and_the_list_sorted_filtered_and_paged,
    bad_bodies_are_400_naming_the_field_and_store_nothing,
    an_account_that_exists_in_the_file_or_the_database_is_409,
    platform_keys_rotate_with_an_overlap_and_each_patch_bumps_keys_version,
    a_patch_may_not_move_an_account_and_is_404_unknown_and_409_for_the_file,
    delete_disables_and_a_disabled_merchant_is_answered_like_an_unknown_one,
    an_alipay_app_added_through_the_api_verifies_its_notifications_until_disabled,
    a_second_instance_follows_an_add_a_rotation_and_a_disable_at_its_reload,
    a_second_instance_with_jobs_verifies_an_added_merchant_within_reload_secs,
    no_admin_answer_and_no_metric_holds_a_key,
    an_app_auth_token_is_never_shown,
    the_accounts_gauge_follows_an_add_and_a_disable,
    an_instance_whose_key_does_not_open_a_change_keeps_failing_its_reloads,
    a_refund_of_an_order_of_a_disabled_account_is_409,
);

/// `secrets.master_key`: base64 of 32 bytes, the same for every instance of a test.
const MASTER_KEY: &str = "cGF5bm90aWZ5LW1lcmNoYW50LXRlc3RzLWtleS0zMmI=";

/// The WeChat merchant the tests add, and what it is given.
const ACCOUNT: &str = "1900000101";
const APPID: &str = "wx0000000000000101";
const APIV3: &str = "MMMMMMMMMMMMMMMMMMMMMMMMMMMMMMM1";
const API_BASE: &str = "https://api.mch.weixin.qq.com";
const MERCHANT_SERIAL: &str = "3775B6A45ACD588826D15E583A95F5DD2C4E7A01";
/// Its platform keys before and after a rotation: serial and the name of the key pair.
const OLD: (&str, &str) = (
    "PUB_KEY_ID_0000000000000000000000000000101A",
    "merchants-platform-old",
);
const NEW: (&str, &str) = (
    "PUB_KEY_ID_0000000000000000000000000000101B",
    "merchants-platform-new",
);
/// The merchant API key pair (`private_key_pem`).
const CLIENT_KEY: &str = "merchants-client";

/// The Alipay app the tests add.
const ALIPAY_APP: &str = "2021000000000101";
const ALIPAY_SELLER: &str = "2088000000000101";
/// Alipay's key for that app, and the app's own.
const ALIPAY_KEY: &str = "merchants-alipay";
const ALIPAY_APP_KEY: &str = "merchants-alipay-app";

/// Every key of the view, sorted.
const VIEW_KEYS: [&str; 16] = [
    "account",
    "api_base",
    "appids",
    "certificates",
    "channel",
    "created_at",
    "has_api_credentials",
    "has_app_auth_token",
    "keys_version",
    "mode",
    "platform_serials",
    "seller_id",
    "source",
    "sp_account",
    "status",
    "updated_at",
];

/// The file's accounts (`crate::wechat::settings`, `crate::alipay::settings`), as the list
/// sorts them.
const FILE_ACCOUNTS: [(&str, &str); 4] = [
    ("alipay", "2021000000000001"),
    ("alipay", "2021000000000002"),
    ("wechat", "1900000001"),
    ("wechat", "1900000002"),
];

/// Two WeChat merchants and two Alipay apps in the file, without a master key.
fn file_accounts(s: &mut Settings) {
    s.wechat = crate::wechat::settings();
    s.alipay = crate::alipay::settings();
}

/// [`file_accounts`] and the master key: `/admin/merchants` takes writes.
fn with_master_key(s: &mut Settings) {
    file_accounts(s);
    s.secrets.master_key = Secret::new(MASTER_KEY);
}

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, with_master_key).await
}

fn public_pem(name: &str) -> String {
    rsa_key(name);
    std::fs::read_to_string(public_key_path(name)).expect("public key PEM")
}

fn private_pem(name: &str) -> String {
    std::fs::read_to_string(private_key_path(name)).expect("private key PEM")
}

/// A `platform_keys` entry: `(serial, key pair name)`.
fn platform_key((serial, name): (&str, &str)) -> Value {
    json!({"serial": serial, "public_key_pem": public_pem(name)})
}

/// `POST /admin/merchants` for a WeChat direct merchant with API credentials and static
/// platform keys.
fn wechat_body(account: &str, platform_keys: &[(&str, &str)]) -> Value {
    rsa_key(CLIENT_KEY);
    json!({
        "channel": "wechat",
        "account": account,
        "mode": "direct",
        "appids": [APPID],
        "api_base": API_BASE,
        "certificates": "static",
        "keys": {
            "apiv3_key": APIV3,
            "platform_keys": platform_keys.iter().copied().map(platform_key).collect::<Vec<_>>(),
            "private_key_pem": private_pem(CLIENT_KEY),
            "merchant_serial": MERCHANT_SERIAL,
        },
    })
}

/// `POST /admin/merchants` for an Alipay direct app with its private key.
fn alipay_body() -> Value {
    rsa_key(ALIPAY_APP_KEY);
    json!({
        "channel": "alipay",
        "account": ALIPAY_APP,
        "mode": "direct",
        "seller_id": ALIPAY_SELLER,
        "keys": {
            "alipay_public_key_pem": public_pem(ALIPAY_KEY),
            "app_private_key_pem": private_pem(ALIPAY_APP_KEY),
        },
    })
}

/// The view of [`wechat_body`]'s merchant, without its two times.
fn wechat_view(account: &str, serials: &[&str], keys_version: i64, status: &str) -> Value {
    json!({
        "channel": "wechat",
        "account": account,
        "mode": "direct",
        "sp_account": null,
        "appids": [APPID],
        "seller_id": null,
        "api_base": API_BASE,
        "certificates": "static",
        "source": "api",
        "status": status,
        "platform_serials": serials,
        "has_api_credentials": true,
        "has_app_auth_token": false,
        "keys_version": keys_version,
    })
}

/// A view with exactly the contract's keys, its two times checked and taken out.
fn without_times(view: &Value) -> Value {
    let mut keys: Vec<&str> = view
        .as_object()
        .unwrap_or_else(|| panic!("a view is an object: {view}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, VIEW_KEYS, "{view}");
    let mut rest = view.clone();
    for time in ["created_at", "updated_at"] {
        let stamp = rest[time]
            .as_str()
            .unwrap_or_else(|| panic!("{time}: {view}"));
        assert!(
            chrono::DateTime::parse_from_rfc3339(stamp).is_ok(),
            "{time} is RFC 3339: {view}"
        );
        if let Some(o) = rest.as_object_mut() {
            o.remove(time);
        }
    }
    rest
}

/// An admin request with the API token and an optional JSON body: status and raw body.
async fn request_text(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> (u16, String) {
    let mut request = app
        .client
        .request(method, app.url(path))
        .bearer_auth(&app.api_token);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// [`request_text`] with the answer parsed: every `/admin/merchants` answer is JSON.
async fn request(app: &TestApp, method: Method, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = request_text(app, method, path, body).await;
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{path} answered {status} with non-JSON {text:?}: {e}"));
    (status, json)
}

async fn add(app: &TestApp, body: &Value) -> (u16, Value) {
    request(app, Method::POST, "/admin/merchants", Some(body)).await
}

/// Adds `body`'s account, which must be accepted; its view.
async fn added(app: &TestApp, body: &Value) -> Value {
    let (status, view) = add(app, body).await;
    assert_eq!(status, 201, "{view}");
    view
}

async fn get(app: &TestApp, channel: &str, account: &str) -> (u16, Value) {
    let path = format!("/admin/merchants/{channel}/{account}");
    request(app, Method::GET, &path, None).await
}

async fn patch(app: &TestApp, channel: &str, account: &str, body: &Value) -> (u16, Value) {
    let path = format!("/admin/merchants/{channel}/{account}");
    request(app, Method::PATCH, &path, Some(body)).await
}

async fn delete(app: &TestApp, channel: &str, account: &str) -> (u16, Value) {
    let path = format!("/admin/merchants/{channel}/{account}");
    request(app, Method::DELETE, &path, None).await
}

/// `GET /admin/merchants?{query}`, which must answer 200 with an array.
async fn list(app: &TestApp, query: &str) -> Vec<Value> {
    let (status, body) =
        request(app, Method::GET, &format!("/admin/merchants?{query}"), None).await;
    assert_eq!(status, 200, "?{query}: {body}");
    body.as_array()
        .unwrap_or_else(|| panic!("?{query}: an array: {body}"))
        .clone()
}

/// `(channel, account)` of each view, in the list's order.
fn accounts(views: &[Value]) -> Vec<(String, String)> {
    views
        .iter()
        .map(|v| {
            (
                v["channel"].as_str().unwrap_or("?").to_owned(),
                v["account"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(c, a)| ((*c).to_owned(), (*a).to_owned()))
        .collect()
}

/// A `{"error": …}` answer whose message names `field`.
fn assert_names(body: &Value, field: &str) {
    let message = body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("an error body: {body}"));
    assert!(message.contains(field), "names {field}: {body}");
}

/// `POST /orders` of 100 fen naming `account` in `field` (`wechat_mchid`, `alipay_app_id`).
async fn create_named(app: &TestApp, order_no: &str, field: &str, account: &str) -> (u16, Value) {
    let body = json!({"order_no": order_no, "amount_fen": 100, "currency": "CNY", field: account});
    request(app, Method::POST, "/orders", Some(&body)).await
}

/// [`create_named`] for the WeChat merchant [`ACCOUNT`], which must be accepted.
async fn wechat_order(app: &TestApp, order_no: &str) {
    let (status, body) = create_named(app, order_no, "wechat_mchid", ACCOUNT).await;
    assert_eq!(status, 201, "{order_no}: {body}");
}

/// WeChat's side of [`ACCOUNT`], signing with the platform key `(serial, key pair name)`.
fn platform((serial, name): (&str, &str)) -> wechat::Sandbox {
    wechat::Sandbox {
        serial: serial.into(),
        private_key: rsa_key(name),
        mchid: ACCOUNT.into(),
        appid: APPID.into(),
        apiv3_key: APIV3.into(),
    }
}

/// WeChat's payment notification of 100 fen for `order_no`, signed with `key`.
fn wechat_paid(app: &TestApp, key: (&str, &str), order_no: &str) -> Delivery {
    crate::wechat::paid(app, &platform(key), order_no, 100)
}

/// A WeChat notification refused as from an unknown merchant: `401` in WeChat's `FAIL` shape.
async fn assert_wechat_refused(app: &TestApp, d: &Delivery) {
    let (status, body) = crate::wechat::pay(app, d).await;
    assert_eq!(status, 401, "{body}");
    let body: Value = serde_json::from_str(&body).expect("FAIL body is JSON");
    assert_eq!(body["code"], "FAIL", "{body}");
}

/// Delivers `d`, which must be acknowledged, and `order_no` is paid.
async fn assert_wechat_applied(app: &TestApp, d: &Delivery, order_no: &str) {
    assert_eq!(
        crate::wechat::pay(app, d).await,
        (204, String::new()),
        "{order_no}"
    );
    assert_eq!(app.status_of(order_no).await, "PAID", "{order_no}");
}

/// Nothing but the receipt was written for `order_no`: it waits for its payment, and no
/// callback row nor outbox message exists.
async fn assert_nothing_written(app: &TestApp, order_no: &str) {
    assert_eq!(app.status_of(order_no).await, "WAIT_PAY", "{order_no}");
    let no = format!("pay_callback WHERE out_trade_no = '{order_no}'");
    assert_eq!(app.db.count(&no).await, 0, "{order_no}");
    assert_eq!(app.db.count("local_message").await, 0, "{order_no}");
}

/// Alipay's side of [`ALIPAY_APP`].
fn alipay_sandbox() -> alipay::Sandbox {
    alipay::Sandbox {
        app_id: ALIPAY_APP.into(),
        seller_id: ALIPAY_SELLER.into(),
        private_key: rsa_key(ALIPAY_KEY),
    }
}

/// Alipay's `TRADE_SUCCESS` notification of 100 fen for `order_no`.
fn alipay_paid(order_no: &str) -> Delivery {
    let s = alipay_sandbox();
    let fields = alipay::payment(
        &s,
        order_no,
        &format!("2026{order_no}"),
        100,
        "TRADE_SUCCESS",
    );
    s.notification(fields, false).expect("forge")
}

async fn alipay_send(app: &TestApp, d: &Delivery) -> (u16, String) {
    post_delivery(app, "/notify/alipay", d).await
}

/// `/metrics` as Prometheus scrapes it.
async fn scrape(app: &TestApp) -> String {
    let response = app.get_without_token("/metrics").await;
    assert_eq!(response.status(), 200);
    response.text().await.expect("metrics text")
}

/// The value of `paynotify_accounts` with exactly these labels; a series not exported is 0.
fn accounts_gauge(text: &str, labels: [(&str, &str); 4]) -> f64 {
    let mut wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    wanted.sort();
    text.lines()
        .filter_map(|line| line.strip_prefix("paynotify_accounts{"))
        .filter_map(|rest| rest.split_once("} "))
        .find(|(series, _)| {
            let mut got: Vec<String> = series.split(',').map(str::to_owned).collect();
            got.sort();
            got == wanted
        })
        .map_or(0.0, |(_, value)| {
            value.trim().parse().expect("a gauge value")
        })
}

/// The lines of every key the tests give (APIv3 keys, PEM bodies, tokens), each of which
/// must never come back in an answer.
fn key_material(keys: &[&str]) -> Vec<String> {
    keys.iter()
        .flat_map(|key| key.lines())
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("-----"))
        .map(str::to_owned)
        .collect()
}

fn assert_holds_no_key(what: &str, text: &str, secrets: &[String]) {
    for secret in secrets {
        assert!(
            !text.contains(secret.as_str()),
            "{what} holds {secret:?}: {text}"
        );
    }
}

async fn writes_without_a_master_key_are_503_and_the_file_accounts_are_still_listed(
    backend: Backend,
) {
    let app = spawn_app_with(backend, file_accounts).await;
    let unset = json!({"error": "secrets.master_key is not set"});
    let body = wechat_body(ACCOUNT, &[OLD]);
    assert_eq!(add(&app, &body).await, (503, unset.clone()));
    let change = json!({"appids": [APPID]});
    assert_eq!(
        patch(&app, "wechat", ACCOUNT, &change).await,
        (503, unset.clone())
    );
    assert_eq!(delete(&app, "wechat", ACCOUNT).await, (503, unset));

    let views = list(&app, "").await;
    assert_eq!(accounts(&views), pairs(&FILE_ACCOUNTS));
    for view in &views {
        assert_eq!(view["source"], "config", "{view}");
        assert_eq!(view["status"], "enabled", "{view}");
        assert_eq!(view["mode"], "direct", "{view}");
    }
    let (status, view) = get(&app, "wechat", "1900000001").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["source"], "config");
    assert_eq!(
        view["platform_serials"],
        json!([
            "5157F09EFDC096DE15EBE81A47057A7232F1B8E1",
            "PUB_KEY_ID_0000000000000000000000000000000A"
        ])
    );
    assert_eq!(view["has_api_credentials"], false);
    assert_eq!(get(&app, "wechat", ACCOUNT).await.0, 404);
}

async fn every_merchants_route_wants_the_bearer_token(backend: Backend) {
    let app = app(backend).await;
    let anonymous = |method: Method, path: &str| {
        let mut request = app.client.request(method.clone(), app.url(path));
        if method != Method::GET && method != Method::DELETE {
            request = request.json(&wechat_body(ACCOUNT, &[OLD]));
        }
        request
    };
    let reference = anonymous(Method::GET, "/admin/messages")
        .send()
        .await
        .expect("GET /admin/messages");
    assert_eq!(reference.status(), 401);
    let refused: Value = reference.json().await.expect("JSON");
    let one = format!("/admin/merchants/wechat/{ACCOUNT}");
    let routes = [
        (Method::GET, "/admin/merchants"),
        (Method::POST, "/admin/merchants"),
        (Method::GET, one.as_str()),
        (Method::PATCH, one.as_str()),
        (Method::DELETE, one.as_str()),
        (Method::GET, "/admin/merchants/wechat/1900000001"),
    ];
    for (method, path) in routes {
        for token in [None, Some("wrong-token")] {
            let mut request = anonymous(method.clone(), path);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.expect(path);
            assert_eq!(response.status(), 401, "{method} {path} with {token:?}");
            let body: Value = response.json().await.expect("JSON");
            assert_eq!(body, refused, "{method} {path} with {token:?}");
        }
    }
    assert_eq!(
        get(&app, "wechat", ACCOUNT).await.0,
        404,
        "nothing was added"
    );
}

async fn a_wechat_merchant_added_through_the_api_verifies_its_next_notification(backend: Backend) {
    let app = app(backend).await;
    let d = wechat_paid(&app, OLD, "MA-1");
    assert_wechat_refused(&app, &d).await;
    assert_eq!(app.db.count("pay_callback").await, 0);

    let view = added(&app, &wechat_body(ACCOUNT, &[OLD])).await;
    assert_eq!(
        without_times(&view),
        wechat_view(ACCOUNT, &[OLD.0], 1, "enabled")
    );
    // No restart: the instance that made the change applied it before it answered.
    wechat_order(&app, "MA-1").await;
    assert_wechat_applied(&app, &d, "MA-1").await;
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

async fn one_account_and_the_list_sorted_filtered_and_paged(backend: Backend) {
    let app = app(backend).await;
    let mut views = Vec::new();
    // Added out of order: the list sorts.
    for (account, serial) in [
        ("1900000300", "PUB_KEY_ID_0000000000000000000000000000300A"),
        ("1900000100", "PUB_KEY_ID_0000000000000000000000000000100A"),
        ("1900000200", "PUB_KEY_ID_0000000000000000000000000000200A"),
    ] {
        views.push(added(&app, &wechat_body(account, &[(serial, OLD.1)])).await);
    }
    added(&app, &alipay_body()).await;

    assert_eq!(
        get(&app, "wechat", "1900000100").await,
        (200, views[1].clone())
    );
    assert_eq!(get(&app, "wechat", "1900000999").await.0, 404);
    assert_eq!(
        get(&app, "alipay", "1900000100").await.0,
        404,
        "another channel"
    );

    let every = pairs(&[
        ("alipay", "2021000000000001"),
        ("alipay", "2021000000000002"),
        ("alipay", ALIPAY_APP),
        ("wechat", "1900000001"),
        ("wechat", "1900000002"),
        ("wechat", "1900000100"),
        ("wechat", "1900000200"),
        ("wechat", "1900000300"),
    ]);
    let all = list(&app, "").await;
    assert_eq!(accounts(&all), every);
    let sources: Vec<&str> = all
        .iter()
        .map(|v| v["source"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        sources,
        [
            "config", "config", "api", "config", "config", "api", "api", "api"
        ]
    );
    assert_eq!(all[5], views[1], "a listed view is the account's view");
    assert_eq!(accounts(&list(&app, "channel=alipay").await), every[..3]);
    assert_eq!(accounts(&list(&app, "channel=wechat").await), every[3..]);

    assert_eq!(delete(&app, "wechat", "1900000200").await.0, 200);
    assert_eq!(
        accounts(&list(&app, "status=disabled").await),
        pairs(&[("wechat", "1900000200")])
    );
    let enabled: Vec<_> = every
        .iter()
        .filter(|(_, a)| a != "1900000200")
        .cloned()
        .collect();
    assert_eq!(accounts(&list(&app, "status=enabled").await), enabled);
    assert_eq!(
        accounts(&list(&app, "channel=wechat&status=enabled").await),
        enabled[3..]
    );

    // Pages of two: `after` is the last account of the page before.
    let mut pages = Vec::new();
    let mut after = String::new();
    loop {
        let query = if after.is_empty() {
            "channel=wechat&limit=2".to_owned()
        } else {
            format!("channel=wechat&limit=2&after={after}")
        };
        let page = accounts(&list(&app, &query).await);
        let Some((_, last)) = page.last() else { break };
        after = last.clone();
        pages.push(page);
        assert!(pages.len() <= 3, "{pages:?}");
    }
    assert_eq!(
        pages,
        [
            every[3..5].to_vec(),
            every[5..7].to_vec(),
            every[7..].to_vec()
        ]
    );
    assert_eq!(list(&app, "limit=1").await.len(), 1);
    assert_eq!(list(&app, "limit=10000").await.len(), every.len());
    for limit in ["0", "10001"] {
        let path = format!("/admin/merchants?limit={limit}");
        let (status, body) = request(&app, Method::GET, &path, None).await;
        assert_eq!(status, 400, "limit={limit}: {body}");
        assert_names(&body, "limit");
    }
}

async fn bad_bodies_are_400_naming_the_field_and_store_nothing(backend: Backend) {
    let app = app(backend).await;
    let before = list(&app, "").await;
    let with = |change: &dyn Fn(&mut Value)| {
        let mut body = wechat_body(ACCOUNT, &[OLD]);
        change(&mut body);
        body
    };
    let (certificate, _) = platform_certificate(
        "merchants-certificate",
        "6B3F8E2A91C4D5E6F708192A3B4C5D6E7F801234",
        (2026, 11, 1),
        (2031, 11, 1),
    );
    let cases: Vec<(Value, &str)> = vec![
        (with(&|b| b["mode"] = json!("sub_merchant")), "mode"),
        (with(&|b| b["channel"] = json!("paypal")), "channel"),
        (
            with(&|b| b["keys"]["apiv3_key"] = json!(&APIV3[..31])),
            "apiv3_key",
        ),
        (
            with(&|b| {
                b["keys"]["platform_keys"][0]["public_key_pem"] =
                    json!("-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n")
            }),
            "public_key_pem",
        ),
        (
            with(&|b| {
                b["keys"]["platform_keys"] = json!([{
                    "serial": "0000000000000000000000000000000000000001",
                    "certificate_pem": certificate,
                }])
            }),
            "platform_keys",
        ),
        (
            with(&|b| b["keys"]["private_key_pem"] = json!("-----BEGIN PRIVATE KEY-----\n")),
            "private_key_pem",
        ),
        (
            // A sub-merchant has no keys: its service provider's serve it.
            json!({"channel": "wechat", "account": ACCOUNT, "mode": "partner_sub",
                   "sp_account": "1900000001", "keys": wechat_body(ACCOUNT, &[OLD])["keys"]}),
            "keys",
        ),
        (
            json!({"channel": "wechat", "account": ACCOUNT, "mode": "partner_sub",
                   "sp_account": "1999999999"}),
            "sp_account",
        ),
        (
            with(&|b| {
                if let Some(o) = b.as_object_mut() {
                    o.remove("channel");
                }
            }),
            "channel",
        ),
        (
            with(&|b| {
                if let Some(o) = b.as_object_mut() {
                    o.remove("account");
                }
            }),
            "account",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = add(&app, &body).await;
        assert_eq!(status, 400, "{field}: {answer}");
        assert_names(&answer, field);
        assert_eq!(list(&app, "").await, before, "nothing stored for {field}");
    }
    assert_eq!(get(&app, "wechat", ACCOUNT).await.0, 404);
}

async fn an_account_that_exists_in_the_file_or_the_database_is_409(backend: Backend) {
    let app = app(backend).await;
    let view = added(&app, &wechat_body(ACCOUNT, &[OLD])).await;
    let conflicts = [
        wechat_body(ACCOUNT, &[OLD]),
        wechat_body(ACCOUNT, &[NEW]),
        wechat_body("1900000001", &[NEW]),
        {
            let mut file_app = alipay_body();
            file_app["account"] = json!("2021000000000001");
            file_app
        },
    ];
    let before = list(&app, "").await;
    for body in &conflicts {
        let (status, answer) = add(&app, body).await;
        assert_eq!(status, 409, "{}: {answer}", body["account"]);
        assert!(answer["error"].is_string(), "{answer}");
        assert_eq!(list(&app, "").await, before, "nothing stored");
    }
    assert_eq!(get(&app, "wechat", ACCOUNT).await, (200, view));

    // A disabled account still exists.
    assert_eq!(delete(&app, "wechat", ACCOUNT).await.0, 200);
    let (status, answer) = add(&app, &wechat_body(ACCOUNT, &[NEW])).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(get(&app, "wechat", ACCOUNT).await.1["status"], "disabled");
}

async fn platform_keys_rotate_with_an_overlap_and_each_patch_bumps_keys_version(backend: Backend) {
    let app = app(backend).await;
    added(&app, &wechat_body(ACCOUNT, &[OLD])).await;
    wechat_order(&app, "MR-1").await;
    assert_wechat_applied(&app, &wechat_paid(&app, OLD, "MR-1"), "MR-1").await;

    // WeChat's rotation: both keys sign for a while.
    let overlap = json!({"keys": {"platform_keys": [platform_key(OLD), platform_key(NEW)]}});
    let (status, view) = patch(&app, "wechat", ACCOUNT, &overlap).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        without_times(&view),
        wechat_view(ACCOUNT, &[OLD.0, NEW.0], 2, "enabled")
    );
    for (order_no, key) in [("MR-2", OLD), ("MR-3", NEW)] {
        wechat_order(&app, order_no).await;
        assert_wechat_applied(&app, &wechat_paid(&app, key, order_no), order_no).await;
    }

    let only_new = json!({"keys": {"platform_keys": [platform_key(NEW)]}});
    let (status, view) = patch(&app, "wechat", ACCOUNT, &only_new).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        without_times(&view),
        wechat_view(ACCOUNT, &[NEW.0], 3, "enabled")
    );
    assert_eq!(get(&app, "wechat", ACCOUNT).await, (200, view));
    wechat_order(&app, "MR-4").await;
    assert_wechat_refused(&app, &wechat_paid(&app, OLD, "MR-4")).await;
    assert_eq!(app.status_of("MR-4").await, "WAIT_PAY");
    assert_wechat_applied(&app, &wechat_paid(&app, NEW, "MR-4"), "MR-4").await;
    assert_eq!(app.messages("ORDER_PAID").await, 4);
}

async fn a_patch_may_not_move_an_account_and_is_404_unknown_and_409_for_the_file(backend: Backend) {
    let app = app(backend).await;
    let view = added(&app, &wechat_body(ACCOUNT, &[OLD])).await;
    let moves = [
        (json!({"mode": "partner_sub"}), "mode"),
        (json!({"account": "1900000102"}), "account"),
        (json!({"channel": "alipay"}), "channel"),
        (json!({"sp_account": "1900000001"}), "sp_account"),
        (json!({"keys": {"apiv3_key": &APIV3[..31]}}), "apiv3_key"),
        (
            json!({"keys": {"platform_keys": [{"serial": NEW.0, "public_key_pem": "not a key"}]}}),
            "public_key_pem",
        ),
    ];
    for (body, field) in moves {
        let (status, answer) = patch(&app, "wechat", ACCOUNT, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_names(&answer, field);
    }
    assert_eq!(
        get(&app, "wechat", ACCOUNT).await,
        (200, view),
        "nothing changed"
    );

    let rotate = json!({"keys": {"platform_keys": [platform_key(NEW)]}});
    assert_eq!(patch(&app, "wechat", "1900000999", &rotate).await.0, 404);
    assert_eq!(patch(&app, "alipay", ALIPAY_APP, &rotate).await.0, 404);
    let (status, answer) = patch(&app, "wechat", "1900000001", &rotate).await;
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = patch(
        &app,
        "alipay",
        "2021000000000001",
        &json!({"seller_id": "2088000000000009"}),
    )
    .await;
    assert_eq!(status, 409, "{answer}");
}

async fn delete_disables_and_a_disabled_merchant_is_answered_like_an_unknown_one(backend: Backend) {
    let app = app(backend).await;
    added(&app, &wechat_body(ACCOUNT, &[OLD])).await;
    wechat_order(&app, "MD-1").await;

    let (status, disabled) = delete(&app, "wechat", ACCOUNT).await;
    assert_eq!(status, 200, "{disabled}");
    let mut shown = without_times(&disabled);
    let mut expected = wechat_view(ACCOUNT, &[OLD.0], 1, "disabled");
    // Whether disabling counts as a key change is not the point here.
    for view in [&mut shown, &mut expected] {
        if let Some(o) = view.as_object_mut() {
            o.remove("keys_version");
        }
    }
    assert_eq!(shown, expected);
    assert_eq!(
        delete(&app, "wechat", ACCOUNT).await,
        (200, disabled.clone())
    );
    assert_eq!(get(&app, "wechat", ACCOUNT).await, (200, disabled));

    let d = wechat_paid(&app, OLD, "MD-1");
    assert_wechat_refused(&app, &d).await;
    assert_nothing_written(&app, "MD-1").await;
    let (status, answer) = create_named(&app, "MD-2", "wechat_mchid", ACCOUNT).await;
    assert_eq!(status, 400, "{answer}");
    assert_names(&answer, "wechat_mchid");

    let (status, view) = patch(&app, "wechat", ACCOUNT, &json!({"status": "enabled"})).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "enabled");
    // WeChat retries: the same notification is applied once the merchant is back.
    assert_wechat_applied(&app, &d, "MD-1").await;
    wechat_order(&app, "MD-2").await;

    let (status, answer) = delete(&app, "wechat", "1900000001").await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(delete(&app, "wechat", "1900000999").await.0, 404);
    assert_eq!(delete(&app, "alipay", ACCOUNT).await.0, 404);
}

async fn an_alipay_app_added_through_the_api_verifies_its_notifications_until_disabled(
    backend: Backend,
) {
    let app = app(backend).await;
    let fail = (401, "fail".to_owned());
    let d = alipay_paid("MAL-1");
    assert_eq!(alipay_send(&app, &d).await, fail);

    let (status, view) = add(&app, &alipay_body()).await;
    assert_eq!(status, 201, "{view}");
    for (key, value) in [
        ("channel", json!("alipay")),
        ("account", json!(ALIPAY_APP)),
        ("mode", json!("direct")),
        ("sp_account", json!(null)),
        ("seller_id", json!(ALIPAY_SELLER)),
        ("source", json!("api")),
        ("status", json!("enabled")),
        ("has_api_credentials", json!(true)),
        ("has_app_auth_token", json!(false)),
        ("keys_version", json!(1)),
    ] {
        assert_eq!(view[key], value, "{key}: {view}");
    }

    let (status, answer) = create_named(&app, "MAL-1", "alipay_app_id", ALIPAY_APP).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(alipay_send(&app, &d).await, (200, "success".to_owned()));
    assert_eq!(app.status_of("MAL-1").await, "PAID");

    let (status, answer) = create_named(&app, "MAL-2", "alipay_app_id", ALIPAY_APP).await;
    assert_eq!(status, 201, "{answer}");
    let paid_events = app.messages("ORDER_PAID").await;
    assert_eq!(
        delete(&app, "alipay", ALIPAY_APP).await.1["status"],
        "disabled"
    );
    assert_eq!(alipay_send(&app, &alipay_paid("MAL-2")).await, fail);
    assert_eq!(app.status_of("MAL-2").await, "WAIT_PAY");
    let callbacks = "pay_callback WHERE out_trade_no = 'MAL-2'";
    assert_eq!(app.db.count(callbacks).await, 0);
    assert_eq!(app.messages("ORDER_PAID").await, paid_events);
}

async fn a_second_instance_follows_an_add_a_rotation_and_a_disable_at_its_reload(backend: Backend) {
    let a = app(backend).await;
    let b = a.spawn_beside(with_master_key).await;
    let first = wechat_paid(&b, OLD, "M2-1");
    assert_wechat_refused(&b, &first).await;

    pass_a_second(&a, &b);
    added(&a, &wechat_body(ACCOUNT, &[OLD])).await;
    wechat_order(&a, "M2-1").await;
    reload(&b).await;
    assert_wechat_applied(&b, &first, "M2-1").await;

    pass_a_second(&a, &b);
    let only_new = json!({"keys": {"platform_keys": [platform_key(NEW)]}});
    assert_eq!(patch(&a, "wechat", ACCOUNT, &only_new).await.0, 200);
    wechat_order(&a, "M2-2").await;
    reload(&b).await;
    assert_wechat_refused(&b, &wechat_paid(&b, OLD, "M2-2")).await;
    assert_wechat_applied(&b, &wechat_paid(&b, NEW, "M2-2"), "M2-2").await;

    pass_a_second(&a, &b);
    wechat_order(&a, "M2-3").await;
    assert_eq!(delete(&a, "wechat", ACCOUNT).await.0, 200);
    reload(&b).await;
    let paid_events = b.messages("ORDER_PAID").await;
    assert_wechat_refused(&b, &wechat_paid(&b, NEW, "M2-3")).await;
    assert_eq!(b.status_of("M2-3").await, "WAIT_PAY");
    assert_eq!(b.messages("ORDER_PAID").await, paid_events);
    let (status, answer) = create_named(&b, "M2-4", "wechat_mchid", ACCOUNT).await;
    assert_eq!(status, 400, "{answer}");
}

/// Time passes on both instances between two changes, as it does between an operator's
/// requests.
fn pass_a_second(a: &TestApp, b: &TestApp) {
    a.clock.advance(1);
    b.clock.advance(1);
}

/// `b` reads the accounts changed since its last read, which holds the change just made.
async fn reload(b: &TestApp) {
    let changed = b.merchants.reload().await.expect("reload");
    assert!(
        changed >= 1,
        "the change made on the other instance: {changed}"
    );
}

async fn a_second_instance_with_jobs_verifies_an_added_merchant_within_reload_secs(
    backend: Backend,
) {
    let a = app(backend).await;
    let b = a
        .spawn_beside_with_jobs(|s| {
            with_master_key(s);
            s.merchants.reload_secs = 1;
        })
        .await;
    let d = wechat_paid(&b, OLD, "MJ-1");
    assert_wechat_refused(&b, &d).await;

    pass_a_second(&a, &b);
    added(&a, &wechat_body(ACCOUNT, &[OLD])).await;
    wechat_order(&a, "MJ-1").await;
    // One reload period and the scheduling around it; nobody calls `reload` here.
    let verified = eventually(std::time::Duration::from_secs(5), || async {
        crate::wechat::pay(&b, &d).await.0 == 204
    })
    .await;
    assert!(verified, "B verifies the added merchant within reload_secs");
    assert_eq!(b.status_of("MJ-1").await, "PAID");
}

async fn no_admin_answer_and_no_metric_holds_a_key(backend: Backend) {
    let app = app(backend).await;
    let (old, new, client) = (
        public_pem(OLD.1),
        public_pem(NEW.1),
        private_pem(CLIENT_KEY),
    );
    let (alipay_public, alipay_private) = (public_pem(ALIPAY_KEY), private_pem(ALIPAY_APP_KEY));
    let short = &APIV3[..31];
    let secrets = key_material(&[
        APIV3,
        short,
        &old,
        &new,
        &client,
        &alipay_public,
        &alipay_private,
    ]);
    let one = format!("/admin/merchants/wechat/{ACCOUNT}");
    let alipay_one = format!("/admin/merchants/alipay/{ALIPAY_APP}");
    let mut bad = wechat_body(ACCOUNT, &[OLD]);
    bad["keys"]["apiv3_key"] = json!(short);
    let rotate = json!({"keys": {"platform_keys": [platform_key(OLD), platform_key(NEW)],
                                 "private_key_pem": client.clone()}});
    let calls: Vec<(Method, &str, Option<Value>, u16)> = vec![
        (Method::POST, "/admin/merchants", Some(bad), 400),
        (
            Method::POST,
            "/admin/merchants",
            Some(wechat_body(ACCOUNT, &[OLD])),
            201,
        ),
        (
            Method::POST,
            "/admin/merchants",
            Some(wechat_body(ACCOUNT, &[OLD])),
            409,
        ),
        (Method::POST, "/admin/merchants", Some(alipay_body()), 201),
        (Method::GET, &one, None, 200),
        (Method::GET, &alipay_one, None, 200),
        (Method::GET, "/admin/merchants", None, 200),
        (Method::PATCH, &one, Some(rotate), 200),
        (Method::DELETE, &one, None, 200),
        (Method::DELETE, &alipay_one, None, 200),
        (Method::GET, "/admin/merchants?status=disabled", None, 200),
    ];
    for (method, path, body, expected) in calls {
        let what = format!("{method} {path}");
        let (status, text) = request_text(&app, method, path, body.as_ref()).await;
        assert_eq!(status, expected, "{what}: {text}");
        assert_holds_no_key(&what, &text, &secrets);
    }
    assert_holds_no_key("/metrics", &scrape(&app).await, &secrets);
}

async fn an_app_auth_token_is_never_shown(backend: Backend) {
    let app = app(backend).await;
    added(&app, &alipay_body()).await;
    let (token, rotated) = (
        "202611BBd3f1a0c5e9b74d2a8f6c0e1b3d5a7c9e",
        "202612CCe4a2b1d6f0c85e3b9a7d1f2c4e6b8d0f",
    );
    let merchant = "2021000000000201";
    let view = added(
        &app,
        &json!({"channel": "alipay", "account": merchant, "mode": "partner_sub",
                "sp_account": ALIPAY_APP, "keys": {"app_auth_token": token}}),
    )
    .await;
    assert_eq!(view["mode"], "partner_sub");
    assert_eq!(view["sp_account"], ALIPAY_APP);
    assert_eq!(view["has_app_auth_token"], true);
    let secrets = key_material(&[token, rotated]);
    assert_holds_no_key("the view", &view.to_string(), &secrets);
    let one = format!("/admin/merchants/alipay/{merchant}");
    let change = json!({"keys": {"app_auth_token": rotated}});
    let calls: Vec<(Method, &str, Option<Value>)> = vec![
        (Method::GET, &one, None),
        (Method::GET, "/admin/merchants?channel=alipay", None),
        (Method::PATCH, &one, Some(change)),
        (Method::DELETE, &one, None),
    ];
    for (method, path, body) in calls {
        let what = format!("{method} {path}");
        let (status, text) = request_text(&app, method, path, body.as_ref()).await;
        assert_eq!(status, 200, "{what}: {text}");
        assert_holds_no_key(&what, &text, &secrets);
    }
    assert_holds_no_key("/metrics", &scrape(&app).await, &secrets);
}

async fn the_accounts_gauge_follows_an_add_and_a_disable(backend: Backend) {
    let app = app(backend).await;
    let series = |channel, source, status| {
        [
            ("channel", channel),
            ("mode", "direct"),
            ("source", source),
            ("status", status),
        ]
    };
    let text = scrape(&app).await;
    assert_eq!(
        accounts_gauge(&text, series("wechat", "config", "enabled")),
        2.0
    );
    assert_eq!(
        accounts_gauge(&text, series("alipay", "config", "enabled")),
        2.0
    );
    assert_eq!(
        accounts_gauge(&text, series("wechat", "api", "enabled")),
        0.0
    );

    added(&app, &wechat_body(ACCOUNT, &[OLD])).await;
    let text = scrape(&app).await;
    assert_eq!(
        accounts_gauge(&text, series("wechat", "api", "enabled")),
        1.0
    );
    assert_eq!(
        accounts_gauge(&text, series("wechat", "api", "disabled")),
        0.0
    );
    assert_eq!(
        accounts_gauge(&text, series("wechat", "config", "enabled")),
        2.0
    );

    assert_eq!(delete(&app, "wechat", ACCOUNT).await.0, 200);
    let text = scrape(&app).await;
    assert_eq!(
        accounts_gauge(&text, series("wechat", "api", "enabled")),
        0.0
    );
    assert_eq!(
        accounts_gauge(&text, series("wechat", "api", "disabled")),
        1.0
    );
    assert_eq!(
        accounts_gauge(&text, series("alipay", "api", "enabled")),
        0.0
    );
}

/// An instance still on another master key (a rotation half done): the change it cannot open
/// fails every reload, long after the change, so the lag grows and the alert fires; the
/// account is not live there meanwhile.
async fn an_instance_whose_key_does_not_open_a_change_keeps_failing_its_reloads(backend: Backend) {
    let a = app(backend).await;
    let b = a
        .spawn_beside(|s| {
            file_accounts(s);
            s.secrets.master_key = Secret::new("b3RoZXItbWFzdGVyLWtleS1mb3ItdGhlLXRlc3QtMzI=");
        })
        .await;
    pass_a_second(&a, &b);
    added(&a, &wechat_body(ACCOUNT, &[OLD])).await;
    let failed = || paynotify::metrics::Metrics::count(&b.metrics.account_reload, &["failed"]);
    for round in 1..=3 {
        assert_eq!(
            b.merchants.reload().await.expect("reload"),
            0,
            "round {round}"
        );
        assert_eq!(failed(), round, "round {round}");
        // Minutes pass: the change is long out of the look-back, and still read again.
        a.clock.advance(300);
        b.clock.advance(300);
    }
    wechat_order(&a, "MK-1").await;
    assert_wechat_refused(&b, &wechat_paid(&b, OLD, "MK-1")).await;
}

/// A disabled account is asked nothing: a refund of its order answers 409 and nothing is
/// recorded.
async fn a_refund_of_an_order_of_a_disabled_account_is_409(backend: Backend) {
    let app = app(backend).await;
    added(&app, &wechat_body(ACCOUNT, &[OLD])).await;
    wechat_order(&app, "MD-1").await;
    assert_wechat_applied(&app, &wechat_paid(&app, OLD, "MD-1"), "MD-1").await;
    assert_eq!(delete(&app, "wechat", ACCOUNT).await.0, 200);
    let body = json!({"out_refund_no": "MD-1-R1", "amount_fen": 100});
    let (status, answer) = request(&app, Method::POST, "/orders/MD-1/refunds", Some(&body)).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("disabled")),
        "{answer}"
    );
    assert_eq!(app.db.count("refund_request").await, 0);
}
