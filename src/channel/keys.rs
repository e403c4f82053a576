//! Provider public keys, read once at start-up and verified with `ring` on every request.
//! Every failure is a configuration error naming the key and the file.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
use rsa::pkcs1::EncodeRsaPublicKey;
use rsa::pkcs8::DecodePublicKey;

use crate::config::value::{ConfigError, invalid};
use crate::time::Timestamp;

/// An RSA public key that checks RSASSA-PKCS1-v1_5 / SHA-256 signatures.
#[derive(Clone)]
pub struct RsaVerifier(UnparsedPublicKey<Vec<u8>>);

impl RsaVerifier {
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        self.0.verify(message, signature).is_ok()
    }

    /// Whether `other` is the same public key.
    pub fn same_key(&self, other: &Self) -> bool {
        self.0.as_ref() == other.0.as_ref()
    }

    /// `plaintext` encrypted to this key as WeChat Pay wants a sensitive field (a transfer's
    /// `user_name`): RSAES-OAEP with SHA-1 and MGF1-SHA-1, base64. Each call differs (OAEP is
    /// randomised); only the private half reads it back.
    pub fn encrypt_oaep_sha1_base64(&self, plaintext: &[u8]) -> Result<String, String> {
        use rsa::pkcs1::DecodeRsaPublicKey;
        let public = rsa::PublicKey::from_pkcs1_der(self.0.as_ref())
            .map_err(|e| format!("not an RSA public key: {e}"))?;
        let sealed = public
            .encrypt(&mut SystemRng, rsa::Oaep::<sha1::Sha1>::new(), plaintext)
            .map_err(|e| format!("encryption failed: {e}"))?;
        Ok(BASE64.encode(sealed))
    }

    /// From SPKI DER (the form in PEM files and certificates); ring wants PKCS#1 inside it.
    fn from_spki(spki_der: &[u8]) -> Result<Self, String> {
        let public = rsa::PublicKey::from_public_key_der(spki_der)
            .map_err(|e| format!("not an RSA public key: {e}"))?;
        let der = public
            .to_pkcs1_der()
            .map_err(|e| format!("cannot encode the key: {e}"))?;
        Ok(Self(UnparsedPublicKey::new(
            &RSA_PKCS1_2048_8192_SHA256,
            der.as_bytes().to_vec(),
        )))
    }
}

/// The operating system's generator (ring's `SystemRandom`) as the `rsa` crate takes one.
struct SystemRng;

impl rsa::rand_core::TryRng for SystemRng {
    type Error = std::io::Error;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut bytes = [0; 4];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut bytes = [0; 8];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        use ring::rand::SecureRandom;
        ring::rand::SystemRandom::new()
            .fill(dst)
            .map_err(|_| std::io::Error::other("the system random number generator failed"))
    }
}

impl rsa::rand_core::TryCryptoRng for SystemRng {}

fn read(key: &str, path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))
}

/// A public key file: SPKI PEM (`BEGIN PUBLIC KEY`), or the bare base64 of the SPKI DER as
/// the Alipay console hands it out.
pub fn public_key_file(key: &str, path: &Path) -> Result<RsaVerifier, ConfigError> {
    let text = read(key, path)?;
    public_key_text(&text).map_err(|e| invalid(key, format!("{}: {e}", path.display())))
}

/// A public key as [`public_key_file`] reads one, from its text; says why not, in words.
pub fn public_key_text(text: &str) -> Result<RsaVerifier, String> {
    let der = if text.contains("-----BEGIN") {
        let public = rsa::PublicKey::from_public_key_pem(text)
            .map_err(|e| format!("not an SPKI RSA public key: {e}"))?;
        let der = public.to_pkcs1_der().map_err(|e| e.to_string())?;
        return Ok(RsaVerifier(UnparsedPublicKey::new(
            &RSA_PKCS1_2048_8192_SHA256,
            der.as_bytes().to_vec(),
        )));
    } else {
        let compact: String = text.split_whitespace().collect();
        BASE64
            .decode(compact)
            .map_err(|_| "neither PEM nor base64".to_owned())?
    };
    RsaVerifier::from_spki(&der)
}

/// A certificate file: its serial (upper-case hex, no leading zero byte) and its key.
/// An expired certificate is refused.
pub fn certificate_file(
    key: &str,
    path: &Path,
    now: Timestamp,
) -> Result<(String, RsaVerifier), ConfigError> {
    read_certificate(key, path, now).map(|c| (c.serial, c.key))
}

/// A certificate file, read as [`parse_certificate`] reads it; an expired certificate is
/// refused.
pub fn read_certificate(
    key: &str,
    path: &Path,
    now: Timestamp,
) -> Result<ParsedCertificate, ConfigError> {
    let pem = read(key, path)?;
    let cert =
        parse_certificate(&pem).map_err(|e| invalid(key, format!("{}: {e}", path.display())))?;
    if cert.not_after.unix_seconds() < now.unix_seconds() {
        return Err(invalid(
            key,
            format!(
                "{}: certificate expired at unix time {}; install the current one",
                path.display(),
                cert.not_after.unix_seconds()
            ),
        ));
    }
    Ok(cert)
}

/// What a certificate says that verification needs.
pub struct ParsedCertificate {
    /// Upper-case hex, no leading zero byte: as `Wechatpay-Serial` names it.
    pub serial: String,
    pub key: RsaVerifier,
    pub not_before: Timestamp,
    pub not_after: Timestamp,
}

/// A PEM certificate with an RSA key. Says why not, in words, for a caller to put in its
/// error: not PEM, not a certificate, not an RSA key.
pub fn parse_certificate(pem: &str) -> Result<ParsedCertificate, String> {
    use x509_cert::Certificate;
    use x509_cert::der::{DecodePem, Encode};

    let cert =
        Certificate::from_pem(pem.as_bytes()).map_err(|e| format!("not a PEM certificate: {e}"))?;
    let tbs = cert.tbs_certificate();
    let time = |t: &x509_cert::time::Time| {
        let seconds = i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX / 4);
        chrono::DateTime::from_timestamp(seconds, 0)
            .map(Timestamp::new)
            .ok_or_else(|| format!("validity time {seconds} out of range"))
    };
    let serial = tbs.serial_number().as_bytes();
    let significant = serial.iter().position(|b| *b != 0).unwrap_or(serial.len());
    let serial = crate::text::hex(&serial[significant..]).to_ascii_uppercase();
    let spki = tbs
        .subject_public_key_info()
        .to_der()
        .map_err(|e| format!("bad public key: {e}"))?;
    let public = rsa::PublicKey::from_public_key_der(&spki)
        .map_err(|e| format!("not an RSA public key: {e}"))?;
    let der = public
        .to_pkcs1_der()
        .map_err(|e| format!("cannot encode the key: {e}"))?;
    Ok(ParsedCertificate {
        serial,
        key: RsaVerifier(UnparsedPublicKey::new(
            &RSA_PKCS1_2048_8192_SHA256,
            der.as_bytes().to_vec(),
        )),
        not_before: time(&tbs.validity().not_before)?,
        not_after: time(&tbs.validity().not_after)?,
    })
}

/// Refuses a certificate past its `notAfter`, naming the key and the file.
pub fn not_expired(
    key: &str,
    path: &Path,
    cert: &x509_cert::Certificate,
    now: Timestamp,
) -> Result<(), ConfigError> {
    let not_after = cert
        .tbs_certificate()
        .validity()
        .not_after
        .to_unix_duration()
        .as_secs();
    if i64::try_from(not_after).unwrap_or(i64::MAX) < now.unix_seconds() {
        return Err(invalid(
            key,
            format!(
                "{}: certificate expired at unix time {not_after}; install the current one",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// An RSA private key that makes RSASSA-PKCS1-v1_5 / SHA-256 signatures: the merchant's
/// WeChat Pay API key (`apiclient_key.pem`), an Alipay app private key. `rsa` reads the key
/// files (every form the providers' tools write); `ring` signs, about four times faster than
/// `rsa` on this kind of machine (2.3 ms against 9.7 ms for a 2048-bit key). PKCS#1 v1.5
/// signatures are deterministic: both give the same bytes.
pub struct RsaSigner(ring::signature::RsaKeyPair);

impl RsaSigner {
    pub fn new(key: &rsa::PrivateKey) -> Result<Self, String> {
        use rsa::pkcs1::EncodeRsaPrivateKey;
        let der = key.to_pkcs1_der().map_err(|e| e.to_string())?;
        ring::signature::RsaKeyPair::from_der(der.as_bytes())
            .map(Self)
            .map_err(|e| e.to_string())
    }

    /// The signature of `message`, base64 (both providers' form).
    pub fn sign_base64(&self, message: &[u8]) -> Result<String, String> {
        let mut signature = vec![0; self.0.public().modulus_len()];
        self.0
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                message,
                &mut signature,
            )
            .map_err(|e| e.to_string())?;
        Ok(BASE64.encode(signature))
    }
}

/// A merchant's API private key as an account added through `/admin/merchants` holds it: its
/// text, parsed on the first signature rather than when the account is installed. Parsing one
/// key takes milliseconds (the `rsa` decode and `ring`'s consistency checks), so ten thousand
/// stored accounts would hold start-up for tens of seconds; most accounts never sign a call
/// between two restarts. The text passed [`private_key_text`] when the account was added or
/// changed (the book's `check`), so a later failure means the stored keys were altered.
pub struct Signer {
    text: crate::config::value::Secret,
    parsed: std::sync::OnceLock<Result<RsaSigner, String>>,
}

impl Signer {
    /// A key already parsed (the configuration file's, read at start-up).
    pub fn parsed(key: RsaSigner) -> Self {
        Self {
            text: crate::config::value::Secret::new(""),
            parsed: std::sync::OnceLock::from(Ok(key)),
        }
    }

    /// A key parsed when first used.
    pub fn deferred(text: &str) -> Self {
        Self {
            text: crate::config::value::Secret::new(text),
            parsed: std::sync::OnceLock::new(),
        }
    }

    /// The parsed key, or why the text is not one ([`private_key_text`]'s words).
    pub fn get(&self) -> Result<&RsaSigner, String> {
        self.parsed
            .get_or_init(|| private_key_text(self.text.expose()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// [`RsaSigner::sign_base64`], parsing the key first if it was not yet.
    pub fn sign_base64(&self, message: &[u8]) -> Result<String, String> {
        self.get()?.sign_base64(message)
    }
}

/// A private key file: PKCS#8 or PKCS#1 PEM, or the bare base64 of either's DER as the
/// Alipay key tool writes it.
pub fn private_key_file(key: &str, path: &Path) -> Result<RsaSigner, ConfigError> {
    let text = read(key, path)?;
    private_key_text(&text).map_err(|e| invalid(key, format!("{}: {e}", path.display())))
}

/// A private key as [`private_key_file`] reads one, from its text; says why not, in words.
pub fn private_key_text(text: &str) -> Result<RsaSigner, String> {
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use rsa::pkcs8::DecodePrivateKey;

    let parsed = if text.contains("-----BEGIN RSA PRIVATE KEY") {
        rsa::PrivateKey::from_pkcs1_pem(text).map_err(|e| e.to_string())
    } else if text.contains("-----BEGIN") {
        rsa::PrivateKey::from_pkcs8_pem(text).map_err(|e| e.to_string())
    } else {
        let compact: String = text.split_whitespace().collect();
        match BASE64.decode(compact) {
            Ok(der) => rsa::PrivateKey::from_pkcs8_der(&der)
                .or_else(|_| rsa::PrivateKey::from_pkcs1_der(&der))
                .map_err(|e| e.to_string()),
            Err(_) => Err("neither PEM nor base64".to_owned()),
        }
    };
    parsed
        .and_then(|k| RsaSigner::new(&k))
        .map_err(|e| format!("not an RSA private key: {e}"))
}

/// Every certificate of a PEM file, in file order (a bundle such as `alipayRootCert.crt`;
/// text between the blocks is ignored). None is a configuration error, as is a block that
/// does not parse.
pub fn certificates_file(
    key: &str,
    path: &Path,
) -> Result<Vec<x509_cert::Certificate>, ConfigError> {
    let text = read(key, path)?;
    certificates_text(&text).map_err(|e| invalid(key, format!("{}: {e}", path.display())))
}

/// Every certificate of a PEM bundle, as [`certificates_file`] reads one, from its text.
pub fn certificates_text(text: &str) -> Result<Vec<x509_cert::Certificate>, String> {
    use x509_cert::der::DecodePem;

    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut certs = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let block = &rest[start..];
        let Some(end) = block.find(END) else {
            return Err("a certificate without its END line".to_owned());
        };
        let pem = &block[..end + END.len()];
        let cert = x509_cert::Certificate::from_pem(pem.as_bytes()).map_err(|e| {
            format!(
                "certificate {} is not a PEM certificate: {e}",
                certs.len() + 1
            )
        })?;
        certs.push(cert);
        rest = &block[end + END.len()..];
    }
    if certs.is_empty() {
        return Err("no PEM certificate in the text".to_owned());
    }
    Ok(certs)
}
