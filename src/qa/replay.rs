//! `paynotify replay`: forges provider-signed notifications with the sandbox keys and sends
//! them at a running service, for QA. Each response is checked against what the contract
//! says for that input.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rsa::PrivateKey;
use rsa::pkcs8::DecodePrivateKey;

use crate::config::Settings;
use crate::qa::forge::{Delivery, alipay, wechat};
use crate::time::{Clock, SystemClock};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// WeChat Pay TRANSACTION.SUCCESS to /notify/wechat/pay
    Wechat,
    /// Alipay TRADE_SUCCESS to /notify/alipay
    Alipay,
    /// WeChat Pay REFUND.SUCCESS to /notify/wechat/refund
    WechatRefund,
    /// Alipay refund (refund_fee, out_biz_no) to /notify/alipay
    AlipayRefund,
    /// WeChat Pay MCHTRANSFER.BILL.FINISHED (SUCCESS) to /notify/wechat/transfer; --order-no
    /// is the transfer's out_bill_no
    WechatTransfer,
    /// WeChat Pay combined payment (合单支付) TRANSACTION.SUCCESS to /notify/wechat/pay:
    /// --combine-no with one --sub ORDER_NO:AMOUNT_FEN per sub-order, each SUCCESS to the
    /// sandbox merchant
    WechatCombined,
}

impl Kind {
    fn is_wechat(self) -> bool {
        matches!(
            self,
            Self::Wechat | Self::WechatRefund | Self::WechatTransfer | Self::WechatCombined
        )
    }
    fn path(self) -> &'static str {
        match self {
            Self::Wechat | Self::WechatCombined => "/notify/wechat/pay",
            Self::WechatRefund => "/notify/wechat/refund",
            Self::WechatTransfer => "/notify/wechat/transfer",
            Self::Alipay | Self::AlipayRefund => "/notify/alipay",
        }
    }
}

/// Ways to break a notification on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakage {
    pub bad_signature: bool,
    pub tamper_amount: bool,
    pub stale: bool,
    pub unknown_serial: bool,
    pub probe: bool,
}

impl Breakage {
    fn any(self) -> bool {
        self.bad_signature || self.tamper_amount || self.stale || self.unknown_serial || self.probe
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub kind: Kind,
    /// The order (for `wechat-combined`, the combination's `combine_out_trade_no`).
    pub order_no: String,
    /// `wechat-combined`: each sub-order's `out_trade_no` and amount; `amount_fen` is their sum.
    pub subs: Vec<(String, i64)>,
    pub amount_fen: i64,
    pub out_refund_no: Option<String>,
    pub refund_fen: Option<i64>,
    pub times: usize,
    pub concurrency: usize,
    pub target: Option<String>,
    pub create_order: bool,
    /// Wait this long for `/readyz` to answer 200 before sending anything.
    pub wait: Option<Duration>,
    pub breakage: Breakage,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("{0}")]
    Usage(String),
    #[error("forging failed: {0}")]
    Forge(#[from] crate::qa::forge::ForgeError),
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
}

fn private_key(path: Option<&std::path::Path>, key: &str) -> Result<PrivateKey, ReplayError> {
    let path = path.ok_or_else(|| {
        ReplayError::Config(format!("{key} is not set (run `paynotify sandbox-keys`)"))
    })?;
    let pem = std::fs::read_to_string(path)
        .map_err(|e| ReplayError::Config(format!("{key}: cannot read {}: {e}", path.display())))?;
    PrivateKey::from_pkcs8_pem(&pem)
        .map_err(|e| ReplayError::Config(format!("{key}: {}: {e}", path.display())))
}

/// A different, still well-formed signature: its first byte changed.
fn corrupt(signature: &str) -> String {
    let mut bytes = BASE64.decode(signature).unwrap_or_else(|_| vec![0; 256]);
    if let Some(first) = bytes.first_mut() {
        *first ^= 0x01;
    }
    BASE64.encode(bytes)
}

/// The WeChat Pay sandbox of the configuration: its first merchant and platform key serial,
/// signed with `sandbox.wechat_private_key_file`.
fn wechat_sandbox(settings: &Settings) -> Result<wechat::Sandbox, ReplayError> {
    let merchant = settings
        .wechat
        .merchants
        .first()
        .ok_or_else(|| ReplayError::Config("no [[wechat.merchants]] configured".into()))?;
    let serial = merchant
        .platform_keys
        .iter()
        .find_map(|k| k.serial.clone())
        .ok_or_else(|| {
            ReplayError::Config("wechat.merchants[0] has no platform key serial".into())
        })?;
    Ok(wechat::Sandbox {
        serial,
        private_key: private_key(
            settings.sandbox.wechat_private_key_file.as_deref(),
            "sandbox.wechat_private_key_file",
        )?,
        mchid: merchant.mchid.clone(),
        appid: merchant
            .all_appids()
            .into_iter()
            .next()
            .ok_or_else(|| ReplayError::Config("wechat.merchants[0] has no appid".into()))?,
        apiv3_key: merchant.apiv3_key.expose().to_owned(),
    })
}

/// A combined payment's decrypted resource: every `--sub` paid (`transaction_id`
/// `4200000000{order_no}`) to the sandbox merchant; `bump_first` fen more on the first.
fn combined_plaintext(
    sandbox: &wechat::Sandbox,
    plan: &Plan,
    bump_first: i64,
) -> Result<String, ReplayError> {
    let subs: Vec<wechat::CombinedSub> = plan
        .subs
        .iter()
        .enumerate()
        .map(|(i, (order_no, fen))| wechat::CombinedSub {
            transaction_id: format!("4200000000{order_no}"),
            ..wechat::CombinedSub::paid(
                order_no,
                if i == 0 { fen + bump_first } else { *fen },
                &sandbox.mchid,
            )
        })
        .collect();
    Ok(wechat::combined(
        &sandbox.appid,
        &plan.order_no,
        &sandbox.mchid,
        &subs,
        "replay",
        "2026-11-30T10:00:00+08:00",
    )?)
}

fn wechat_delivery(sandbox: &wechat::Sandbox, plan: &Plan) -> Result<Delivery, ReplayError> {
    if plan.kind == Kind::WechatCombined {
        return combined_delivery(sandbox, plan);
    }
    let transaction_id = format!("4200000000{}", plan.order_no);
    let (event, plaintext) = match plan.kind {
        Kind::WechatRefund => (
            "REFUND.SUCCESS",
            wechat::refund(
                sandbox,
                &plan.order_no,
                &transaction_id,
                plan.out_refund_no.as_deref().unwrap_or("R1"),
                plan.refund_fen.unwrap_or(plan.amount_fen),
                plan.amount_fen,
            ),
        ),
        Kind::WechatTransfer => (
            "MCHTRANSFER.BILL.FINISHED",
            wechat::transfer(
                sandbox,
                &plan.order_no,
                &format!("1330{}", plan.order_no),
                "SUCCESS",
                plan.amount_fen,
                None,
            ),
        ),
        _ => (
            "TRANSACTION.SUCCESS",
            wechat::transaction(sandbox, &plan.order_no, &transaction_id, plan.amount_fen),
        ),
    };
    let b = plan.breakage;
    let now = SystemClock.now().unix_seconds();
    let timestamp = if b.stale { now - 600 } else { now };
    let mut d = sandbox.notification(event, &plaintext, timestamp)?;
    if b.tamper_amount {
        // The amount changed after WeChat signed: same headers, a body they do not cover.
        let mut changed = plaintext.clone();
        let field = match plan.kind {
            Kind::WechatRefund => "/amount/refund",
            Kind::WechatTransfer => "/transfer_amount",
            _ => "/amount/total",
        };
        if let Some(amount) = changed.pointer_mut(field) {
            *amount = (amount.as_i64().unwrap_or(0) + 1).into();
        }
        let original_type = match plan.kind {
            Kind::WechatRefund => "refund",
            Kind::WechatTransfer => "mch_payment",
            _ => "transaction",
        };
        let ciphertext = wechat::encrypt(
            sandbox.apiv3_key.as_bytes(),
            "replayTamper",
            original_type,
            changed.to_string().as_bytes(),
        )?;
        d.body = wechat::envelope(
            event,
            original_type,
            &ciphertext,
            original_type,
            "replayTamper",
        )
        .into_bytes();
    }
    Ok(break_headers(d, b))
}

/// `wechat-combined`: one notification for the whole combination.
fn combined_delivery(sandbox: &wechat::Sandbox, plan: &Plan) -> Result<Delivery, ReplayError> {
    const EVENT: &str = "TRANSACTION.SUCCESS";
    let b = plan.breakage;
    let now = SystemClock.now().unix_seconds();
    let timestamp = if b.stale { now - 600 } else { now };
    let plaintext = combined_plaintext(sandbox, plan, 0)?;
    let mut d = sandbox.sealed(EVENT, plaintext.as_bytes(), timestamp)?;
    if b.tamper_amount {
        // The first sub-order's amount changed after WeChat signed.
        let changed = combined_plaintext(sandbox, plan, 1)?;
        let original_type = wechat::original_type(EVENT);
        let ciphertext = wechat::encrypt(
            sandbox.apiv3_key.as_bytes(),
            "replayTamper",
            original_type,
            changed.as_bytes(),
        )?;
        d.body = wechat::envelope(
            EVENT,
            original_type,
            &ciphertext,
            original_type,
            "replayTamper",
        )
        .into_bytes();
    }
    Ok(break_headers(d, b))
}

/// The header breakages of a WeChat delivery.
fn break_headers(mut d: Delivery, b: Breakage) -> Delivery {
    let signature = d
        .header("Wechatpay-Signature")
        .unwrap_or_default()
        .to_owned();
    if b.bad_signature {
        d.set_header("Wechatpay-Signature", corrupt(&signature));
    }
    if b.probe {
        d.set_header(
            "Wechatpay-Signature",
            format!("WECHATPAY/SIGNTEST/{signature}"),
        );
    }
    if b.unknown_serial {
        d.set_header(
            "Wechatpay-Serial",
            "PUB_KEY_ID_0000000000000000000000000000000000",
        );
    }
    d
}

/// The Alipay sandbox of the configuration: its first app (or an unknown app id), signed
/// with `sandbox.alipay_private_key_file`.
fn alipay_sandbox(settings: &Settings, unknown_app: bool) -> Result<alipay::Sandbox, ReplayError> {
    let app = settings
        .alipay
        .apps
        .first()
        .ok_or_else(|| ReplayError::Config("no [[alipay.apps]] configured".into()))?;
    Ok(alipay::Sandbox {
        app_id: if unknown_app {
            "2021999999999999".into()
        } else {
            app.app_id.clone()
        },
        seller_id: app.seller_id.clone(),
        private_key: private_key(
            settings.sandbox.alipay_private_key_file.as_deref(),
            "sandbox.alipay_private_key_file",
        )?,
    })
}

fn alipay_delivery(sandbox: &alipay::Sandbox, plan: &Plan) -> Result<Delivery, ReplayError> {
    let b = plan.breakage;
    if b.stale || b.probe {
        return Err(ReplayError::Usage(
            "--stale and --probe are WeChat Pay rules".into(),
        ));
    }
    let trade_no = format!("2026{}", plan.order_no);
    let fields = match plan.kind {
        Kind::AlipayRefund => alipay::refund(
            sandbox,
            &plan.order_no,
            &trade_no,
            plan.amount_fen,
            plan.out_refund_no.as_deref().unwrap_or("R1"),
            plan.refund_fen.unwrap_or(plan.amount_fen),
        ),
        _ => alipay::payment(
            sandbox,
            &plan.order_no,
            &trade_no,
            plan.amount_fen,
            "TRADE_SUCCESS",
        ),
    };
    let mut d = sandbox.notification(fields, false)?;
    let mut body = String::from_utf8_lossy(&d.body).into_owned();
    if b.tamper_amount {
        let signed = format!("total_amount={}", alipay::yuan(plan.amount_fen));
        body = body.replacen(
            &signed,
            &format!("total_amount={}", alipay::yuan(plan.amount_fen + 1)),
            1,
        );
    }
    if b.bad_signature
        && let Some(start) = body.find("&sign=")
    {
        let value_start = start + "&sign=".len();
        let end = body[value_start..]
            .find('&')
            .map_or(body.len(), |i| value_start + i);
        let signature: String =
            form_urlencoded::parse(format!("s={}", &body[value_start..end]).as_bytes())
                .map(|(_, v)| v.into_owned())
                .next()
                .unwrap_or_default();
        let corrupted: String =
            form_urlencoded::byte_serialize(corrupt(&signature).as_bytes()).collect();
        body.replace_range(value_start..end, &corrupted);
    }
    d.body = body.into_bytes();
    Ok(d)
}

/// Forges one well-formed notification of `kind` per order `{prefix}{n}` for every `n` in
/// `numbers` (amount `amount_fen`, timestamped now) and writes each to `out` as the raw
/// HTTP/1.1 request a provider would send, after a line with its length in bytes: what a
/// load generator replays byte for byte (`bench/notify.lua`). Signing is spread over the
/// machine's cores; the requests come out in order.
pub fn forge_requests(
    settings: &Settings,
    kind: Kind,
    prefix: &str,
    numbers: std::ops::RangeInclusive<u64>,
    amount_fen: i64,
    out: &mut dyn std::io::Write,
) -> Result<usize, ReplayError> {
    if kind == Kind::WechatCombined {
        return Err(ReplayError::Usage(
            "wechat-combined is sent by `paynotify replay`, not forged in bulk".into(),
        ));
    }
    let wechat = if kind.is_wechat() {
        Some(wechat_sandbox(settings)?)
    } else {
        None
    };
    let alipay = if kind.is_wechat() {
        None
    } else {
        Some(alipay_sandbox(settings, false)?)
    };
    let forge_one = |n: u64| -> Result<Vec<u8>, ReplayError> {
        let plan = Plan {
            kind,
            order_no: format!("{prefix}{n}"),
            subs: Vec::new(),
            amount_fen,
            out_refund_no: None,
            refund_fen: None,
            times: 1,
            concurrency: 1,
            target: None,
            create_order: false,
            wait: None,
            breakage: Breakage::default(),
        };
        let d = match (&wechat, &alipay) {
            (Some(sandbox), _) => wechat_delivery(sandbox, &plan)?,
            (None, Some(sandbox)) => alipay_delivery(sandbox, &plan)?,
            (None, None) => return Err(ReplayError::Usage("no sandbox".into())),
        };
        let mut request = format!("POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\n", kind.path());
        for (name, value) in &d.headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!("Content-Length: {}\r\n\r\n", d.body.len()));
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(&d.body);
        Ok(bytes)
    };
    let all: Vec<u64> = numbers.collect();
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let chunk = all.len().div_ceil(threads).max(1);
    let forged: Vec<Result<Vec<Vec<u8>>, ReplayError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = all
            .chunks(chunk)
            .map(|part| scope.spawn(|| part.iter().map(|&n| forge_one(n)).collect()))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(ReplayError::Usage("a forging thread panicked".into())))
            })
            .collect()
    });
    let io = |e: std::io::Error| ReplayError::Usage(format!("cannot write the requests: {e}"));
    let mut written = 0;
    for part in forged {
        for request in part? {
            writeln!(out, "{}", request.len()).map_err(io)?;
            out.write_all(&request).map_err(io)?;
            written += 1;
        }
    }
    Ok(written)
}

/// What the contract says this input gets.
fn expected_status(plan: &Plan) -> u16 {
    if plan.breakage.any() {
        401
    } else if plan.kind.is_wechat() {
        204
    } else {
        200
    }
}

/// One response as the tool prints it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub index: usize,
    pub status: u16,
    pub latency: Duration,
    pub body: String,
}

/// Every check of the flags, before anything is created or sent.
pub fn validate(plan: &Plan) -> Result<(), ReplayError> {
    let usage = |m: &str| Err(ReplayError::Usage(m.to_owned()));
    if plan.times == 0 || plan.concurrency == 0 {
        return usage("--times and --concurrency must be at least 1");
    }
    if plan.amount_fen <= 0 {
        return usage("--amount-fen must be positive");
    }
    let b = plan.breakage;
    if !plan.kind.is_wechat() && (b.stale || b.probe) {
        return usage("--stale and --probe are WeChat Pay rules (wechat, wechat-refund)");
    }
    let refund = matches!(plan.kind, Kind::WechatRefund | Kind::AlipayRefund);
    if !refund && (plan.out_refund_no.is_some() || plan.refund_fen.is_some()) {
        return usage("--out-refund-no and --refund-fen are for wechat-refund and alipay-refund");
    }
    if plan.refund_fen.is_some_and(|f| f <= 0) {
        return usage("--refund-fen must be positive");
    }
    if plan.out_refund_no.as_deref() == Some("") {
        return usage("--out-refund-no must not be empty");
    }
    if plan.kind == Kind::WechatTransfer && plan.create_order {
        return usage("--create-order is for payments: a transfer is started by POST /transfers");
    }
    if plan.kind == Kind::WechatCombined {
        if plan.create_order {
            return usage(
                "--create-order is for single payments: a combination is created by POST /combined-orders",
            );
        }
        if plan.subs.is_empty() || plan.subs.len() > crate::notice::MAX_SUB_ORDERS {
            return usage("wechat-combined takes 1 to 50 --sub ORDER_NO:AMOUNT_FEN");
        }
        if plan.subs.iter().any(|(_, fen)| *fen <= 0) {
            return usage("every --sub amount must be positive");
        }
    } else if !plan.subs.is_empty() {
        return usage("--combine-no and --sub are for wechat-combined");
    }
    Ok(())
}

/// Polls `{target}/readyz` every 200 ms until it answers 200, for at most `within`.
async fn wait_until_ready(
    client: &reqwest::Client,
    target: &str,
    within: Duration,
) -> Result<(), ReplayError> {
    let deadline = Instant::now() + within;
    loop {
        let ready = client
            .get(format!("{target}/readyz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ReplayError::Usage(format!(
                "{target}/readyz did not answer 200 within {} s",
                within.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends the plan; prints a line per response and a summary; true when every response was
/// the one the contract says. Flags and sandbox keys are checked before anything is sent.
pub async fn run(settings: &Settings, plan: &Plan) -> Result<bool, ReplayError> {
    validate(plan)?;
    let delivery = Arc::new(if plan.kind.is_wechat() {
        wechat_delivery(&wechat_sandbox(settings)?, plan)?
    } else {
        alipay_delivery(
            &alipay_sandbox(settings, plan.breakage.unknown_serial)?,
            plan,
        )?
    });
    let target = plan
        .target
        .clone()
        .unwrap_or_else(|| format!("http://{}", settings.server.listen))
        .trim_end_matches('/')
        .to_owned();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    if let Some(within) = plan.wait {
        wait_until_ready(&client, &target, within).await?;
    }
    if plan.create_order {
        let response = client
            .post(format!("{target}/orders"))
            .bearer_auth(settings.server.api_token.expose())
            .header("Idempotency-Key", format!("replay-{}", plan.order_no))
            .json(&serde_json::json!({ "order_no": plan.order_no, "amount_fen": plan.amount_fen, "subject": "replay" }))
            .send()
            .await?;
        let status = response.status().as_u16();
        println!("create order {}: {status}", plan.order_no);
        if status != 201 && status != 409 {
            println!("{}", response.text().await.unwrap_or_default());
            return Ok(false);
        }
    }
    let url = format!("{target}{}", plan.kind.path());
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..plan.concurrency.min(plan.times) {
        let (client, url, delivery, next, times) = (
            client.clone(),
            url.clone(),
            delivery.clone(),
            next.clone(),
            plan.times,
        );
        workers.spawn(async move {
            let mut sent = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= times {
                    return sent;
                }
                let mut request = client.post(&url).body(delivery.body.clone());
                for (k, v) in &delivery.headers {
                    request = request.header(k.as_str(), v.as_str());
                }
                let started = Instant::now();
                let (status, body) = match request.send().await {
                    Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
                    Err(e) => (0, e.to_string()),
                };
                sent.push(Sent {
                    index,
                    status,
                    latency: started.elapsed(),
                    body,
                });
            }
        });
    }
    let mut all = Vec::with_capacity(plan.times);
    while let Some(done) = workers.join_next().await {
        all.extend(done.unwrap_or_default());
    }
    all.sort_by_key(|s| s.index);
    for s in &all {
        println!(
            "#{:<4} {} {:>8.2} ms {}",
            s.index + 1,
            s.status,
            s.latency.as_secs_f64() * 1000.0,
            s.body.trim()
        );
    }
    let expected = expected_status(plan);
    let ok = print_summary(&all, expected, plan.times);
    Ok(ok)
}

/// With the Redis gate, a twin sent while the first copy is still being applied may be told
/// 503 ("in flight, retry"): the contract's answer for that case. Everything else must be
/// `expected`, and at least one copy must have been answered `expected`.
fn print_summary(all: &[Sent], expected: u16, times: usize) -> bool {
    let mut counts = std::collections::BTreeMap::new();
    for s in all {
        *counts.entry(s.status).or_insert(0usize) += 1;
    }
    let mut latencies: Vec<Duration> = all.iter().map(|s| s.latency).collect();
    latencies.sort();
    // The latency at percentile `p` (nearest rank), in milliseconds.
    let at = |p: usize| {
        let i = (latencies.len().saturating_sub(1) * p + 50) / 100;
        latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let by_status: Vec<String> = counts
        .iter()
        .map(|(status, n)| format!("{status}×{n}"))
        .collect();
    let in_flight_allowed = expected != 401;
    let ok = all.len() == times
        && all.iter().any(|s| s.status == expected)
        && all
            .iter()
            .all(|s| s.status == expected || (in_flight_allowed && s.status == 503));
    println!(
        "summary: sent {} | {} | latency min {:.2} ms, median {:.2} ms, p99 {:.2} ms | expected {expected}: {}",
        all.len(),
        by_status.join(" "),
        at(0),
        at(50),
        at(99),
        if ok { "ok" } else { "MISMATCH" }
    );
    ok
}
