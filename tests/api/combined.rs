//! Combined payments (合单支付), on every backend: the combination's create, repeat and
//! conflicts, its view, and the combined payment applied by the ledger in one transaction,
//! exactly once, by the single-order rules (interface.md, "Combined payments").

use paynotify::notice::{
    ChannelId, Combination, MerchantIds, Notice, NoticeKind, Outcome, SubPayment,
};
use paynotify::time::Clock;
use serde_json::{Value, json};

use crate::support::helpers::{Backend, TestApp, released_together, spawn_app_with};

crate::on_every_backend!(
    a_combination_is_created_once_and_conflicts_are_409,
    bad_combinations_are_400_and_write_nothing,
    a_combined_payment_pays_every_sub_order_once,
    twenty_concurrent_deliveries_make_one_transition_per_sub_order,
    each_sub_order_is_judged_by_the_single_order_rules,
    other_content_under_a_recorded_transaction_is_a_conflict_and_writes_nothing,
    an_unknown_combination_writes_nothing,
    an_alipay_combination_is_mixed_while_part_is_paid,
);

const MCH_A: &str = "1900000001";
const MCH_B: &str = "1900000002";
const APPID_A: &str = "wx0000000000000001";

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| {
        s.wechat = crate::wechat::settings();
        s.alipay = crate::alipay::settings();
    })
    .await
}

async fn post(app: &TestApp, path: &str, body: &Value) -> (u16, Value) {
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

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let response = app
        .client
        .get(app.url(path))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("GET");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A WeChat combination `no` of merchant A with sub-orders `{no}-1`… of 100, 200, … fen,
/// the odd ones of merchant A and the even ones of merchant B.
fn wechat_request(no: &str, subs: usize) -> Value {
    let sub_orders: Vec<Value> = (1..=subs)
        .map(|i| {
            json!({
                "order_no": format!("{no}-{i}"),
                "amount_fen": 100 * i,
                "account": if i % 2 == 1 { MCH_A } else { MCH_B },
                "subject": format!("shop {i}"),
            })
        })
        .collect();
    json!({"combine_out_trade_no": no, "channel": "wechat", "account": MCH_A,
           "sub_orders": sub_orders})
}

async fn create(app: &TestApp, body: &Value) -> Value {
    let (status, view) = post(app, "/combined-orders", body).await;
    assert_eq!(status, 201, "{view}");
    view
}

/// The combined payment of `no` as WeChat would notify it: every sub-order of the request
/// paid (`SUCCESS`) with transaction `T{out_trade_no}`, signed by merchant A.
fn combined_paid(request: &Value) -> Notice {
    let subs = request["sub_orders"]
        .as_array()
        .expect("sub_orders")
        .iter()
        .map(|s| {
            let no = s["order_no"].as_str().expect("order_no");
            SubPayment {
                out_trade_no: no.to_owned(),
                transaction_id: format!("T{no}"),
                amount_fen: s["amount_fen"].as_i64().expect("amount"),
                currency: "CNY".into(),
                mchid: s["account"].as_str().unwrap_or(MCH_A).to_owned(),
                trade_state: "SUCCESS".into(),
                occurred_at: None,
            }
        })
        .collect();
    combined(request["combine_out_trade_no"].as_str().expect("no"), subs)
}

fn combined(no: &str, subs: Vec<SubPayment>) -> Notice {
    Notice {
        channel: ChannelId::Wechat,
        out_trade_no: no.to_owned(),
        transaction_id: String::new(),
        amount_fen: subs.iter().map(|s| s.amount_fen).sum(),
        currency: "CNY".into(),
        merchant: MerchantIds {
            merchant_id: MCH_A.into(),
            app_id: Some(APPID_A.into()),
        },
        merchant_matches: true,
        occurred_at: None,
        kind: NoticeKind::Combined(Box::new(Combination { subs })),
    }
}

fn subs_of(n: &mut Notice) -> &mut Vec<SubPayment> {
    match &mut n.kind {
        NoticeKind::Combined(c) => &mut c.subs,
        _ => unreachable!("a combined notice"),
    }
}

async fn apply(app: &TestApp, n: &Notice) -> Outcome {
    app.store
        .apply(n, app.clock.now())
        .await
        .expect("no database error")
}

async fn a_combination_is_created_once_and_conflicts_are_409(backend: Backend) {
    let app = app(backend).await;
    let request = wechat_request("C-1", 3);
    let view = create(&app, &request).await;
    assert_eq!(view["combine_out_trade_no"], "C-1");
    assert_eq!(view["channel"], "wechat");
    assert_eq!(view["account"], MCH_A);
    assert_eq!(view["status"], "WAIT_PAY");
    assert_eq!(view["amount_fen"], 600);
    let subs = view["sub_orders"].as_array().expect("sub_orders");
    let nos: Vec<&str> = subs
        .iter()
        .map(|s| s["order_no"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        nos,
        ["C-1-1", "C-1-2", "C-1-3"],
        "in the order of the request"
    );
    assert_eq!(subs[1]["account"], MCH_B);
    assert_eq!(subs[1]["status"], "WAIT_PAY");
    let mut keys: Vec<&str> = subs[0]
        .as_object()
        .expect("sub")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "account",
            "amount_fen",
            "closed_at",
            "order_no",
            "paid_at",
            "refunded_fen",
            "status",
            "transaction_id"
        ]
    );
    // Each sub-order is an ordinary order that names its combination.
    let order = app.get_order("C-1-2").await;
    assert_eq!(order["combine_out_trade_no"], "C-1");
    assert_eq!(order["amount_fen"], 200);
    app.create_order("ORD-1", 100).await;
    assert_eq!(
        app.get_order("ORD-1").await["combine_out_trade_no"],
        Value::Null
    );

    // The same body again (keys in another order): 200, the combination as it is now.
    let mut reordered = serde_json::Map::new();
    for key in ["sub_orders", "account", "channel", "combine_out_trade_no"] {
        reordered.insert(key.to_owned(), request[key].clone());
    }
    let (status, again) = post(&app, "/combined-orders", &Value::Object(reordered)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again, view);
    // Another body under the number: 409, nothing changed.
    let mut other = request.clone();
    other["sub_orders"][0]["amount_fen"] = json!(101);
    let (status, body) = post(&app, "/combined-orders", &other).await;
    assert_eq!(status, 409, "{body}");
    // A sub-order number that exists (an ordinary order, or another combination's): 409,
    // and nothing of the new combination is written.
    for taken in ["ORD-1", "C-1-3"] {
        let mut request = wechat_request("C-2", 2);
        request["sub_orders"][1]["order_no"] = json!(taken);
        let (status, body) = post(&app, "/combined-orders", &request).await;
        assert_eq!(status, 409, "{taken}: {body}");
        assert_eq!(get(&app, "/combined-orders/C-2").await.0, 404);
        assert_eq!(app.db.count("orders WHERE order_no = 'C-2-1'").await, 0);
    }
    // The conflicts are checked before the accounts.
    let mut both = wechat_request("C-1", 1);
    both["account"] = json!("1999999999");
    assert_eq!(post(&app, "/combined-orders", &both).await.0, 409);
    assert_eq!(get(&app, "/combined-orders/NOPE").await.0, 404);
    // A combination may share its number with one of its sub-orders.
    let mut same = wechat_request("C-3", 1);
    same["sub_orders"][0]["order_no"] = json!("C-3");
    assert_eq!(post(&app, "/combined-orders", &same).await.0, 201);
    assert_eq!(app.db.count("combined_order").await, 2);
    assert_eq!(app.db.count("orders").await, 5);
}

async fn bad_combinations_are_400_and_write_nothing(backend: Backend) {
    let app = app(backend).await;
    let mut cases: Vec<(&str, Value)> = Vec::new();
    cases.push(("no sub-orders", wechat_request("B-1", 0)));
    cases.push(("51 sub-orders", wechat_request("B-1", 51)));
    for amount in [
        json!(0),
        json!(-5),
        json!(1.5),
        json!("100"),
        json!(1_000_000_001),
    ] {
        let mut r = wechat_request("B-1", 2);
        r["sub_orders"][1]["amount_fen"] = amount;
        cases.push(("amount", r));
    }
    let mut twice = wechat_request("B-1", 2);
    twice["sub_orders"][1]["order_no"] = json!("B-1-1");
    cases.push(("an order_no twice", twice));
    for no in ["", "C#1", &"C".repeat(33)] {
        let mut r = wechat_request("B-1", 1);
        r["combine_out_trade_no"] = json!(no);
        cases.push(("combine_out_trade_no", r));
    }
    let mut channel = wechat_request("B-1", 1);
    channel["channel"] = json!("paypal");
    cases.push(("channel", channel));
    let mut unknown = wechat_request("B-1", 1);
    unknown["account"] = json!("1999999999");
    cases.push(("an unknown combination account", unknown));
    let mut sub = wechat_request("B-1", 2);
    sub["sub_orders"][1]["account"] = json!("1999999999");
    cases.push(("an unknown sub-order account", sub));
    let mut field = wechat_request("B-1", 1);
    field["extra"] = json!(1);
    cases.push(("an unknown field", field));
    for (what, body) in cases {
        let (status, answer) = post(&app, "/combined-orders", &body).await;
        assert_eq!(status, 400, "{what}: {answer}");
        assert!(answer["error"].is_string(), "{what}: {answer}");
    }
    assert_eq!(app.db.count("combined_order").await, 0);
    assert_eq!(app.db.count("orders").await, 0);
    let response = app
        .client
        .post(app.url("/combined-orders"))
        .json(&wechat_request("B-2", 1))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 401);
}

async fn a_combined_payment_pays_every_sub_order_once(backend: Backend) {
    let app = app(backend).await;
    let request = wechat_request("P-1", 3);
    create(&app, &request).await;
    let notice = combined_paid(&request);
    assert_eq!(apply(&app, &notice).await, Outcome::Applied);
    for (i, no) in ["P-1-1", "P-1-2", "P-1-3"].iter().enumerate() {
        let order = app.get_order(no).await;
        assert_eq!(order["status"], "PAID", "{no}");
        assert_eq!(order["transaction_id"], format!("T{no}"), "{no}");
        assert_eq!(order["amount_fen"], 100 * (i as i64 + 1));
    }
    let paid = app.outbox("ORDER_PAID").await;
    assert_eq!(paid.len(), 3);
    assert!(
        paid.iter()
            .all(|m| m.payload.0["combine_out_trade_no"] == "P-1"),
        "every ORDER_PAID names its combination"
    );
    assert_eq!(app.db.count("pay_callback").await, 3);
    let (_, view) = get(&app, "/combined-orders/P-1").await;
    assert_eq!(view["status"], "PAID");
    // The same notification again, re-stamped: a duplicate, nothing written.
    let mut again = notice.clone();
    for sub in subs_of(&mut again) {
        sub.occurred_at = Some(app.clock.now());
    }
    assert_eq!(apply(&app, &again).await, Outcome::Duplicate);
    assert_eq!(app.db.count("local_message").await, 3);
    assert_eq!(app.db.count("pay_callback").await, 3);
}

async fn twenty_concurrent_deliveries_make_one_transition_per_sub_order(backend: Backend) {
    let app = app(backend).await;
    let request = wechat_request("R-1", 50);
    create(&app, &request).await;
    let notice = combined_paid(&request);
    let now = app.clock.now();
    let outcomes: Vec<Outcome> = released_together(20, |_| {
        let (store, notice) = (app.store.clone(), notice.clone());
        async move { store.apply(&notice, now).await }
    })
    .await
    .into_iter()
    .map(|r| r.expect("no database error"))
    .collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Applied).count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Applied | Outcome::Duplicate)),
        "{outcomes:?}"
    );
    assert_eq!(app.messages("ORDER_PAID").await, 50);
    assert_eq!(app.db.count("local_message").await, 50);
    assert_eq!(app.db.count("pay_callback").await, 50);
    assert_eq!(app.db.count("orders WHERE status = 'PAID'").await, 50);
}

async fn each_sub_order_is_judged_by_the_single_order_rules(backend: Backend) {
    let app = app(backend).await;
    let request = wechat_request("J-1", 6);
    create(&app, &request).await;
    app.create_order("ORD-J", 700).await;
    // J-1-6 is closed before the money arrives.
    let (status, body) = post(&app, "/orders/J-1-6/close", &json!({})).await;
    assert_eq!(
        status, 409,
        "a sub-order of a WeChat combination is closed only whole: {body}"
    );
    app.db
        .execute("UPDATE orders SET status = 'CLOSED' WHERE order_no = 'J-1-6'")
        .await;
    let mut notice = combined_paid(&request);
    {
        let subs = subs_of(&mut notice);
        subs[1].amount_fen += 1; // J-1-2: another amount
        subs[2].mchid = MCH_B.into(); // J-1-3: the sub-order is merchant A's
        subs[3].trade_state = "NOTPAY".into(); // J-1-4: not paid: untouched
        subs.push(SubPayment {
            out_trade_no: "ORD-J".into(),
            transaction_id: "TORD-J".into(),
            amount_fen: 700,
            currency: "CNY".into(),
            mchid: MCH_A.into(),
            trade_state: "SUCCESS".into(),
            occurred_at: None,
        });
        subs.push(SubPayment {
            out_trade_no: "NOWHERE".into(),
            transaction_id: "TNOWHERE".into(),
            amount_fen: 5,
            currency: "CNY".into(),
            mchid: MCH_A.into(),
            trade_state: "SUCCESS".into(),
            occurred_at: None,
        });
    }
    assert_eq!(apply(&app, &notice).await, Outcome::Applied);
    assert_eq!(app.status_of("J-1-1").await, "PAID");
    assert_eq!(app.status_of("J-1-5").await, "PAID");
    for no in ["J-1-2", "J-1-3", "J-1-4"] {
        assert_eq!(app.status_of(no).await, "WAIT_PAY", "{no}");
    }
    assert_eq!(app.status_of("J-1-6").await, "CLOSED");
    assert_eq!(app.status_of("ORD-J").await, "WAIT_PAY");
    let reason = |no: &str| {
        let app = &app;
        let no = no.to_owned();
        async move {
            let anomalies = app.anomalies(&no).await;
            assert_eq!(anomalies.len(), 1, "{no}: {anomalies:?}");
            anomalies[0].0.clone()
        }
    };
    assert_eq!(reason("J-1-2").await, "AMOUNT_MISMATCH");
    assert_eq!(reason("J-1-3").await, "MERCHANT_MISMATCH");
    assert_eq!(reason("J-1-6").await, "PAID_AFTER_CLOSE");
    assert_eq!(reason("ORD-J").await, "NOT_IN_COMBINATION");
    assert_eq!(reason("NOWHERE").await, "NOT_IN_COMBINATION");
    assert_eq!(
        app.anomalies("NOWHERE").await[0].1,
        "NOWHERE:wechat:TNOWHERE"
    );
    // NOT_IN_COMBINATION writes nothing else: no callback row for either.
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no IN ('ORD-J', 'NOWHERE', 'J-1-4')")
            .await,
        0
    );
    let anomaly = app
        .outbox("PAYMENT_ANOMALY")
        .await
        .into_iter()
        .find(|m| m.payload.0["order_no"] == "J-1-2")
        .expect("the amount anomaly");
    assert_eq!(anomaly.payload.0["combine_out_trade_no"], "J-1");
    assert_eq!(get(&app, "/combined-orders/J-1").await.1["status"], "MIXED");
    // The same delivery again: every anomaly raised once, nothing moves.
    let messages = app.db.count("local_message").await;
    assert_eq!(apply(&app, &notice).await, Outcome::Duplicate);
    assert_eq!(app.db.count("local_message").await, messages);
    // J-1-3's payment of the wrong merchant holds its callback key only until a payment of
    // its own merchant arrives, which pays it; the earlier one stays its one anomaly.
    let mut corrected = notice.clone();
    {
        let subs = subs_of(&mut corrected);
        subs[2].mchid = MCH_A.into();
        subs[2].transaction_id = "TJ-1-3-A".into();
    }
    assert_eq!(apply(&app, &corrected).await, Outcome::Applied);
    assert_eq!(app.status_of("J-1-3").await, "PAID");
    assert_eq!(reason("J-1-3").await, "MERCHANT_MISMATCH");
    assert_eq!(apply(&app, &notice).await, Outcome::Duplicate);
    assert_eq!(app.status_of("J-1-3").await, "PAID");

    // A combination notified under another combine_mchid: every sub-order a
    // MERCHANT_MISMATCH, none moved.
    let request = wechat_request("J-2", 2);
    create(&app, &request).await;
    let mut foreign = combined_paid(&request);
    foreign.merchant.merchant_id = MCH_B.into();
    assert_eq!(
        apply(&app, &foreign).await,
        Outcome::Anomaly(paynotify::notice::AnomalyReason::MerchantMismatch)
    );
    for no in ["J-2-1", "J-2-2"] {
        assert_eq!(app.status_of(no).await, "WAIT_PAY");
        assert_eq!(reason(no).await, "MERCHANT_MISMATCH");
    }
}

async fn other_content_under_a_recorded_transaction_is_a_conflict_and_writes_nothing(
    backend: Backend,
) {
    let app = app(backend).await;
    let request = wechat_request("X-1", 3);
    create(&app, &request).await;
    // X-1-3 alone first.
    let mut first = combined_paid(&request);
    subs_of(&mut first).drain(..2);
    assert_eq!(apply(&app, &first).await, Outcome::Applied);
    let messages = app.db.count("local_message").await;
    // The whole combination, with X-1-3's transaction carrying another amount: 409, and
    // X-1-1 and X-1-2, written before X-1-3 was reached, are undone with it.
    let mut contradicting = combined_paid(&request);
    subs_of(&mut contradicting)[2].amount_fen += 7;
    assert_eq!(apply(&app, &contradicting).await, Outcome::Conflict);
    assert_eq!(app.db.count("local_message").await, messages);
    assert_eq!(app.status_of("X-1-1").await, "WAIT_PAY");
    assert_eq!(app.status_of("X-1-2").await, "WAIT_PAY");
    assert_eq!(app.db.count("pay_callback").await, 1);
    // The true delivery still applies the rest.
    assert_eq!(
        apply(&app, &combined_paid(&request)).await,
        Outcome::Applied
    );
    assert_eq!(app.db.count("orders WHERE status = 'PAID'").await, 3);
}

async fn an_unknown_combination_writes_nothing(backend: Backend) {
    let app = app(backend).await;
    let notice = combined_paid(&wechat_request("U-1", 2));
    assert_eq!(apply(&app, &notice).await, Outcome::UnknownOrder);
    assert_eq!(app.db.count("local_message").await, 0);
    assert_eq!(app.db.count("payment_anomaly").await, 0);
    // Created late, the provider's retry applies it.
    create(&app, &wechat_request("U-1", 2)).await;
    assert_eq!(apply(&app, &notice).await, Outcome::Applied);
}

async fn an_alipay_combination_is_mixed_while_part_is_paid(backend: Backend) {
    let app = app(backend).await;
    let app_id = crate::alipay::sandbox().app_id;
    let seller = crate::alipay::sandbox().seller_id;
    let request = json!({"combine_out_trade_no": "M-1", "channel": "alipay", "account": app_id,
        "sub_orders": [{"order_no": "M-1-1", "amount_fen": 100}, {"order_no": "M-1-2", "amount_fen": 200}]});
    let view = create(&app, &request).await;
    assert_eq!(view["sub_orders"][1]["account"], app_id.as_str());
    // Alipay notifies each trade on its own, with an ordinary notification.
    let one = Notice {
        channel: ChannelId::Alipay,
        kind: NoticeKind::Paid,
        out_trade_no: "M-1-1".into(),
        transaction_id: "2026M11".into(),
        amount_fen: 100,
        currency: "CNY".into(),
        merchant: MerchantIds {
            merchant_id: seller,
            app_id: Some(app_id),
        },
        merchant_matches: true,
        occurred_at: None,
    };
    assert_eq!(apply(&app, &one).await, Outcome::Applied);
    assert_eq!(apply(&app, &one).await, Outcome::Duplicate);
    let (_, view) = get(&app, "/combined-orders/M-1").await;
    assert_eq!(view["status"], "MIXED");
    assert_eq!(view["sub_orders"][0]["status"], "PAID");
    let paid = app.outbox("ORDER_PAID").await;
    assert_eq!(paid.len(), 1);
    assert_eq!(paid[0].payload.0["combine_out_trade_no"], "M-1");
    assert_eq!(paid[0].payload.0["order_no"], "M-1-1");
}
