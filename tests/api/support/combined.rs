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
pub use paynotify::qa::forge::wechat::CombinedSub;
use paynotify::qa::forge::wechat::{Sandbox, combined};

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
        combined(
            &self.combine_appid,
            &self.combine_out_trade_no,
            &self.combine_mchid,
            &self.subs,
            &"附".repeat(self.attach_len),
            &self.success_time,
        )
        .expect("json")
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
    s.sealed("TRANSACTION.SUCCESS", plaintext.as_bytes(), timestamp)
        .expect("seal")
}
