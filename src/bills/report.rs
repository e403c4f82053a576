//! A reconciled bill as the admin API, the CLI and `bill_report` / `bill_item` show it.

use serde::Serialize;

use crate::channel::bill::{BillTotals, Integrity};
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// How a (bill date, channel, account) came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// No open item: the books agree (items still `pending` or `recovered` are listed).
    Balanced,
    /// At least one open item.
    Mismatched,
    /// The bill could not be had or read (`reason`): nothing was compared or acted upon.
    Unavailable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Balanced => "balanced",
            Self::Mismatched => "mismatched",
            Self::Unavailable => "unavailable",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Balanced, Self::Mismatched, Self::Unavailable]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// What a difference is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ItemType {
    /// The provider has a payment the ledger does not.
    MissingHere,
    /// The ledger has a payment the provider's bill does not.
    MissingAtProvider,
    /// Both have the payment, with different amounts.
    AmountMismatch,
    RefundMissingHere,
    RefundMissingAtProvider,
    RefundAmountMismatch,
}

impl ItemType {
    pub const ALL: [Self; 6] = [
        Self::MissingHere,
        Self::MissingAtProvider,
        Self::AmountMismatch,
        Self::RefundMissingHere,
        Self::RefundMissingAtProvider,
        Self::RefundAmountMismatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingHere => "MISSING_HERE",
            Self::MissingAtProvider => "MISSING_AT_PROVIDER",
            Self::AmountMismatch => "AMOUNT_MISMATCH",
            Self::RefundMissingHere => "REFUND_MISSING_HERE",
            Self::RefundMissingAtProvider => "REFUND_MISSING_AT_PROVIDER",
            Self::RefundAmountMismatch => "REFUND_AMOUNT_MISMATCH",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Whether an open item of this type is raised as a `PAYMENT_ANOMALY` (`BILL_MISMATCH`):
    /// money the ledger counts that the provider does not, or counts differently. What the
    /// provider has and the ledger lacks is recovered through the ledger instead, when the
    /// provider's signed answer allows it.
    pub fn raised(self) -> bool {
        !matches!(self, Self::MissingHere | Self::RefundMissingHere)
    }
}

/// What became of a difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    /// The provider's signed answer confirmed it and it went through the ledger.
    Recovered,
    /// A difference for a person (and, where [`ItemType::raised`], an anomaly event).
    Open,
    /// May be timing (near midnight, dated the next day by the other side): compared again
    /// by the runs of the next `bills.settle_days` days before it is reported.
    Pending,
    /// Was `open` (and raised), until a later run found it explained: the payment or refund
    /// is in another day's bill (its bill was compared after this day's). Its anomaly event
    /// is followed by one saying so.
    Settled,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recovered => "recovered",
            Self::Open => "open",
            Self::Pending => "pending",
            Self::Settled => "settled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Recovered, Self::Open, Self::Pending, Self::Settled]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// One side's view of a payment or refund.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Side {
    /// The provider's words (`SUCCESS`, `REFUND`, `交易`, `退款`), or the ledger's
    /// (`PAID`, a refund's `SUCCESS`).
    pub status: String,
    pub amount_fen: i64,
}

/// One difference between the bill and the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Item {
    #[serde(rename = "type")]
    pub kind: ItemType,
    pub out_trade_no: String,
    pub out_refund_no: Option<String>,
    pub transaction_id: Option<String>,
    pub provider: Option<Side>,
    pub ours: Option<Side>,
    pub resolution: Resolution,
}

/// The ledger's side of a day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct OurTotals {
    pub count: i64,
    pub amount_fen: i64,
    pub refund_count: i64,
    pub refund_fen: i64,
}

/// One (bill date, channel, account), compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Report {
    /// The bill date, a provider-local day: `YYYY-MM-DD`.
    pub date: String,
    #[schema(value_type = String)]
    pub channel: ChannelId,
    /// WeChat `mchid` or Alipay `app_id` (the seller's first app: its bill is the seller's).
    pub account: String,
    /// What vouches for the bill file: `signed_hash` (WeChat), or `none` (Alipay: the file
    /// is not integrity-protected; its own totals are all it is checked against).
    pub integrity: Integrity,
    pub status: Status,
    /// Why the report is `unavailable` (`null` otherwise).
    pub reason: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub fetched_at: Timestamp,
    pub provider: BillTotals,
    pub ours: OurTotals,
    pub items: Vec<Item>,
}

impl Report {
    /// The status its items give a report that was compared.
    pub fn status_of(items: &[Item]) -> Status {
        if items.iter().any(|i| i.resolution == Resolution::Open) {
            Status::Mismatched
        } else {
            Status::Balanced
        }
    }
}

/// What `paynotify bills reconcile` exits with: 2 when any report is unavailable (the day
/// cannot be signed off), else 1 when any is mismatched, else 0.
pub fn exit_code(reports: &[Report]) -> u8 {
    if reports.iter().any(|r| r.status == Status::Unavailable) {
        2
    } else if reports.iter().any(|r| r.status == Status::Mismatched) {
        1
    } else {
        0
    }
}

impl std::fmt::Display for Report {
    /// A few lines for a person: the report, its totals, then one line per item.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fen = |v: i64| crate::money::fen_to_yuan(v);
        writeln!(
            f,
            "{} {} {}: {}{}",
            self.date,
            self.channel,
            self.account,
            self.status.as_str(),
            self.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )?;
        if self.integrity == Integrity::None {
            writeln!(
                f,
                "  the bill file is not integrity-protected: the provider gives no hash or signature of it"
            )?;
        }
        if self.status != Status::Unavailable {
            writeln!(
                f,
                "  provider: {} payments {} yuan, {} refunds {} yuan, fees {} yuan",
                self.provider.count,
                fen(self.provider.amount_fen),
                self.provider.refund_count,
                fen(self.provider.refund_fen),
                fen(self.provider.fee_fen)
            )?;
            writeln!(
                f,
                "  ours:     {} payments {} yuan, {} refunds {} yuan",
                self.ours.count,
                fen(self.ours.amount_fen),
                self.ours.refund_count,
                fen(self.ours.refund_fen)
            )?;
        }
        for item in &self.items {
            let side = |s: &Option<Side>| {
                s.as_ref().map_or_else(
                    || "-".to_owned(),
                    |s| format!("{} {}", s.status, fen(s.amount_fen)),
                )
            };
            writeln!(
                f,
                "  {} {}{} provider: {} ours: {} -> {}",
                item.kind.as_str(),
                item.out_trade_no,
                item.out_refund_no
                    .as_deref()
                    .map(|r| format!(" refund {r}"))
                    .unwrap_or_default(),
                side(&item.provider),
                side(&item.ours),
                item.resolution.as_str()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alipay_report_says_its_bill_is_not_integrity_protected() {
        let report = |channel: ChannelId| Report {
            date: "2026-11-30".into(),
            channel,
            account: "2021000000000001".into(),
            integrity: Integrity::of(channel),
            status: Status::Balanced,
            reason: None,
            fetched_at: Timestamp::new(chrono::Utc::now()),
            provider: BillTotals::default(),
            ours: OurTotals::default(),
            items: Vec::new(),
        };
        let alipay = report(ChannelId::Alipay);
        assert!(alipay.to_string().contains("not integrity-protected"));
        let json = serde_json::to_value(&alipay).expect("json");
        assert_eq!(json["integrity"], "none");
        let wechat = report(ChannelId::Wechat);
        assert!(!wechat.to_string().contains("integrity"));
        let json = serde_json::to_value(&wechat).expect("json");
        assert_eq!(json["integrity"], "signed_hash");
    }
}
