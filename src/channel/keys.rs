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
pub struct RsaVerifier(UnparsedPublicKey<Vec<u8>>);

impl RsaVerifier {
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        self.0.verify(message, signature).is_ok()
    }

    /// From SPKI DER (the form in PEM files and certificates); ring wants PKCS#1 inside it.
    fn from_spki(key: &str, path: &Path, spki_der: &[u8]) -> Result<Self, ConfigError> {
        let public = rsa::PublicKey::from_public_key_der(spki_der).map_err(|e| {
            invalid(
                key,
                format!("{}: not an RSA public key: {e}", path.display()),
            )
        })?;
        let der = public.to_pkcs1_der().map_err(|e| {
            invalid(
                key,
                format!("{}: cannot encode the key: {e}", path.display()),
            )
        })?;
        Ok(Self(UnparsedPublicKey::new(
            &RSA_PKCS1_2048_8192_SHA256,
            der.as_bytes().to_vec(),
        )))
    }
}

fn read(key: &str, path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))
}

/// A public key file: SPKI PEM (`BEGIN PUBLIC KEY`), or the bare base64 of the SPKI DER as
/// the Alipay console hands it out.
pub fn public_key_file(key: &str, path: &Path) -> Result<RsaVerifier, ConfigError> {
    let text = read(key, path)?;
    let der = if text.contains("-----BEGIN") {
        let public = rsa::PublicKey::from_public_key_pem(&text).map_err(|e| {
            invalid(
                key,
                format!("{}: not an SPKI RSA public key: {e}", path.display()),
            )
        })?;
        let der = public
            .to_pkcs1_der()
            .map_err(|e| invalid(key, e.to_string()))?;
        return Ok(RsaVerifier(UnparsedPublicKey::new(
            &RSA_PKCS1_2048_8192_SHA256,
            der.as_bytes().to_vec(),
        )));
    } else {
        let compact: String = text.split_whitespace().collect();
        BASE64
            .decode(compact)
            .map_err(|_| invalid(key, format!("{}: neither PEM nor base64", path.display())))?
    };
    RsaVerifier::from_spki(key, path, &der)
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
    let serial: String = tbs
        .serial_number()
        .as_bytes()
        .iter()
        .skip_while(|b| **b == 0)
        .map(|b| format!("{b:02X}"))
        .collect();
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

/// A private key file: PKCS#8 or PKCS#1 PEM, or the bare base64 of either's DER as the
/// Alipay key tool writes it.
pub fn private_key_file(key: &str, path: &Path) -> Result<RsaSigner, ConfigError> {
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use rsa::pkcs8::DecodePrivateKey;

    let text = read(key, path)?;
    let parsed = if text.contains("-----BEGIN RSA PRIVATE KEY") {
        rsa::PrivateKey::from_pkcs1_pem(&text).map_err(|e| e.to_string())
    } else if text.contains("-----BEGIN") {
        rsa::PrivateKey::from_pkcs8_pem(&text).map_err(|e| e.to_string())
    } else {
        let compact: String = text.split_whitespace().collect();
        match BASE64.decode(compact) {
            Ok(der) => rsa::PrivateKey::from_pkcs8_der(&der)
                .or_else(|_| rsa::PrivateKey::from_pkcs1_der(&der))
                .map_err(|e| e.to_string()),
            Err(_) => Err("neither PEM nor base64".to_owned()),
        }
    };
    parsed.and_then(|k| RsaSigner::new(&k)).map_err(|e| {
        invalid(
            key,
            format!("{}: not an RSA private key: {e}", path.display()),
        )
    })
}

/// Alipay certificate mode: the SN of one certificate, as alipay-sdk-java-all's
/// `AntCertificationUtil.getCertSN` computes it (the gateway was built with that SDK): the
/// lower-case hex MD5 of the issuer as `X500Principal.getName()` writes it (RFC 2253,
/// [`java_rfc2253`]) followed by the serial number in decimal (`BigInteger.toString()`).
/// Java turns the digest into hex with `new BigInteger(1, md5).toString(16)`, which drops
/// leading zeros, and then pads them back to 32 digits (`fillMD5`): plain hex.
pub fn alipay_cert_sn(cert: &x509_cert::Certificate) -> String {
    use md5::{Digest, Md5};

    let tbs = cert.tbs_certificate();
    let mut text = java_rfc2253(tbs.issuer());
    text.push_str(&signed_decimal(tbs.serial_number().as_bytes()));
    Md5::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `alipay_root_cert_sn`: the SNs of the certificates in `alipayRootCert.crt` signed with an
/// RSA algorithm, in file order, joined by `_`. Which ones are RSA is Java's test,
/// `getSigAlgOID().startsWith("1.2.840.113549.1.1")` (the PKCS #1 arc: sha1-, sha256-, also
/// sha384-/sha512WithRSAEncryption), as alipay-sdk-nodejs-all's; python-alipay-sdk keeps
/// those whose algorithm name contains `rsaEncryption`, the same set for every file Alipay
/// hands out. The file's ECDSA and SM2 roots are left out by all of them.
pub fn alipay_root_cert_sn(certs: &[x509_cert::Certificate]) -> String {
    certs
        .iter()
        .filter(|c| {
            c.signature_algorithm()
                .oid
                .to_string()
                .starts_with("1.2.840.113549.1.1")
        })
        .map(alipay_cert_sn)
        .collect::<Vec<_>>()
        .join("_")
}

/// A name as the JDK's `X500Principal.getName()` (RFC 2253) writes it: the RDNs in reverse of
/// their DER order joined by `,`, the values of a multi-valued RDN by `+`, no spaces. The
/// JDK's own rules where RFC 2253 leaves a choice (`sun.security.x509.AVA.toRFC2253String`):
/// only CN, C, L, ST, O, OU, STREET, DC and UID are named, any other type is its dotted OID
/// with the value as `#` and the lower-case hex of its DER; a value that is not one of the
/// string types below is written the same way; in a string `,=+<>#;"\` are escaped with `\`
/// anywhere, NUL is `\00`, and leading or trailing spaces (and CRs) are escaped. x509-cert's
/// `Name` Display gives the same for names of those five types with plain values, but names
/// other types otherwise and does not escape `=` or an inner `#`.
pub fn java_rfc2253(name: &x509_cert::name::Name) -> String {
    use x509_cert::der::{Encode, Tag, Tagged};

    let keyword = |oid: &str| match oid {
        "2.5.4.3" => Some("CN"),
        "2.5.4.6" => Some("C"),
        "2.5.4.7" => Some("L"),
        "2.5.4.8" => Some("ST"),
        "2.5.4.10" => Some("O"),
        "2.5.4.11" => Some("OU"),
        "2.5.4.9" => Some("STREET"),
        "0.9.2342.19200300.100.1.25" => Some("DC"),
        "0.9.2342.19200300.100.1.1" => Some("UID"),
        _ => None,
    };
    let ava = |atv: &x509_cert::attr::AttributeTypeAndValue| {
        let oid = atv.oid.to_string();
        let value = &atv.value;
        // The JDK reads every string type's bytes as UTF-8 (a BMPString too).
        let text = matches!(
            value.tag(),
            Tag::PrintableString
                | Tag::TeletexString
                | Tag::Ia5String
                | Tag::GeneralString
                | Tag::BmpString
                | Tag::Utf8String
        )
        .then(|| String::from_utf8_lossy(value.value()).into_owned());
        match (keyword(&oid), text) {
            (Some(k), Some(text)) => format!("{k}={}", java_escape(&text)),
            (k, _) => {
                let der = value.to_der().unwrap_or_default();
                let hex: String = der.iter().map(|b| format!("{b:02x}")).collect();
                format!("{}=#{hex}", k.unwrap_or(&oid))
            }
        }
    };
    name.iter_rdn()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .map(|rdn| rdn.as_ref().iter().map(ava).collect::<Vec<_>>().join("+"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One value escaped as `AVA.toRFC2253String` escapes it.
fn java_escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            ',' | '=' | '+' | '<' | '>' | '#' | ';' | '"' | '\\' => {
                escaped.push('\\');
                escaped.push(c);
            }
            '\0' => escaped.push_str("\\00"),
            _ => escaped.push(c),
        }
    }
    let chars: Vec<char> = escaped.chars().collect();
    let blank = |c: &char| *c == ' ' || *c == '\r';
    let lead = chars.iter().take_while(|c| blank(c)).count();
    let trail = chars.iter().rev().take_while(|c| blank(c)).count();
    let mut out = String::with_capacity(escaped.len() + lead + trail);
    for (i, c) in chars.iter().enumerate() {
        if i < lead || i >= chars.len() - trail {
            out.push('\\');
        }
        out.push(*c);
    }
    out
}

/// A DER INTEGER's content bytes (big-endian two's complement) in decimal, as Java's
/// `BigInteger.toString()` gives a serial number: signed, no leading zeros.
fn signed_decimal(bytes: &[u8]) -> String {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let mut magnitude: Vec<u8> = bytes.to_vec();
    if negative {
        // Two's complement: invert and add one.
        for b in magnitude.iter_mut() {
            *b = !*b;
        }
        for b in magnitude.iter_mut().rev() {
            let (sum, carry) = b.overflowing_add(1);
            *b = sum;
            if !carry {
                break;
            }
        }
    }
    // Repeated division by ten, most significant byte first.
    let mut digits = Vec::new();
    while magnitude.iter().any(|b| *b != 0) {
        let mut remainder = 0u32;
        for b in magnitude.iter_mut() {
            let current = (remainder << 8) | u32::from(*b);
            *b = (current / 10) as u8;
            remainder = current % 10;
        }
        digits.push(char::from(b'0' + remainder as u8));
    }
    if digits.is_empty() {
        digits.push('0');
    }
    if negative {
        digits.push('-');
    }
    digits.iter().rev().collect()
}

/// Every certificate of a PEM file, in file order (a bundle such as `alipayRootCert.crt`;
/// text between the blocks is ignored). None is a configuration error, as is a block that
/// does not parse.
pub fn certificates_file(
    key: &str,
    path: &Path,
) -> Result<Vec<x509_cert::Certificate>, ConfigError> {
    use x509_cert::der::DecodePem;

    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let text = read(key, path)?;
    let mut certs = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find(BEGIN) {
        let block = &rest[start..];
        let Some(end) = block.find(END) else {
            return Err(invalid(
                key,
                format!("{}: a certificate without its END line", path.display()),
            ));
        };
        let pem = &block[..end + END.len()];
        let cert = x509_cert::Certificate::from_pem(pem.as_bytes()).map_err(|e| {
            invalid(
                key,
                format!(
                    "{}: certificate {} is not a PEM certificate: {e}",
                    path.display(),
                    certs.len() + 1
                ),
            )
        })?;
        certs.push(cert);
        rest = &block[end + END.len()..];
    }
    if certs.is_empty() {
        return Err(invalid(
            key,
            format!("{}: no PEM certificate in the file", path.display()),
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_are_written_as_java_biginteger_writes_them() {
        assert_eq!(signed_decimal(&[0x00]), "0");
        assert_eq!(signed_decimal(&[0x00, 0x9F]), "159");
        assert_eq!(signed_decimal(&[0x01, 0x00]), "256");
        assert_eq!(
            signed_decimal(&[0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),
            "18446744073709551615"
        );
        // A serial encoded negative (no leading zero) is negative to Java as well.
        assert_eq!(signed_decimal(&[0xFF]), "-1");
        assert_eq!(signed_decimal(&[0x80]), "-128");
        assert_eq!(signed_decimal(&[0xFE, 0xFF]), "-257");
    }

    #[test]
    fn values_are_escaped_as_the_jdk_escapes_them() {
        assert_eq!(java_escape("Ant Financial"), "Ant Financial");
        assert_eq!(
            java_escape("a,b=c+d#e;f\"g\\h<i>"),
            "a\\,b\\=c\\+d\\#e\\;f\\\"g\\\\h\\<i\\>"
        );
        assert_eq!(java_escape(" x  "), "\\ x\\ \\ ");
        assert_eq!(java_escape("a\0b"), "a\\00b");
        assert_eq!(java_escape("支付宝_@"), "支付宝_@");
    }
}
