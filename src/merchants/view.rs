//! What `/admin/merchants` takes and shows: the bodies of `POST` and `PATCH`, and the view,
//! which holds no key material (no APIv3 key, no PEM, no token; only serials and flags).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::store::{Status, StoredAccount};
use crate::channel::accounts::{AccountSettings, ConfiguredAccount, Mode};
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The body of `POST /admin/merchants`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMerchant {
    /// `wechat` or `alipay`.
    pub channel: String,
    /// A WeChat `mchid` (a sub-merchant's `sub_mchid`) or an Alipay `app_id` (an authorizing
    /// merchant's `auth_app_id`).
    pub account: String,
    /// `direct` or `partner_sub`.
    pub mode: String,
    /// A `partner_sub`'s service provider (`mchid`) or ISV app (`app_id`).
    #[serde(default)]
    pub sp_account: Option<String>,
    /// WeChat: the apps bound to the merchant (a sub-merchant's `sub_appid`s).
    #[serde(default)]
    pub appids: Option<Vec<String>>,
    /// Alipay: the merchant's PID.
    #[serde(default)]
    pub seller_id: Option<String>,
    /// WeChat API v3's base URL.
    #[serde(default)]
    pub api_base: Option<String>,
    /// Alipay's OpenAPI gateway.
    #[serde(default)]
    pub gateway: Option<String>,
    /// WeChat: `download` or `static`.
    #[serde(default)]
    pub certificates: Option<String>,
    /// The keys (see the contract); stored only sealed, never shown.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub keys: Option<Map<String, Value>>,
}

/// The body of `PATCH /admin/merchants/{channel}/{account}`: each field given replaces that
/// field; each key given replaces that key (`null` removes it).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MerchantChange {
    /// Refused when it differs: an account's ids and mode never change.
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub account: Option<String>,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub sp_account: Option<String>,
    #[serde(default)]
    pub appids: Option<Vec<String>>,
    #[serde(default)]
    pub seller_id: Option<String>,
    #[serde(default)]
    pub api_base: Option<String>,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub certificates: Option<String>,
    /// `enabled` re-enables a disabled account.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub keys: Option<Map<String, Value>>,
}

/// An account as `/admin/merchants` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct MerchantView {
    pub channel: String,
    pub account: String,
    pub mode: String,
    pub sp_account: Option<String>,
    pub appids: Vec<String>,
    pub seller_id: Option<String>,
    /// WeChat's `api_base`, Alipay's `gateway`: where its API calls go (`null` without API
    /// credentials, or for a `partner_sub`, which uses its provider's).
    pub api_base: Option<String>,
    pub certificates: Option<String>,
    /// `config` (the file) or `api`.
    pub source: String,
    pub status: String,
    pub platform_serials: Vec<String>,
    pub has_api_credentials: bool,
    pub has_app_auth_token: bool,
    /// 0 for a file account; 1 when added, and one more for every change.
    pub keys_version: i64,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub created_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub updated_at: Option<Timestamp>,
}

impl MerchantView {
    pub fn stored(a: &StoredAccount) -> Self {
        Self::of(
            a.channel,
            &a.account,
            a.mode,
            a.sp_account.clone(),
            &a.settings,
            "api",
            a.status,
        )
        .versioned(a.keys_version, a.created_at, a.updated_at)
    }

    pub fn configured(channel: ChannelId, a: &ConfiguredAccount) -> Self {
        Self::of(
            channel,
            &a.account,
            Mode::Direct,
            None,
            &a.settings,
            "config",
            Status::Enabled,
        )
    }

    fn of(
        channel: ChannelId,
        account: &str,
        mode: Mode,
        sp_account: Option<String>,
        settings: &AccountSettings,
        source: &str,
        status: Status,
    ) -> Self {
        let mut platform_serials = settings.facts.platform_serials.clone();
        platform_serials.sort();
        Self {
            channel: channel.as_str().to_owned(),
            account: account.to_owned(),
            mode: mode.as_str().to_owned(),
            sp_account,
            appids: settings.appids.clone(),
            seller_id: settings.seller_id.clone(),
            api_base: settings
                .api_base
                .clone()
                .or_else(|| settings.facts.api_base.clone()),
            certificates: settings.certificates.clone(),
            source: source.to_owned(),
            status: status.as_str().to_owned(),
            platform_serials,
            has_api_credentials: settings.facts.has_api_credentials,
            has_app_auth_token: settings.facts.has_app_auth_token,
            keys_version: 0,
            created_at: None,
            updated_at: None,
        }
    }

    fn versioned(self, keys_version: i64, created_at: Timestamp, updated_at: Timestamp) -> Self {
        Self {
            keys_version,
            created_at: Some(created_at),
            updated_at: Some(updated_at),
            ..self
        }
    }
}
