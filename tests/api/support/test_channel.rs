//! A stand-in payment provider for tests of the shared notify path: JSON bodies signed with
//! SHA-256 over a shared secret. It exists only here, never in the service.

use std::sync::Arc;

use actix_web::http::StatusCode;
use paynotify::channel::{Answer, Channel, Inbound, NotifyRoute, Rejection, Reply, Standing};
use paynotify::notice::{ChannelId, Digest, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};
use serde::{Deserialize, Serialize};

const SECRET: &str = "test-channel-secret";
pub const PATH: &str = "/notify/test";

#[derive(Debug, Default)]
pub struct TestChannel;

/// The wire format of the stand-in provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestNotification {
    pub channel: ChannelName,
    pub kind: String,
    pub out_trade_no: String,
    pub transaction_id: String,
    pub amount_fen: i64,
    pub currency: String,
    pub merchant_matches: bool,
    pub refund: Option<(String, String, i64)>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelName {
    Wechat,
    Alipay,
}

impl TestNotification {
    pub fn paid(order_no: &str, transaction_id: &str, amount_fen: i64) -> Self {
        Self {
            channel: ChannelName::Wechat,
            kind: "paid".into(),
            out_trade_no: order_no.into(),
            transaction_id: transaction_id.into(),
            amount_fen,
            currency: "CNY".into(),
            merchant_matches: true,
            refund: None,
        }
    }

    pub fn to_notice(&self) -> Notice {
        let kind = match (self.kind.as_str(), &self.refund) {
            ("refunded", Some((out_refund_no, refund_id, refund_fen))) => {
                NoticeKind::Refunded(Refund {
                    out_refund_no: out_refund_no.clone(),
                    refund_id: refund_id.clone(),
                    amount: RefundAmount::This(*refund_fen),
                })
            }
            ("paid", _) => NoticeKind::Paid,
            ("closed", _) => NoticeKind::Closed,
            (other, _) => NoticeKind::Other {
                status: other.to_owned(),
            },
        };
        Notice {
            channel: match self.channel {
                ChannelName::Wechat => ChannelId::Wechat,
                ChannelName::Alipay => ChannelId::Alipay,
            },
            kind,
            out_trade_no: self.out_trade_no.clone(),
            transaction_id: self.transaction_id.clone(),
            amount_fen: self.amount_fen,
            currency: self.currency.clone(),
            merchant: MerchantIds {
                merchant_id: "1900000001".into(),
                app_id: Some("wx0000000000000001".into()),
            },
            merchant_matches: self.merchant_matches,
            occurred_at: None,
        }
    }

    /// The body and its signature header value.
    pub fn signed(&self) -> (String, String) {
        let body = serde_json::to_string(self).expect("json");
        let signature = sign(body.as_bytes());
        (body, signature)
    }
}

pub fn sign(body: &[u8]) -> String {
    let mut message = SECRET.as_bytes().to_vec();
    message.extend_from_slice(body);
    Digest::of(&message).as_str().to_owned()
}

impl Channel for TestChannel {
    type Verified = Vec<u8>;

    fn id(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn verify(&self, request: &Inbound<'_>) -> Result<Vec<u8>, Rejection> {
        let presented = request
            .headers
            .get("X-Test-Signature")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Rejection::BadRequest("missing X-Test-Signature".into()))?;
        if presented != sign(request.body) {
            return Err(Rejection::BadSignature("signature does not match".into()));
        }
        Ok(request.body.to_vec())
    }

    fn decode(&self, verified: Vec<u8>) -> Result<Notice, Rejection> {
        let n: TestNotification =
            serde_json::from_slice(&verified).map_err(|e| Rejection::BadRequest(e.to_string()))?;
        Ok(n.to_notice())
    }

    fn standing(&self, request: &Inbound<'_>) -> Standing {
        Standing {
            keyed: request.headers.contains_key("X-Test-Signature"),
            shaped: serde_json::from_slice::<TestNotification>(request.body).is_ok(),
        }
    }

    fn render(&self, reply: Reply<'_>) -> Answer {
        match reply {
            Reply::Success => Answer::empty(204),
            Reply::Failure { status, message } => Answer::json(
                status,
                &serde_json::json!({ "code": "FAIL", "message": message }),
            ),
        }
    }
}

/// The stand-in's notify route, mounted beside the real providers'.
pub fn route() -> NotifyRoute {
    NotifyRoute {
        path: PATH,
        channel: Arc::new(TestChannel),
    }
}

/// Sends a signed notification; returns the status and body.
pub async fn deliver(
    app: &crate::support::helpers::TestApp,
    n: &TestNotification,
) -> (StatusCode, String) {
    let (body, signature) = n.signed();
    send_raw(app, body, &signature).await
}

pub async fn send_raw(
    app: &crate::support::helpers::TestApp,
    body: String,
    signature: &str,
) -> (StatusCode, String) {
    let response = app
        .client
        .post(app.url(PATH))
        .header("X-Test-Signature", signature)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .expect("notify request");
    let status = StatusCode::from_u16(response.status().as_u16()).expect("status");
    (status, response.text().await.expect("body"))
}

/// Creates `order_no` and pays it through the notify path (transaction `T-{order_no}`).
pub async fn paid_order(app: &crate::support::helpers::TestApp, order_no: &str, amount_fen: i64) {
    app.create_order(order_no, amount_fen).await;
    let (status, body) = deliver(
        app,
        &TestNotification::paid(order_no, &format!("T-{order_no}"), amount_fen),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{order_no}: {body}");
}
