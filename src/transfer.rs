//! What a merchant transfer (商家转账) is, provider-neutral: our status, the provider's
//! state, what a verified answer or notification says about one transfer, and the call that
//! starts one. The transfers room (`crate::transfers`) starts and follows them; the providers
//! (`crate::channel`) speak the wire; the ledger (`crate::store::ledger`) applies what they
//! report. All three read this file and nothing of each other.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// A transfer's status (`transfer.status`). Final: `SUCCESS`, `FAIL`, `CANCELLED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TransferStatus {
    /// Sent with the answer unknown, or accepted and not finished.
    Processing,
    /// WeChat only: waiting for the user to confirm (`package_info` opens WeChat's page).
    WaitUserConfirm,
    Success,
    Fail,
    /// WeChat only.
    Cancelled,
}

impl TransferStatus {
    pub const ALL: [TransferStatus; 5] = [
        Self::Processing,
        Self::WaitUserConfirm,
        Self::Success,
        Self::Fail,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "PROCESSING",
            Self::WaitUserConfirm => "WAIT_USER_CONFIRM",
            Self::Success => "SUCCESS",
            Self::Fail => "FAIL",
            Self::Cancelled => "CANCELLED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Success | Self::Fail | Self::Cancelled)
    }

    /// The `result` label of `paynotify_transfers_final_total`.
    pub fn result_label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Fail => "fail",
            Self::Cancelled => "cancelled",
            Self::Processing | Self::WaitUserConfirm => "none",
        }
    }
}

/// A transfer as the provider holds it: WeChat's `state`, Alipay's `status`, one vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferState {
    /// WeChat `ACCEPTED`.
    Accepted,
    /// WeChat `PROCESSING` (funds being locked), Alipay `DEALING`.
    Processing,
    /// WeChat only: `package_info` opens the confirm page.
    WaitUserConfirm,
    /// WeChat: the user confirmed; a cancel is no longer possible.
    Transfering,
    /// WeChat: a cancel was accepted; `CANCELLED` follows.
    Canceling,
    Success,
    Fail,
    Cancelled,
}

impl TransferState {
    /// How far along the provider's own order a state is: an answer reporting a lower rank
    /// than the one recorded is older news and is ignored. The finals share the top rank.
    pub fn rank(self) -> u8 {
        match self {
            Self::Accepted => 0,
            Self::Processing => 1,
            Self::WaitUserConfirm => 2,
            Self::Transfering | Self::Canceling => 3,
            Self::Success | Self::Fail | Self::Cancelled => 4,
        }
    }

    /// Our status for this state; `None` for WeChat `CANCELING`, which leaves it unchanged.
    pub fn status(self) -> Option<TransferStatus> {
        Some(match self {
            Self::Accepted | Self::Processing | Self::Transfering => TransferStatus::Processing,
            Self::WaitUserConfirm => TransferStatus::WaitUserConfirm,
            Self::Canceling => return None,
            Self::Success => TransferStatus::Success,
            Self::Fail => TransferStatus::Fail,
            Self::Cancelled => TransferStatus::Cancelled,
        })
    }

    pub fn is_final(self) -> bool {
        self.rank() == 4
    }

    /// WeChat's and Alipay's words for the state, as they are recorded in
    /// `transfer.provider_state` (Alipay `REFUND`, money sent back, is a failure).
    pub fn parse(provider_state: &str) -> Option<Self> {
        Some(match provider_state {
            "ACCEPTED" => Self::Accepted,
            "PROCESSING" | "DEALING" => Self::Processing,
            "WAIT_USER_CONFIRM" => Self::WaitUserConfirm,
            "TRANSFERING" => Self::Transfering,
            "CANCELING" => Self::Canceling,
            "SUCCESS" => Self::Success,
            "FAIL" | "FAILED" | "REFUND" => Self::Fail,
            "CANCELLED" => Self::Cancelled,
            _ => return None,
        })
    }
}

/// What one verified provider answer or notification says about one transfer. Answers and
/// notifications both become this, and the ledger applies it in one place
/// (`Store::apply_transfer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferSeen {
    pub out_bill_no: String,
    /// WeChat `transfer_bill_no`, Alipay `order_id`, when the provider names it.
    pub provider_bill_no: Option<String>,
    pub state: TransferState,
    /// The provider's own word for `state` (`TRANSFERING`, `DEALING`); `None` when nothing
    /// exists at the provider (a confirmed refusal of the create).
    pub provider_state: Option<String>,
    /// The amount the provider names, in fen (`None` when the answer names none).
    pub amount_fen: Option<i64>,
    /// The merchant or app the provider names (WeChat `mch_id`/`mchid`, Alipay `app_id`).
    pub account: String,
    /// WeChat `package_info` (`WAIT_USER_CONFIRM`).
    pub package_info: Option<String>,
    /// WeChat `fail_reason`, Alipay `error_code`, or the refusal's code.
    pub fail_reason: Option<String>,
    pub occurred_at: Option<Timestamp>,
}

/// The widest transfer ids the `transfer` table holds.
pub mod max_len {
    /// `out_bill_no`: 1 to 32 of A-Z a-z 0-9 (WeChat's limit; Alipay's `out_biz_no` allows 64).
    pub const OUT_BILL_NO: usize = 32;
    /// An `out_bill_no` a provider names: Alipay's `out_biz_no` allows 64, and one longer than
    /// ours is money out never started here (`UNKNOWN_TRANSFER`), not a malformed message.
    pub const SEEN_OUT_BILL_NO: usize = 64;
    /// WeChat `transfer_bill_no`, Alipay `order_id`.
    pub const PROVIDER_BILL_NO: usize = 64;
    pub const FAIL_REASON: usize = 64;
    pub const PACKAGE_INFO: usize = 1024;
}

impl TransferSeen {
    /// Longer ids than the table holds are refused where they arrive.
    pub fn check_lengths(&self) -> Result<(), String> {
        let fields = [
            (
                "out_bill_no",
                Some(&self.out_bill_no),
                max_len::SEEN_OUT_BILL_NO,
            ),
            (
                "provider bill no",
                self.provider_bill_no.as_ref(),
                max_len::PROVIDER_BILL_NO,
            ),
            (
                "fail_reason",
                self.fail_reason.as_ref(),
                max_len::FAIL_REASON,
            ),
            (
                "package_info",
                self.package_info.as_ref(),
                max_len::PACKAGE_INFO,
            ),
        ];
        for (name, value, max) in fields {
            if let Some(value) = value
                && value.chars().count() > max
            {
                return Err(format!("{name} is longer than {max} characters"));
            }
        }
        Ok(())
    }
}

/// One transfer to send, exactly as it is sent every time (the provider deduplicates on
/// `out_bill_no` and wants the same parameters again). Stored whole, names included, so a
/// retry after a restart sends the same; never shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferCall {
    pub out_bill_no: String,
    pub amount_fen: i64,
    pub remark: String,
    pub payee: Payee,
}

/// Who is paid, and the channel's own fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "channel", rename_all = "lowercase")]
pub enum Payee {
    Wechat(WechatPayee),
    Alipay(AlipayPayee),
}

/// A WeChat transfer's payee and scene (`POST /v3/fund-app/mch-transfer/transfer-bills`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WechatPayee {
    pub appid: String,
    pub openid: String,
    /// Sent encrypted with the platform key.
    pub user_name: Option<String>,
    pub transfer_scene_id: String,
    pub transfer_scene_report_infos: Vec<SceneReportInfo>,
    pub user_recv_perception: Option<String>,
    /// `transfers.wechat_notify_url`, when set.
    pub notify_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SceneReportInfo {
    pub info_type: String,
    pub info_content: String,
}

/// An Alipay transfer's payee (`alipay.fund.trans.uni.transfer`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlipayPayee {
    pub identity: String,
    /// `ALIPAY_USER_ID` or `ALIPAY_LOGON_ID`.
    pub identity_type: String,
    pub name: Option<String>,
    pub order_title: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for s in TransferStatus::ALL {
            assert_eq!(TransferStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(TransferStatus::parse("success"), None);
    }

    #[test]
    fn a_final_state_outranks_every_other_and_canceling_keeps_the_status() {
        use TransferState::*;
        let all = [
            Accepted,
            Processing,
            WaitUserConfirm,
            Transfering,
            Canceling,
            Success,
            Fail,
            Cancelled,
        ];
        for s in all {
            assert_eq!(
                s.is_final(),
                s.status().is_some_and(TransferStatus::is_final)
            );
            if !s.is_final() {
                assert!(s.rank() < Success.rank(), "{s:?}");
            }
        }
        assert!(Accepted.rank() < Processing.rank());
        assert!(Processing.rank() < WaitUserConfirm.rank());
        assert!(WaitUserConfirm.rank() < Transfering.rank());
        assert_eq!(Canceling.status(), None);
        assert_eq!(Transfering.status(), Some(TransferStatus::Processing));
        assert_eq!(TransferState::parse("DEALING"), Some(Processing));
        assert_eq!(TransferState::parse("REFUND"), Some(Fail));
        assert_eq!(TransferState::parse("NEW_STATE"), None);
    }
}
