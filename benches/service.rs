//! The whole service over HTTP on PostgreSQL, with and without the Redis gate, in one run:
//! WeChat Pay notifications (RSA-signed, AES-GCM-encrypted, built by `forge`) sent by 32
//! concurrent clients to a release build on loopback; first deliveries, then exact duplicates.
//!
//! `cargo bench --bench service` (PostgreSQL at $PAYNOTIFY_BENCH_PG_URL, default
//! postgres://postgres@127.0.0.1:5432/postgres; Redis at 127.0.0.1:6379).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use diesel_async::SimpleAsyncConnection;
use paynotify::channel::wechat::{PlatformKey, WechatMerchant};
use paynotify::config::{Secret, Settings};
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat::{self, Sandbox};
use paynotify::startup::{Application, Options};
use paynotify::time::{Clock, SystemClock};
use rsa::pkcs8::{EncodePublicKey, LineEnding};
use rsa::{Generate, PrivateKey};

const ORDERS: usize = 4000;
const CLIENTS: usize = 32;
const SERIAL: &str = "PUB_KEY_ID_0000000000000000000000000000000A";

/// Sends every delivery once from `CLIENTS` tasks; returns requests per second.
async fn blast(url: &str, deliveries: &Arc<Vec<Delivery>>) -> f64 {
    paynotify::https::install_crypto();
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (client, next, deliveries, url) = (
                client.clone(),
                next.clone(),
                deliveries.clone(),
                url.to_owned(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(d) = deliveries.get(i) else { break };
                    let mut request = client.post(&url).body(d.body.clone());
                    for (k, v) in &d.headers {
                        request = request.header(k.as_str(), v.as_str());
                    }
                    let status = request.send().await.expect("request").status();
                    assert_eq!(status.as_u16(), 204, "delivery {i}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
    deliveries.len() as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let database = support::BenchDatabase::create("paynotify_service_bench").await;
    let db_url = database.url.clone();

    let key = PrivateKey::try_generate().expect("key");
    let dir = tempfile::tempdir().expect("tempdir");
    let pem = key
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("pem");
    std::fs::write(dir.path().join("wechat.pem"), pem).expect("write");
    let sandbox = Sandbox {
        serial: SERIAL.into(),
        private_key: key,
        mchid: "1900000001".into(),
        appid: "wx0000000000000001".into(),
        apiv3_key: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA1".into(),
    };
    let settings = |redis: bool| {
        let mut s = Settings::default();
        s.server.listen = "127.0.0.1:0".parse().expect("addr");
        s.database.url = Secret::new(db_url.clone());
        s.database.pool_size = 16;
        s.wechat.merchants = vec![WechatMerchant {
            private_key_file: None,
            merchant_serial: None,
            api_base: None,
            certificates: None,
            mchid: sandbox.mchid.clone(),
            appid: Some(sandbox.appid.clone()),
            appids: Vec::new(),
            apiv3_key: Secret::new(sandbox.apiv3_key.clone()),
            platform_keys: vec![PlatformKey {
                serial: Some(SERIAL.into()),
                public_key_file: Some(dir.path().join("wechat.pem")),
                certificate_file: None,
            }],
        }];
        if redis {
            s.redis.url = Secret::new("redis://127.0.0.1:6379");
            s.redis.key_prefix = format!("paynotify:bench:{}:", std::process::id());
        }
        s
    };
    let mut db = database.connect().await;
    println!(
        "whole service, PostgreSQL, {CLIENTS} clients, {ORDERS} WeChat notifications per phase"
    );
    // Alternating rounds, so neither configuration always runs on the colder database.
    let rounds = [false, true, true, false, false, true];
    let mut totals = [(0.0, 0.0); 2];
    for (round, redis) in rounds.into_iter().enumerate() {
        let label = if redis {
            "with Redis gate"
        } else {
            "ledger only"
        };
        let app = Application::build(&settings(redis), Options::default())
            .await
            .expect("app");
        let url = format!("http://127.0.0.1:{}/notify/wechat/pay", app.port());
        let handle = app.handle();
        tokio::spawn(app.run_until_stopped());
        let tag = format!("{}{round}_", if redis { "R" } else { "L" });
        db.batch_execute(&format!(
                "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, created_at, expire_at) \
                 SELECT '{tag}' || g, 'WAIT_PAY', 19900, 0, 'CNY', 'bench', now(), now() + interval '1 day' \
                 FROM generate_series(1, {ORDERS}) g"
            ))
            .await
            .expect("seed");
        let now = SystemClock.now().unix_seconds();
        let deliveries: Arc<Vec<Delivery>> = Arc::new(
            (1..=ORDERS)
                .map(|i| {
                    let plaintext = wechat::transaction(
                        &sandbox,
                        &format!("{tag}{i}"),
                        &format!("42{tag}{i}"),
                        19900,
                    );
                    sandbox
                        .notification("TRANSACTION.SUCCESS", &plaintext, now)
                        .expect("forge")
                })
                .collect(),
        );
        let first = blast(&url, &deliveries).await;
        let duplicates = blast(&url, &deliveries).await;
        println!(
            "round {round}: {label:<16} first deliveries {first:>7.0}/s   exact duplicates {duplicates:>7.0}/s"
        );
        let total = &mut totals[usize::from(redis)];
        total.0 += first / 3.0;
        total.1 += duplicates / 3.0;
        handle.stop(true).await;
    }
    let ([plain_first, plain_dup], [gate_first, gate_dup]) =
        ([totals[0].0, totals[0].1], [totals[1].0, totals[1].1]);
    println!("mean of 3 rounds each:");
    println!(
        "ledger only      first deliveries {plain_first:>7.0}/s   exact duplicates {plain_dup:>7.0}/s"
    );
    println!(
        "with Redis gate  first deliveries {gate_first:>7.0}/s   exact duplicates {gate_dup:>7.0}/s"
    );
    println!(
        "gate / ledger only: first deliveries {:.2}, duplicates {:.2}",
        gate_first / plain_first,
        gate_dup / plain_dup
    );
    drop(db);
    database.drop().await;
}
