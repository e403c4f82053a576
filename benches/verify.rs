//! Per-notification crypto and parsing, without the database: WeChat Pay verify + decrypt +
//! decode of a realistic ~1 KB notification, Alipay parse + verify + decode of a realistic
//! form, and the RSA-2048 verification alone with `ring` and with `rsa`, which is why
//! verification uses `ring`.
//!
//! A platform certificate held by many merchants (certificate mode) costs one APIv3-key try
//! per holder before the payer's: `wechat shared certificate, payer last of N`.
//!
//! `cargo bench --bench verify`

use std::hint::black_box;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use criterion::{Criterion, criterion_group, criterion_main};
use paynotify::channel::wechat::WechatPay;
use paynotify::channel::wechat::{PlatformKey, WechatMerchant, WechatSettings};
use paynotify::channel::{Channel, Inbound};
use paynotify::config::Secret;
use paynotify::qa::forge::wechat::{self, Sandbox};
use paynotify::time::{Clock, SystemClock};
use rsa::pkcs1::EncodeRsaPublicKey;
use rsa::pkcs8::{EncodePublicKey, LineEnding};
use rsa::sha2::Sha256;
use rsa::{Generate, PrivateKey};

/// A fresh RSA-2048 key and its public half as a PEM file named `name` in `dir`.
fn key_with_pem(dir: &std::path::Path, name: &str) -> PrivateKey {
    let key = PrivateKey::try_generate().expect("key");
    let pem = key
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("pem");
    std::fs::write(dir.join(name), pem).expect("write");
    key
}

/// A forged delivery's headers as the server receives them.
fn header_map(delivery: &paynotify::qa::forge::Delivery) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (k, v) in &delivery.headers {
        headers.append(
            HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    headers
}

/// Benchmarks one WeChat payment notification through `channel`: verify, decrypt, decode.
fn wechat_notification(
    c: &mut Criterion,
    name: &str,
    channel: &WechatPay,
    delivery: &paynotify::qa::forge::Delivery,
) {
    let headers = header_map(delivery);
    let now = SystemClock.now();
    c.bench_function(name, |b| {
        b.iter(|| {
            let inbound = Inbound {
                headers: &headers,
                body: &delivery.body,
                now,
                route: Some(paynotify::channel::wechat::PAY_ROUTE),
            };
            let verified = channel.verify(black_box(&inbound)).expect("verifies");
            black_box(channel.decode(verified).expect("decodes"))
        })
    });
}

fn wechat(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_with_pem(dir.path(), "k.pem");
    let serial = "PUB_KEY_ID_0000000000000000000000000000000A";
    let apiv3 = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA1";
    let settings = WechatSettings {
        merchants: vec![WechatMerchant {
            private_key_file: None,
            merchant_serial: None,
            api_base: None,
            certificates: None,
            mchid: "1900000001".into(),
            appid: Some("wx0000000000000001".into()),
            appids: Vec::new(),
            apiv3_key: Secret::new(apiv3),
            platform_keys: vec![PlatformKey {
                serial: Some(serial.into()),
                public_key_file: Some(dir.path().join("k.pem")),
                certificate_file: None,
            }],
        }],
    };
    let now = SystemClock.now();
    let channel = WechatPay::from_settings(&settings, now).expect("channel");
    let sandbox = Sandbox {
        serial: serial.into(),
        private_key: key.clone(),
        mchid: "1900000001".into(),
        appid: "wx0000000000000001".into(),
        apiv3_key: apiv3.into(),
    };
    let mut plaintext = wechat::transaction(
        &sandbox,
        "PN20261130100512000371",
        "4200002793202611185421936078",
        19900,
    );
    plaintext["attach"] = "自定义数据".into();
    plaintext["promotion_detail"] = serde_json::json!([{"coupon_id": "109519", "name": "单品惠-6", "scope": "SINGLE", "type": "DISCOUNT", "amount": 100, "stock_id": "931386", "currency": "CNY"}]);
    let delivery = sandbox
        .notification("TRANSACTION.SUCCESS", &plaintext, now.unix_seconds())
        .expect("forge");
    println!("WeChat notification body: {} bytes", delivery.body.len());
    wechat_notification(c, "wechat verify+decrypt+decode", &channel, &delivery);

    let message = b"1794967523\n29LH9I1HCJ2D2CQERDTLC3ES13YNGPA2\n{\"id\":\"x\"}\n";
    let signature = key.pkcs1v15_sign::<Sha256>(message).expect("sign");
    let public = key.to_public_key();
    let ring_key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        public.to_pkcs1_der().expect("der").as_bytes().to_vec(),
    );
    c.bench_function("rsa-2048 verify with ring", |b| {
        b.iter(|| {
            ring_key
                .verify(black_box(message), black_box(&signature))
                .expect("ok")
        })
    });
    c.bench_function("rsa-2048 verify with rsa", |b| {
        b.iter(|| {
            public
                .pkcs1v15_verify::<Sha256>(black_box(message), black_box(&signature))
                .expect("ok")
        })
    });
}

fn alipay(c: &mut Criterion) {
    use paynotify::channel::alipay::Alipay;
    use paynotify::channel::alipay::{AlipayApp, AlipaySettings};
    use paynotify::qa::forge::alipay;

    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_with_pem(dir.path(), "alipay.pem");
    let settings = AlipaySettings {
        apps: vec![AlipayApp {
            app_private_key_file: None,
            gateway: None,
            app_id: "2021000000000001".into(),
            seller_id: "2088000000000001".into(),
            alipay_public_key_file: Some(dir.path().join("alipay.pem")),
            alipay_cert_file: None,
            app_cert_file: None,
            alipay_root_cert_file: None,
        }],
        ..AlipaySettings::default()
    };
    let channel = Alipay::from_settings(&settings, SystemClock.now()).expect("channel");
    let sandbox = alipay::Sandbox {
        app_id: "2021000000000001".into(),
        seller_id: "2088000000000001".into(),
        private_key: key,
    };
    let fields = alipay::payment(
        &sandbox,
        "PN20261130120307000381",
        "2026113022001456731405127733",
        19900,
        "TRADE_SUCCESS",
    );
    let delivery = sandbox.notification(fields, false).expect("forge");
    let headers = header_map(&delivery);
    println!("Alipay notification body: {} bytes", delivery.body.len());
    let now = SystemClock.now();
    c.bench_function("alipay parse+verify+decode", |b| {
        b.iter(|| {
            let inbound = Inbound {
                headers: &headers,
                body: &delivery.body,
                now,
                route: None,
            };
            let verified = channel.verify(black_box(&inbound)).expect("verifies");
            black_box(channel.decode(verified).expect("decodes"))
        })
    });
}

/// One certificate held by `n` merchants, each with its own APIv3 key; the payer is the last
/// holder, so every other holder's key is tried first (the worst case).
fn shared_certificate(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_with_pem(dir.path(), "k.pem");
    let serial = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1";
    let now = SystemClock.now();
    for n in [1usize, 100, 10_000] {
        let merchants: Vec<WechatMerchant> = (0..n)
            .map(|i| WechatMerchant {
                private_key_file: None,
                merchant_serial: None,
                api_base: None,
                certificates: None,
                mchid: format!("19{i:08}"),
                appid: Some(format!("wx{i:016}")),
                appids: Vec::new(),
                apiv3_key: Secret::new(format!("{i:032}")),
                platform_keys: vec![PlatformKey {
                    serial: Some(serial.into()),
                    public_key_file: Some(dir.path().join("k.pem")),
                    certificate_file: None,
                }],
            })
            .collect();
        let started = std::time::Instant::now();
        let channel =
            WechatPay::from_settings(&WechatSettings { merchants }, now).expect("channel");
        println!(
            "{n} merchants on one certificate: built in {:?}",
            started.elapsed()
        );
        let last = n - 1;
        let sandbox = Sandbox {
            serial: serial.into(),
            private_key: key.clone(),
            mchid: format!("19{last:08}"),
            appid: format!("wx{last:016}"),
            apiv3_key: format!("{last:032}"),
        };
        let plaintext = wechat::transaction(&sandbox, "PN1", "4200002793202611185421936078", 19900);
        let delivery = sandbox
            .notification("TRANSACTION.SUCCESS", &plaintext, now.unix_seconds())
            .expect("forge");
        wechat_notification(
            c,
            &format!("wechat shared certificate, payer last of {n}"),
            &channel,
            &delivery,
        );
    }
}

criterion_group!(benches, wechat, alipay, shared_certificate);
criterion_main!(benches);
