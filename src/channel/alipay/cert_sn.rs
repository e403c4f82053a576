//! Alipay certificate mode (公钥证书): the SNs every API request of such an app carries,
//! `app_cert_sn` and `alipay_root_cert_sn`, computed exactly as the official SDKs do.

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
    crate::text::hex(&Md5::digest(text.as_bytes()))
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
                format!("{}=#{}", k.unwrap_or(&oid), crate::text::hex(&der))
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
