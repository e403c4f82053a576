//! WeChat's combined payment notification (合单支付), built as WeChat sends it: event
//! `TRANSACTION.SUCCESS`, one resource for the whole combination (`original_type` and
//! `associated_data` `transaction`), AES-256-GCM with the combine merchant's APIv3 key, the
//! envelope signed with its platform key exactly as `paynotify::qa::forge::wechat` signs an
//! ordinary payment.
//!
//! The decrypted resource keeps the key order of WeChat's doc sample: `combine_appid`,
//! `combine_out_trade_no`, `combine_mchid`, `scene_info`, `sub_orders` (each `mchid`,
//! `trade_type`, `trade_state`, `bank_type`, `attach`, `amount{total_amount, currency,
//! payer_amount, payer_currency}`, `success_time`, `transaction_id`, `out_trade_no`), then
//! `combine_payer_info`.
//!
//! ```ignore
//! let c = Combined::new(&s, "C-1", vec![CombinedSub::paid("S-1", 1000, &s.mchid)]);
//! let first = c.delivery(&s, now);
//! let retry = c.delivery(&s, now + 15); // re-encrypted and re-signed, the same content
//! ```

use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat::{Sandbox, encrypt, envelope};
use serde::Serialize;

/// One sub-order as the notification lists it; `trade_state` `SUCCESS` in a real one.
#[derive(Debug, Clone)]
pub struct CombinedSub {
    pub out_trade_no: String,
    pub transaction_id: String,
    pub total_amount: i64,
    pub mchid: String,
    pub trade_state: String,
}

impl CombinedSub {
    /// `out_trade_no` paid `total_amount` to `mchid`, transaction `42{out_trade_no}`.
    pub fn paid(out_trade_no: &str, total_amount: i64, mchid: &str) -> Self {
        Self {
            out_trade_no: out_trade_no.into(),
            transaction_id: format!("42{out_trade_no}"),
            total_amount,
            mchid: mchid.into(),
            trade_state: "SUCCESS".into(),
        }
    }
}

/// A combination as one notification carries it.
#[derive(Debug, Clone)]
pub struct Combined {
    pub combine_out_trade_no: String,
    pub combine_mchid: String,
    pub combine_appid: String,
    pub subs: Vec<CombinedSub>,
    /// Each sub-order's `attach` is this many characters (WeChat allows 128), each a
    /// Chinese one: three bytes, the widest a merchant's note usually is.
    pub attach_len: usize,
    pub success_time: String,
}

impl Combined {
    /// `subs` combined by the sandbox's merchant and app.
    pub fn new(s: &Sandbox, combine_out_trade_no: &str, subs: Vec<CombinedSub>) -> Self {
        Self {
            combine_out_trade_no: combine_out_trade_no.into(),
            combine_mchid: s.mchid.clone(),
            combine_appid: s.appid.clone(),
            subs,
            attach_len: 8,
            success_time: "2026-11-30T10:00:00+08:00".into(),
        }
    }

    /// `count` sub-orders `{prefix}-1` … of `total_amount` each, all paid to the sandbox's
    /// merchant.
    pub fn of(s: &Sandbox, combine_out_trade_no: &str, count: usize, total_amount: i64) -> Self {
        let subs = (1..=count)
            .map(|i| {
                CombinedSub::paid(
                    &format!("{combine_out_trade_no}-{i}"),
                    total_amount,
                    &s.mchid,
                )
            })
            .collect();
        Self::new(s, combine_out_trade_no, subs)
    }

    /// Every sub-order's `attach` `len` characters long (128 with 50 sub-orders: the
    /// contract's 47 KB body).
    pub fn attach(mut self, len: usize) -> Self {
        self.attach_len = len;
        self
    }

    /// The decrypted resource, compact, in the doc sample's key order.
    pub fn plaintext(&self) -> String {
        let attach = "附".repeat(self.attach_len);
        let resource = Resource {
            combine_appid: &self.combine_appid,
            combine_out_trade_no: &self.combine_out_trade_no,
            combine_mchid: &self.combine_mchid,
            scene_info: SceneInfo {
                device_id: "POS1:1",
            },
            sub_orders: self
                .subs
                .iter()
                .map(|sub| SubOrder {
                    mchid: &sub.mchid,
                    trade_type: "JSAPI",
                    trade_state: &sub.trade_state,
                    bank_type: "OTHERS",
                    attach: &attach,
                    amount: Amount {
                        total_amount: sub.total_amount,
                        currency: "CNY",
                        payer_amount: sub.total_amount,
                        payer_currency: "CNY",
                    },
                    success_time: &self.success_time,
                    transaction_id: &sub.transaction_id,
                    out_trade_no: &sub.out_trade_no,
                })
                .collect(),
            combine_payer_info: PayerInfo {
                openid: "oSandboxOpenId0000000000000",
            },
        };
        serde_json::to_string(&resource).expect("json")
    }

    /// The whole notification, encrypted with `s`'s APIv3 key and signed at `timestamp`.
    /// Every call encrypts with a fresh nonce and signs with a fresh one, as WeChat's
    /// retries of the same notification do.
    pub fn delivery(&self, s: &Sandbox, timestamp: i64) -> Delivery {
        sealed(s, &self.plaintext(), timestamp)
    }
}

/// `plaintext` (any decrypted resource, broken ones included) as a signed
/// `TRANSACTION.SUCCESS` notification of `s`.
pub fn sealed(s: &Sandbox, plaintext: &str, timestamp: i64) -> Delivery {
    const NONCE_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let nonce = paynotify::random::token(NONCE_CHARS, 12).expect("random");
    let ciphertext = encrypt(
        s.apiv3_key.as_bytes(),
        &nonce,
        "transaction",
        plaintext.as_bytes(),
    )
    .expect("encrypt");
    let body = envelope(
        "TRANSACTION.SUCCESS",
        "transaction",
        &ciphertext,
        "transaction",
        &nonce,
    );
    s.sign(timestamp, body.into_bytes()).expect("sign")
}

#[derive(Serialize)]
struct Resource<'a> {
    combine_appid: &'a str,
    combine_out_trade_no: &'a str,
    combine_mchid: &'a str,
    scene_info: SceneInfo<'a>,
    sub_orders: Vec<SubOrder<'a>>,
    combine_payer_info: PayerInfo<'a>,
}

#[derive(Serialize)]
struct SceneInfo<'a> {
    device_id: &'a str,
}

#[derive(Serialize)]
struct SubOrder<'a> {
    mchid: &'a str,
    trade_type: &'a str,
    trade_state: &'a str,
    bank_type: &'a str,
    attach: &'a str,
    amount: Amount<'a>,
    success_time: &'a str,
    transaction_id: &'a str,
    out_trade_no: &'a str,
}

#[derive(Serialize)]
struct Amount<'a> {
    total_amount: i64,
    currency: &'a str,
    payer_amount: i64,
    payer_currency: &'a str,
}

#[derive(Serialize)]
struct PayerInfo<'a> {
    openid: &'a str,
}
