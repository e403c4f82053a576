//! Merchants added through `/admin/merchants`: their stored `keys` built into the same
//! [`Merchant`], platform keys and API credentials a file merchant has, and swapped into the
//! channel's book and the client's accounts in one step.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Deserialize;

use super::api::{API_BASE, ApiMerchant, WechatApi};
use super::{Book, Merchant, PlatformVerifier, SubMerchant, WechatPay};
use crate::channel::accounts::{
    AccountBook, AccountSettings, AccountSpec, Batch, Change, ConfiguredAccount, Facts, Invalid,
    Mode, Parse, build_changes,
};
use crate::channel::api::Account;
use crate::channel::keys;
use crate::channel::platform::KeyOrigin;
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The `keys` of a WeChat `direct` account, as the admin API takes them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectKeys {
    apiv3_key: String,
    #[serde(default)]
    platform_keys: Vec<KeyEntry>,
    #[serde(default)]
    private_key_pem: Option<String>,
    #[serde(default)]
    merchant_serial: Option<String>,
}

/// One platform key: a WeChat Pay public key with its `PUB_KEY_ID_…`, or a certificate.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    #[serde(default)]
    serial: Option<String>,
    #[serde(default)]
    public_key_pem: Option<String>,
    #[serde(default)]
    certificate_pem: Option<String>,
}

/// An account built from its spec, not yet installed.
enum Built {
    Direct {
        merchant: Arc<Merchant>,
        keys: Vec<(String, PlatformVerifier)>,
        api: Option<ApiMerchant>,
    },
    Sub(SubMerchant),
}

/// The WeChat channel's live accounts: its book and its client's accounts, changed together.
pub struct WechatBook {
    pub(super) channel: Arc<WechatPay>,
    pub(super) api: Arc<WechatApi>,
}

impl WechatBook {
    fn build(&self, spec: &AccountSpec, now: Timestamp, parse: Parse) -> Result<Built, Invalid> {
        let mchid = &spec.account;
        if mchid.is_empty() || mchid.len() > 32 || !mchid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Invalid::new("account", "a WeChat mchid is 1 to 32 digits"));
        }
        let settings = &spec.settings;
        if settings.seller_id.is_some() {
            return Err(Invalid::new("seller_id", "only for Alipay"));
        }
        if let Some(mode) = &settings.certificates
            && mode != "download"
            && mode != "static"
        {
            return Err(Invalid::new("certificates", "\"download\" or \"static\""));
        }
        if settings.appids.iter().any(|a| a.is_empty() || a.len() > 32) {
            return Err(Invalid::new("appids", "each appid is 1 to 32 characters"));
        }
        match spec.mode {
            Mode::PartnerSub => self.build_sub(spec),
            Mode::Direct => self.build_direct(spec, now, parse),
        }
    }

    fn build_sub(&self, spec: &AccountSpec) -> Result<Built, Invalid> {
        if !spec.keys.is_empty() {
            return Err(Invalid::new(
                "keys",
                "a WeChat partner_sub has no keys: its service provider's serve it",
            ));
        }
        let settings = &spec.settings;
        if settings.api_base.is_some() || settings.certificates.is_some() {
            let field = if settings.api_base.is_some() {
                "api_base"
            } else {
                "certificates"
            };
            return Err(Invalid::new(
                field,
                "a partner_sub uses its service provider's",
            ));
        }
        let Some(sp) = &spec.sp_account else {
            return Err(Invalid::new("sp_account", "required for a partner_sub"));
        };
        if !self.is_keyed(sp) {
            return Err(Invalid::new(
                "sp_account",
                format!("{sp} is not an enabled WeChat merchant with its own keys"),
            ));
        }
        Ok(Built::Sub(SubMerchant {
            sub_mchid: spec.account.clone(),
            sp_mchid: sp.clone(),
            appids: settings.appids.clone(),
        }))
    }

    fn build_direct(
        &self,
        spec: &AccountSpec,
        now: Timestamp,
        parse: Parse,
    ) -> Result<Built, Invalid> {
        if spec.sp_account.is_some() {
            return Err(Invalid::new("sp_account", "only for a partner_sub"));
        }
        let keys: DirectKeys = serde_json::from_value(serde_json::Value::Object(spec.keys.clone()))
            .map_err(|e| Invalid::new("keys", e.to_string()))?;
        let merchant = Merchant::new(
            spec.account.clone(),
            spec.settings.appids.clone(),
            keys.apiv3_key.as_bytes(),
        )
        .map(Arc::new)
        .ok_or_else(|| {
            Invalid::new(
                "keys.apiv3_key",
                format!("must be exactly 32 bytes (got {})", keys.apiv3_key.len()),
            )
        })?;
        let book = self.channel.book();
        let mut platform: Vec<(String, PlatformVerifier)> = Vec::new();
        for (i, entry) in keys.platform_keys.iter().enumerate() {
            let field = format!("keys.platform_keys[{i}]");
            let (serial, verifier) = platform_key(&field, entry, &merchant, now)?;
            let serial = serial.to_ascii_uppercase();
            if platform.iter().any(|(s, _)| *s == serial) {
                return Err(Invalid::new(
                    format!("{field}.serial"),
                    format!("{serial} is given twice"),
                ));
            }
            if let Some(why) = book.conflicting(&serial, &spec.account, &verifier.key) {
                return Err(Invalid::new(format!("{field}.serial"), why));
            }
            if let Some(why) = book.ambiguous(&serial, &merchant) {
                return Err(Invalid::new("keys.apiv3_key", why));
            }
            platform.push((serial, verifier));
        }
        let api = match (&keys.private_key_pem, &keys.merchant_serial) {
            (None, None) => None,
            (Some(pem), Some(serial)) if !serial.is_empty() => {
                let key = keys::Signer::deferred(pem);
                if parse == Parse::Now {
                    key.get()
                        .map_err(|e| Invalid::new("keys.private_key_pem", e))?;
                }
                let base = spec
                    .settings
                    .api_base
                    .clone()
                    .unwrap_or_else(|| API_BASE.to_owned());
                let base = base.trim_end_matches('/').to_owned();
                crate::https::provider_url("api_base", &base)
                    .map_err(|e| Invalid::new("api_base", e.to_string()))?;
                Some(ApiMerchant {
                    merchant: Arc::clone(&merchant),
                    serial: serial.clone(),
                    key: Arc::new(key),
                    base,
                    downloads: spec.settings.certificates.as_deref() != Some("static"),
                    sub_mchid: None,
                })
            }
            (Some(_), _) => {
                return Err(Invalid::new(
                    "keys.merchant_serial",
                    "required with private_key_pem: the serial of the merchant API certificate",
                ));
            }
            (None, Some(_)) => {
                return Err(Invalid::new(
                    "keys.private_key_pem",
                    "required with merchant_serial: the merchant API private key",
                ));
            }
        };
        if spec.settings.certificates.as_deref() == Some("download") && api.is_none() {
            return Err(Invalid::new(
                "certificates",
                "\"download\" needs API credentials (keys.private_key_pem, keys.merchant_serial)",
            ));
        }
        if spec.settings.api_base.is_some() && api.is_none() {
            return Err(Invalid::new(
                "api_base",
                "only used with API credentials (keys.private_key_pem)",
            ));
        }
        if platform.is_empty() && !api.as_ref().is_some_and(|a| a.downloads) {
            return Err(Invalid::new(
                "keys.platform_keys",
                "at least one key is needed (or certificates = \"download\" with API credentials)",
            ));
        }
        Ok(Built::Direct {
            merchant,
            keys: platform,
            api,
        })
    }

    /// Takes `mchid` out of `book` (and reports whether its downloaded keys must follow a
    /// replacement): its merchant, sub-merchant entry and every key.
    fn take_out(book: &mut Book, mchid: &str) -> Vec<(String, Arc<PlatformVerifier>)> {
        book.subs.remove(mchid);
        if book.merchants.remove(mchid).is_none() {
            // Keys are held only by merchants here (`WechatPay::learn`): none to look for.
            return Vec::new();
        }
        book.take_keys_of(mchid)
            .into_iter()
            .filter(|(_, p)| p.origin == KeyOrigin::Downloaded)
            .collect()
    }
}

/// One platform key entry, parsed and checked.
fn platform_key(
    field: &str,
    entry: &KeyEntry,
    merchant: &Arc<Merchant>,
    now: Timestamp,
) -> Result<(String, PlatformVerifier), Invalid> {
    match (&entry.public_key_pem, &entry.certificate_pem) {
        (Some(pem), None) => {
            let serial = entry
                .serial
                .clone()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    Invalid::new(format!("{field}.serial"), "required with public_key_pem")
                })?;
            let key = keys::public_key_text(pem)
                .map_err(|e| Invalid::new(format!("{field}.public_key_pem"), e))?;
            Ok((
                serial,
                PlatformVerifier {
                    key,
                    merchant: Arc::clone(merchant),
                    origin: KeyOrigin::Configured,
                    effective_at: None,
                    expire_at: None,
                    fetched_at: None,
                },
            ))
        }
        (None, Some(pem)) => {
            let name = format!("{field}.certificate_pem");
            let cert = keys::parse_certificate(pem).map_err(|e| Invalid::new(&name, e))?;
            if cert.not_after.unix_seconds() < now.unix_seconds() {
                return Err(Invalid::new(name, "the certificate has expired"));
            }
            if let Some(given) = &entry.serial
                && !given.eq_ignore_ascii_case(&cert.serial)
            {
                return Err(Invalid::new(
                    format!("{field}.serial"),
                    format!(
                        "{given} differs from the certificate's serial {}",
                        cert.serial
                    ),
                ));
            }
            Ok((
                cert.serial,
                PlatformVerifier {
                    key: cert.key,
                    merchant: Arc::clone(merchant),
                    origin: KeyOrigin::Configured,
                    effective_at: Some(cert.not_before),
                    expire_at: Some(cert.not_after),
                    fetched_at: None,
                },
            ))
        }
        _ => Err(Invalid::new(
            field,
            "give exactly one of public_key_pem and certificate_pem",
        )),
    }
}

impl AccountBook for WechatBook {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn check(&self, spec: &AccountSpec, now: Timestamp) -> Result<Facts, Invalid> {
        Ok(facts_of(&self.build(spec, now, Parse::Now)?))
    }

    fn apply(&self, changes: Vec<Change>, now: Timestamp) -> Vec<(String, Invalid)> {
        let Batch { built, refused } = build_changes(changes, &self.channel.file, |spec| {
            self.build(spec, now, Parse::OnFirstUse)
        });
        let mut api_put = Vec::new();
        let mut api_removed = Vec::new();
        let touched: HashSet<String> = built.iter().map(|(a, _)| a.clone()).collect();
        self.channel.change(|book| {
            for (account, b) in built {
                let downloaded = Self::take_out(book, &account);
                api_removed.push(account.clone());
                match b {
                    None => {}
                    Some(Built::Sub(sub)) => {
                        book.subs.insert(account, Arc::new(sub));
                    }
                    Some(Built::Direct {
                        merchant,
                        keys,
                        api,
                    }) => {
                        // Keys downloaded before a rotation stay, now opening with the new
                        // APIv3 key; a configured key of the same serial wins. The merchant
                        // holds nothing else now: its entries are added without a search,
                        // unless a configured key may meet a download.
                        let downloads = !downloaded.is_empty();
                        for (serial, p) in downloaded {
                            book.add_key(
                                serial,
                                Arc::new(PlatformVerifier {
                                    key: p.key.clone(),
                                    merchant: Arc::clone(&merchant),
                                    origin: p.origin,
                                    effective_at: p.effective_at,
                                    expire_at: p.expire_at,
                                    fetched_at: p.fetched_at,
                                }),
                            );
                        }
                        for (serial, p) in keys {
                            if downloads {
                                book.put_key(serial, Arc::new(p));
                            } else {
                                book.add_key(serial, Arc::new(p));
                            }
                        }
                        book.merchants.insert(account, merchant);
                        if let Some(api) = api {
                            api_put.push(api);
                        }
                    }
                }
            }
        });
        // A sub-merchant's entry is its service provider's credentials: rebuilt whenever
        // either changes, so a rotation of the provider's key reaches every sub-merchant.
        // Only a change of a keyed merchant (or a removal) needs every sub-merchant looked at.
        let book = self.channel.book();
        let affected: Vec<&Arc<SubMerchant>> = if touched.iter().all(|a| book.subs.contains_key(a))
        {
            touched.iter().filter_map(|a| book.subs.get(a)).collect()
        } else {
            book.subs
                .values()
                .filter(|s| touched.contains(&s.sub_mchid) || touched.contains(&s.sp_mchid))
                .collect()
        };
        let mut subs: Vec<ApiMerchant> = Vec::new();
        for sub in affected {
            let sp = match api_put.iter().find(|p| p.id() == sub.sp_mchid) {
                Some(sp) => Some(sp.for_sub(&sub.sub_mchid)),
                None if touched.contains(&sub.sp_mchid) => None,
                None => self
                    .api
                    .merchants
                    .get(&sub.sp_mchid)
                    .ok()
                    .filter(|sp| sp.sub_mchid.is_none())
                    .map(|sp| sp.for_sub(&sub.sub_mchid)),
            };
            match sp {
                Some(entry) => subs.push(entry),
                None => api_removed.push(sub.sub_mchid.clone()),
            }
        }
        api_put.extend(subs);
        api_removed.retain(|a| !api_put.iter().any(|p: &ApiMerchant| p.id() == a));
        self.api.merchants.change(api_put, &api_removed);
        refused
    }

    fn configured(&self) -> Vec<ConfiguredAccount> {
        let book = self.channel.book();
        self.channel
            .file
            .iter()
            .filter_map(|mchid| {
                let merchant = book.merchants.get(mchid)?;
                let api = self.api.merchants.get(mchid).ok();
                Some(ConfiguredAccount {
                    account: mchid.clone(),
                    settings: AccountSettings {
                        appids: merchant.appids.clone(),
                        seller_id: None,
                        api_base: api.as_ref().map(|a| a.base.clone()),
                        certificates: Some(
                            if api.as_ref().is_some_and(|a| a.downloads) {
                                "download"
                            } else {
                                "static"
                            }
                            .to_owned(),
                        ),
                        facts: Facts {
                            platform_serials: serials(&book, mchid),
                            has_api_credentials: api.is_some(),
                            has_app_auth_token: false,
                            api_base: api.as_ref().map(|a| a.base.clone()),
                        },
                    },
                })
            })
            .collect()
    }

    fn is_keyed(&self, account: &str) -> bool {
        self.channel.book().merchants.contains_key(account)
    }

    fn is_live(&self, account: &str) -> bool {
        let book = self.channel.book();
        book.merchants.contains_key(account) || book.subs.contains_key(account)
    }
}

/// What the view shows of a built account.
fn facts_of(built: &Built) -> Facts {
    match built {
        Built::Sub(_) => Facts::default(),
        Built::Direct { keys, api, .. } => {
            let mut platform_serials: Vec<String> = keys.iter().map(|(s, _)| s.clone()).collect();
            platform_serials.sort();
            Facts {
                platform_serials,
                has_api_credentials: api.is_some(),
                has_app_auth_token: false,
                api_base: api.as_ref().map(|a| a.base.clone()),
            }
        }
    }
}

/// The serials of `mchid`'s keys in `book`, sorted.
fn serials(book: &Book, mchid: &str) -> Vec<String> {
    let mut all: Vec<String> = book
        .keys
        .iter()
        .filter(|(_, held)| held.iter().any(|p| p.merchant.mchid == mchid))
        .map(|(s, _)| s.clone())
        .collect();
    all.sort();
    all
}
