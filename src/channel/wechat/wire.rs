//! The notification on the wire: its headers, its JSON and the decryption of its `resource`.

#[allow(unused_imports)]
use super::*;

/// The one value of a header that must appear exactly once.
pub(super) fn single_header<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a str>, Rejection> {
    let mut values = headers.get_all(name);
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::BadRequest(format!(
            "header {name} appears more than once"
        )));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| Rejection::BadRequest(format!("header {name} is not visible ASCII")))
}

pub(super) fn required_header<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<&'a str, Rejection> {
    single_header(headers, name)?
        .ok_or_else(|| Rejection::BadRequest(format!("missing header {name}")))
}

#[derive(Deserialize)]
pub(super) struct Envelope {
    pub(super) event_type: String,
    pub(super) resource_type: Option<String>,
    pub(super) resource: Resource,
}

#[derive(Deserialize)]
pub(super) struct Resource {
    pub(super) algorithm: String,
    pub(super) ciphertext: String,
    #[serde(default)]
    pub(super) associated_data: String,
    pub(super) nonce: String,
}

#[derive(Deserialize)]
pub(super) struct Transaction {
    pub(super) appid: String,
    pub(super) mchid: String,
    pub(super) out_trade_no: String,
    pub(super) transaction_id: String,
    pub(super) trade_state: String,
    pub(super) amount: TransactionAmount,
    pub(super) success_time: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct TransactionAmount {
    /// The order amount; not `payer_total`, which coupons reduce.
    pub(super) total: i64,
    pub(super) currency: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RefundResource {
    pub(super) mchid: String,
    pub(super) transaction_id: String,
    pub(super) out_trade_no: String,
    pub(super) refund_id: String,
    pub(super) out_refund_no: String,
    pub(super) refund_status: String,
    pub(super) amount: WechatRefundAmount,
    pub(super) success_time: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct WechatRefundAmount {
    pub(super) total: i64,
    pub(super) refund: i64,
}

/// A payment's notice, from the transaction a notification or a query answer carries: the
/// same fields, so the same digest either way.
pub(super) fn transaction_notice(m: &Merchant, t: Transaction, kind: NoticeKind) -> Notice {
    Notice {
        channel: ChannelId::Wechat,
        kind,
        merchant_matches: t.mchid == m.mchid && m.appids.contains(&t.appid),
        merchant: MerchantIds {
            merchant_id: t.mchid,
            app_id: Some(t.appid),
        },
        out_trade_no: t.out_trade_no,
        transaction_id: t.transaction_id,
        amount_fen: t.amount.total,
        currency: t.amount.currency.unwrap_or_else(|| "CNY".to_owned()),
        occurred_at: parse_time(t.success_time.as_deref()),
    }
}

pub(super) fn parse_time(text: Option<&str>) -> Option<Timestamp> {
    text.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| Timestamp::new(t.with_timezone(&chrono::Utc)))
}

pub(super) fn bad_json(what: &str) -> impl Fn(serde_json::Error) -> Rejection + '_ {
    move |e| Rejection::BadRequest(format!("{what}: {e}"))
}

/// A signed body opened: the envelope read and `resource` decrypted with `merchant`'s APIv3
/// key. Only ever called on a body whose signature verified.
pub(super) fn open(merchant: &Arc<Merchant>, body: &[u8]) -> Result<Verified, Rejection> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(bad_json("envelope"))?;
    if envelope
        .resource_type
        .as_deref()
        .is_some_and(|t| t != "encrypt-resource")
    {
        return Err(Rejection::BadRequest(
            "resource_type is not encrypt-resource".into(),
        ));
    }
    let r = envelope.resource;
    if r.algorithm != "AEAD_AES_256_GCM" {
        return Err(Rejection::BadRequest(format!(
            "unsupported algorithm {}",
            r.algorithm
        )));
    }
    let nonce = Nonce::try_assume_unique_for_key(r.nonce.as_bytes())
        .map_err(|_| Rejection::BadRequest("resource.nonce is not 12 bytes".into()))?;
    let mut sealed = BASE64
        .decode(&r.ciphertext)
        .map_err(|_| Rejection::BadRequest("resource.ciphertext is not base64".into()))?;
    let plaintext = merchant
        .apiv3_key
        .open_in_place(nonce, Aad::from(r.associated_data.as_bytes()), &mut sealed)
        .map_err(|_| {
            Rejection::Undecryptable(format!(
                "resource does not decrypt with the apiv3_key of merchant {}",
                merchant.mchid
            ))
        })?
        .to_vec();
    Ok(Verified {
        merchant: Arc::clone(merchant),
        event_type: envelope.event_type,
        plaintext,
    })
}
