//! `paynotify sandbox-keys`: a fresh provider-side key set for QA and a config that runs the
//! service against it.

use std::io::Write;
use std::path::{Path, PathBuf};

use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use rsa::{Generate, PrivateKey};

pub const WECHAT_MCHID: &str = "1900000001";
pub const WECHAT_APPID: &str = "wx5a1d0b3c7e9f2468";
pub const ALIPAY_APP_ID: &str = "2021000000000001";
pub const ALIPAY_SELLER_ID: &str = "2088000000000001";

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("{0} exists already; choose an empty directory")]
    Exists(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("key generation failed: {0}")]
    Key(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError + '_ {
    move |source| SandboxError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `len` random characters from `alphabet`.
fn random(alphabet: &[u8], len: usize) -> Result<String, SandboxError> {
    crate::random::token(alphabet, len)
        .map_err(|_| SandboxError::Key("random number generator failed".into()))
}

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Writes `contents` to a new file; `private` files get mode 0600.
fn write_new(path: &Path, contents: &str, private: bool) -> Result<(), SandboxError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            SandboxError::Exists(path.to_path_buf())
        } else {
            SandboxError::Io {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })?;
    file.write_all(contents.as_bytes()).map_err(io(path))
}

fn key_pair(dir: &Path, name: &str) -> Result<(), SandboxError> {
    let key = PrivateKey::try_generate().map_err(|e| SandboxError::Key(e.to_string()))?;
    let private = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| SandboxError::Key(e.to_string()))?;
    let public = key
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| SandboxError::Key(e.to_string()))?;
    write_new(
        &dir.join(format!("keys/{name}_private.pem")),
        &private,
        true,
    )?;
    write_new(&dir.join(format!("keys/{name}_public.pem")), &public, false)
}

/// Writes `keys/` and `paynotify.toml` into `dir`; returns the config's path. Paths in the
/// config are relative: run the service from `dir`.
pub fn write(dir: &Path, listen: std::net::SocketAddr) -> Result<PathBuf, SandboxError> {
    let config = dir.join("paynotify.toml");
    if config.exists() {
        return Err(SandboxError::Exists(config));
    }
    std::fs::create_dir_all(dir.join("keys")).map_err(io(dir))?;
    key_pair(dir, "wechat_platform")?;
    key_pair(dir, "alipay")?;
    // The merchant's and the app's own keys: what signs API calls (query, close) to the
    // providers, for a stand-in provider that checks them.
    key_pair(dir, "wechat_merchant")?;
    key_pair(dir, "alipay_app")?;
    let merchant_serial = random(b"0123456789ABCDEF", 40)?;
    let serial = format!("PUB_KEY_ID_{}", random(b"0123456789", 34)?);
    let apiv3_key = random(ALNUM, 32)?;
    let api_token = random(ALNUM, 40)?;
    let toml = format!(
        r#"# Sandbox configuration written by `paynotify sandbox-keys`. Run from this directory:
#   paynotify serve --config paynotify.toml
# The wechat_platform and alipay private keys under keys/ stand in for WeChat Pay and Alipay:
# only `paynotify replay` reads them, to forge notifications for QA. wechat_merchant and
# alipay_app are the merchant's and the app's own keys, which sign query and close calls;
# uncomment the lines below and point api_base / gateway at a stand-in provider that knows
# their public halves. Never use any of them in production.

[server]
listen = "{listen}"
api_token = "{api_token}"

[database]
url = "sqlite://data/paynotify.db"

[[wechat.merchants]]
mchid = "{WECHAT_MCHID}"
appid = "{WECHAT_APPID}"
apiv3_key = "{apiv3_key}"
# private_key_file = "keys/wechat_merchant_private.pem"
# merchant_serial = "{merchant_serial}"
# api_base = "http://127.0.0.1:9000"
  [[wechat.merchants.platform_keys]]
  serial = "{serial}"
  public_key_file = "keys/wechat_platform_public.pem"

[[alipay.apps]]
app_id = "{ALIPAY_APP_ID}"
seller_id = "{ALIPAY_SELLER_ID}"
alipay_public_key_file = "keys/alipay_public.pem"
# app_private_key_file = "keys/alipay_app_private.pem"
# gateway = "http://127.0.0.1:9000/gateway.do"

[sandbox]
wechat_private_key_file = "keys/wechat_platform_private.pem"
alipay_private_key_file = "keys/alipay_private.pem"
"#
    );
    write_new(&config, &toml, true)?;
    Ok(config)
}
