//! Provider keys made once per test run: RSA key pairs, and a self-signed certificate made
//! with the `openssl` command (as a provider's certificate would be).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use rsa::pkcs8::{DecodePrivateKey, EncodePublicKey, LineEnding};
use rsa::{Generate, PrivateKey};

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("tempdir"))
}

/// A key pair by name; its SPKI PEM public key is at `public_key_path(name)`.
pub fn rsa_key(name: &str) -> PrivateKey {
    static KEYS: OnceLock<Mutex<HashMap<String, PrivateKey>>> = OnceLock::new();
    let keys = KEYS.get_or_init(Default::default);
    let mut keys = keys.lock().unwrap_or_else(|p| p.into_inner());
    keys.entry(name.to_owned())
        .or_insert_with(|| {
            let key = PrivateKey::try_generate().expect("RSA key");
            let pem = key
                .to_public_key()
                .to_public_key_pem(LineEnding::LF)
                .expect("pem");
            std::fs::write(public_key_path(name), pem).expect("write public key");
            key
        })
        .clone()
}

pub fn public_key_path(name: &str) -> PathBuf {
    dir().path().join(format!("{name}.pub.pem"))
}

/// The PKCS#8 PEM private key of `rsa_key(name)`, written once.
pub fn private_key_path(name: &str) -> PathBuf {
    use rsa::pkcs8::EncodePrivateKey;
    static WRITING: Mutex<()> = Mutex::new(());
    let key = rsa_key(name);
    let _writing = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let path = dir().path().join(format!("{name}.key.pem"));
    if !path.exists() {
        let pem = key.to_pkcs8_pem(LineEnding::LF).expect("private key pem");
        std::fs::write(&path, pem.as_bytes()).expect("write private key");
    }
    path
}

/// A self-signed certificate with the given serial (hex), its private key and its path.
pub fn certificate(name: &str, serial_hex: &str) -> (PrivateKey, PathBuf) {
    static CERTS: OnceLock<Mutex<HashMap<String, PrivateKey>>> = OnceLock::new();
    let certs = CERTS.get_or_init(Default::default);
    let mut certs = certs.lock().unwrap_or_else(|p| p.into_inner());
    let cert_path = dir().path().join(format!("{name}.crt"));
    let key = certs
        .entry(name.to_owned())
        .or_insert_with(|| {
            let key_path = dir().path().join(format!("{name}.key"));
            let out = Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                ])
                .args(["-subj", &format!("/O=paynotify tests/CN={name}")])
                .args(["-set_serial", &format!("0x{serial_hex}")])
                .arg("-keyout")
                .arg(&key_path)
                .arg("-out")
                .arg(&cert_path)
                .output()
                .expect("the openssl command is needed to make a test certificate");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let pem = std::fs::read_to_string(&key_path).expect("read key");
            PrivateKey::from_pkcs8_pem(&pem).expect("certificate key")
        })
        .clone();
    (key, cert_path)
}

/// A platform certificate as WeChat Pay issues one: an RSA key of its own (`rsa_key(name)`),
/// the serial `serial_hex`, valid between the two dates (year, month, day). Its PEM and key.
pub fn platform_certificate(
    name: &str,
    serial_hex: &str,
    not_before: (i32, u8, u8),
    not_after: (i32, u8, u8),
) -> (String, PrivateKey) {
    use rsa::pkcs8::EncodePrivateKey;
    let key = rsa_key(name);
    let pkcs8 = key.to_pkcs8_pem(LineEnding::LF).expect("pkcs8");
    let pair = rcgen::KeyPair::from_pem(&pkcs8).expect("an RSA key rcgen signs with");
    (
        signed_certificate(&pair, serial_hex, not_before, not_after),
        key,
    )
}

/// A certificate whose key is not RSA (ECDSA P-256), otherwise like [`platform_certificate`].
pub fn ec_certificate(serial_hex: &str) -> String {
    let pair = rcgen::KeyPair::generate().expect("EC key");
    signed_certificate(&pair, serial_hex, (2026, 11, 1), (2031, 11, 1))
}

fn signed_certificate(
    pair: &rcgen::KeyPair,
    serial_hex: &str,
    (y0, m0, d0): (i32, u8, u8),
    (y1, m1, d1): (i32, u8, u8),
) -> String {
    let serial: Vec<u8> = (0..serial_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&serial_hex[i..i + 2], 16).expect("hex serial"))
        .collect();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    params.not_before = rcgen::date_time_ymd(y0, m0, d0);
    params.not_after = rcgen::date_time_ymd(y1, m1, d1);
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "Tenpay.com");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Tenpay.com Root CA");
    params.self_signed(pair).expect("certificate").pem()
}

/// Runs `openssl` with `args` in the key directory; its stdout.
pub fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir().path())
        .output()
        .expect("the openssl command is needed to make test certificates");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("openssl output")
}

/// A self-signed certificate over `rsa_key(key_name)` (so a fake provider signing with that
/// key is verified through it), valid for ten years, at the returned path.
pub fn certificate_over(name: &str, key_name: &str) -> PathBuf {
    static WRITING: Mutex<()> = Mutex::new(());
    let key = private_key_path(key_name);
    let _writing = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let path = dir().path().join(format!("{name}.crt"));
    if !path.exists() {
        let key = key.to_str().expect("path");
        let out = path.to_str().expect("path");
        let subject = format!("/C=CN/O=paynotify tests/CN={name}");
        openssl(&[
            "req", "-x509", "-key", key, "-days", "3650", "-subj", &subject, "-out", out,
        ]);
    }
    path
}

/// Alipay's certificate-mode files in their real format, made with `openssl`.
pub struct AlipayCerts {
    /// `appCertPublicKey_<app_id>.crt`: the app key's certificate, issued by the first root
    /// (multi-RDN issuer, a 19-byte serial with its high bit set).
    pub app_cert: PathBuf,
    /// `alipayRootCert.crt`: an RSA/SHA-256 root, an EC root, an RSA/SHA-1 root.
    pub root: PathBuf,
    /// A root file without the first root: another SN.
    pub other_root: PathBuf,
    /// Each root's own file, in the order of `root`.
    pub roots: [PathBuf; 3],
}

/// [`AlipayCerts`], made once per test run; the app certificate is over `rsa_key(app_key)`.
pub fn alipay_certs(app_key: &str) -> &'static AlipayCerts {
    static CERTS: OnceLock<AlipayCerts> = OnceLock::new();
    CERTS.get_or_init(|| {
        let app_key = private_key_path(app_key);
        let app_key = app_key.to_str().expect("path");
        let root = |name: &str, subject: &str, serial: &str, key: &[&str], digest: &str| {
            let mut args = vec!["req", "-x509", "-nodes", "-days", "30", digest];
            args.extend_from_slice(key);
            let key_out = format!("{name}.key");
            let cert_out = format!("{name}.crt");
            args.extend_from_slice(&["-subj", subject, "-set_serial", serial]);
            args.extend_from_slice(&["-keyout", &key_out, "-out", &cert_out]);
            openssl(&args);
            dir().path().join(cert_out)
        };
        let r1 = root(
            "alipay-root-r1",
            "/C=CN/O=Paynotify Test/OU=Certification Authority/CN=Paynotify Test Root R1",
            "0x00AB",
            &["-newkey", "rsa:2048"],
            "-sha256",
        );
        let e1 = root(
            "alipay-root-e1",
            "/C=CN/O=Paynotify Test/CN=Paynotify Test Root E1",
            "0x0E01",
            &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
            "-sha256",
        );
        let r2 = root(
            "alipay-root-r2",
            "/C=CN/O=Paynotify Test Two/CN=Paynotify Test Root Class 2",
            "0x7FFFFFFF01",
            &["-newkey", "rsa:2048"],
            "-sha1",
        );
        openssl(&[
            "req",
            "-new",
            "-key",
            app_key,
            "-out",
            "alipay-app.csr",
            "-subj",
            "/C=CN/O=Paynotify Test App/OU=Alipay/CN=2021000000000002",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "alipay-app.csr",
            "-CA",
            "alipay-root-r1.crt",
            "-CAkey",
            "alipay-root-r1.key",
            "-set_serial",
            "0x9F1E2D3C4B5A69788796A5B4C3D2E1F0011223",
            "-days",
            "30",
            "-sha256",
            "-out",
            "appCertPublicKey_2021000000000002.crt",
        ]);
        let read = |p: &PathBuf| std::fs::read_to_string(p).expect("read certificate");
        let bundle = |parts: &[&PathBuf], name: &str| {
            // Alipay's file: the PEM blocks one after the other, a blank line between.
            let text: Vec<String> = parts.iter().map(|p| read(p)).collect();
            let path = dir().path().join(name);
            std::fs::write(&path, text.join("\n")).expect("write root file");
            path
        };
        AlipayCerts {
            app_cert: dir().path().join("appCertPublicKey_2021000000000002.crt"),
            root: bundle(&[&r1, &e1, &r2], "alipayRootCert.crt"),
            other_root: bundle(&[&e1, &r2], "otherRootCert.crt"),
            roots: [r1, e1, r2],
        }
    })
}
