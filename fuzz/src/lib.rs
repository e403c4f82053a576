//! What the fuzz targets share: both channels, built once per process.

use std::sync::OnceLock;

use paynotify::channel::alipay::Alipay;
use paynotify::channel::wechat::WechatPay;
use paynotify::config::Settings;
use paynotify::time::Timestamp;

/// The WeChat platform key's serial and the merchant's APIv3 key (a sandbox key: it decrypts
/// nothing real). Only the public halves of the sandbox keys are in `keys/`: nothing here can
/// sign a notification.
pub const SERIAL: &str = "PUB_KEY_ID_2837648040222990588773854098549603";
pub const APIV3_KEY: &str = "3BByxoNZ4oW7eZSvKaijqCFXgCbRNr6m";
pub const ALIPAY_APP_ID: &str = "2021000000000001";

/// Both channels configured as `paynotify sandbox-keys` configures a service.
pub struct Channels {
    pub wechat: WechatPay,
    pub alipay: Alipay,
    pub serial: String,
    pub apiv3_key: String,
    pub alipay_app_id: String,
}

pub fn now() -> Timestamp {
    Timestamp::new(chrono::Utc::now())
}

/// Loads the channels through the config loader and the start-up key loading. Generating keys
/// here instead would take longer under the sanitizer than libFuzzer allows one input. A
/// failure is a broken fuzz setup, not a finding: it panics with the reason.
pub fn channels() -> &'static Channels {
    static CHANNELS: OnceLock<Channels> = OnceLock::new();
    CHANNELS.get_or_init(|| {
        let keys = concat!(env!("CARGO_MANIFEST_DIR"), "/keys");
        let config =
            std::env::temp_dir().join(format!("paynotify-fuzz-{}.toml", std::process::id()));
        let toml = format!(
            r#"
[[wechat.merchants]]
mchid = "1900000001"
appid = "wx5a1d0b3c7e9f2468"
apiv3_key = "{APIV3_KEY}"
  [[wechat.merchants.platform_keys]]
  serial = "{SERIAL}"
  public_key_file = "{keys}/wechat_platform_public.pem"

[[alipay.apps]]
app_id = "{ALIPAY_APP_ID}"
seller_id = "2088000000000001"
alipay_public_key_file = "{keys}/alipay_public.pem"
"#
        );
        std::fs::write(&config, toml).expect("write the fuzz config");
        let settings =
            Settings::load_from(&config, Default::default()).expect("the fuzz config loads");
        let _ = std::fs::remove_file(&config);
        let wechat = WechatPay::from_settings(&settings.wechat, now()).expect("wechat keys");
        let alipay = Alipay::from_settings(&settings.alipay, now()).expect("alipay keys");
        Channels {
            wechat,
            alipay,
            serial: SERIAL.to_owned(),
            apiv3_key: APIV3_KEY.to_owned(),
            alipay_app_id: ALIPAY_APP_ID.to_owned(),
        }
    })
}
