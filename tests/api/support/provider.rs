//! A fake WeChat Pay API v3 and Alipay OpenAPI gateway on a local port. It checks every
//! request's signature with the merchant's (app's) public key, keeps a state per trade, and
//! answers as the providers do: WeChat signed with the platform key (`Wechatpay-*` headers),
//! Alipay with `sign` over the exact bytes of the `…_response` value.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use paynotify::channel::keys::{RsaVerifier, public_key_file};
use paynotify::qa::forge::alipay::yuan;
use paynotify::qa::forge::rsa_sign;
use paynotify::time::{Clock, ManualClock};
use serde_json::{Value, json};

use crate::support::alipay_bill;
use crate::support::alipay_transfer;
use crate::support::keys::{public_key_path, rsa_key};
use crate::support::partner;
use crate::support::refunds;
use crate::support::wechat_bill;
use crate::support::wechat_combine;
use crate::support::wechat_transfer;

pub const MERCHANT_SERIAL: &str = "3775B6A45ACD588826D15E583A95F5DD00000001";
/// The merchant's API key pair (the service signs with its private half).
pub const MERCHANT_KEY: &str = "wechat-merchant-api";
/// The Alipay app's key pair (the service signs with its private half).
pub const APP_KEY: &str = "alipay-app";
/// A key that is neither provider's.
const FORGER_KEY: &str = "forger";

/// A trade as the provider knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trade {
    NotPaid,
    Paid {
        transaction_id: String,
        total: i64,
    },
    /// Paid, then refunded in full (WeChat `REFUND`, Alipay `TRADE_CLOSED` with the payment).
    Refunded {
        transaction_id: String,
        total: i64,
    },
    Closed,
}

/// How the fake signs its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signing {
    /// With the provider's key, as it should.
    Provider,
    /// With a key the service does not know (a server in the middle).
    Forger,
    /// Not at all.
    Unsigned,
}

/// What a server in the middle (or a replaying proxy) answers instead of the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lie {
    /// Nothing: the provider's own answers.
    None,
    /// A close is answered "closed" and the trade stays open: WeChat a signed empty 204
    /// (replayed from another close), Alipay a signed success that names another order.
    CloseKeepsTrade,
    /// WeChat: every call answered with an unsigned `404 ORDER_NOT_EXIST`.
    NotFoundUnsigned,
    /// WeChat: a close answered with a replayed 204, and queries answered signed but naming
    /// another merchant, the trade `CLOSED`.
    OtherMerchant,
}

/// A refund the provider holds, by refund number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refunded {
    pub out_trade_no: String,
    pub transaction_id: String,
    pub refund_fen: i64,
    pub total: i64,
    pub status: RefundStatus,
}

/// A refund's status at the provider, in WeChat's words (Alipay's refund is done, or not
/// yet: `REFUND_SUCCESS` only for [`RefundStatus::Success`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundStatus {
    Success,
    /// Accepted, the money not moved yet (Alipay: `fund_change` `N`).
    Processing,
    /// Closed without money moving.
    Closed,
    /// Stuck until someone acts in the merchant platform.
    Abnormal,
}

impl RefundStatus {
    /// WeChat's `status`.
    pub fn wechat(self) -> &'static str {
        match self {
            Self::Success => "SUCCESS",
            Self::Processing => "PROCESSING",
            Self::Closed => "CLOSED",
            Self::Abnormal => "ABNORMAL",
        }
    }
}

/// Why the provider refuses every new refund, whatever it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The merchant's balance does not cover it: WeChat `403 NOT_ENOUGH`, Alipay
    /// `40004 ACQ.SELLER_BALANCE_NOT_ENOUGH`.
    BalanceNotEnough,
}

/// One detail row of a fake bill: a payment, or a refund when `out_refund_no` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLine {
    pub out_trade_no: String,
    pub transaction_id: String,
    /// A refund row's refund number (WeChat 商户退款单号, Alipay 退款批次号/请求号).
    pub out_refund_no: Option<String>,
    /// A payment's order amount, or a refund's refunded amount (positive).
    pub amount_fen: i64,
    /// The provider's fee in thousandths of a fen (WeChat's 0.00001 yuan).
    pub fee_milli_fen: i64,
    /// When the provider booked it, Beijing time: `2026-11-30 23:59:59`.
    pub at: String,
}

/// What is wrong with a fake bill (each a bad input the service must refuse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BillFault {
    /// WeChat: `hash_value` is not the SHA1 of the decompressed file.
    WrongHash,
    /// The gzip (WeChat) or zip (Alipay) is cut off halfway.
    Truncated,
    /// The detail header lacks this column.
    MissingColumn(&'static str),
    /// The detail header has a column the format does not have (and lacks none).
    UnknownColumn,
    /// The summary states one more payment (and its amount) than the details carry.
    SummaryOff,
    /// Alipay: bytes that are not GBK in a detail row. WeChat: bytes that are not UTF-8.
    BadCharset,
    /// Every row is of another merchant (WeChat 商户号) / seller (Alipay `#账号`).
    OtherMerchant,
    /// The download URL answers only after 30 s.
    Hang,
    /// The download's headers come at once, its body in pieces over this long (a large bill
    /// on a slow line).
    Trickle(std::time::Duration),
    /// Alipay: `bill_download_url` names `localhost` (this machine, by another name than
    /// the one configured in `alipay.bill_hosts`).
    ForeignHost,
    /// Alipay: the zip holds a thousand empty entries besides the two CSVs.
    ManyEntries,
    /// Alipay: a hundred thousand blank lines before the details' end separator.
    BlankLines,
    /// The download URL answers 302 to another host.
    Redirect,
    /// The answer to the bill call carries no signature.
    Unsigned,
    /// The answer to the bill call is signed with a key that is not the provider's.
    WrongSignature,
    /// The provider says there is no bill for that day (WeChat `NO_STATEMENT_EXIST`,
    /// Alipay `isp.bill_not_exist`).
    NoBill,
}

/// The bill the fake serves for one date (`YYYY-MM-DD`), to every merchant/app it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeBill {
    pub lines: Vec<FakeLine>,
    pub fault: Option<BillFault>,
}

pub struct Fake {
    /// Bills by date; a date without one: WeChat `NO_STATEMENT_EXIST`, Alipay
    /// `isp.bill_not_exist`.
    pub bills: Mutex<HashMap<String, FakeBill>>,
    /// Bill downloads that verified, by date.
    pub bill_downloads: Mutex<Vec<String>>,
    pub trades: Mutex<HashMap<String, Trade>>,
    /// Refunds by refund number (WeChat `out_refund_no`, Alipay `out_request_no`).
    pub refunds: Mutex<HashMap<String, Refunded>>,
    /// The status a refund created from now on gets ([`RefundStatus::Success`] unless set).
    pub new_refund_status: Mutex<RefundStatus>,
    /// Every new refund refused so, while set.
    pub refund_refusal: Mutex<Option<Refusal>>,
    /// How many refund creates still record the refund and then answer only after
    /// [`refunds::HANG_SECS`] (the caller times out while the refund exists).
    pub hang_refund_creates: AtomicUsize,
    /// Refunds created by refund calls (each number once).
    pub refunds_created: AtomicUsize,
    /// Answer every request with 503.
    pub down: AtomicBool,
    /// Answer every request only after three seconds.
    pub stall: AtomicBool,
    pub signing: Mutex<Signing>,
    pub lie: Mutex<Lie>,
    /// Requests whose signature verified, and those that did not.
    pub verified: AtomicUsize,
    pub refused: AtomicUsize,
    /// When each request arrived.
    pub arrivals: Mutex<Vec<Instant>>,
    /// Alipay certificate mode: the `(app_cert_sn, alipay_root_cert_sn)` every request must
    /// carry; a request without them or with others is refused as Alipay's gateway refuses it.
    pub expect_cert_sn: Mutex<Option<(String, String)>>,
    /// `(call, out_trade_no)` of every request, in order (transfers: `out_biz_no`).
    pub calls: Mutex<Vec<(String, String)>>,
    /// Alipay transfers, by `out_biz_no` (`support/alipay_transfer.rs`).
    pub alipay_transfers: Mutex<alipay_transfer::Transfers>,
    /// The provider's own clock and how far it moves after each answer (a backlog whose
    /// calls are spread over minutes); without it, answers are stamped with the request's
    /// timestamp.
    clock: Mutex<Option<(Arc<ManualClock>, i64)>>,
    pub(super) mchid: String,
    pub(super) appid: String,
    /// The platform key WeChat signs its answers with now, and its serial.
    platform: Mutex<(String, rsa::PrivateKey)>,
    /// What `GET /v3/certificates` lists.
    pub served_certificates: Mutex<Vec<Served>>,
    /// `GET /v3/certificates` requests that verified.
    pub certificate_calls: AtomicUsize,
    /// WeChat merchant transfers: the bills held and how the stand-in behaves.
    pub wechat_transfers: wechat_transfer::Transfers,
    /// WeChat combined payments: the combinations held and the requests they got.
    pub wechat_combinations: wechat_combine::Combinations,
    /// Service-provider mode: providers, sub-merchants, tokens, and the calls received.
    pub(super) partner: Mutex<partner::Partner>,
    merchant_key: RsaVerifier,
    app_id: String,
    /// More apps the fake gateway serves (under the same seller, signing with the same key).
    more_apps: Mutex<Vec<String>>,
    alipay_key: rsa::PrivateKey,
    app_key: RsaVerifier,
    forger: rsa::PrivateKey,
}

fn verifier(name: &str) -> RsaVerifier {
    rsa_key(name);
    public_key_file("test", Path::new(&public_key_path(name))).expect("public key")
}

impl Fake {
    /// Serves `bill` for `date` (`YYYY-MM-DD`) from now on.
    pub fn set_bill(&self, date: &str, bill: FakeBill) {
        self.bills
            .lock()
            .expect("bills")
            .insert(date.to_owned(), bill);
    }

    pub fn set(&self, out_trade_no: &str, trade: Trade) {
        self.trades
            .lock()
            .expect("trades")
            .insert(out_trade_no.to_owned(), trade);
    }

    pub fn refund(&self, out_refund_no: &str, refund: Refunded) {
        self.refunds
            .lock()
            .expect("refunds")
            .insert(out_refund_no.to_owned(), refund);
    }

    /// Refunds created from now on get `status`.
    pub fn new_refunds(&self, status: RefundStatus) {
        *self.new_refund_status.lock().expect("status") = status;
    }

    /// New refunds are refused with `refusal` from now on (`None`: accepted again).
    pub fn refuse_refunds(&self, refusal: Option<Refusal>) {
        *self.refund_refusal.lock().expect("refusal") = refusal;
    }

    /// The next `creates` refund creates record the refund, then answer only after
    /// [`refunds::HANG_SECS`].
    pub fn hang_after_creating(&self, creates: usize) {
        self.hang_refund_creates.store(creates, Ordering::SeqCst);
    }

    /// How many refunds refund calls created.
    pub fn refunds_created(&self) -> usize {
        self.refunds_created.load(Ordering::SeqCst)
    }

    /// Refund `out_refund_no` is `status` now (the bank finished, or gave up); a trade whose
    /// refunds reach its total is refunded in full.
    pub fn settle_refund(&self, out_refund_no: &str, status: RefundStatus) {
        let mut refunds = self.refunds.lock().expect("refunds");
        let refund = refunds
            .get_mut(out_refund_no)
            .expect("a refund the provider holds");
        refund.status = status;
        let refund = refund.clone();
        let mut trades = self.trades.lock().expect("trades");
        refunds::refunded_in_full(&refunds, &mut trades, &refund);
    }

    fn refunded(&self, out_refund_no: &str) -> Option<Refunded> {
        self.refunds
            .lock()
            .expect("refunds")
            .get(out_refund_no)
            .cloned()
    }

    pub fn trade(&self, out_trade_no: &str) -> Option<Trade> {
        self.trades
            .lock()
            .expect("trades")
            .get(out_trade_no)
            .cloned()
    }

    pub fn lie(&self, lie: Lie) {
        *self.lie.lock().expect("lie") = lie;
    }

    fn lying(&self) -> Lie {
        *self.lie.lock().expect("lie")
    }

    /// Serves Alipay app `app_id` too.
    pub fn also_app(&self, app_id: &str) {
        self.more_apps.lock().expect("apps").push(app_id.to_owned());
    }

    /// Alipay: from now on every request must carry these SNs (certificate mode).
    pub fn expect_cert_sn(&self, app_cert_sn: &str, alipay_root_cert_sn: &str) {
        *self.expect_cert_sn.lock().expect("cert sn") =
            Some((app_cert_sn.to_owned(), alipay_root_cert_sn.to_owned()));
    }

    fn expected_cert_sn(&self) -> Option<(String, String)> {
        self.expect_cert_sn.lock().expect("cert sn").clone()
    }

    pub fn sign_with(&self, signing: Signing) {
        *self.signing.lock().expect("signing") = signing;
    }

    /// Stamps answers with `clock` and moves it `step` seconds on after each answer.
    pub fn tick(&self, clock: Arc<ManualClock>, step: i64) {
        *self.clock.lock().expect("clock") = Some((clock, step));
    }

    /// The provider's time now (unix seconds), if it keeps its own clock.
    fn now(&self) -> Option<String> {
        let clock = self.clock.lock().expect("clock");
        clock
            .as_ref()
            .map(|(c, _)| c.now().unix_seconds().to_string())
    }

    fn time_passes(&self) {
        if let Some((clock, step)) = self.clock.lock().expect("clock").as_ref() {
            clock.advance(*step);
        }
    }

    pub fn calls(&self) -> Vec<(String, String)> {
        self.calls.lock().expect("calls").clone()
    }

    /// WeChat signs its answers with the platform key `serial` from now on (a rotation).
    pub fn sign_as(&self, serial: &str, key: rsa::PrivateKey) {
        *self.platform.lock().expect("platform") = (serial.to_owned(), key);
    }

    /// The platform key WeChat signs with now, and its serial.
    pub(super) fn platform(&self) -> (String, rsa::PrivateKey) {
        self.platform.lock().expect("platform").clone()
    }

    /// `GET /v3/certificates` lists these from now on.
    pub fn serve_certificates(&self, served: Vec<Served>) {
        *self.served_certificates.lock().expect("served") = served;
    }
}

/// One entry of `GET /v3/certificates`: a certificate PEM, encrypted with `apiv3_key` as
/// WeChat encrypts it, listed under `serial_no`.
#[derive(Debug, Clone)]
pub struct Served {
    pub serial_no: String,
    pub pem: String,
    /// The merchant's APIv3 key (32 bytes), or another (a list not meant for this merchant).
    pub apiv3_key: String,
    /// One byte of the ciphertext flipped on the way.
    pub tampered: bool,
    pub effective_time: String,
    pub expire_time: String,
}

impl Served {
    pub fn new(serial_no: &str, pem: &str, apiv3_key: &str) -> Self {
        Self {
            serial_no: serial_no.to_owned(),
            pem: pem.to_owned(),
            apiv3_key: apiv3_key.to_owned(),
            tampered: false,
            effective_time: "2026-11-01T00:00:00+08:00".to_owned(),
            expire_time: "2031-11-01T00:00:00+08:00".to_owned(),
        }
    }

    /// `encrypt_certificate` as WeChat makes it: AEAD_AES_256_GCM, a 12-character nonce,
    /// associated data `certificate`, base64 of ciphertext‖tag.
    fn entry(&self, n: usize) -> Value {
        use base64::Engine;
        use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
        let nonce = format!("{n:012}");
        let key = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, self.apiv3_key.as_bytes()).expect("32-byte key"),
        );
        let mut sealed = self.pem.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::try_assume_unique_for_key(nonce.as_bytes()).expect("nonce"),
            Aad::from(b"certificate"),
            &mut sealed,
        )
        .expect("seal");
        if self.tampered {
            sealed[0] ^= 1;
        }
        json!({
            "serial_no": self.serial_no,
            "effective_time": self.effective_time,
            "expire_time": self.expire_time,
            "encrypt_certificate": {
                "algorithm": "AEAD_AES_256_GCM",
                "nonce": nonce,
                "associated_data": "certificate",
                "ciphertext": base64::engine::general_purpose::STANDARD.encode(sealed),
            }
        })
    }
}

pub struct FakeProvider {
    pub url: String,
    pub port: u16,
    pub state: Arc<Fake>,
    handle: ServerHandle,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        tokio::spawn(async move { handle.stop(false).await });
    }
}

impl FakeProvider {
    /// WeChat: merchant `mchid`/`appid` with the platform key `platform_serial`/`platform`;
    /// Alipay: `app_id` with the Alipay key named `alipay_key`.
    pub async fn start(
        (mchid, appid, platform_serial, platform): (&str, &str, &str, rsa::PrivateKey),
        (app_id, alipay_key): (&str, &str),
    ) -> Self {
        let state = Arc::new(Fake {
            bills: Mutex::new(HashMap::new()),
            bill_downloads: Mutex::new(Vec::new()),
            trades: Mutex::new(HashMap::new()),
            refunds: Mutex::new(HashMap::new()),
            new_refund_status: Mutex::new(RefundStatus::Success),
            refund_refusal: Mutex::new(None),
            hang_refund_creates: AtomicUsize::new(0),
            refunds_created: AtomicUsize::new(0),
            down: AtomicBool::new(false),
            stall: AtomicBool::new(false),
            signing: Mutex::new(Signing::Provider),
            lie: Mutex::new(Lie::None),
            verified: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            arrivals: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            alipay_transfers: Mutex::new(alipay_transfer::Transfers::default()),
            expect_cert_sn: Mutex::new(None),
            clock: Mutex::new(None),
            mchid: mchid.to_owned(),
            appid: appid.to_owned(),
            platform: Mutex::new((platform_serial.to_owned(), platform)),
            served_certificates: Mutex::new(Vec::new()),
            certificate_calls: AtomicUsize::new(0),
            wechat_transfers: wechat_transfer::Transfers::default(),
            wechat_combinations: wechat_combine::Combinations::default(),
            partner: Mutex::new(partner::Partner::default()),
            merchant_key: verifier(MERCHANT_KEY),
            app_id: app_id.to_owned(),
            more_apps: Mutex::new(Vec::new()),
            alipay_key: rsa_key(alipay_key),
            app_key: verifier(APP_KEY),
            forger: rsa_key(FORGER_KEY),
        });
        let data = web::Data::from(Arc::clone(&state));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(answer))
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .expect("bind the fake provider");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            url: format!("http://127.0.0.1:{port}"),
            port,
            state,
            handle,
        }
    }
}

async fn answer(req: HttpRequest, body: web::Bytes, fake: web::Data<Fake>) -> HttpResponse {
    fake.arrivals.lock().expect("arrivals").push(Instant::now());
    if fake.stall.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    }
    if fake.down.load(Ordering::SeqCst) {
        return HttpResponse::ServiceUnavailable()
            .json(json!({"code": "SYSTEM_ERROR", "message": "系统繁忙"}));
    }
    let answer = if req.path() == "/gateway.do" {
        alipay(&fake, &body, &req).await
    } else if req.path() == wechat_bill::DOWNLOAD_PATH {
        wechat_bill::download(&req, &body, &fake).await
    } else if req.path() == alipay_bill::DOWNLOAD_PATH {
        alipay_bill::download(&req, &fake).await
    } else {
        wechat(&req, &body, &fake).await
    };
    fake.time_passes();
    answer
}

/// `k="v"` pairs of a WeChat `Authorization` header.
fn authorization(req: &HttpRequest) -> Option<HashMap<String, String>> {
    let value = req.headers().get("Authorization")?.to_str().ok()?;
    let params = value.strip_prefix("WECHATPAY2-SHA256-RSA2048 ")?;
    Some(
        params
            .split(',')
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.trim().to_owned(), v.trim_matches('"').to_owned()))
            })
            .collect(),
    )
}

/// WeChat Pay v3: `METHOD\npath?query\ntimestamp\nnonce\nbody\n` with the merchant API key.
pub(super) fn wechat_request_verifies(
    req: &HttpRequest,
    body: &[u8],
    fake: &Fake,
) -> Option<String> {
    use base64::Engine;
    let auth = authorization(req)?;
    if auth.get("mchid")? != &fake.mchid || auth.get("serial_no")? != MERCHANT_SERIAL {
        return None;
    }
    let timestamp = auth.get("timestamp")?;
    let path = req.uri().path_and_query()?.as_str();
    let mut message = format!(
        "{}\n{path}\n{timestamp}\n{}\n",
        req.method(),
        auth.get("nonce_str")?
    )
    .into_bytes();
    message.extend_from_slice(body);
    message.push(b'\n');
    let signature = base64::engine::general_purpose::STANDARD
        .decode(auth.get("signature")?)
        .ok()?;
    fake.merchant_key
        .verify(&message, &signature)
        .then(|| timestamp.clone())
}

pub(super) fn wechat_signed(
    fake: &Fake,
    status: u16,
    timestamp: &str,
    body: String,
) -> HttpResponse {
    let signing = *fake.signing.lock().expect("signing");
    wechat_signed_as(fake, status, timestamp, body, signing)
}

/// An answer signed as `signing` says, whatever the fake signs with otherwise.
pub(super) fn wechat_signed_as(
    fake: &Fake,
    status: u16,
    timestamp: &str,
    body: String,
    signing: Signing,
) -> HttpResponse {
    let mut response =
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("status"));
    let (serial, platform) = fake.platform.lock().expect("platform").clone();
    let key = match signing {
        Signing::Provider => Some(&platform),
        Signing::Forger => Some(&fake.forger),
        Signing::Unsigned => None,
    };
    if let Some(key) = key {
        // WeChat stamps an answer with its own time, not the request's.
        let timestamp = fake.now().unwrap_or_else(|| timestamp.to_owned());
        let timestamp = timestamp.as_str();
        let nonce = "fakeprovidernonce0000000000000001";
        let message = format!("{timestamp}\n{nonce}\n{body}\n");
        response
            .insert_header(("Wechatpay-Timestamp", timestamp.to_owned()))
            .insert_header(("Wechatpay-Nonce", nonce))
            .insert_header(("Wechatpay-Serial", serial))
            .insert_header(("Wechatpay-Signature-Type", "WECHATPAY2-SHA256-RSA2048"))
            .insert_header((
                "Wechatpay-Signature",
                rsa_sign(key, message.as_bytes()).expect("sign"),
            ));
    }
    if body.is_empty() {
        response.finish()
    } else {
        response.content_type("application/json").body(body)
    }
}

pub(super) fn wechat_error(status: u16, code: &str, message: &str) -> HttpResponse {
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("status"))
        .json(json!({ "code": code, "message": message }))
}

async fn wechat(req: &HttpRequest, body: &[u8], fake: &Fake) -> HttpResponse {
    if let Some(answer) = partner::wechat(req, body, fake).await {
        return answer;
    }
    let Some(timestamp) = wechat_request_verifies(req, body, fake) else {
        fake.refused.fetch_add(1, Ordering::SeqCst);
        return wechat_error(401, "SIGN_ERROR", "签名错误");
    };
    fake.verified.fetch_add(1, Ordering::SeqCst);
    let path = req.path();
    if path == "/v3/certificates" {
        fake.certificate_calls.fetch_add(1, Ordering::SeqCst);
        let served = fake.served_certificates.lock().expect("served").clone();
        let data: Vec<Value> = served.iter().enumerate().map(|(n, c)| c.entry(n)).collect();
        return wechat_signed(fake, 200, &timestamp, json!({ "data": data }).to_string());
    }
    if path == "/v3/bill/tradebill" {
        return wechat_bill::apply(req, fake, &timestamp);
    }
    if path == refunds::WECHAT_PATH && req.method() == actix_web::http::Method::POST {
        return refunds::wechat_create(body, fake, &timestamp).await;
    }
    if let Some(out_refund_no) = path.strip_prefix("/v3/refund/domestic/refunds/") {
        let Some(r) = fake.refunded(out_refund_no) else {
            return wechat_error(404, "RESOURCE_NOT_EXISTS", "退款单不存在");
        };
        let answer = refunds::wechat_refund(out_refund_no, &r);
        return wechat_signed(fake, 200, &timestamp, answer.to_string());
    }
    if path.starts_with(wechat_transfer::PATH) {
        return wechat_transfer::answer(req, body, fake, &timestamp).await;
    }
    if path.starts_with(wechat_combine::PATH) {
        return wechat_combine::answer(req, body, fake, &timestamp).await;
    }
    let Some(rest) = path.strip_prefix("/v3/pay/transactions/out-trade-no/") else {
        return wechat_error(404, "NOT_FOUND", "no such API");
    };
    let (no, close) = match rest.strip_suffix("/close") {
        Some(no) => (no.to_owned(), true),
        None => (rest.to_owned(), false),
    };
    fake.calls.lock().expect("calls").push((
        if close {
            "wechat.close"
        } else {
            "wechat.query"
        }
        .to_owned(),
        no.clone(),
    ));
    if fake.lying() == Lie::NotFoundUnsigned {
        return wechat_error(404, "ORDER_NOT_EXIST", "订单不存在");
    }
    // WeChat's FAQ: a sub-order of a combination is seen only through the combine query
    // ("不能使用普通支付的查单接口"). Its ordinary close is answered as a close of a trade WeChat
    // never saw, and closes nothing (the fake's choice).
    if fake.wechat_combinations.holds_sub(&no) {
        return match close {
            true => wechat_signed(fake, 204, &timestamp, String::new()),
            false => wechat_error(404, "ORDER_NOT_EXIST", "订单不存在"),
        };
    }
    let trade = fake.trade(&no);
    if close {
        if matches!(fake.lying(), Lie::CloseKeepsTrade | Lie::OtherMerchant) {
            return wechat_signed(fake, 204, &timestamp, String::new());
        }
        return match trade {
            Some(Trade::Paid { .. } | Trade::Refunded { .. }) => {
                wechat_error(400, "ORDERPAID", "订单已支付")
            }
            // WeChat answers 204 also for a trade it never saw.
            _ => {
                fake.set(&no, Trade::Closed);
                wechat_signed(fake, 204, &timestamp, String::new())
            }
        };
    }
    let mchid = match fake.lying() {
        Lie::OtherMerchant => "1900009999".to_owned(),
        _ => fake.mchid.clone(),
    };
    let base = json!({ "appid": fake.appid, "mchid": mchid, "out_trade_no": no });
    let trade = match fake.lying() {
        Lie::OtherMerchant => Some(Trade::Closed),
        _ => trade,
    };
    let answer = match trade {
        None => return wechat_error(404, "ORDER_NOT_EXIST", "订单不存在"),
        Some(Trade::NotPaid) => {
            json!({ "trade_state": "NOTPAY", "trade_state_desc": "订单未支付", "amount": { "payer_currency": "CNY" } })
        }
        Some(Trade::Closed) => json!({ "trade_state": "CLOSED", "trade_state_desc": "订单已关闭" }),
        Some(Trade::Refunded {
            transaction_id,
            total,
        }) => json!({
            "transaction_id": transaction_id,
            "trade_type": "JSAPI",
            "trade_state": "REFUND",
            "trade_state_desc": "转入退款",
            "bank_type": "OTHERS",
            "success_time": "2026-11-30T10:00:00+08:00",
            "payer": { "openid": "oSandboxOpenId0000000000000" },
            "amount": { "total": total, "payer_total": total, "currency": "CNY", "payer_currency": "CNY" }
        }),
        Some(Trade::Paid {
            transaction_id,
            total,
        }) => json!({
            "transaction_id": transaction_id,
            "trade_type": "JSAPI",
            "trade_state": "SUCCESS",
            "trade_state_desc": "支付成功",
            "bank_type": "OTHERS",
            "success_time": "2026-11-30T10:00:00+08:00",
            "payer": { "openid": "oSandboxOpenId0000000000000" },
            "amount": { "total": total, "payer_total": total, "currency": "CNY", "payer_currency": "CNY" }
        }),
    };
    let mut full = base;
    if let (Some(full), Value::Object(more)) = (full.as_object_mut(), answer) {
        full.extend(more);
    }
    wechat_signed(fake, 200, &timestamp, full.to_string())
}

/// Alipay: every parameter but `sign`, non-empty, sorted, `k=v&…`, with the app's key.
fn alipay_request(body: &[u8], fake: &Fake) -> Option<HashMap<String, String>> {
    use base64::Engine;
    let params: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    let app_id = params.get("app_id")?;
    let known = app_id == &fake.app_id || fake.more_apps.lock().expect("apps").contains(app_id);
    if !known || params.get("sign_type")? != "RSA2" {
        return None;
    }
    let mut signed: Vec<(&String, &String)> = params
        .iter()
        .filter(|(k, v)| k.as_str() != "sign" && !v.is_empty())
        .collect();
    signed.sort();
    let content = signed
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let signature = base64::engine::general_purpose::STANDARD
        .decode(params.get("sign")?)
        .ok()?;
    fake.app_key
        .verify(content.as_bytes(), &signature)
        .then_some(params)
}

/// Certificate mode: Alipay's answer to a request without the expected SNs, as its gateway
/// gives it (signed, under the method's `…_response`): `40001 isv.missing-app-cert-sn` (缺少应用
/// 公钥证书序列号), `40002 isv.app-cert-not-exist` (应用公钥证书不存在) for an SN it does not
/// know, `40002 isv.invalid-alipay-root-cert-sn` (无效支付宝根证书序列号); and, by analogy, `40001
/// isv.missing-alipay-root-cert-sn` for a missing root SN.
pub(super) fn cert_sn_refusal(fake: &Fake, params: &HashMap<String, String>) -> Option<Value> {
    let (app, root) = fake.expected_cert_sn()?;
    let given = |k: &str| params.get(k).filter(|v| !v.is_empty());
    let refusal = |code: &str, msg: &str, sub_code: &str, sub_msg: &str| json!({"code": code, "msg": msg, "sub_code": sub_code, "sub_msg": sub_msg});
    let missing = "Missing Required Arguments";
    let invalid = "Invalid Arguments";
    match (given("app_cert_sn"), given("alipay_root_cert_sn")) {
        (None, _) => Some(refusal(
            "40001",
            missing,
            "isv.missing-app-cert-sn",
            "缺少应用公钥证书序列号",
        )),
        (_, None) => Some(refusal(
            "40001",
            missing,
            "isv.missing-alipay-root-cert-sn",
            "缺少支付宝根证书序列号",
        )),
        (Some(a), _) if *a != app => Some(refusal(
            "40002",
            invalid,
            "isv.app-cert-not-exist",
            "应用公钥证书不存在",
        )),
        (_, Some(r)) if *r != root => Some(refusal(
            "40002",
            invalid,
            "isv.invalid-alipay-root-cert-sn",
            "无效支付宝根证书序列号",
        )),
        _ => None,
    }
}

pub(super) fn alipay_signed(fake: &Fake, method: &str, value: &Value) -> HttpResponse {
    let signing = *fake.signing.lock().expect("signing");
    alipay_signed_as(fake, method, value, signing)
}

fn alipay_signed_as(fake: &Fake, method: &str, value: &Value, signing: Signing) -> HttpResponse {
    let key = format!("{}_response", method.replace('.', "_"));
    // Not serde's compact form: the signature covers these exact bytes, and re-serialising
    // the parsed answer would not give them back.
    let value = serde_json::to_string_pretty(value).expect("json");
    // Certificate mode: Alipay names the certificate that signed the answer.
    let cert_sn = match fake.expected_cert_sn() {
        Some(_) => ",\"alipay_cert_sn\":\"fakegatewayalipaycertsn000000001\"",
        None => "",
    };
    let signer = match signing {
        Signing::Provider => Some(&fake.alipay_key),
        Signing::Forger => Some(&fake.forger),
        Signing::Unsigned => None,
    };
    let body = match signer {
        Some(signer) => format!(
            "{{\"{key}\":{value}{cert_sn},\"sign\":\"{}\"}}",
            rsa_sign(signer, value.as_bytes()).expect("sign")
        ),
        None => format!("{{\"{key}\":{value}{cert_sn}}}"),
    };
    HttpResponse::Ok()
        .content_type("text/html;charset=utf-8")
        .body(body)
}

async fn alipay(fake: &Fake, body: &[u8], req: &HttpRequest) -> HttpResponse {
    let Some(params) = alipay_request(body, fake) else {
        fake.refused.fetch_add(1, Ordering::SeqCst);
        // Alipay's answer to a bad signature is signed; an unknown app's is not.
        let value = json!({"code": "40002", "msg": "Invalid Arguments", "sub_code": "isv.invalid-signature", "sub_msg": "验签出错"});
        return alipay_signed(fake, "error", &value);
    };
    let method = params.get("method").cloned().unwrap_or_default();
    if method.starts_with("alipay.fund.trans.") {
        return alipay_transfer::answer(fake, &method, &params).await;
    }
    if let Some(refusal) = cert_sn_refusal(fake, &params) {
        fake.refused.fetch_add(1, Ordering::SeqCst);
        return alipay_signed(fake, &method, &refusal);
    }
    if let Some(refusal) = partner::alipay(fake, &method, &params) {
        return refusal;
    }
    fake.verified.fetch_add(1, Ordering::SeqCst);
    let biz: Value = params
        .get("biz_content")
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    let no = biz["out_trade_no"].as_str().unwrap_or("").to_owned();
    fake.calls
        .lock()
        .expect("calls")
        .push((method.clone(), no.clone()));
    if method == "alipay.data.dataservice.bill.downloadurl.query" {
        let host = req.connection_info().host().to_owned();
        let signing = *fake.signing.lock().expect("signing");
        let (value, signing) = alipay_bill::answer(fake, &biz, &host, signing);
        return alipay_signed_as(fake, &method, &value, signing);
    }
    if method == "alipay.trade.refund" {
        return refunds::alipay_create(&biz, fake).await;
    }
    let not_exist = json!({"code": "40004", "msg": "Business Failed", "sub_code": "ACQ.TRADE_NOT_EXIST", "sub_msg": "交易不存在"});
    let trade = fake.trade(&no);
    let value = match (method.as_str(), trade) {
        ("alipay.trade.query", None) => not_exist,
        ("alipay.trade.query", Some(trade)) => {
            let (status, trade_no, total) = match trade {
                Trade::NotPaid => ("WAIT_BUYER_PAY", String::new(), 0),
                Trade::Closed => ("TRADE_CLOSED", String::new(), 0),
                Trade::Paid {
                    transaction_id,
                    total,
                } => ("TRADE_SUCCESS", transaction_id, total),
                // Alipay: "未付款交易超时关闭，或支付完成后全额退款".
                Trade::Refunded {
                    transaction_id,
                    total,
                } => ("TRADE_CLOSED", transaction_id, total),
            };
            let mut v = json!({"code": "10000", "msg": "Success", "out_trade_no": no, "trade_status": status, "buyer_logon_id": "159****3821"});
            if !trade_no.is_empty() {
                v["trade_no"] = json!(trade_no);
                v["total_amount"] = json!(yuan(total));
                v["buyer_pay_amount"] = json!(yuan(total));
                v["send_pay_date"] = json!("2026-11-30 10:00:07");
            }
            v
        }
        ("alipay.trade.fastpay.refund.query", _) => {
            let request_no = biz["out_request_no"].as_str().unwrap_or("");
            match fake.refunded(request_no) {
                // An unknown refund request: 10000 without refund_status.
                None => json!({"code": "10000", "msg": "Success"}),
                // Alipay: "未返回该字段表示退款请求未收到或者退款失败".
                Some(r) if r.status != RefundStatus::Success => json!({
                    "code": "10000", "msg": "Success", "out_trade_no": r.out_trade_no,
                    "trade_no": r.transaction_id, "out_request_no": request_no,
                    "total_amount": yuan(r.total), "refund_amount": yuan(r.refund_fen)
                }),
                Some(r) => json!({
                    "code": "10000", "msg": "Success", "out_trade_no": r.out_trade_no,
                    "trade_no": r.transaction_id, "out_request_no": request_no,
                    "total_amount": yuan(r.total), "refund_amount": yuan(r.refund_fen),
                    "refund_status": "REFUND_SUCCESS"
                }),
            }
        }
        ("alipay.trade.close", Some(Trade::NotPaid)) if fake.lying() == Lie::CloseKeepsTrade => {
            json!({"code": "10000", "msg": "Success", "out_trade_no": "RC-SOME-OTHER-ORDER", "trade_no": "2026RC-SOME-OTHER-ORDER"})
        }
        ("alipay.trade.close", None) => not_exist,
        ("alipay.trade.close", Some(Trade::NotPaid)) => {
            fake.set(&no, Trade::Closed);
            json!({"code": "10000", "msg": "Success", "out_trade_no": no})
        }
        // Paid, or closed already: the same answer.
        ("alipay.trade.close", Some(_)) => {
            json!({"code": "40004", "msg": "Business Failed", "sub_code": "ACQ.TRADE_STATUS_ERROR", "sub_msg": "交易状态不合法"})
        }
        _ => {
            json!({"code": "40004", "msg": "Business Failed", "sub_code": "isv.invalid-method", "sub_msg": "不存在的方法名"})
        }
    };
    alipay_signed(fake, &method, &value)
}

/// A TLS front on a local port for a plain HTTP server on 127.0.0.1, with a certificate for
/// `127.0.0.1` issued by a CA made for it; the CA's PEM is at `ca_file`. The front ends when
/// dropped.
pub struct TlsFront {
    pub port: u16,
    pub ca_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsFront {
    pub async fn start(target_port: u16) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "paynotify test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca.self_signed(&ca_key).expect("CA certificate");
        let key = KeyPair::generate().expect("server key");
        let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
        server
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let server = server
            .signed_by(&key, &ca, &ca_key)
            .expect("server certificate");

        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("test-ca.pem");
        std::fs::write(&ca_file, ca.pem()).expect("write CA");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![server.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the TLS front");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if let Ok(mut plain) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target_port)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        Self {
            port,
            ca_file,
            _dir: dir,
            task,
        }
    }
}

/// A 200 whose body comes in ten pieces spread over `over` (the headers at once).
pub fn trickled(body: Vec<u8>, over: std::time::Duration) -> HttpResponse {
    struct Pieces(tokio::sync::mpsc::Receiver<web::Bytes>);
    impl futures_core::Stream for Pieces {
        type Item = Result<web::Bytes, actix_web::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            self.0.poll_recv(cx).map(|piece| piece.map(Ok))
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let size = body.len().div_ceil(10).max(1);
        for piece in body.chunks(size) {
            tokio::time::sleep(over / 10).await;
            if tx.send(web::Bytes::copy_from_slice(piece)).await.is_err() {
                return;
            }
        }
    });
    HttpResponse::Ok()
        .content_type("application/octet-stream")
        .streaming(Pieces(rx))
}
