//! Apps added through `/admin/merchants`: their stored `keys` built into the same [`App`]
//! and API credentials a file app has, and swapped into the channel's book and the client's
//! accounts in one step.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Deserialize;

use super::api::{ApiApp, Authorized, CertSn, GATEWAY};
use super::{Alipay, AlipayApi, App, AuthorizedApp, cert_sn};
use crate::channel::accounts::{
    AccountBook, AccountSettings, AccountSpec, Batch, Change, ConfiguredAccount, Facts, Invalid,
    Mode, Parse, build_changes,
};
use crate::channel::api::Account;
use crate::channel::keys;
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The `keys` of an Alipay `direct` app, as the admin API takes them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectKeys {
    #[serde(default)]
    alipay_public_key_pem: Option<String>,
    #[serde(default)]
    alipay_cert_pem: Option<String>,
    #[serde(default)]
    app_private_key_pem: Option<String>,
    #[serde(default)]
    app_cert_pem: Option<String>,
    #[serde(default)]
    alipay_root_cert_pem: Option<String>,
}

/// The `keys` of a `partner_sub`: the token the merchant granted the ISV's app.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubKeys {
    app_auth_token: String,
}

enum Built {
    Direct {
        app: Arc<App>,
        api: Option<ApiApp>,
    },
    /// With the token its API entry is built with.
    Sub(AuthorizedApp, String),
}

/// The Alipay channel's live apps: its book and its client's accounts, changed together.
pub struct AlipayBook {
    pub(super) channel: Arc<Alipay>,
    pub(super) api: Arc<AlipayApi>,
}

impl AlipayBook {
    fn build(&self, spec: &AccountSpec, now: Timestamp, parse: Parse) -> Result<Built, Invalid> {
        let id = &spec.account;
        if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Invalid::new(
                "account",
                "an Alipay app_id is 1 to 32 digits",
            ));
        }
        let settings = &spec.settings;
        if !settings.appids.is_empty() {
            return Err(Invalid::new("appids", "only for WeChat"));
        }
        if settings.certificates.is_some() {
            return Err(Invalid::new("certificates", "only for WeChat"));
        }
        if let Some(seller) = &settings.seller_id
            && (seller.is_empty() || seller.len() > 32)
        {
            return Err(Invalid::new("seller_id", "a PID is 1 to 32 characters"));
        }
        match spec.mode {
            Mode::PartnerSub => self.build_sub(spec),
            Mode::Direct => self.build_direct(spec, now, parse),
        }
    }

    fn build_sub(&self, spec: &AccountSpec) -> Result<Built, Invalid> {
        if spec.settings.api_base.is_some() {
            return Err(Invalid::new("gateway", "a partner_sub uses its ISV app's"));
        }
        let Some(isv) = &spec.sp_account else {
            return Err(Invalid::new("sp_account", "required for a partner_sub"));
        };
        if !self.is_keyed(isv) {
            return Err(Invalid::new(
                "sp_account",
                format!("{isv} is not an enabled Alipay app with its own keys"),
            ));
        }
        let keys: SubKeys = serde_json::from_value(serde_json::Value::Object(spec.keys.clone()))
            .map_err(|e| Invalid::new("keys", e.to_string()))?;
        if keys.app_auth_token.is_empty() || keys.app_auth_token.len() > 128 {
            return Err(Invalid::new(
                "keys.app_auth_token",
                "1 to 128 characters, as alipay.open.auth.token.app returned it",
            ));
        }
        Ok(Built::Sub(
            AuthorizedApp {
                auth_app_id: spec.account.clone(),
                isv_app_id: isv.clone(),
                seller_id: spec.settings.seller_id.clone(),
            },
            keys.app_auth_token,
        ))
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
        let Some(seller_id) = spec.settings.seller_id.clone() else {
            return Err(Invalid::new("seller_id", "required: the merchant's PID"));
        };
        let keys: DirectKeys = serde_json::from_value(serde_json::Value::Object(spec.keys.clone()))
            .map_err(|e| Invalid::new("keys", e.to_string()))?;
        let certificate_mode = keys.alipay_cert_pem.is_some();
        let key = match (&keys.alipay_public_key_pem, &keys.alipay_cert_pem) {
            (Some(pem), None) => keys::public_key_text(pem)
                .map_err(|e| Invalid::new("keys.alipay_public_key_pem", e))?,
            (None, Some(pem)) => {
                let cert = keys::parse_certificate(pem)
                    .map_err(|e| Invalid::new("keys.alipay_cert_pem", e))?;
                if cert.not_after.unix_seconds() < now.unix_seconds() {
                    return Err(Invalid::new(
                        "keys.alipay_cert_pem",
                        "the certificate has expired",
                    ));
                }
                cert.key
            }
            _ => {
                return Err(Invalid::new(
                    "keys",
                    "give exactly one of alipay_public_key_pem and alipay_cert_pem",
                ));
            }
        };
        let app = Arc::new(App {
            app_id: spec.account.clone(),
            seller_id,
            key,
        });
        let api = match &keys.app_private_key_pem {
            None => {
                for (field, given) in [
                    ("keys.app_cert_pem", &keys.app_cert_pem),
                    ("keys.alipay_root_cert_pem", &keys.alipay_root_cert_pem),
                ] {
                    if given.is_some() {
                        return Err(Invalid::new(
                            field,
                            "only used with app_private_key_pem (API calls)",
                        ));
                    }
                }
                if spec.settings.api_base.is_some() {
                    return Err(Invalid::new(
                        "gateway",
                        "only used with keys.app_private_key_pem (API calls)",
                    ));
                }
                None
            }
            Some(pem) => {
                let key = keys::Signer::deferred(pem);
                if parse == Parse::Now {
                    key.get()
                        .map_err(|e| Invalid::new("keys.app_private_key_pem", e))?;
                }
                let cert_sn = cert_sn_of(&keys, certificate_mode, now)?;
                let gateway = spec
                    .settings
                    .api_base
                    .clone()
                    .unwrap_or_else(|| GATEWAY.to_owned());
                crate::https::provider_url("gateway", &gateway)
                    .map_err(|e| Invalid::new("gateway", e.to_string()))?;
                Some(ApiApp {
                    app: Arc::clone(&app),
                    key: Arc::new(key),
                    gateway,
                    cert_sn,
                    authorized: None,
                })
            }
        };
        Ok(Built::Direct { app, api })
    }
}

/// Certificate mode with API credentials: the two SNs every request carries.
fn cert_sn_of(
    keys: &DirectKeys,
    certificate_mode: bool,
    now: Timestamp,
) -> Result<Option<CertSn>, Invalid> {
    let given = [
        ("keys.app_cert_pem", &keys.app_cert_pem),
        ("keys.alipay_root_cert_pem", &keys.alipay_root_cert_pem),
    ];
    if !certificate_mode {
        return match given.iter().find(|(_, pem)| pem.is_some()) {
            Some((field, _)) => Err(Invalid::new(
                *field,
                "only for certificate mode (alipay_cert_pem)",
            )),
            None => Ok(None),
        };
    }
    if let Some((field, _)) = given.iter().find(|(_, pem)| pem.is_none()) {
        return Err(Invalid::new(
            *field,
            "required in certificate mode with app_private_key_pem",
        ));
    }
    let (Some(app_pem), Some(root_pem)) = (&keys.app_cert_pem, &keys.alipay_root_cert_pem) else {
        return Ok(None);
    };
    let app_certs =
        keys::certificates_text(app_pem).map_err(|e| Invalid::new("keys.app_cert_pem", e))?;
    let [app_cert] = app_certs.as_slice() else {
        return Err(Invalid::new(
            "keys.app_cert_pem",
            format!("{} certificates; give the app's one", app_certs.len()),
        ));
    };
    let not_after = app_cert
        .tbs_certificate()
        .validity()
        .not_after
        .to_unix_duration()
        .as_secs();
    if i64::try_from(not_after).unwrap_or(i64::MAX) < now.unix_seconds() {
        return Err(Invalid::new(
            "keys.app_cert_pem",
            "the certificate has expired",
        ));
    }
    let roots = keys::certificates_text(root_pem)
        .map_err(|e| Invalid::new("keys.alipay_root_cert_pem", e))?;
    let root = cert_sn::alipay_root_cert_sn(&roots);
    if root.is_empty() {
        return Err(Invalid::new(
            "keys.alipay_root_cert_pem",
            "no RSA certificate in it; is it alipayRootCert.crt?",
        ));
    }
    Ok(Some(CertSn {
        app: cert_sn::alipay_cert_sn(app_cert),
        root,
    }))
}

impl AccountBook for AlipayBook {
    fn channel(&self) -> ChannelId {
        ChannelId::Alipay
    }

    fn check(&self, spec: &AccountSpec, now: Timestamp) -> Result<Facts, Invalid> {
        Ok(match self.build(spec, now, Parse::Now)? {
            Built::Sub(..) => Facts {
                has_app_auth_token: true,
                ..Facts::default()
            },
            Built::Direct { api, .. } => Facts {
                has_api_credentials: api.is_some(),
                api_base: api.as_ref().map(|a| a.gateway.clone()),
                ..Facts::default()
            },
        })
    }

    fn apply(&self, changes: Vec<Change>, now: Timestamp) -> Vec<(String, Invalid)> {
        let Batch { built, refused } = build_changes(changes, &self.channel.file, |spec| {
            self.build(spec, now, Parse::OnFirstUse)
        });
        let mut api_put: Vec<ApiApp> = Vec::new();
        let mut api_removed = Vec::new();
        let touched: HashSet<String> = built.iter().map(|(a, _)| a.clone()).collect();
        let mut tokens: HashMap<String, String> = HashMap::new();
        self.channel.change(|book| {
            for (account, b) in built {
                book.apps.remove(&account);
                book.authorized.remove(&account);
                match b {
                    None => api_removed.push(account),
                    Some(Built::Sub(sub, token)) => {
                        book.authorized.insert(account.clone(), Arc::new(sub));
                        tokens.insert(account.clone(), token);
                        api_removed.push(account);
                    }
                    Some(Built::Direct { app, api }) => {
                        book.apps.insert(account.clone(), app);
                        match api {
                            Some(api) => api_put.push(api),
                            None => api_removed.push(account),
                        }
                    }
                }
            }
        });
        // An authorized app's entry is its ISV app's credentials and its own token: rebuilt
        // whenever either changes, so a rotation of the ISV app's key reaches every merchant.
        let book = self.channel.book();
        let affected: Vec<&Arc<AuthorizedApp>> =
            if touched.iter().all(|a| book.authorized.contains_key(a)) {
                touched
                    .iter()
                    .filter_map(|a| book.authorized.get(a))
                    .collect()
            } else {
                book.authorized
                    .values()
                    .filter(|s| touched.contains(&s.auth_app_id) || touched.contains(&s.isv_app_id))
                    .collect()
            };
        let gone: Vec<&String> = touched
            .iter()
            .filter(|a| !book.authorized.contains_key(*a))
            .collect();
        self.api.change_tokens(tokens, &gone);
        let mut subs: Vec<ApiApp> = Vec::new();
        for sub in affected {
            let Some(app_auth_token) = self.api.token(&sub.auth_app_id) else {
                api_removed.push(sub.auth_app_id.clone());
                continue;
            };
            let authorized = Authorized {
                auth_app_id: sub.auth_app_id.clone(),
                app_auth_token,
                seller_id: sub.seller_id.clone(),
            };
            let entry = match api_put.iter().find(|p| p.id() == sub.isv_app_id) {
                Some(isv) => Some(isv.for_authorized(authorized)),
                None if touched.contains(&sub.isv_app_id) => None,
                None => self
                    .api
                    .apps
                    .get(&sub.isv_app_id)
                    .ok()
                    .filter(|isv| isv.authorized.is_none())
                    .map(|isv| isv.for_authorized(authorized)),
            };
            match entry {
                Some(entry) => subs.push(entry),
                None => api_removed.push(sub.auth_app_id.clone()),
            }
        }
        api_put.extend(subs);
        api_removed.retain(|a| !api_put.iter().any(|p| p.id() == a));
        self.api.apps.change(api_put, &api_removed);
        refused
    }

    fn configured(&self) -> Vec<ConfiguredAccount> {
        let book = self.channel.book();
        self.channel
            .file
            .iter()
            .filter_map(|id| {
                let app = book.apps.get(id)?;
                let api = self.api.apps.get(id).ok();
                Some(ConfiguredAccount {
                    account: id.clone(),
                    settings: AccountSettings {
                        appids: Vec::new(),
                        seller_id: Some(app.seller_id.clone()),
                        api_base: api.as_ref().map(|a| a.gateway.clone()),
                        certificates: None,
                        facts: Facts {
                            platform_serials: Vec::new(),
                            has_api_credentials: api.is_some(),
                            has_app_auth_token: false,
                            api_base: api.as_ref().map(|a| a.gateway.clone()),
                        },
                    },
                })
            })
            .collect()
    }

    fn is_keyed(&self, account: &str) -> bool {
        self.channel.book().apps.contains_key(account)
    }

    fn is_live(&self, account: &str) -> bool {
        let book = self.channel.book();
        book.apps.contains_key(account) || book.authorized.contains_key(account)
    }
}
