//! The Alipay client's transfer calls against the stand-in gateway
//! (`support/alipay_transfer.rs`), as the service builds the client: a transfer succeeds at
//! once, the same call again is the same transfer, a refusal names Alipay's `sub_code` and
//! holds nothing, a hang after creating is no answer with exactly one transfer held, an answer
//! that is not Alipay's is never a transfer, and an app in public-key mode cannot transfer.

use std::sync::Arc;

use paynotify::channel::Mounted;
use paynotify::channel::api::{CancelReply, Failure, ProviderApi, TransferAnswer, TransferReply};
use paynotify::config::Settings;
use paynotify::notice::ChannelId;
use paynotify::time::Timestamp;
use paynotify::transfer::{AlipayPayee, Payee, TransferCall, TransferState};

use crate::alipay::{APP, CERT_APP, cert_gateway, cert_mode};
use crate::support::alipay_transfer::{NewTransfer, Status};
use crate::support::keys::private_key_path;
use crate::support::provider::{APP_KEY, FakeProvider, Signing};

/// The client's overall timeout here: shorter than a hanging create
/// (`support::refunds::HANG_SECS`), long enough for every other answer.
const TIMEOUT_MS: u64 = 2000;

/// The Alipay client against the stand-in: app 2021000000000002 in certificate mode, and app
/// 2021000000000001 in public-key mode, both with API credentials.
struct Desk {
    fake: FakeProvider,
    _mounted: Vec<Mounted>,
    api: Arc<dyn ProviderApi>,
    now: Timestamp,
}

async fn desk() -> Desk {
    paynotify::telemetry::init_for_tests();
    let fake = cert_gateway().await;
    fake.state.also_app(APP);
    let root = crate::support::keys::alipay_certs(APP_KEY).root.clone();
    let mut settings = Settings::default();
    cert_mode(&mut settings, &fake.url, &root);
    let public_key_mode = &mut settings.alipay.apps[0];
    public_key_mode.app_private_key_file = Some(private_key_path(APP_KEY));
    public_key_mode.gateway = Some(format!("{}/gateway.do", fake.url));
    settings.provider_api.timeout_ms = TIMEOUT_MS;
    let now = Timestamp::new(chrono::Utc::now());
    let mounted = paynotify::providers::mount_all(&settings, now).expect("providers");
    let api = mounted
        .iter()
        .filter_map(|m| m.api.clone())
        .find(|a| a.channel() == ChannelId::Alipay)
        .expect("the Alipay client");
    Desk {
        fake,
        _mounted: mounted,
        api,
        now,
    }
}

/// 1.23 yuan to an Alipay user id, numbered `out_bill_no`.
fn to_user(out_bill_no: &str) -> TransferCall {
    TransferCall {
        out_bill_no: out_bill_no.to_owned(),
        amount_fen: 123,
        remark: "活动奖励".to_owned(),
        payee: Payee::Alipay(AlipayPayee {
            identity: "2088000000000099".to_owned(),
            identity_type: "ALIPAY_USER_ID".to_owned(),
            name: None,
            order_title: "十一月奖励".to_owned(),
        }),
    }
}

impl Desk {
    async fn transfer(&self, call: &TransferCall) -> TransferReply {
        self.api.transfer(CERT_APP, call, self.now).await
    }

    async fn query(&self, out_bill_no: &str) -> TransferAnswer {
        self.api
            .transfer_query(CERT_APP, out_bill_no, self.now)
            .await
    }
}

fn accepted(reply: TransferReply) -> paynotify::transfer::TransferSeen {
    match reply {
        TransferReply::Accepted(seen) => *seen,
        other => panic!("accepted, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_succeeds_at_once_and_the_same_call_again_is_the_same_transfer() {
    let desk = desk().await;
    let call = to_user("TA1");
    let seen = accepted(desk.transfer(&call).await);
    let held = desk.fake.state.alipay_transfer("TA1").expect("held");
    assert_eq!(seen.state, TransferState::Success);
    assert_eq!(seen.provider_state.as_deref(), Some("SUCCESS"));
    assert_eq!(
        seen.provider_bill_no.as_deref(),
        Some(held.order_id.as_str())
    );
    assert_eq!(seen.account, CERT_APP);
    assert_eq!(seen.amount_fen, None);
    // What Alipay was asked: yuan, the fixed product and scene, no name at all.
    assert_eq!(held.amount_fen, 123);
    assert_eq!(held.asked["trans_amount"], "1.23");
    assert_eq!(held.asked["product_code"], "TRANS_ACCOUNT_NO_PWD");
    assert_eq!(held.asked["biz_scene"], "DIRECT_TRANSFER");
    assert_eq!(held.asked["order_title"], "十一月奖励");
    assert_eq!(held.asked["remark"], "活动奖励");
    assert!(
        held.asked["payee_info"].get("name").is_none(),
        "{}",
        held.asked
    );

    let again = accepted(desk.transfer(&call).await);
    assert_eq!(again.provider_bill_no, seen.provider_bill_no);
    assert_eq!(desk.fake.state.alipay_transfers_created(), 1);

    let TransferAnswer::Found(found) = desk.query("TA1").await else {
        panic!("found");
    };
    assert_eq!(found.state, TransferState::Success);
    assert_eq!(found.amount_fen, Some(123));
    assert_eq!(found.provider_bill_no, seen.provider_bill_no);
    assert_eq!(found.account, CERT_APP);
    assert_eq!(desk.query("TA-NONE").await, TransferAnswer::NotFound);
    // Every call carried both certificate SNs.
    assert_eq!(
        desk.fake
            .state
            .refused
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_alipay_s_sub_code_and_hold_nothing() {
    let desk = desk().await;
    desk.fake
        .state
        .new_alipay_transfers(NewTransfer::Refused("PAYEE_NOT_EXIST"));
    let TransferReply::Refused { code, .. } = desk.transfer(&to_user("TR1")).await else {
        panic!("refused");
    };
    assert_eq!(code, "PAYEE_NOT_EXIST");
    assert_eq!(desk.query("TR1").await, TransferAnswer::NotFound);

    // A logon id without a name (the service refuses it first; the gateway does too).
    desk.fake.state.new_alipay_transfers(NewTransfer::Success);
    let mut logon = to_user("TR2");
    if let Payee::Alipay(p) = &mut logon.payee {
        p.identity = "buyer@example.com".to_owned();
        p.identity_type = "ALIPAY_LOGON_ID".to_owned();
    }
    let TransferReply::Refused { code, .. } = desk.transfer(&logon).await else {
        panic!("refused");
    };
    assert_eq!(code, "PAYEE_USERINFO_ERROR");
    assert_eq!(desk.fake.state.alipay_transfers_created(), 0);

    // The same number with another amount: refused, the first transfer stands.
    accepted(desk.transfer(&to_user("TR3")).await);
    let mut more = to_user("TR3");
    more.amount_fen = 500;
    let TransferReply::Refused { code, .. } = desk.transfer(&more).await else {
        panic!("refused");
    };
    assert_eq!(code, "INVALID_PARAMETER");
    let held = desk.fake.state.alipay_transfer("TR3").expect("held");
    assert_eq!(held.amount_fen, 123);
    assert_eq!(desk.fake.state.alipay_transfers_created(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_hangs_after_creating_is_no_answer_and_one_transfer_is_held() {
    let desk = desk().await;
    desk.fake.state.hang_alipay_transfers(1);
    let call = to_user("TH1");
    let reply = desk.transfer(&call).await;
    assert!(
        matches!(reply, TransferReply::Failed(Failure::Unreachable(_))),
        "{reply:?}"
    );
    assert_eq!(desk.fake.state.alipay_transfers_created(), 1);
    // Sent again under the same number: the same transfer, still one.
    let seen = accepted(desk.transfer(&call).await);
    let held = desk.fake.state.alipay_transfer("TH1").expect("held");
    assert_eq!(
        seen.provider_bill_no.as_deref(),
        Some(held.order_id.as_str())
    );
    assert_eq!(desk.fake.state.alipay_transfers_created(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dealing_transfer_is_followed_by_query_to_its_end_and_never_cancelled() {
    let desk = desk().await;
    desk.fake.state.new_alipay_transfers(NewTransfer::Dealing);
    let seen = accepted(desk.transfer(&to_user("TD1")).await);
    assert_eq!(seen.state, TransferState::Processing);
    assert_eq!(seen.provider_state.as_deref(), Some("DEALING"));
    let TransferAnswer::Found(found) = desk.query("TD1").await else {
        panic!("found");
    };
    assert_eq!(found.state, TransferState::Processing);
    assert_eq!(found.amount_fen, None);

    desk.fake
        .state
        .settle_alipay_transfer("TD1", Status::Success);
    let TransferAnswer::Found(found) = desk.query("TD1").await else {
        panic!("found");
    };
    assert_eq!(found.state, TransferState::Success);
    assert_eq!(found.amount_fen, Some(123));

    accepted(desk.transfer(&to_user("TD2")).await);
    desk.fake
        .state
        .settle_alipay_transfer("TD2", Status::Fail("PAYEE_ACCOUNT_STATUS_ERROR".into()));
    let TransferAnswer::Found(found) = desk.query("TD2").await else {
        panic!("found");
    };
    assert_eq!(found.state, TransferState::Fail);
    assert_eq!(
        found.fail_reason.as_deref(),
        Some("PAYEE_ACCOUNT_STATUS_ERROR")
    );

    let cancel = desk.api.transfer_cancel(CERT_APP, "TD1", desk.now).await;
    assert!(
        matches!(cancel, CancelReply::Failed(Failure::Unexpected(_))),
        "{cancel:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_is_not_alipay_s_is_never_a_transfer() {
    let desk = desk().await;
    for (signing, no) in [(Signing::Unsigned, "TF1"), (Signing::Forger, "TF2")] {
        desk.fake.state.sign_with(signing);
        let reply = desk.transfer(&to_user(no)).await;
        assert!(
            matches!(reply, TransferReply::Failed(Failure::BadSignature(_))),
            "{signing:?}: {reply:?}"
        );
        let answer = desk.query(no).await;
        assert!(
            matches!(answer, TransferAnswer::Failed(Failure::BadSignature(_))),
            "{signing:?}: {answer:?}"
        );
        let none = desk.query("TF-NONE").await;
        assert!(
            matches!(none, TransferAnswer::Failed(Failure::BadSignature(_))),
            "{signing:?}: {none:?}"
        );
    }
    // The stand-in made them: only the answers were not Alipay's.
    assert_eq!(desk.fake.state.alipay_transfers_created(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_in_public_key_mode_cannot_transfer() {
    let desk = desk().await;
    assert_eq!(desk.api.transfer_apps(CERT_APP), Ok(Vec::new()));
    let why = desk.api.transfer_apps(APP).expect_err("public-key mode");
    assert!(why.contains("public-key mode"), "{why}");
    assert!(why.contains("certificate mode"), "{why}");
    assert!(desk.api.transfer_apps("2021000000000404").is_err());

    // Sent anyway, Alipay's gateway refuses the app: no transfer, nothing about the payee.
    let reply = desk.api.transfer(APP, &to_user("TP1"), desk.now).await;
    assert!(
        matches!(&reply, TransferReply::Failed(Failure::Unexpected(why)) if why.contains("isv.insufficient-isv-permissions")),
        "{reply:?}"
    );
    assert_eq!(desk.fake.state.alipay_transfers_created(), 0);
}

/// Through the service: `POST /transfers` from an app in public-key mode is `422
/// ACCOUNT_CANNOT_TRANSFER`, nothing recorded, nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_refuses_a_transfer_from_an_app_in_public_key_mode() {
    let fake = crate::reconcile::fake().await;
    let app =
        crate::transfers::app_with(crate::support::helpers::Backend::Sqlite, &fake, |_| {}).await;
    let body = serde_json::json!({
        "out_bill_no": "TPK1", "channel": "alipay", "account": APP,
        "amount_fen": 100, "remark": "活动奖励",
        "payee": {"identity": "2088000000000099", "identity_type": "ALIPAY_USER_ID"}
    });
    let (status, answer) = crate::transfers::start(&app, &body).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["code"], "ACCOUNT_CANNOT_TRANSFER");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("certificate mode")),
        "{answer}"
    );
    assert_eq!(crate::transfers::recorded(&app).await, 0);
    assert!(fake.state.calls().is_empty(), "{:?}", fake.state.calls());
    assert_eq!(fake.state.alipay_transfers_created(), 0);
}
