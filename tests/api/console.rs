//! The console (`/admin/console`): every page on every backend with its rows escaped, the
//! sign-in and its cookie, the CSRF token and the cross-site check on every form, the open
//! console of a loopback service without a token, re-apply and redrive through it, the
//! transfers by status with a transfer's events and its cancel; and in a
//! real browser (headless Chromium through chromedriver), a receipt whose body is an XSS
//! payload rendered inert, with a screenshot of each page.

use paynotify::config::Secret;
use paynotify::merchants::store::Status;
use paynotify::notice::ChannelId;
use paynotify::qa::forge::Delivery;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};

use crate::support::browser::Browser;
use crate::support::helpers::{Backend, TestApp, spawn_app_with};
use crate::transfer_ops;
use crate::transfers::MCHID;
use crate::wechat::{paid, pay, sandbox, settings};

/// What a forger puts wherever the console might show it.
const XSS: &str = r#"<script>window.__xss=1</script><img src=x onerror="window.__xss=2">"#;
const WRONG_APIV3: &str = "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ1";
const REFUSED: &str = "/admin/console/refused";

/// A form body, as a browser posts it.
trait PostForm {
    fn form_of(self, pairs: &[(&str, &str)]) -> Self;
}

impl PostForm for reqwest::RequestBuilder {
    fn form_of(self, pairs: &[(&str, &str)]) -> Self {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        self.header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
    }
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// A payment notification with the payload in its body and its User-Agent: refused (its
/// signature no longer verifies) and kept whole, being in WeChat's shape.
fn forged(app: &TestApp, order_no: &str) -> Delivery {
    let mut d = paid(app, &sandbox('A'), order_no, 300);
    let mut body: serde_json::Value = serde_json::from_slice(&d.body).expect("JSON body");
    body["summary"] = XSS.into();
    d.body = serde_json::to_vec(&body).expect("body");
    d.set_header("User-Agent", XSS);
    d
}

/// Rows for every page: a refused receipt carrying the payload, two orders, an anomaly
/// (paid 999 for an order of 300), a dead letter whose last error carries the payload.
async fn seeded(app: &TestApp) {
    app.create_order("CON-1", 300).await;
    app.create_order("CON-2", 300).await;
    assert_eq!(pay(app, &forged(app, "CON-1")).await.0, 401);
    // The payload as the serial: it comes back in the refusal's detail and in explain's.
    let mut serial = paid(app, &sandbox('A'), "CON-1", 300);
    serial.set_header("Wechatpay-Serial", XSS);
    assert_eq!(pay(app, &serial).await.0, 401);
    assert_eq!(
        pay(app, &paid(app, &sandbox('A'), "CON-2", 999)).await.0,
        204
    );
    app.receipts_stored(2).await;
    app.db
        .execute(&format!(
            "UPDATE local_message SET status = 2, attempts = 3, last_error = '{}' WHERE topic = 'PAYMENT_ANOMALY'",
            XSS.replace('\'', "''")
        ))
        .await;
}

/// Every receipt kept, newest first.
async fn receipts(app: &TestApp) -> Vec<paynotify::receipts::store::StoredReceipt> {
    app.store
        .receipts(&paynotify::receipts::store::ReceiptFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("receipts")
}

async fn get(app: &TestApp, path: &str) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let response = no_redirects()
        .get(app.url(path))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect(path);
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.text().await.expect("body"))
}

fn assert_inert(path: &str, html: &str) {
    assert!(!html.contains("<script"), "{path}: a raw <script> tag");
    assert!(!html.contains("<img src=x"), "{path}: a raw <img> tag");
}

async fn every_console_page_shows_its_rows_escaped(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.wechat = settings()).await;
    seeded(&app).await;
    let (status, _, refused) = get(&app, REFUSED).await;
    assert_eq!(status, 200, "{refused}");
    assert!(refused.contains("bad_signature"), "{refused}");
    assert!(
        refused.contains("signature: the signature does not verify"),
        "{refused}"
    );
    let id = receipts(&app).await;
    let pages = [
        (REFUSED.to_owned(), "/admin/console/receipts/"),
        (
            format!("/admin/console/receipts/{}", id[0].id),
            "&lt;script&gt;window.__xss=1",
        ),
        ("/admin/console/anomalies".to_owned(), "CON-2"),
        ("/admin/console/dead".to_owned(), "&lt;img src=x onerror="),
        ("/admin/console/orders".to_owned(), "CON-2"),
        ("/admin/console/orders?status=WAIT_PAY".to_owned(), "CON-1"),
        ("/admin/console/orders?order_no=CON-2".to_owned(), "CON-2"),
        (
            "/admin/console/reconcile".to_owned(),
            "No bill was reconciled",
        ),
        ("/admin/console/certificates".to_owned(), "Certificates"),
    ];
    for (path, expected) in &pages {
        let (status, headers, html) = get(&app, path).await;
        assert_eq!(status, 200, "{path}: {html}");
        assert!(html.contains(expected), "{path} lacks {expected:?}: {html}");
        assert_inert(path, &html);
        let csp = headers
            .get("content-security-policy")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
        assert!(
            !csp.contains("script-src"),
            "{path}: no script source is allowed"
        );
        assert_eq!(
            headers.get("cache-control").map(|v| v.as_bytes()),
            Some(&b"no-store"[..])
        );
        assert!(
            headers[CONTENT_TYPE]
                .to_str()
                .unwrap_or_default()
                .starts_with("text/html"),
            "{path}"
        );
    }
    // Filters that find nothing, and one that is wrong.
    let (status, _, html) = get(&app, "/admin/console/orders?status=PAID").await;
    assert_eq!(status, 200);
    assert!(!html.contains("CON-1") && !html.contains("CON-2"), "{html}");
    let (status, _, html) = get(&app, "/admin/console/orders?status=<b>").await;
    assert_eq!(status, 400);
    assert!(
        html.contains("&lt;b&gt;") && !html.contains("<b>\""),
        "{html}"
    );
    let (status, _, _) = get(&app, "/admin/console/reconcile?date=yesterday").await;
    assert_eq!(status, 400);
    let (status, _, _) = get(&app, "/admin/console/receipts/999999").await;
    assert_eq!(status, 404);
}

async fn the_console_re_applies_refused_receipts_once_the_key_is_fixed(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.wechat.merchants[0].apiv3_key = Secret::new(WRONG_APIV3);
    })
    .await;
    for order_no in ["CRA-1", "CRA-2", "CRA-3"] {
        app.create_order(order_no, 300).await;
        assert_eq!(
            pay(&app, &paid(&app, &sandbox('A'), order_no, 300)).await.0,
            500
        );
    }
    app.receipts_stored(3).await;
    let app = app.rebuild(|s| s.wechat = settings()).await;
    let bulk = |csrf: Option<&str>| {
        let mut form = vec![("outcome", "undecryptable")];
        if let Some(csrf) = csrf {
            form.push(("csrf", csrf));
        }
        no_redirects()
            .post(app.url("/admin/console/refused/reapply"))
            .bearer_auth(&app.api_token)
            .form_of(&form)
            .send()
    };
    // A bearer request carries its credential in a header: no CSRF token needed, but the
    // field is still read.
    let first = bulk(Some("")).await.expect("bulk re-apply");
    assert_eq!(first.status(), 200);
    let html = first.text().await.expect("body");
    assert!(html.contains("3 receipts re-applied"), "{html}");
    for order_no in ["CRA-1", "CRA-2", "CRA-3"] {
        assert_eq!(app.status_of(order_no).await, "PAID");
    }
    assert_eq!(app.messages("ORDER_PAID").await, 3);
    let second = bulk(Some(""))
        .await
        .expect("bulk re-apply")
        .text()
        .await
        .expect("body");
    // The next click takes those not re-applied yet: none.
    assert!(second.contains("0 receipts re-applied"), "{second}");
    assert_eq!(app.messages("ORDER_PAID").await, 3, "applied once");
    let stored = receipts(&app).await;
    assert!(
        stored
            .iter()
            .all(|r| r.reapply_outcome.as_deref() == Some("applied"))
    );

    // One receipt, from its page.
    let one = no_redirects()
        .post(app.url(&format!("/admin/console/receipts/{}/reapply", stored[0].id)))
        .bearer_auth(&app.api_token)
        .form_of(&[("csrf", "")])
        .send()
        .await
        .expect("re-apply");
    assert_eq!(one.status(), 303);
    let (status, _, page) = get(&app, &format!("/admin/console/receipts/{}", stored[0].id)).await;
    assert_eq!(status, 200);
    assert!(page.contains("Last re-applied"), "{page}");
    assert!(page.contains("<code>duplicate</code>"), "{page}");
    assert_eq!(app.messages("ORDER_PAID").await, 3, "applied once");
}

/// A transfer in every state the page tells apart, the payload in its payee and its
/// `package_info`; an anomaly about one of them and one about a transfer never started here.
async fn seeded_transfers(app: &TestApp) {
    use paynotify::notice::ChannelId::{Alipay, Wechat};
    use paynotify::transfer::TransferState as S;
    for (no, channel) in [
        ("TC1", Wechat),
        ("TC2", Wechat),
        ("TC3", Wechat),
        ("TC30", Wechat),
        ("TC4", Alipay),
        ("TC5", Wechat),
        ("TC6", Wechat),
    ] {
        transfer_ops::record(app, no, channel, 300, XSS).await;
    }
    let bill = "1330000071100999991182020050700019480001";
    let mut confirm = transfer_ops::seen(
        "TC2",
        S::WaitUserConfirm,
        "WAIT_USER_CONFIRM",
        300,
        MCHID,
        bill,
    );
    confirm.package_info = Some(XSS.to_owned());
    let moves = [
        (Wechat, confirm),
        // Another amount under another bill number: an anomaly, the transfer not moved.
        (
            Wechat,
            transfer_ops::seen("TC3", S::Success, "SUCCESS", 999, MCHID, "BILL-OTHER"),
        ),
        (
            Wechat,
            transfer_ops::seen("TC3", S::Success, "SUCCESS", 300, MCHID, bill),
        ),
        (
            Wechat,
            transfer_ops::seen("TC30", S::Fail, "FAIL", 300, MCHID, bill),
        ),
        (
            Alipay,
            transfer_ops::seen(
                "TC4",
                S::Processing,
                "DEALING",
                300,
                transfer_ops::APP_ID,
                bill,
            ),
        ),
        (
            Wechat,
            transfer_ops::seen("TC5", S::Transfering, "TRANSFERING", 300, MCHID, bill),
        ),
        (
            Wechat,
            transfer_ops::seen("TC6", S::Cancelled, "CANCELLED", 300, MCHID, bill),
        ),
        (
            Wechat,
            transfer_ops::seen(
                "TNOBODY1",
                S::Success,
                "SUCCESS",
                5000,
                MCHID,
                "BILL-NOBODY",
            ),
        ),
    ];
    for (channel, seen) in &moves {
        transfer_ops::apply(app, *channel, seen).await;
    }
}

async fn post_cancel(app: &TestApp, no: &str) -> (StatusCode, String, String) {
    let response = no_redirects()
        .post(app.url(&format!("/admin/console/transfers/{no}/cancel")))
        .bearer_auth(&app.api_token)
        .form_of(&[("csrf", "")])
        .send()
        .await
        .expect("cancel");
    let status = response.status();
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, location, response.text().await.expect("body"))
}

async fn the_transfers_page_filters_by_status_and_a_transfer_shows_its_events_and_cancel(
    backend: Backend,
) {
    let app = transfer_ops::app_with(backend, |_| {}).await;
    seeded_transfers(&app).await;
    let pages = [
        (
            "/admin/console/transfers",
            vec!["TC1", "TC2", "TC4", "TC6", "&lt;script&gt;"],
        ),
        ("/admin/console/transfers?status=", vec!["TC1", "TC6"]),
        (
            "/admin/console/transfers?status=WAIT_USER_CONFIRM",
            vec!["TC2"],
        ),
        ("/admin/console/transfers?status=CANCELLED", vec!["TC6"]),
        (
            "/admin/console/transfers?out_bill_no=TC4",
            vec!["TC4", "DEALING"],
        ),
        (
            "/admin/console/transfers/TC1",
            vec![
                "the provider has not answered",
                r#"action="/admin/console/transfers/TC1/cancel""#,
            ],
        ),
        (
            "/admin/console/transfers/TC2",
            vec![
                "WAIT_USER_CONFIRM",
                "&lt;img src=x",
                r#"action="/admin/console/transfers/TC2/cancel""#,
            ],
        ),
        (
            "/admin/console/transfers/TC3",
            vec![
                "TRANSFER_SUCCEEDED",
                "TRANSFER_ANOMALY",
                "AMOUNT_MISMATCH",
                "TC3:wechat:BILL-OTHER",
                "No cancel: the transfer is SUCCESS: final",
            ],
        ),
        (
            "/admin/console/transfers/TC4",
            vec!["No cancel: only WeChat transfers can be cancelled"],
        ),
        (
            "/admin/console/transfers/TC5",
            vec!["No cancel: the user confirmed"],
        ),
        (
            "/admin/console/anomalies",
            vec![
                "transfer-anomalies",
                "UNKNOWN_TRANSFER",
                "TNOBODY1",
                "AMOUNT_MISMATCH",
            ],
        ),
    ];
    for (path, expected) in &pages {
        let (status, _, html) = get(&app, path).await;
        assert_eq!(status, 200, "{path}: {html}");
        for e in expected {
            assert!(html.contains(e), "{path} lacks {e:?}: {html}");
        }
        assert!(
            html.contains(r#"href="/admin/console/transfers""#),
            "{path}: in the nav"
        );
        assert_inert(path, &html);
    }
    let (_, _, waiting) = get(&app, "/admin/console/transfers?status=WAIT_USER_CONFIRM").await;
    assert!(
        !waiting.contains(">TC1<") && !waiting.contains(">TC6<"),
        "{waiting}"
    );
    // A transfer's events are its own: not TC30's, whose number starts with TC3.
    let (_, _, tc3) = get(&app, "/admin/console/transfers/TC3").await;
    assert!(
        !tc3.contains("TC30:wechat") && !tc3.contains("TRANSFER_FAILED"),
        "{tc3}"
    );
    assert!(
        !tc3.contains("/cancel"),
        "no cancel button for a final transfer"
    );
    let (status, _, html) = get(&app, "/admin/console/transfers?status=<b>").await;
    assert_eq!(status, 400);
    assert!(!html.contains("<b>\""), "{html}");
    assert_eq!(get(&app, "/admin/console/transfers/TNOSUCH").await.0, 404);

    // Cancel: refused without asking WeChat where the contract says so, already done, and
    // WeChat out of reach (a closed port): the same answers as the JSON API's.
    for (no, status, says) in [
        ("TC3", 409, "final"),
        ("TC4", 409, "only WeChat"),
        ("TC5", 409, "the user confirmed"),
        ("TNOSUCH", 404, "no such transfer"),
        ("TC2", 503, "did not answer the cancel usably"),
    ] {
        let (answered, _, html) = post_cancel(&app, no).await;
        assert_eq!(answered.as_u16(), status, "{no}: {html}");
        assert!(html.contains(says), "{no}: {html}");
    }
    let (status, location, _) = post_cancel(&app, "TC6").await;
    assert_eq!(status, 303);
    assert_eq!(location, "/admin/console/transfers/TC6?cancel=already");
    let (_, _, html) = get(&app, &location).await;
    assert!(html.contains("Already CANCELLED"), "{html}");
    // From another site: refused before anything is asked.
    let cross = no_redirects()
        .post(app.url("/admin/console/transfers/TC2/cancel"))
        .bearer_auth(&app.api_token)
        .header("sec-fetch-site", "cross-site")
        .form_of(&[("csrf", "")])
        .send()
        .await
        .expect("cancel");
    assert_eq!(cross.status(), 403);
    let tc2 = app.transfers.get("TC2").await.expect("get").expect("TC2");
    assert_eq!(tc2.provider_state.as_deref(), Some("WAIT_USER_CONFIRM"));

    // Transfers off: the page still shows them, the cancel is refused.
    let url = transfer_ops::closed_port();
    let off = app
        .rebuild(move |s| {
            crate::reconcile::configure(s, &url);
            s.transfers.enabled = false;
        })
        .await;
    assert_eq!(get(&off, "/admin/console/transfers/TC2").await.0, 200);
    let (status, _, html) = post_cancel(&off, "TC2").await;
    assert_eq!(status, 403, "{html}");
    assert!(html.contains("transfers.enabled"), "{html}");
}

/// A stored account through the console: listed beside the file's, its rotation overlap
/// shown, disabled with its button (and the disable is the API's: live at once).
async fn the_merchants_page_lists_the_accounts_and_disables_a_stored_one(backend: Backend) {
    const SUB: &str = "1900000301";
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.secrets.master_key = Secret::new("cGF5bm90aWZ5LWNvbnNvbGUtbWVyY2hhbnRzLWtleTI=");
    })
    .await;
    let added = app
        .client
        .post(app.url("/admin/merchants"))
        .bearer_auth(&app.api_token)
        .json(&serde_json::json!({
            "channel": "wechat", "account": SUB, "mode": "partner_sub", "sp_account": "1900000001",
        }))
        .send()
        .await
        .expect("add");
    assert_eq!(added.status(), 201);
    let (status, _, html) = get(&app, "/admin/console/merchants").await;
    assert_eq!(status, 200, "{html}");
    for e in [
        "1900000001",
        "1900000002",
        SUB,
        "partner_sub",
        "config",
        "(rotation overlap)",
    ] {
        assert!(html.contains(e), "lacks {e:?}: {html}");
    }
    let disable = format!("/admin/console/merchants/wechat/{SUB}/disable");
    assert!(html.contains(&format!(r#"action="{disable}""#)), "{html}");
    assert!(
        !html.contains("/admin/console/merchants/wechat/1900000001/disable"),
        "a file account has no Disable: {html}"
    );
    assert_inert("/admin/console/merchants", &html);
    let (status, _, html) = get(&app, "/admin/console/merchants?status=nope").await;
    assert_eq!(status, 400, "{html}");

    let response = no_redirects()
        .post(app.url(&disable))
        .bearer_auth(&app.api_token)
        .form_of(&[("csrf", "")])
        .send()
        .await
        .expect("disable");
    assert_eq!(response.status(), 303);
    let (_, _, html) = get(&app, "/admin/console/merchants?status=disabled").await;
    assert!(html.contains(SUB), "{html}");
    assert!(
        !html.contains("<td>config</td>"),
        "file accounts are enabled: {html}"
    );
    assert_eq!(
        app.store
            .merchant(ChannelId::Wechat, SUB)
            .await
            .expect("read")
            .map(|m| m.status),
        Some(Status::Disabled)
    );
}

crate::on_every_backend!(
    every_console_page_shows_its_rows_escaped,
    the_console_re_applies_refused_receipts_once_the_key_is_fixed,
    the_transfers_page_filters_by_status_and_a_transfer_shows_its_events_and_cancel,
    the_merchants_page_lists_the_accounts_and_disables_a_stored_one,
);

/// Signs in with `token` through the form: the answer.
async fn sign_in(app: &TestApp, token: &str, extra: Option<(&str, &str)>) -> reqwest::Response {
    let mut request = no_redirects()
        .post(app.url("/admin/console/login"))
        .form_of(&[("token", token)]);
    if let Some((name, value)) = extra {
        request = request.header(name, value);
    }
    request.send().await.expect("sign in")
}

/// The `name=value` of a Set-Cookie, and its attributes.
fn session_of(response: &reqwest::Response) -> (String, String) {
    let header = response
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("Set-Cookie")
        .to_owned();
    let (pair, attributes) = header.split_once(';').unwrap_or((&header, ""));
    (pair.trim().to_owned(), attributes.to_owned())
}

async fn with_cookie(app: &TestApp, cookie: &str, path: &str) -> (StatusCode, String) {
    let response = no_redirects()
        .get(app.url(path))
        .header(COOKIE, cookie)
        .send()
        .await
        .expect(path);
    (response.status(), response.text().await.expect("body"))
}

/// The CSRF token a page's forms carry.
fn csrf_in(html: &str) -> String {
    let at = html.find(r#"name="csrf" value=""#).expect("a CSRF field") + 19;
    html[at..].split('"').next().expect("its value").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_with_the_token_and_keeps_a_session_cookie() {
    let app = spawn_app_with(Backend::Sqlite, |s| s.wechat = settings()).await;
    let anonymous = no_redirects()
        .get(app.url(REFUSED))
        .send()
        .await
        .expect("get");
    assert_eq!(anonymous.status(), 401);
    let form = anonymous.text().await.expect("body");
    assert!(form.contains(r#"action="/admin/console/login""#), "{form}");
    let wrong_bearer = no_redirects()
        .get(app.url(REFUSED))
        .bearer_auth("not-the-token")
        .send()
        .await
        .expect("get");
    assert_eq!(wrong_bearer.status(), 401);

    let wrong = sign_in(&app, "not-the-token", None).await;
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get(SET_COOKIE).is_none());
    assert!(
        wrong
            .text()
            .await
            .expect("body")
            .contains("not the API token")
    );

    let right = sign_in(&app, &app.api_token, None).await;
    assert_eq!(right.status(), 303);
    assert_eq!(right.headers()[LOCATION], "/admin/console");
    let (cookie, attributes) = session_of(&right);
    assert!(
        !cookie.contains(&app.api_token),
        "the cookie never holds the token"
    );
    for attribute in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/admin/console",
        "Max-Age=28800",
    ] {
        assert!(
            attributes.contains(attribute),
            "{attribute} in {attributes}"
        );
    }
    // Even to a browser on this machine: a TLS proxy here may relay it without a header.
    assert!(
        attributes.contains("Secure"),
        "Secure from loopback too: {attributes}"
    );
    let (status, page) = with_cookie(&app, &cookie, REFUSED).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Sign out"), "{page}");

    // A tampered cookie, and the session past its 8 hours.
    let tampered = cookie.replacen('=', "=1", 1);
    assert_eq!(with_cookie(&app, &tampered, REFUSED).await.0, 401);
    app.clock.advance(8 * 3600 + 1);
    assert_eq!(with_cookie(&app, &cookie, REFUSED).await.0, 401);

    // Relayed by a proxy (TLS ends there): Secure.
    let relayed = sign_in(
        &app,
        &app.api_token,
        Some(("x-forwarded-for", "203.0.113.9")),
    )
    .await;
    assert_eq!(relayed.status(), 303);
    assert!(session_of(&relayed).1.contains("Secure"));

    // A console opened over plain http on this machine, as configured: a browser here gets
    // its cookie without Secure (it would never send it back), a relayed request still with.
    let plain = app.rebuild(|s| s.server.console_plain_http = true).await;
    let local = sign_in(&plain, &plain.api_token, None).await;
    assert_eq!(local.status(), 303);
    let (_, attributes) = session_of(&local);
    assert!(!attributes.contains("Secure"), "{attributes}");
    let relayed = sign_in(
        &plain,
        &plain.api_token,
        Some(("x-forwarded-for", "203.0.113.9")),
    )
    .await;
    assert!(session_of(&relayed).1.contains("Secure"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_without_its_csrf_token_or_from_another_site_changes_nothing() {
    let app = spawn_app_with(Backend::Sqlite, |s| s.wechat = settings()).await;
    seeded(&app).await;
    let dead = app
        .store
        .messages(Some(2), 10)
        .await
        .expect("messages")
        .pop()
        .expect("a dead letter");
    let (cookie, _) = session_of(&sign_in(&app, &app.api_token, None).await);
    let (_, page) = with_cookie(&app, &cookie, "/admin/console/dead").await;
    let csrf = csrf_in(&page);
    let (other, _) = {
        app.clock.advance(1);
        session_of(&sign_in(&app, &app.api_token, None).await)
    };
    let (_, other_page) = with_cookie(&app, &other, "/admin/console/dead").await;
    let other_csrf = csrf_in(&other_page);
    assert_ne!(csrf, other_csrf, "a token is bound to its session");
    let action = app.url(&format!("/admin/console/dead/{}/redrive", dead.id));
    let post = |csrf: &str, headers: &[(&str, &str)]| {
        let mut request = no_redirects()
            .post(&action)
            .header(COOKIE, &cookie)
            .form_of(&[("csrf", csrf)]);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send()
    };
    let origin = app.address.clone();
    for (why, csrf, headers) in [
        ("no token", "", vec![]),
        ("another session's token", other_csrf.as_str(), vec![]),
        (
            "another site",
            csrf.as_str(),
            vec![("origin", "http://evil.example")],
        ),
        (
            "a sibling site",
            csrf.as_str(),
            vec![("sec-fetch-site", "same-site")],
        ),
        ("a sandboxed frame", csrf.as_str(), vec![("origin", "null")]),
    ] {
        let refused = post(csrf, &headers).await.expect("post");
        assert_eq!(refused.status(), 403, "{why}");
        let still = app.store.message_status(dead.id).await.expect("status");
        assert_eq!(still, Some(2), "{why}: nothing changed");
    }
    // No csrf field at all; and the bearer token (a gateway adding it to every request of a
    // browser) posted from another site.
    let missing = no_redirects()
        .post(&action)
        .header(COOKIE, &cookie)
        .form_of(&[])
        .send()
        .await
        .expect("post");
    assert_eq!(missing.status(), 403, "no csrf field");
    let bearer_elsewhere = no_redirects()
        .post(&action)
        .bearer_auth(&app.api_token)
        .header("sec-fetch-site", "cross-site")
        .form_of(&[])
        .send()
        .await
        .expect("post");
    assert_eq!(bearer_elsewhere.status(), 403, "bearer, from another site");
    assert_eq!(
        app.store.message_status(dead.id).await.expect("status"),
        Some(2)
    );
    let done = post(
        &csrf,
        &[
            ("origin", origin.as_str()),
            ("sec-fetch-site", "same-origin"),
        ],
    )
    .await
    .expect("post");
    assert_eq!(done.status(), 303);
    assert_eq!(
        app.store.message_status(dead.id).await.expect("status"),
        Some(0)
    );
    // The session is ended by its form.
    let out = no_redirects()
        .post(app.url("/admin/console/logout"))
        .header(COOKIE, &cookie)
        .form_of(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("logout");
    assert_eq!(out.status(), 303);
    assert!(session_of(&out).1.contains("Max-Age=0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_loopback_console_is_open_and_its_forms_still_need_their_csrf() {
    let app = spawn_app_with(Backend::Sqlite, |s| {
        s.wechat = settings();
        s.server.api_token = Secret::new("");
    })
    .await;
    seeded(&app).await;
    let page = no_redirects()
        .get(app.url("/admin/console/dead"))
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), 200);
    let csrf = csrf_in(&page.text().await.expect("body"));
    let dead = app.store.messages(Some(2), 10).await.expect("messages")[0].id;
    let action = app.url(&format!("/admin/console/dead/{dead}/redrive"));
    let forged = no_redirects()
        .post(&action)
        .form_of(&[("csrf", "")])
        .send()
        .await
        .expect("post");
    assert_eq!(forged.status(), 403, "without the page's CSRF token");
    // With the right token (say, read through a rebinding page) but from another site, or
    // naming another host (DNS rebinding: the browser thinks it is that site).
    for (header, value) in [
        ("origin", "http://evil.example"),
        ("sec-fetch-site", "cross-site"),
        ("host", "evil.example"),
    ] {
        let refused = no_redirects()
            .post(&action)
            .header(header, value)
            .form_of(&[("csrf", csrf.as_str())])
            .send()
            .await
            .expect("post");
        assert_eq!(refused.status(), 403, "{header}: {value}");
    }
    assert_eq!(
        app.store.message_status(dead).await.expect("status"),
        Some(2)
    );
    let app = &app;
    let get_with = |path: &'static str, header: &'static str, value: &'static str| async move {
        let response = no_redirects()
            .get(app.url(path))
            .header(header, value)
            .send()
            .await
            .expect("get");
        response.status()
    };
    for (path, header, value, status) in [
        ("/admin/console/dead", "host", "evil.example:8080", 403),
        ("/admin/messages", "host", "evil.example:8080", 403),
        ("/admin/messages", "host", "localhost", 200),
        ("/admin/console/dead", "x-forwarded-for", "203.0.113.9", 403),
    ] {
        assert_eq!(
            get_with(path, header, value).await,
            status,
            "{path} with {header}: {value}"
        );
    }
    let done = no_redirects()
        .post(&action)
        .form_of(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("post");
    assert_eq!(done.status(), 303);
    assert_eq!(
        app.store.message_status(dead).await.expect("status"),
        Some(0)
    );
}

/// The console in a real browser: signed in through its form, every page rendered with the
/// payload inert (no script ran, no element was injected: the payload is text), a re-apply
/// and a redrive clicked; a screenshot of each page in `target/tmp/console-screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_browser_the_console_signs_in_shows_every_page_inert_and_its_buttons_work() {
    let app = spawn_app_with(Backend::Sqlite, |s| s.wechat = settings()).await;
    seeded(&app).await;
    // Two more refusals of other kinds, for the screenshot: no signature headers at all, and
    // a timestamp out of WeChat's window.
    let bare = app
        .client
        .post(app.url("/notify/wechat/pay"))
        .body("{}")
        .send()
        .await;
    assert_eq!(bare.expect("notify").status(), 400);
    let mut stale = paid(&app, &sandbox('A'), "CON-2", 300);
    stale.set_header("Wechatpay-Timestamp", "1700000000");
    assert_eq!(pay(&app, &stale).await.0, 401);
    app.receipts_stored(3).await;
    let browser = Browser::start().await;
    browser.goto(&app.url("/admin/console")).await;
    assert!(
        browser.url().await.ends_with("/admin/console"),
        "shown the form in place"
    );
    browser.screenshot("sign-in").await;
    browser.type_into("#token", &app.api_token).await;
    browser.click("button[type=submit]").await;
    browser.wait_for("#refused").await;
    assert!(
        browser.url().await.ends_with(REFUSED),
        "{}",
        browser.url().await
    );

    let inert =
        "return [typeof window.__xss, document.querySelectorAll('script, img[src=x]').length]";
    let pages = [
        ("refused", REFUSED, "#refused"),
        ("anomalies", "/admin/console/anomalies", "#anomalies"),
        ("dead-letters", "/admin/console/dead", "#dead"),
        ("orders", "/admin/console/orders", "#orders"),
        ("reconcile", "/admin/console/reconcile", "h1"),
        ("certificates", "/admin/console/certificates", "h1"),
    ];
    for (name, path, table) in pages {
        browser.goto(&app.url(path)).await;
        browser.find(table).await;
        assert_eq!(
            browser.script(inert).await,
            serde_json::json!(["undefined", 0]),
            "{name}"
        );
        browser.screenshot(name).await;
    }

    // The receipt: its body shown as the text it is (the payload's, the first refused).
    let first = receipts(&app).await.last().expect("a receipt").id;
    browser.goto(&app.url(REFUSED)).await;
    browser
        .click(&format!(
            "#refused a[href='/admin/console/receipts/{first}']"
        ))
        .await;
    browser.wait_for("#body").await;
    // In the JSON body its quotes are escaped; the tags are there as text.
    let body = browser.text("#body").await;
    assert!(
        body.contains("<script>window.__xss=1</script><img src=x"),
        "{body}"
    );
    assert!(
        browser.text("#headers").await.contains(XSS),
        "the User-Agent as text"
    );
    assert_eq!(
        browser.script(inert).await,
        serde_json::json!(["undefined", 0])
    );
    browser.screenshot("receipt").await;
    browser.click("form.inline button").await;
    browser.wait_for("#reapply-outcome").await;
    assert!(
        browser
            .text("#reapply-outcome")
            .await
            .contains("bad_signature"),
        "re-applied, still refused: its signature does not verify"
    );
    assert_eq!(app.status_of("CON-1").await, "WAIT_PAY");

    browser.goto(&app.url("/admin/console/dead")).await;
    browser.click("#dead form.inline button").await;
    browser.wait_for("p.notice").await;
    assert!(
        browser.url().await.contains("redriven="),
        "{}",
        browser.url().await
    );
    let pending = app.store.messages(Some(0), 10).await.expect("messages");
    assert!(
        pending.iter().any(|m| m.topic == "PAYMENT_ANOMALY"),
        "redriven"
    );
    browser.screenshot("dead-letters-redriven").await;
    browser.quit().await;
}
