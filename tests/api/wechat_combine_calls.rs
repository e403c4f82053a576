//! The WeChat client's combine query and combine close against the stand-in
//! (`support/wechat_combine.rs`): a combination is found with every sub-order and its state,
//! paid or not; an answer that is not WeChat's, or names another combination or merchant, is
//! never found; a close lists exactly the sub-orders of the create and closes all or none; a
//! close without an answer is no answer. Alipay has no combine API and is never asked.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use paynotify::channel::api::{CloseAnswer, CombineAnswer, Failure, ProviderApi};
use paynotify::config::Settings;
use paynotify::notice::{ChannelId, Notice, NoticeKind, SubPayment};
use paynotify::time::Timestamp;

use crate::reconcile::{APP_ID, MCHID, configure, fake};
use crate::support::provider::{FakeProvider, Lie, Signing};
use crate::support::wechat_combine::{Call, State, transaction_id};

/// The combination's app: the merchant [`MCHID`]'s.
const APPID: &str = "wx0000000000000001";
/// A second merchant, settled one of the sub-orders.
const OTHER_MCHID: &str = "1900000002";

/// Shorter than the stand-in's stall (3 s), long enough for every other answer.
const TIMEOUT_MS: u64 = 2000;

/// Both clients, built as the service builds them, against one stand-in.
struct Desk {
    fake: FakeProvider,
    wechat: Arc<dyn ProviderApi>,
    alipay: Arc<dyn ProviderApi>,
    now: Timestamp,
}

async fn desk() -> Desk {
    paynotify::telemetry::init_for_tests();
    let fake = fake().await;
    let mut settings = Settings::default();
    configure(&mut settings, &fake.url);
    settings.provider_api.timeout_ms = TIMEOUT_MS;
    let now = Timestamp::new(chrono::Utc::now());
    let mounted = paynotify::providers::mount_all(&settings, now).expect("providers");
    let api = |channel: ChannelId| {
        mounted
            .iter()
            .filter_map(|m| m.api.clone())
            .find(|a| a.channel() == channel)
            .expect("an API client")
    };
    Desk {
        wechat: api(ChannelId::Wechat),
        alipay: api(ChannelId::Alipay),
        fake,
        now,
    }
}

/// The sub-orders of combination `no`: `(mchid, out_trade_no, amount_fen)`.
fn subs_of(no: &str) -> Vec<(String, String, i64)> {
    vec![
        (MCHID.to_owned(), format!("{no}-1"), 100),
        (OTHER_MCHID.to_owned(), format!("{no}-2"), 250),
    ]
}

/// The sub-orders as the close lists them: `(mchid, out_trade_no)`.
fn recorded(no: &str) -> Vec<(String, String)> {
    subs_of(no)
        .into_iter()
        .map(|(mchid, out_trade_no, _)| (mchid, out_trade_no))
        .collect()
}

impl Desk {
    /// Holds combination `no` of [`MCHID`] at the stand-in, not paid.
    fn register(&self, no: &str) {
        let subs = subs_of(no);
        let subs: Vec<(&str, &str, i64)> = subs
            .iter()
            .map(|(m, o, fen)| (m.as_str(), o.as_str(), *fen))
            .collect();
        self.fake
            .state
            .wechat_combinations
            .register(no, MCHID, APPID, &subs);
    }

    async fn query(&self, no: &str) -> CombineAnswer {
        self.wechat.combine_query(MCHID, no, self.now).await
    }

    async fn close(&self, no: &str, subs: &[(String, String)]) -> CloseAnswer {
        self.wechat
            .combine_close(MCHID, no, APPID, subs, self.now)
            .await
    }

    /// What the query finds, or a panic naming what it got instead.
    async fn found(&self, no: &str) -> Notice {
        match self.query(no).await {
            CombineAnswer::Found(notice) => *notice,
            other => panic!("{no}: found, not {other:?}"),
        }
    }

    fn state(&self, no: &str) -> Option<State> {
        self.fake.state.wechat_combinations.state(no)
    }
}

fn subs(notice: &Notice) -> &[SubPayment] {
    match &notice.kind {
        NoticeKind::Combined(c) => &c.subs,
        other => panic!("a combination, not {other:?}"),
    }
}

fn unexpected_naming(answer: &CloseAnswer, code: &str) -> bool {
    matches!(answer, CloseAnswer::Failed(Failure::Unexpected(d)) if d.contains(code))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaid_combination_is_found_with_every_sub_order_not_paid() {
    let desk = desk().await;
    desk.register("CQ1");
    let notice = desk.found("CQ1").await;
    assert_eq!(notice.channel, ChannelId::Wechat);
    assert_eq!(notice.out_trade_no, "CQ1");
    assert_eq!(notice.transaction_id, "");
    assert_eq!(notice.amount_fen, 350);
    assert_eq!(notice.merchant.merchant_id, MCHID);
    assert_eq!(notice.merchant.app_id.as_deref(), Some(APPID));
    assert!(notice.merchant_matches);
    assert_eq!(notice.occurred_at, None);
    let subs = subs(&notice);
    assert_eq!(subs.len(), 2);
    for (sub, (mchid, no, fen)) in subs.iter().zip(subs_of("CQ1")) {
        assert_eq!(sub.trade_state, "NOTPAY");
        assert!(!sub.is_paid());
        assert_eq!(sub.out_trade_no, no);
        assert_eq!(sub.mchid, mchid);
        assert_eq!(sub.amount_fen, fen);
        assert_eq!(sub.transaction_id, "");
    }
    // One request, signed by the combination's merchant, without a query string.
    let asked = desk.fake.state.wechat_combinations.asked();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].call, Call::Query);
    assert_eq!(asked[0].combine_out_trade_no, "CQ1");
    assert_eq!(desk.fake.state.refused.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_combination_is_found_with_each_sub_order_s_own_payment() {
    let desk = desk().await;
    desk.register("CQ2");
    desk.fake.state.wechat_combinations.pay("CQ2");
    let notice = desk.found("CQ2").await;
    assert!(notice.merchant_matches);
    assert_eq!(notice.amount_fen, 350);
    assert!(notice.occurred_at.is_some(), "the latest success_time");
    let subs = subs(&notice);
    assert_eq!(subs.len(), 2);
    for (sub, (mchid, no, fen)) in subs.iter().zip(subs_of("CQ2")) {
        assert_eq!(sub.trade_state, "SUCCESS");
        assert!(sub.is_paid());
        assert_eq!(sub.transaction_id, transaction_id(&no));
        assert_eq!(sub.out_trade_no, no);
        assert_eq!(sub.mchid, mchid);
        assert_eq!(sub.amount_fen, fen);
        assert_eq!(sub.currency, "CNY");
        assert!(sub.occurred_at.is_some());
    }
    // The ordinary query does not see a sub-order (WeChat's FAQ).
    let ordinary = desk.wechat.query(MCHID, "CQ2-1", desk.now).await;
    assert_eq!(ordinary, paynotify::channel::api::TradeAnswer::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_combination_is_not_found() {
    let desk = desk().await;
    assert_eq!(desk.query("CQ-NONE").await, CombineAnswer::NotFound);
    // Another merchant's combination is not the signing merchant's: not found either.
    desk.fake.state.wechat_combinations.register(
        "CQ-THEIRS",
        OTHER_MCHID,
        APPID,
        &[(OTHER_MCHID, "CQ-THEIRS-1", 100)],
    );
    assert_eq!(desk.query("CQ-THEIRS").await, CombineAnswer::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_not_signed_by_wechat_is_never_found() {
    let desk = desk().await;
    desk.register("CQ3");
    desk.fake.state.wechat_combinations.pay("CQ3");
    for signing in [Signing::Unsigned, Signing::Forger] {
        desk.fake.state.sign_with(signing);
        let answer = desk.query("CQ3").await;
        assert!(
            matches!(answer, CombineAnswer::Failed(Failure::BadSignature(_))),
            "{signing:?}: {answer:?}"
        );
        assert_eq!(answer.label(), "bad_signature");
    }
    // Signed by WeChat again: found.
    desk.fake.state.sign_with(Signing::Provider);
    assert!(matches!(desk.query("CQ3").await, CombineAnswer::Found(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_naming_another_merchant_is_unexpected() {
    let desk = desk().await;
    desk.register("CQ4");
    desk.fake.state.wechat_combinations.pay("CQ4");
    desk.fake.state.lie(Lie::OtherMerchant);
    let answer = desk.query("CQ4").await;
    assert!(
        matches!(&answer, CombineAnswer::Failed(Failure::Unexpected(d)) if d.contains("1900009999")),
        "{answer:?}"
    );
    assert_eq!(answer.label(), "unexpected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_of_exactly_the_created_sub_orders_closes_them_all() {
    let desk = desk().await;
    desk.register("CC1");
    assert_eq!(
        desk.close("CC1", &recorded("CC1")).await,
        CloseAnswer::Closed
    );
    assert_eq!(desk.state("CC1"), Some(State::Closed));
    let asked = desk.fake.state.wechat_combinations.asked();
    assert_eq!(asked[0].call, Call::Close);
    assert_eq!(
        asked[0].body,
        serde_json::json!({
            "combine_appid": APPID,
            "sub_orders": [
                { "mchid": MCHID, "out_trade_no": "CC1-1" },
                { "mchid": OTHER_MCHID, "out_trade_no": "CC1-2" }
            ]
        })
    );
    let notice = desk.found("CC1").await;
    assert!(subs(&notice).iter().all(|s| s.trade_state == "CLOSED"));
    // Closing a closed combination is closing it.
    assert_eq!(
        desk.close("CC1", &recorded("CC1")).await,
        CloseAnswer::Closed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_missing_a_sub_order_closes_nothing() {
    let desk = desk().await;
    desk.register("CC2");
    let mut partial = recorded("CC2");
    partial.pop();
    let answer = desk.close("CC2", &partial).await;
    assert!(unexpected_naming(&answer, "PARAM_ERROR"), "{answer:?}");
    assert_eq!(desk.state("CC2"), Some(State::NotPaid));
    // Another merchant for a sub-order, or another app: refused the same way.
    let mut wrong = recorded("CC2");
    wrong[1].0 = MCHID.to_owned();
    let answer = desk.close("CC2", &wrong).await;
    assert!(unexpected_naming(&answer, "PARAM_ERROR"), "{answer:?}");
    let answer = desk
        .wechat
        .combine_close(
            MCHID,
            "CC2",
            "wx0000000000000003",
            &recorded("CC2"),
            desk.now,
        )
        .await;
    assert!(unexpected_naming(&answer, "PARAM_ERROR"), "{answer:?}");
    let notice = desk.found("CC2").await;
    assert!(subs(&notice).iter().all(|s| s.trade_state == "NOTPAY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_combination_is_not_closable_and_an_unknown_one_not_found() {
    let desk = desk().await;
    desk.register("CC3");
    desk.fake.state.wechat_combinations.pay("CC3");
    assert_eq!(
        desk.close("CC3", &recorded("CC3")).await,
        CloseAnswer::NotClosable
    );
    assert_eq!(desk.state("CC3"), Some(State::Paid));
    assert_eq!(
        desk.close("CC-NONE", &recorded("CC-NONE")).await,
        CloseAnswer::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_without_an_answer_is_unreachable_never_a_refusal() {
    let desk = desk().await;
    desk.register("CC4");
    desk.fake.state.stall.store(true, Ordering::SeqCst);
    let answer = desk.close("CC4", &recorded("CC4")).await;
    assert!(
        matches!(answer, CloseAnswer::Failed(Failure::Unreachable(_))),
        "{answer:?}"
    );
    let answer = desk.query("CC4").await;
    assert!(
        matches!(answer, CombineAnswer::Failed(Failure::Unreachable(_))),
        "{answer:?}"
    );
    desk.fake.state.stall.store(false, Ordering::SeqCst);
    // WeChat down: no answer either.
    desk.fake.state.down.store(true, Ordering::SeqCst);
    let answer = desk.close("CC4", &recorded("CC4")).await;
    assert!(
        matches!(answer, CloseAnswer::Failed(Failure::Unreachable(_))),
        "{answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alipay_has_no_combine_api_and_is_never_asked() {
    let desk = desk().await;
    let answer = desk.alipay.combine_query(APP_ID, "CA1", desk.now).await;
    assert!(
        matches!(&answer, CombineAnswer::Failed(Failure::Unexpected(d)) if d.contains("no combine API")),
        "{answer:?}"
    );
    let subs = [(APP_ID.to_owned(), "CA1-1".to_owned())];
    let answer = desk
        .alipay
        .combine_close(APP_ID, "CA1", APP_ID, &subs, desk.now)
        .await;
    assert!(
        matches!(&answer, CloseAnswer::Failed(Failure::Unexpected(d)) if d.contains("no combine API")),
        "{answer:?}"
    );
    assert!(desk.fake.state.calls().is_empty(), "nothing sent");
    assert!(
        desk.fake
            .state
            .arrivals
            .lock()
            .expect("arrivals")
            .is_empty()
    );
}
