//! Provider accounts as data: what a channel needs to hold an account added through
//! `/admin/merchants` beside those of the configuration file, and the [`AccountBook`] each
//! channel keeps them in. The neutral side; each provider reads its own `keys` object.
//!
//! One account abstraction underneath every feature: a channel builds a file account and a
//! stored one into the same in-memory account, so verification, the API calls, certificates,
//! bills, refunds and transfers never ask where an account came from.

use serde::{Deserialize, Serialize};

use crate::notice::ChannelId;
use crate::time::Timestamp;

/// `mode`: an account with its own keys, or one served by another account's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A WeChat merchant or an Alipay app with its own keys.
    Direct,
    /// A WeChat sub-merchant (`sub_mchid`) of a service provider, or an Alipay merchant that
    /// authorised an ISV's app (`account` = its `auth_app_id`).
    PartnerSub,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::PartnerSub => "partner_sub",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Direct, Self::PartnerSub]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// When a book parses an account's API private key: [`AccountBook::check`] parses it now,
/// so a key that is not one is refused before it is stored; [`AccountBook::apply`] installs
/// an account that passed that check, and its key is parsed on its first signature
/// ([`crate::channel::keys::Signer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    Now,
    OnFirstUse,
}

/// The settings of an account that are not keys, stored in clear.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountSettings {
    /// What its keys are (serials, flags), as [`AccountBook::check`] found them when they
    /// were stored: the view shows them without opening any key.
    #[serde(default)]
    pub facts: Facts,
    /// WeChat: the apps (`appid`s, a sub-merchant's `sub_appid`s) whose payments are ours.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub appids: Vec<String>,
    /// Alipay: the merchant's PID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seller_id: Option<String>,
    /// WeChat `api_base`, Alipay `gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_base: Option<String>,
    /// WeChat: `download` or `static` (as `certificates` in the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<String>,
}

/// An account as a channel builds it: its ids, settings and opened `keys` object.
#[derive(Clone)]
pub struct AccountSpec {
    pub account: String,
    pub mode: Mode,
    /// A `partner_sub`'s service provider (WeChat `mchid`) or ISV app (`app_id`).
    pub sp_account: Option<String>,
    pub settings: AccountSettings,
    /// The `keys` object as the admin API takes it (opened; never logged or shown).
    pub keys: serde_json::Map<String, serde_json::Value>,
}

impl std::fmt::Debug for AccountSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountSpec")
            .field("account", &self.account)
            .field("mode", &self.mode)
            .field("sp_account", &self.sp_account)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A field of the admin request that is wrong, and why: a `400` naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    /// As the request names it: `keys.apiv3_key`, `keys.platform_keys[1].public_key_pem`.
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// What the view shows of an account's keys: serials and flags, never a key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// The platform keys' serials (WeChat), sorted.
    #[serde(default)]
    pub platform_serials: Vec<String>,
    #[serde(default)]
    pub has_api_credentials: bool,
    #[serde(default)]
    pub has_app_auth_token: bool,
    /// Where its API calls go (WeChat `api_base`, Alipay `gateway`, the default when none
    /// was given); `None` without API credentials.
    #[serde(default)]
    pub api_base: Option<String>,
}

/// An account of the configuration file, as `GET /admin/merchants` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredAccount {
    pub account: String,
    /// With the facts of its keys.
    pub settings: AccountSettings,
}

/// One change to a channel's live accounts.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "changes are few and short-lived; most of them are puts"
)]
pub enum Change {
    /// Adds the account, or replaces it (a rotation, a re-enable).
    Put(AccountSpec),
    /// The account is disabled: it verifies nothing and is asked nothing.
    Remove(String),
}

/// A batch of changes built, before it is swapped in.
pub struct Batch<B> {
    /// Each account to swap in, in order (`None`: the account is removed).
    pub built: Vec<(String, Option<B>)>,
    /// Each account that did not build, with why.
    pub refused: Vec<(String, Invalid)>,
}

/// Each of `changes` built with `build`, in order. An account of the configuration file
/// (`file`) is never changed: the file wins.
pub fn build_changes<B>(
    changes: Vec<Change>,
    file: &[String],
    mut build: impl FnMut(&AccountSpec) -> Result<B, Invalid>,
) -> Batch<B> {
    let mut built = Vec::new();
    let mut refused = Vec::new();
    for change in changes {
        let account = match &change {
            Change::Put(spec) => spec.account.clone(),
            Change::Remove(account) => account.clone(),
        };
        if file.contains(&account) {
            refused.push((
                account,
                Invalid::new("account", "configured in the file, which wins"),
            ));
            continue;
        }
        match change {
            Change::Put(spec) => match build(&spec) {
                Ok(b) => built.push((account, Some(b))),
                Err(why) => refused.push((account, why)),
            },
            Change::Remove(_) => built.push((account, None)),
        }
    }
    Batch { built, refused }
}

/// A channel's live set of accounts: those of the file (fixed at start-up) and those
/// installed from the database. Lookups on the notification path read an immutable snapshot
/// the book swaps whole, so they never wait for a change being applied.
pub trait AccountBook: Send + Sync + 'static {
    fn channel(&self) -> ChannelId;

    /// Parses every key of `spec` and checks it as [`AccountBook::apply`] would install it,
    /// installing nothing: what it would show, or the field that is wrong.
    fn check(&self, spec: &AccountSpec, now: Timestamp) -> Result<Facts, Invalid>;

    /// Applies `changes` in order and swaps the snapshot once. An account that does not
    /// build is left as it was and returned with why (a stored account always passed
    /// [`AccountBook::check`]; a certificate may have expired since).
    fn apply(&self, changes: Vec<Change>, now: Timestamp) -> Vec<(String, Invalid)>;

    /// The accounts of the configuration file.
    fn configured(&self) -> Vec<ConfiguredAccount>;

    /// Whether `account` is enabled and holds its own keys (file or database): what a
    /// `partner_sub`'s `sp_account` must be.
    fn is_keyed(&self, account: &str) -> bool;

    /// Whether `account` is live (file or database, enabled, any mode): what `POST /orders`
    /// may name.
    fn is_live(&self, account: &str) -> bool;
}
