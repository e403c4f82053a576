//! The summary row of a WeChat trade bill against its detail rows: every figure it states.

use crate::channel::bill::{self, BillError};
use crate::money::{fen_to_yuan, yuan_to_fen};

/// The sums of the detail rows that the summary row states, in the units it states them.
#[derive(Default)]
pub(super) struct Sums {
    pub(super) rows: i64,
    pub(super) settlement_fen: i64,
    pub(super) refund_fen: i64,
    pub(super) coupon_refund_fen: i64,
    pub(super) fee_milli_fen: i64,
    pub(super) order_fen: i64,
    pub(super) applied_refund_fen: i64,
}

/// The summary row's figures, `stated` by column name, against the detail rows' `sums`
/// (see [`super::read_tradebill`]); `line` is the summary row's.
pub(super) fn summary<'t>(
    stated: impl Fn(&str) -> &'t str,
    line: u64,
    sums: &Sums,
) -> Result<(), BillError> {
    let count = stated("总交易单数");
    if count_of(count) != Some(sums.rows) {
        return Err(BillError::Summary(format!(
            "总交易单数 states {count}, the bill has {} detail rows",
            sums.rows
        )));
    }
    for (name, sum) in [
        ("应结订单总金额", sums.settlement_fen),
        ("退款总金额", sums.refund_fen),
        ("充值券退款总金额", sums.coupon_refund_fen),
        ("订单总金额", sums.order_fen),
        ("申请退款总金额", sums.applied_refund_fen),
    ] {
        let text = stated(name);
        let fen = yuan_to_fen(text).map_err(|_| {
            BillError::Format(format!("line {line}, column {name}: {text:?} is not yuan"))
        })?;
        if fen != sum {
            return Err(BillError::Summary(format!(
                "{name} states {text}, the detail rows sum to {}",
                fen_to_yuan(sum)
            )));
        }
    }
    let fee = stated("手续费总金额");
    let (milli, places) = bill::yuan_to_milli_fen(fee).ok_or_else(|| {
        BillError::Format(format!(
            "line {line}, column 手续费总金额: {fee:?} is not yuan with at most five decimals"
        ))
    })?;
    let agrees = if places > 2 {
        milli == sums.fee_milli_fen
    } else {
        milli == bill::round_milli_fen(sums.fee_milli_fen) * 1000
    };
    if !agrees {
        return Err(BillError::Summary(format!(
            "手续费总金额 states {fee}, the detail rows sum to {}",
            bill::milli_fen_to_yuan(sums.fee_milli_fen)
        )));
    }
    Ok(())
}

/// 总交易单数: a whole number (some bills state it as `45.0`).
fn count_of(text: &str) -> Option<i64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || !fraction.bytes().all(|b| b == b'0') {
        return None;
    }
    whole.parse().ok()
}
