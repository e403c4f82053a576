//! The WeChat client's merchant transfer calls against the stand-in
//! (`support/wechat_transfer.rs`): a bill waiting for the user carries its `package_info`, the
//! same call again is the same bill, the name travels sealed with the platform key, refusals
//! name WeChat's code, a create that hangs is no answer while the bill exists, an answer that
//! is not WeChat's is never a transfer, and a cancel is taken only before the user confirms.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use paynotify::channel::api::{CancelReply, Failure, ProviderApi, TransferAnswer, TransferReply};
use paynotify::channel::{Inbound, Provider};
use paynotify::config::Settings;
use paynotify::notice::{ChannelId, NoticeKind};
use paynotify::time::Timestamp;
use paynotify::transfer::{
    Payee, SceneReportInfo, TransferCall, TransferSeen, TransferState, WechatPayee,
};

use crate::reconcile::{MCHID, configure, fake};
use crate::support::keys::rsa_key;
use crate::support::provider::{FakeProvider, Signing};
use crate::support::wechat_transfer::{BillState, Kind, NewBill};

/// The WeChat client, built as the service builds it, against the stand-in.
struct Desk {
    fake: FakeProvider,
    api: Arc<dyn ProviderApi>,
    provider: Arc<dyn Provider>,
    now: Timestamp,
}

/// Shorter than a hanging create (`support::refunds::HANG_SECS`), long enough for the rest.
const TIMEOUT_MS: u64 = 2000;

async fn desk() -> Desk {
    desk_with(|_| {}).await
}

async fn desk_with(change: impl FnOnce(&mut Settings)) -> Desk {
    paynotify::telemetry::init_for_tests();
    let fake = fake().await;
    let mut settings = Settings::default();
    configure(&mut settings, &fake.url);
    settings.provider_api.timeout_ms = TIMEOUT_MS;
    change(&mut settings);
    let now = Timestamp::new(chrono::Utc::now());
    let mounted = paynotify::providers::mount_all(&settings, now).expect("providers");
    let wechat = mounted
        .into_iter()
        .find(|m| m.provider.channel() == ChannelId::Wechat)
        .expect("WeChat");
    Desk {
        fake,
        api: wechat.api.expect("an API client"),
        provider: wechat.provider,
        now,
    }
}

/// A transfer of `fen` numbered `out_bill_no`, to a user named `user_name` if given.
fn transfer_of(out_bill_no: &str, fen: i64, user_name: Option<&str>) -> TransferCall {
    TransferCall {
        out_bill_no: out_bill_no.to_owned(),
        amount_fen: fen,
        remark: "新会员开卡有礼".to_owned(),
        payee: Payee::Wechat(WechatPayee {
            appid: "wx0000000000000001".to_owned(),
            openid: "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o".to_owned(),
            user_name: user_name.map(str::to_owned),
            transfer_scene_id: "1000".to_owned(),
            transfer_scene_report_infos: vec![
                SceneReportInfo {
                    info_type: "活动名称".to_owned(),
                    info_content: "新会员有礼".to_owned(),
                },
                SceneReportInfo {
                    info_type: "奖励说明".to_owned(),
                    info_content: "注册会员抽奖一等奖".to_owned(),
                },
            ],
            user_recv_perception: Some("现金奖励".to_owned()),
            notify_url: Some("https://pay.example/notify/wechat/transfer".to_owned()),
        }),
    }
}

impl Desk {
    async fn transfer(&self, call: &TransferCall) -> TransferReply {
        self.api.transfer(MCHID, call, self.now).await
    }

    async fn query(&self, out_bill_no: &str) -> TransferAnswer {
        self.api.transfer_query(MCHID, out_bill_no, self.now).await
    }

    async fn cancel(&self, out_bill_no: &str) -> CancelReply {
        self.api.transfer_cancel(MCHID, out_bill_no, self.now).await
    }

    /// What the query finds, or a panic naming what it got instead.
    async fn found(&self, out_bill_no: &str) -> TransferSeen {
        match self.query(out_bill_no).await {
            TransferAnswer::Found(seen) => *seen,
            other => panic!("{out_bill_no}: found, not {other:?}"),
        }
    }

    /// What the bill's `MCHTRANSFER.BILL.FINISHED` notification, come to the transfer route,
    /// says.
    fn notified(&self, out_bill_no: &str) -> TransferSeen {
        let d = self.fake.state.wechat_transfers.finished(
            &crate::wechat::sandbox('A'),
            out_bill_no,
            self.now.unix_seconds(),
        );
        let mut headers = HeaderMap::new();
        for (name, value) in &d.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        let notice = self
            .provider
            .admit(&Inbound {
                headers: &headers,
                body: &d.body,
                now: self.now,
                route: Some("/notify/wechat/transfer"),
            })
            .expect("the notification verifies");
        assert!(notice.merchant_matches);
        match notice.kind {
            NoticeKind::Transfer(seen) => *seen,
            other => panic!("a transfer notice, not {other:?}"),
        }
    }
}

fn accepted(reply: TransferReply) -> TransferSeen {
    match reply {
        TransferReply::Accepted(seen) => *seen,
        other => panic!("accepted, not {other:?}"),
    }
}

fn refused(reply: &TransferReply, code: &str) -> bool {
    matches!(reply, TransferReply::Refused { code: c, .. } if c == code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_waiting_for_the_user_carries_its_package_info_and_is_made_once() {
    let desk = desk().await;
    let t = &desk.fake.state.wechat_transfers;
    let call = transfer_of("TWAIT1", 500, None);
    let reply = desk.transfer(&call).await;
    let seen = accepted(reply.clone());
    assert_eq!(seen.out_bill_no, "TWAIT1");
    assert_eq!(seen.provider_bill_no.as_deref(), Some("1330TWAIT1"));
    assert_eq!(seen.state, TransferState::WaitUserConfirm);
    assert_eq!(seen.provider_state.as_deref(), Some("WAIT_USER_CONFIRM"));
    assert_eq!(
        seen.package_info.as_deref(),
        Some("affffddafdfafddffda==.TWAIT1"),
        "passed through unchanged"
    );
    assert_eq!(seen.amount_fen, None, "the create's answer names no amount");
    assert_eq!(seen.account, MCHID);
    assert!(seen.occurred_at.is_some());

    // The same call again: the same bill.
    assert_eq!(desk.transfer(&call).await, reply);
    assert_eq!(t.held(), 1);
    assert_eq!(t.calls(Kind::Create), 2);
    let bill = t.bill("TWAIT1").expect("held");
    assert_eq!(
        bill.notify_url.as_deref(),
        Some("https://pay.example/notify/wechat/transfer")
    );
    assert_eq!(bill.user_name, None);

    // The same number with another amount is not that bill.
    let other = desk.transfer(&transfer_of("TWAIT1", 501, None)).await;
    assert!(refused(&other, "INVALID_REQUEST"), "{other:?}");
    assert_eq!(t.held(), 1);

    // Bills that need no confirmation are done in the answer.
    t.new_bills(NewBill::Success);
    let done = accepted(desk.transfer(&transfer_of("TDONE1", 500, None)).await);
    assert_eq!(done.state, TransferState::Success);
    assert_eq!(done.package_info, None);
    assert_eq!(desk.fake.state.refused.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_name_travels_sealed_with_the_platform_key_it_names() {
    let desk = desk().await;
    let t = &desk.fake.state.wechat_transfers;
    let call = transfer_of("TNAME1", 300_000, Some("张三"));
    let first = accepted(desk.transfer(&call).await);
    // The stand-in opened it with the platform key's private half and the serial the
    // request named.
    assert_eq!(
        t.bill("TNAME1").expect("held").user_name.as_deref(),
        Some("张三")
    );
    // Sealed afresh (OAEP differs each time), it is still the same bill.
    assert_eq!(accepted(desk.transfer(&call).await), first);
    assert_eq!(t.held(), 1);
    // Another name under the same number is another request.
    let other = desk
        .transfer(&transfer_of("TNAME1", 300_000, Some("李四")))
        .await;
    assert!(refused(&other, "INVALID_REQUEST"), "{other:?}");

    // WeChat's amount rules: no name below 30 fen, a name from 2 000 yuan.
    let small = desk
        .transfer(&transfer_of("TNAME2", 29, Some("张三")))
        .await;
    assert!(refused(&small, "PARAM_ERROR"), "{small:?}");
    let large = desk.transfer(&transfer_of("TNAME3", 200_000, None)).await;
    assert!(refused(&large, "PARAM_ERROR"), "{large:?}");
    assert!(matches!(
        desk.transfer(&transfer_of("TNAME4", 30, Some("张三")))
            .await,
        TransferReply::Accepted(_)
    ));
    assert_eq!(t.held(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_platform_key_a_name_is_not_sent() {
    // The merchant's platform certificates are downloaded and none has been yet: no key to
    // seal the name with.
    let desk = desk_with(|s| {
        let m = &mut s.wechat.merchants[0];
        m.platform_keys.clear();
        m.certificates = Some(paynotify::channel::wechat::CertificateMode::Download);
    })
    .await;
    let t = &desk.fake.state.wechat_transfers;
    let reply = desk
        .transfer(&transfer_of("TNOKEY1", 500, Some("张三")))
        .await;
    assert!(
        matches!(reply, TransferReply::Failed(Failure::UnknownKey(_))),
        "{reply:?}"
    );
    assert_eq!(t.calls(Kind::Create), 0, "nothing sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_wechat_s_code_and_creates_nothing() {
    let desk = desk().await;
    let t = &desk.fake.state.wechat_transfers;
    t.new_bills(NewBill::NotEnough);
    assert_eq!(
        desk.transfer(&transfer_of("TPOOR1", 500, None)).await,
        TransferReply::Refused {
            code: "NOT_ENOUGH".into(),
            message: "基本账户余额不足".into()
        }
    );
    assert_eq!(t.held(), 0);
    // What the transfers room asks before it believes the refusal.
    assert_eq!(desk.query("TPOOR1").await, TransferAnswer::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_hangs_is_no_answer_and_the_same_call_finds_the_bill() {
    let desk = desk().await;
    let state = &desk.fake.state;
    let t = &state.wechat_transfers;
    let call = transfer_of("THANG1", 500, Some("张三"));

    state.down.store(true, Ordering::SeqCst);
    let reply = desk.transfer(&call).await;
    assert!(
        matches!(reply, TransferReply::Failed(Failure::Unreachable(_))),
        "{reply:?}"
    );
    state.down.store(false, Ordering::SeqCst);
    assert_eq!(t.held(), 0);

    // WeChat creates the bill; its answer comes too late.
    t.hang_after_creating(1);
    let reply = desk.transfer(&call).await;
    assert!(
        matches!(reply, TransferReply::Failed(Failure::Unreachable(_))),
        "{reply:?}"
    );
    assert_eq!(t.held(), 1, "created all the same");
    assert_eq!(
        desk.found("THANG1").await.state,
        TransferState::WaitUserConfirm
    );
    // Sent again under the same number: the bill WeChat holds.
    let seen = accepted(desk.transfer(&call).await);
    assert_eq!(seen.provider_bill_no.as_deref(), Some("1330THANG1"));
    assert_eq!(t.held(), 1, "still one bill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_not_signed_by_wechat_are_never_a_transfer() {
    let desk = desk().await;
    let state = &desk.fake.state;
    let t = &state.wechat_transfers;
    assert!(matches!(
        desk.transfer(&transfer_of("TSIGNED", 500, None)).await,
        TransferReply::Accepted(_)
    ));
    for signing in [Signing::Unsigned, Signing::Forger] {
        state.sign_with(signing);
        let no = format!("TFORGED{}", signing == Signing::Forger);
        for _ in 0..2 {
            let reply = desk.transfer(&transfer_of(&no, 500, None)).await;
            assert!(
                matches!(reply, TransferReply::Failed(Failure::BadSignature(_))),
                "{signing:?}: {reply:?}"
            );
        }
        let answer = desk.query("TSIGNED").await;
        assert!(
            matches!(answer, TransferAnswer::Failed(Failure::BadSignature(_))),
            "{signing:?}: {answer:?}"
        );
        let reply = desk.cancel("TSIGNED").await;
        assert!(
            matches!(reply, CancelReply::Failed(Failure::BadSignature(_))),
            "{signing:?}: {reply:?}"
        );
        state.sign_with(Signing::Provider);
    }
    // Signed with a key the client does not know (a rotation it has not seen).
    state.sign_as(
        "PUB_KEY_ID_00000000000000000000000000000ZZ",
        rsa_key("wechat-unknown-platform"),
    );
    let reply = desk.transfer(&transfer_of("TROTATED", 500, None)).await;
    assert!(
        matches!(reply, TransferReply::Failed(Failure::UnknownKey(_))),
        "{reply:?}"
    );
    let answer = desk.query("TROTATED").await;
    assert!(
        matches!(answer, TransferAnswer::Failed(Failure::UnknownKey(_))),
        "{answer:?}"
    );
    // The stand-in cancelled TSIGNED on each try; no answer said so.
    assert_eq!(t.bill("TSIGNED").expect("held").state, BillState::Canceling);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_follows_the_bill_and_says_what_its_notification_says() {
    let desk = desk().await;
    let t = &desk.fake.state.wechat_transfers;
    assert_eq!(desk.query("TQ1").await, TransferAnswer::NotFound);

    accepted(desk.transfer(&transfer_of("TQ1", 500, None)).await);
    let waiting = desk.found("TQ1").await;
    assert_eq!(waiting.state, TransferState::WaitUserConfirm);
    assert_eq!(waiting.amount_fen, Some(500));
    assert_eq!(waiting.account, MCHID);

    t.confirm("TQ1");
    let confirmed = desk.found("TQ1").await;
    assert_eq!(confirmed.state, TransferState::Transfering);
    assert_eq!(confirmed.provider_state.as_deref(), Some("TRANSFERING"));

    t.succeed("TQ1");
    let done = desk.found("TQ1").await;
    assert_eq!(done.state, TransferState::Success);
    assert_eq!(done, desk.notified("TQ1"), "answer and notification agree");

    accepted(desk.transfer(&transfer_of("TQ2", 500, None)).await);
    t.fail("TQ2", "NAME_NOT_CORRECT");
    let failed = desk.found("TQ2").await;
    assert_eq!(failed.state, TransferState::Fail);
    assert_eq!(failed.fail_reason.as_deref(), Some("NAME_NOT_CORRECT"));
    assert_eq!(failed, desk.notified("TQ2"));

    // The states before the user's: WeChat's own words kept.
    accepted(desk.transfer(&transfer_of("TQ3", 500, None)).await);
    for (state, word, want) in [
        (BillState::Accepted, "ACCEPTED", TransferState::Accepted),
        (
            BillState::Processing,
            "PROCESSING",
            TransferState::Processing,
        ),
    ] {
        t.set_state("TQ3", state, None);
        let seen = desk.found("TQ3").await;
        assert_eq!(
            (seen.state, seen.provider_state.as_deref()),
            (want, Some(word))
        );
    }
    assert_eq!(t.calls(Kind::Query), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_is_taken_before_the_user_confirms_and_refused_after() {
    let desk = desk().await;
    let t = &desk.fake.state.wechat_transfers;
    assert_eq!(desk.cancel("TC0").await, CancelReply::NotFound);

    accepted(desk.transfer(&transfer_of("TC1", 500, None)).await);
    let CancelReply::Canceling(seen) = desk.cancel("TC1").await else {
        panic!("the cancel is accepted");
    };
    assert_eq!(seen.state, TransferState::Canceling);
    assert_eq!(seen.provider_state.as_deref(), Some("CANCELING"));
    assert_eq!(seen.provider_bill_no.as_deref(), Some("1330TC1"));
    assert_eq!(desk.found("TC1").await.state, TransferState::Canceling);
    t.finish_cancel("TC1");
    assert_eq!(desk.found("TC1").await.state, TransferState::Cancelled);
    assert_eq!(desk.notified("TC1").state, TransferState::Cancelled);

    accepted(desk.transfer(&transfer_of("TC2", 500, None)).await);
    t.confirm("TC2");
    let reply = desk.cancel("TC2").await;
    assert!(
        matches!(&reply, CancelReply::Refused { code, .. } if code == "INVALID_REQUEST"),
        "{reply:?}"
    );
    assert_eq!(t.bill("TC2").expect("held").state, BillState::Transfering);
    assert_eq!(t.calls(Kind::Cancel), 3);
}
