//! An Alipay bill's own totals against its detail rows: the details' `#交易合计` and
//! `#退款合计` lines, and the summary's `合计` row.

use super::archive::{DETAILS, SUMMARY};
use crate::channel::bill::{self, BillError, BillTotals};
use crate::money::fen_to_yuan;

/// The sums of one kind of detail row, as the file states them (refunds negative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindSums {
    pub count: i64,
    /// 订单金额（元）.
    pub order_fen: i64,
    /// 商家实收（元）.
    pub received_fen: i64,
    /// 商家优惠（元）.
    pub discount_fen: i64,
    /// 服务费（元）, in thousandths of a fen.
    pub fee_milli_fen: i64,
}

impl KindSums {
    pub(super) fn add(&mut self, row: &Row) {
        self.count += 1;
        self.order_fen += row.order_fen;
        self.received_fen += row.received_fen;
        self.discount_fen += row.discount_fen;
        self.fee_milli_fen += row.fee_milli_fen;
    }
}

/// What the details entry came to: the neutral totals, and the sums its summary is checked
/// against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Details {
    pub totals: BillTotals,
    pub payments: KindSums,
    pub refunds: KindSums,
}

/// The 合计 row of 业务明细(汇总).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// 交易订单总笔数.
    pub payments: i64,
    /// 退款订单总笔数.
    pub refunds: i64,
    /// 订单金额（元）.
    pub order_fen: i64,
    /// 商家实收（元）.
    pub received_fen: i64,
    /// 服务费（元）, in thousandths of a fen.
    pub fee_milli_fen: i64,
}

impl Summary {
    /// The 合计 row against the detail rows: counts per kind, and 订单金额, 商家实收 and
    /// 服务费 over all rows as stated.
    pub fn check(&self, d: &Details) -> Result<(), BillError> {
        let both = |f: fn(&KindSums) -> i64| f(&d.payments) + f(&d.refunds);
        let figures = [
            ("交易订单总笔数", self.payments, d.payments.count, false),
            ("退款订单总笔数", self.refunds, d.refunds.count, false),
            (
                "订单金额（元）",
                self.order_fen,
                both(|k| k.order_fen),
                true,
            ),
            (
                "商家实收（元）",
                self.received_fen,
                both(|k| k.received_fen),
                true,
            ),
        ];
        for (name, stated, counted, yuan) in figures {
            if stated != counted {
                let show = |v| if yuan { fen_to_yuan(v) } else { v.to_string() };
                return Err(BillError::Summary(format!(
                    "{SUMMARY} 合计 {name} is {}, the details add up to {}",
                    show(stated),
                    show(counted)
                )));
            }
        }
        let fees = both(|k| k.fee_milli_fen);
        if self.fee_milli_fen != fees {
            return Err(BillError::Summary(format!(
                "{SUMMARY} 合计 服务费（元） is {}, the details add up to {}",
                bill::milli_fen_to_yuan(self.fee_milli_fen),
                bill::milli_fen_to_yuan(fees)
            )));
        }
        Ok(())
    }
}

/// One detail row's amounts, as stated.
pub(super) struct Row {
    pub(super) order_fen: i64,
    pub(super) received_fen: i64,
    pub(super) discount_fen: i64,
    pub(super) fee_milli_fen: i64,
}

/// A `#交易合计` / `#退款合计` line: `N笔，商家实收共X元，商家优惠共Y元` (refunds:
/// `商家实收退款共`, `商家优惠退款共`).
pub(super) struct StatedTotal {
    pub(super) count: i64,
    pub(super) received_fen: Option<i64>,
    pub(super) discount_fen: Option<i64>,
}

impl StatedTotal {
    pub(super) fn check(&self, name: &str, n: u64, sums: &KindSums) -> Result<(), BillError> {
        let off = |figure: &str, stated: String, counted: String| {
            Err(BillError::Summary(format!(
                "{DETAILS} line {n} {name} {figure} is {stated}, the rows add up to {counted}"
            )))
        };
        if self.count != sums.count {
            return off("笔", self.count.to_string(), sums.count.to_string());
        }
        for (figure, stated, counted) in [
            ("商家实收", self.received_fen, sums.received_fen),
            ("商家优惠", self.discount_fen, sums.discount_fen),
        ] {
            if let Some(stated) = stated
                && stated != counted
            {
                return off(figure, fen_to_yuan(stated), fen_to_yuan(counted));
            }
        }
        Ok(())
    }
}
