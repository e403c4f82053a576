//! Platform certificates downloaded with `GET /v3/certificates`: each one decrypted with the
//! merchant's APIv3 key, parsed and checked, and the answer's own signature verified, so no
//! key is added that WeChat did not send. `crate::certificates` decides when to ask.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::aead::{Aad, Nonce};
use serde::Deserialize;

use super::api::{ApiMerchant, WechatApi};
use super::{PlatformVerifier, WechatPay};
use crate::channel::api::{ApiFuture, Failure};
use crate::channel::keys::{self, ParsedCertificate};
use crate::channel::platform::{Download, KeyOrigin, KeySource, KnownKey, PlatformCertificate};
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The answer's body: `{"data": [{serial_no, effective_time, expire_time, encrypt_certificate}]}`.
#[derive(Deserialize)]
struct CertificateList {
    data: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    serial_no: String,
    encrypt_certificate: Sealed,
}

/// `encrypt_certificate`: AEAD_AES_256_GCM with the APIv3 key, like a notification's resource.
#[derive(Deserialize)]
struct Sealed {
    algorithm: String,
    nonce: String,
    #[serde(default)]
    associated_data: String,
    ciphertext: String,
}

/// A certificate that passed every check, with its key for verifying the answer.
struct Opened {
    row: PlatformCertificate,
    parsed: ParsedCertificate,
}

impl WechatApi {
    /// Downloads `m`'s platform certificates. The answer must verify: with a usable key of
    /// `m` it names, or, when it names none known (first use, or signed with a certificate
    /// being rolled out), with the certificate it names among those it carries, which
    /// decrypted with `m`'s APIv3 key and so came from WeChat.
    async fn fetch_certificates(
        &self,
        m: &ApiMerchant,
        now: Timestamp,
    ) -> Result<Download, Failure> {
        let r = self.call(m, false, "/v3/certificates", "", now).await?;
        if !(200..300).contains(&r.status) {
            Self::error_code(&r)?;
            return Err(Self::unexpected(&r));
        }
        // Read before it is verified only to find the key it may be verified with; nothing
        // in it is used unless it verifies.
        let list: CertificateList = serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("certificate list: {e}")))?;
        let mut opened = Vec::new();
        let mut refused = Vec::new();
        for entry in &list.data {
            match open(m, entry, now) {
                Ok(one) => opened.push(one),
                Err(why) => refused.push(format!("certificate {}: {why}", entry.serial_no)),
            }
        }
        let mut first_use = false;
        match self.verify(m, &r, now) {
            Ok(()) => {}
            Err(Failure::UnknownKey(why)) => {
                let signer = r.header("Wechatpay-Serial").unwrap_or_default();
                let Some(carried) = opened
                    .iter()
                    .find(|o| o.row.serial.eq_ignore_ascii_case(signer))
                else {
                    return Err(Failure::BadSignature(format!(
                        "{why}, nor among the certificates the answer carries"
                    )));
                };
                self.verify_with(&r, now, &carried.parsed.key)?;
                first_use = self.channel.serials_of(&m.merchant.mchid, now).is_empty();
            }
            Err(other) => return Err(other),
        }
        Ok(Download {
            certificates: opened.into_iter().map(|o| o.row).collect(),
            refused,
            first_use,
        })
    }
}

/// One entry decrypted, parsed and checked: the algorithm, the APIv3 key, a PEM certificate
/// with an RSA key, its serial the announced one, not expired.
fn open(m: &ApiMerchant, entry: &Entry, now: Timestamp) -> Result<Opened, String> {
    let sealed = &entry.encrypt_certificate;
    if sealed.algorithm != "AEAD_AES_256_GCM" {
        return Err(format!("unsupported algorithm {}", sealed.algorithm));
    }
    let nonce = Nonce::try_assume_unique_for_key(sealed.nonce.as_bytes())
        .map_err(|_| "nonce is not 12 bytes".to_owned())?;
    let mut bytes = BASE64
        .decode(&sealed.ciphertext)
        .map_err(|_| "ciphertext is not base64".to_owned())?;
    let plaintext = m
        .merchant
        .apiv3_key
        .open_in_place(
            nonce,
            Aad::from(sealed.associated_data.as_bytes()),
            &mut bytes,
        )
        .map_err(|_| {
            format!(
                "does not decrypt with the apiv3_key of merchant {} (another key, or tampered)",
                m.merchant.mchid
            )
        })?;
    let pem = std::str::from_utf8(plaintext)
        .map_err(|_| "decrypts to something that is not PEM text".to_owned())?
        .to_owned();
    let parsed = keys::parse_certificate(&pem)?;
    if !parsed.serial.eq_ignore_ascii_case(&entry.serial_no) {
        return Err(format!(
            "the certificate's serial is {}, not the serial_no {} it was listed under",
            parsed.serial, entry.serial_no
        ));
    }
    if parsed.not_after.unix_seconds() <= now.unix_seconds() {
        return Err(format!(
            "expired at {}",
            parsed.not_after.as_datetime().to_rfc3339()
        ));
    }
    Ok(Opened {
        row: PlatformCertificate {
            channel: ChannelId::Wechat,
            account: m.merchant.mchid.clone(),
            serial: parsed.serial.clone(),
            pem,
            effective_at: parsed.not_before,
            expire_at: parsed.not_after,
            fetched_at: now,
        },
        parsed,
    })
}

/// The WeChat channel's keys as `crate::certificates` keeps them: every merchant's, listed and
/// watched, and downloaded for the merchants with API credentials set to download.
pub struct WechatKeys {
    pub(super) channel: Arc<WechatPay>,
    pub(super) api: Arc<WechatApi>,
}

impl KeySource for WechatKeys {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    fn downloading(&self) -> Vec<String> {
        self.api
            .merchants
            .list()
            .iter()
            .filter(|m| m.downloads)
            .map(|m| m.merchant.mchid.clone())
            .collect()
    }

    fn download<'a>(
        &'a self,
        account: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, Result<Download, Failure>> {
        Box::pin(async move {
            let m = self.api.merchants.get(account)?;
            self.api.fetch_certificates(&m, now).await
        })
    }

    fn install(&self, certificates: &[PlatformCertificate], now: Timestamp) -> usize {
        let mut added = 0;
        for c in certificates {
            let Some(merchant) = self.channel.merchant(&c.account) else {
                tracing::warn!(mchid = %c.account, serial = %c.serial, "stored platform certificate of a merchant not configured: not used");
                continue;
            };
            let parsed = match keys::parse_certificate(&c.pem) {
                Ok(parsed) if parsed.serial.eq_ignore_ascii_case(&c.serial) => parsed,
                Ok(parsed) => {
                    tracing::warn!(mchid = %c.account, serial = %c.serial, actual = %parsed.serial, "stored platform certificate has another serial: not used");
                    continue;
                }
                Err(why) => {
                    tracing::warn!(mchid = %c.account, serial = %c.serial, %why, "stored platform certificate does not parse: not used");
                    continue;
                }
            };
            self.channel.mark_refreshed(&c.account, c.fetched_at);
            if parsed.not_after.unix_seconds() <= now.unix_seconds() {
                continue;
            }
            let key = PlatformVerifier {
                key: parsed.key,
                merchant,
                origin: KeyOrigin::Downloaded,
                effective_at: Some(parsed.not_before),
                expire_at: Some(parsed.not_after),
                fetched_at: Some(c.fetched_at),
            };
            if self.channel.learn(&c.serial, key) {
                added += 1;
            }
        }
        added
    }

    fn refreshed(&self, account: &str, at: Timestamp) {
        self.channel.mark_refreshed(account, at);
    }

    fn keys(&self) -> Vec<KnownKey> {
        let mut keys: Vec<KnownKey> = self
            .channel
            .all_keys()
            .into_iter()
            .map(|(serial, p)| KnownKey {
                channel: ChannelId::Wechat,
                mchid: p.merchant.mchid.clone(),
                serial,
                source: p.origin,
                effective_at: p.effective_at,
                expire_at: p.expire_at,
                fetched_at: p.fetched_at,
            })
            .collect();
        keys.sort_by(|a, b| (&a.mchid, &a.serial).cmp(&(&b.mchid, &b.serial)));
        keys
    }
}
