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
