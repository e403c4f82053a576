//! The refund call of both providers' clients, against the stand-in providers
//! (`support/provider.rs`, `support/refunds.rs`): a refund done at once carries the notice
//! its notification would, the same call again is the same refund, a refund not done yet is
//! held until the bank finishes, refusals name the provider's code, and an answer that is
//! not the provider's (no answer, unsigned, forged) is never a refund.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use paynotify::channel::Inbound;
use paynotify::channel::api::{
    Failure, ProviderApi, RefundAnswer, RefundCall, RefundReply, RefundState,
};
use paynotify::channel::{Mounted, Provider};
use paynotify::config::Settings;
use paynotify::notice::{ChannelId, Notice};
use paynotify::qa::forge::Delivery;
use paynotify::time::Timestamp;

use crate::reconcile::{APP_ID, MCHID, configure, fake, paid_at, transaction_id};
use crate::support::provider::{FakeProvider, RefundStatus, Refusal, Signing, Trade};

/// Both clients, built as the service builds them, against one stand-in.
struct Desk {
    fake: FakeProvider,
    mounted: Vec<Mounted>,
    now: Timestamp,
}

const CHANNELS: [&str; 2] = ["wechat", "alipay"];

/// The clients' overall timeout here: shorter than a hanging create
/// (`support::refunds::HANG_SECS`), long enough for every other answer.
const TIMEOUT_MS: u64 = 2000;

async fn desk() -> Desk {
    paynotify::telemetry::init_for_tests();
    let fake = fake().await;
    let mut settings = Settings::default();
    configure(&mut settings, &fake.url);
    settings.provider_api.timeout_ms = TIMEOUT_MS;
    let now = Timestamp::new(chrono::Utc::now());
    let mounted = paynotify::providers::mount_all(&settings, now).expect("providers");
    Desk { fake, mounted, now }
}

fn channel_id(channel: &str) -> ChannelId {
    ChannelId::parse(channel).expect("a channel")
}

fn account(channel: &str) -> &'static str {
    match channel {
        "wechat" => MCHID,
        _ => APP_ID,
    }
}

/// A refund of `fen` of order `no`'s payment of `total`, numbered `out_refund_no`.
fn refund_of(channel: &str, no: &str, out_refund_no: &str, fen: i64, total: i64) -> RefundCall {
    RefundCall {
        out_trade_no: no.to_owned(),
        transaction_id: transaction_id(channel, no),
        out_refund_no: out_refund_no.to_owned(),
        amount_fen: fen,
        total_fen: total,
        reason: Some("退货".to_owned()),
    }
}

impl Desk {
    fn api(&self, channel: &str) -> Arc<dyn ProviderApi> {
        self.mounted
            .iter()
            .filter_map(|m| m.api.clone())
            .find(|a| a.channel() == channel_id(channel))
            .expect("an API client")
    }

    fn provider(&self, channel: &str) -> Arc<dyn Provider> {
        self.mounted
            .iter()
            .find(|m| m.provider.channel() == channel_id(channel))
            .expect("a provider")
            .provider
            .clone()
    }

    async fn refund(&self, channel: &str, call: &RefundCall) -> RefundReply {
        self.api(channel)
            .refund(account(channel), call, self.now)
            .await
    }

    async fn query(&self, channel: &str, call: &RefundCall) -> RefundAnswer {
        self.api(channel)
            .refund_query(
                account(channel),
                &call.out_trade_no,
                &call.out_refund_no,
                self.now,
            )
            .await
    }

    /// What `channel`'s notification `d`, come to `route`, decodes to.
    fn admit(&self, channel: &str, d: &Delivery, route: &str) -> Notice {
        let mut headers = HeaderMap::new();
        for (name, value) in &d.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        self.provider(channel)
            .admit(&Inbound {
                headers: &headers,
                body: &d.body,
                now: self.now,
                route: Some(route),
            })
            .expect("the notification verifies")
    }

    /// The refund notification of `call` (done, the trade's refunded total then
    /// `refunded_total`), as the provider would send it, decoded.
    fn notified(&self, channel: &str, call: &RefundCall, refunded_total: i64) -> Notice {
        match channel {
            "wechat" => {
                let sandbox = crate::wechat::sandbox('A');
                let resource = paynotify::qa::forge::wechat::refund(
                    &sandbox,
                    &call.out_trade_no,
                    &call.transaction_id,
                    &call.out_refund_no,
                    call.amount_fen,
                    call.total_fen,
                );
                let d = sandbox
                    .notification("REFUND.SUCCESS", &resource, self.now.unix_seconds())
                    .expect("forge");
                self.admit(channel, &d, "/notify/wechat/refund")
            }
            _ => {
                let fields = paynotify::qa::forge::alipay::refund(
                    &crate::alipay::sandbox(),
                    &call.out_trade_no,
                    &call.transaction_id,
                    call.total_fen,
                    &call.out_refund_no,
                    refunded_total,
                );
                self.admit(channel, &crate::alipay::signed(fields), "/notify/alipay")
            }
        }
    }

    fn created(&self) -> usize {
        self.fake.state.refunds_created()
    }
}

/// `notice` with its time left out (Alipay's refund answer stamps the second, its
/// notification the millisecond).
fn timeless(notice: &Notice) -> Notice {
    Notice {
        occurred_at: None,
        ..notice.clone()
    }
}

/// Whether a reply is a refusal with `code`.
fn refused(code: &str) -> impl Fn(&RefundReply) -> bool + '_ {
    move |reply| matches!(reply, RefundReply::Refused { code: c, .. } if c == code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_done_at_once_carries_what_its_notification_would() {
    let desk = desk().await;
    for channel in CHANNELS {
        let no = format!("RF-DONE-{channel}");
        paid_at(&desk.fake, &no, 100, channel);
        let call = refund_of(channel, &no, &format!("R-{no}"), 30, 100);
        let reply = desk.refund(channel, &call).await;
        let RefundReply::Accepted {
            state: RefundState::Success,
            refund_id: Some(refund_id),
            notice: Some(notice),
        } = reply.clone()
        else {
            panic!("{channel}: done, with its notice: {reply:?}");
        };
        // The notification of the same refund has the same business content: the ledger
        // takes whichever comes first and the other as a duplicate.
        let notified = desk.notified(channel, &call, 30);
        assert_eq!(notice.digest(), notified.digest(), "{channel}");
        assert_eq!(timeless(&notice), timeless(&notified), "{channel}");
        assert!(notice.occurred_at.is_some(), "{channel}");
        let expected_id = match channel {
            "wechat" => format!("5030R-{no}"),
            _ => format!("{}:R-{no}", call.transaction_id),
        };
        assert_eq!(refund_id, expected_id, "{channel}");
        assert_eq!(desk.created(), 1, "{channel}");

        // The same call again: the same refund, not a second one.
        let again = desk.refund(channel, &call).await;
        match channel {
            "wechat" => assert_eq!(again, reply, "WeChat answers the refund it holds"),
            // Alipay: `fund_change` N, "refunded before under this number, or not yet".
            _ => assert_eq!(
                again,
                RefundReply::Accepted {
                    state: RefundState::Processing,
                    refund_id: Some(expected_id.clone()),
                    notice: None,
                }
            ),
        }
        assert_eq!(desk.created(), 1, "{channel}: no second refund");
        assert!(
            matches!(desk.query(channel, &call).await, RefundAnswer::Refunded(_)),
            "{channel}"
        );
        desk.fake.state.refunds_created.store(0, Ordering::SeqCst);
    }
    let calls: Vec<_> = desk
        .fake
        .state
        .calls()
        .into_iter()
        .filter(|(call, _)| call.ends_with("refund"))
        .collect();
    let call = |name: &str, no: &str| (name.to_owned(), no.to_owned());
    assert_eq!(
        calls,
        [
            call("wechat.refund", "RF-DONE-wechat"),
            call("wechat.refund", "RF-DONE-wechat"),
            call("alipay.trade.refund", "RF-DONE-alipay"),
            call("alipay.trade.refund", "RF-DONE-alipay"),
        ]
    );
    assert_eq!(desk.fake.state.refused.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_not_done_yet_is_held_until_the_bank_finishes() {
    let desk = desk().await;
    desk.fake.state.new_refunds(RefundStatus::Processing);
    for channel in CHANNELS {
        let no = format!("RF-WAIT-{channel}");
        paid_at(&desk.fake, &no, 100, channel);
        let call = refund_of(channel, &no, &format!("R-{no}"), 100, 100);
        let RefundReply::Accepted {
            state: RefundState::Processing,
            refund_id: Some(_),
            notice: None,
        } = desk.refund(channel, &call).await
        else {
            panic!("{channel}: accepted, not done yet");
        };
        let waiting = desk.query(channel, &call).await;
        match channel {
            "wechat" => assert_eq!(
                waiting,
                RefundAnswer::NotRefunded(RefundState::Processing, "PROCESSING".into())
            ),
            // Alipay answers a refund not done without refund_status.
            _ => assert_eq!(waiting, RefundAnswer::NotFound),
        }
        // Not done: the trade is not refunded yet.
        assert!(
            matches!(desk.fake.state.trade(&no), Some(Trade::Paid { .. })),
            "{channel}"
        );

        desk.fake
            .state
            .settle_refund(&call.out_refund_no, RefundStatus::Success);
        let done = desk.query(channel, &call).await;
        match channel {
            "wechat" => {
                let RefundAnswer::Refunded(Some(notice)) = done else {
                    panic!("WeChat: refunded, with its notice: {done:?}");
                };
                assert_eq!(notice.digest(), desk.notified(channel, &call, 100).digest());
            }
            _ => assert_eq!(done, RefundAnswer::Refunded(None)),
        }
        assert!(
            matches!(desk.fake.state.trade(&no), Some(Trade::Refunded { .. })),
            "{channel}: refunded in full"
        );
    }

    // WeChat: stuck until someone acts in the merchant platform.
    desk.fake.state.new_refunds(RefundStatus::Abnormal);
    paid_at(&desk.fake, "RF-STUCK", 100, "wechat");
    let call = refund_of("wechat", "RF-STUCK", "R-RF-STUCK", 10, 100);
    assert!(matches!(
        desk.refund("wechat", &call).await,
        RefundReply::Accepted {
            state: RefundState::Abnormal,
            refund_id: Some(_),
            notice: None,
        }
    ));
    assert_eq!(
        desk.query("wechat", &call).await,
        RefundAnswer::NotRefunded(RefundState::Abnormal, "ABNORMAL".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_provider_s_code_and_create_nothing() {
    let desk = desk().await;
    let state = &desk.fake.state;
    for channel in CHANNELS {
        let no = format!("RF-NO-{channel}");
        paid_at(&desk.fake, &no, 100, channel);
        let number = |n: &str| format!("{no}-{n}");

        state.refuse_refunds(Some(Refusal::BalanceNotEnough));
        let (code, message) = match channel {
            "wechat" => ("NOT_ENOUGH", "基本账户余额不足"),
            _ => ("ACQ.SELLER_BALANCE_NOT_ENOUGH", "卖家余额不足"),
        };
        assert_eq!(
            desk.refund(channel, &refund_of(channel, &no, &number("1"), 70, 100))
                .await,
            RefundReply::Refused {
                code: code.into(),
                message: message.into()
            },
            "{channel}"
        );
        state.refuse_refunds(None);
        assert_eq!(desk.created(), 0, "{channel}: nothing created");

        let first = refund_of(channel, &no, &number("1"), 70, 100);
        assert!(
            matches!(
                desk.refund(channel, &first).await,
                RefundReply::Accepted { .. }
            ),
            "{channel}: refused before, created now"
        );
        let over = match channel {
            "wechat" => "INVALID_REQUEST",
            _ => "ACQ.REFUND_AMT_NOT_EQUAL_TOTAL",
        };
        // More than is left of the payment.
        let reply = desk
            .refund(channel, &refund_of(channel, &no, &number("2"), 31, 100))
            .await;
        assert!(refused(over)(&reply), "{channel}: {reply:?}");
        // The same number with another amount.
        let reply = desk
            .refund(channel, &refund_of(channel, &no, &number("1"), 20, 100))
            .await;
        assert!(refused(over)(&reply), "{channel}: {reply:?}");
        // A trade not paid.
        let unpaid = format!("RF-UNPAID-{channel}");
        state.set(&unpaid, Trade::NotPaid);
        let reply = desk
            .refund(channel, &refund_of(channel, &unpaid, &number("3"), 10, 100))
            .await;
        let not_paid = match channel {
            "wechat" => "INVALID_REQUEST",
            _ => "ACQ.TRADE_NOT_EXIST",
        };
        assert!(refused(not_paid)(&reply), "{channel}: {reply:?}");
        if channel == "wechat" {
            // WeChat checks the payment's total it is told.
            let reply = desk
                .refund(channel, &refund_of(channel, &no, &number("4"), 10, 99))
                .await;
            assert!(refused("PARAM_ERROR")(&reply), "{reply:?}");
        }
        assert_eq!(desk.created(), 1, "{channel}: only the first");

        // What is left, exactly: refunded in full.
        let rest = refund_of(channel, &no, &number("5"), 30, 100);
        let reply = desk.refund(channel, &rest).await;
        let RefundReply::Accepted {
            state: RefundState::Success,
            notice: Some(notice),
            ..
        } = reply
        else {
            panic!("{channel}: the rest refunded: {reply:?}");
        };
        // Alipay's running total: both refunds.
        assert_eq!(
            notice.digest(),
            desk.notified(channel, &rest, 100).digest(),
            "{channel}"
        );
        assert!(
            matches!(state.trade(&no), Some(Trade::Refunded { .. })),
            "{channel}"
        );
        let reply = desk
            .refund(channel, &refund_of(channel, &no, &number("6"), 1, 100))
            .await;
        assert!(
            matches!(reply, RefundReply::Refused { .. }),
            "{channel}: nothing left: {reply:?}"
        );
        state.refunds_created.store(0, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_answer_the_refund_is_sent_again_and_found() {
    let desk = desk().await;
    let state = &desk.fake.state;
    for channel in CHANNELS {
        let no = format!("RF-AGAIN-{channel}");
        paid_at(&desk.fake, &no, 100, channel);
        let call = refund_of(channel, &no, &format!("R-{no}"), 40, 100);

        state.down.store(true, Ordering::SeqCst);
        let reply = desk.refund(channel, &call).await;
        assert!(
            matches!(reply, RefundReply::Failed(Failure::Unreachable(_))),
            "{channel}: {reply:?}"
        );
        state.down.store(false, Ordering::SeqCst);
        assert_eq!(desk.created(), 0, "{channel}");

        // The provider creates the refund; its answer comes too late.
        state.hang_after_creating(1);
        let reply = desk.refund(channel, &call).await;
        assert!(
            matches!(reply, RefundReply::Failed(Failure::Unreachable(_))),
            "{channel}: {reply:?}"
        );
        assert_eq!(desk.created(), 1, "{channel}: created all the same");
        // Sent again under the same number: the refund the provider holds.
        let reply = desk.refund(channel, &call).await;
        let expected = match channel {
            "wechat" => RefundState::Success,
            // Alipay: `fund_change` N for a refund made before under this number.
            _ => RefundState::Processing,
        };
        assert!(
            matches!(reply, RefundReply::Accepted { state, refund_id: Some(_), .. } if state == expected),
            "{channel}: {reply:?}"
        );
        assert_eq!(desk.created(), 1, "{channel}: still one refund");
        assert!(
            matches!(desk.query(channel, &call).await, RefundAnswer::Refunded(_)),
            "{channel}"
        );
        state.refunds_created.store(0, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_not_signed_by_the_provider_are_never_a_refund() {
    let desk = desk().await;
    let state = &desk.fake.state;
    for channel in CHANNELS {
        for signing in [Signing::Unsigned, Signing::Forger] {
            let no = format!("RF-FORGED-{channel}-{signing:?}");
            paid_at(&desk.fake, &no, 100, channel);
            state.sign_with(signing);
            let call = refund_of(channel, &no, &format!("R-{no}"), 100, 100);
            let reply = desk.refund(channel, &call).await;
            assert!(
                matches!(reply, RefundReply::Failed(Failure::BadSignature(_))),
                "{channel} {signing:?}: {reply:?}"
            );
            // Sent again: the same answer, whatever the refund's state.
            let reply = desk.refund(channel, &call).await;
            assert!(
                matches!(reply, RefundReply::Failed(Failure::BadSignature(_))),
                "{channel} {signing:?}: {reply:?}"
            );
            state.sign_with(Signing::Provider);
        }
    }
    // Alipay signs its business errors: an unsigned refusal is not one.
    paid_at(&desk.fake, "RF-FORGED-REFUSAL", 100, "alipay");
    state.refuse_refunds(Some(Refusal::BalanceNotEnough));
    state.sign_with(Signing::Unsigned);
    let call = refund_of(
        "alipay",
        "RF-FORGED-REFUSAL",
        "R-RF-FORGED-REFUSAL",
        10,
        100,
    );
    let reply = desk.refund("alipay", &call).await;
    assert!(
        matches!(reply, RefundReply::Failed(Failure::BadSignature(_))),
        "{reply:?}"
    );
    assert_eq!(state.refused.load(Ordering::SeqCst), 0);
}
