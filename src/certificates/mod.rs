//! Platform certificates that renew themselves. A provider that hands out its keys
//! ([`KeySource`]: WeChat Pay's `GET /v3/certificates`) has them fetched for every merchant set
//! to download them: at start-up from `platform_certificate` (no network), every
//! `certificates.refresh_secs`, on `POST /admin/certificates/refresh`, and when a notification
//! or an API answer names a serial no key is known for. That last one is shared: however many
//! requests name the unknown serial at once, one download per merchant is made, at most once
//! per `certificates.on_unknown_serial_secs`, and a request waits for it at most
//! [`UNKNOWN_SERIAL_WAIT`] (then the provider is answered 503 and retries).
//!
//! Every instance stores what it downloads, and reads the table before it downloads, so a
//! certificate one instance fetched is used by all.

mod refresh;
pub mod settings;
pub mod store;

pub use refresh::NotRefreshed;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::channel::api::{
    ApiFuture, CancelReply, CloseAnswer, CombineAnswer, Failure, ProviderApi, RefundAnswer,
    RefundCall, RefundReply, TradeAnswer, TransferAnswer, TransferReply,
};
use crate::channel::platform::{KeySource, KnownKey};
use crate::metrics::{Metrics, RefreshResult};
use crate::notice::ChannelId;
use crate::store::{Store, StoreError};
use crate::time::{Clock, Timestamp};
use crate::transfer::TransferCall;
use settings::CertificateSettings;

/// How long a notification naming an unknown serial waits for its merchant's certificates
/// to be fetched before it is answered 503 (WeChat retries; its own timeout is 5 s).
pub const UNKNOWN_SERIAL_WAIT: Duration = Duration::from_secs(2);

/// A merchant whose last valid certificate expires within this is warned about (and the
/// expiry gauge lets an alert fire).
pub const EXPIRY_WARNING_SECS: i64 = 7 * 86_400;

/// What asking for the keys of an unknown serial came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// The merchants' certificates were fetched now, or moments ago: verify again with what
    /// is known now.
    Asked,
    /// No merchant of that channel downloads its certificates: there is no one to ask.
    Nobody,
    /// Not done within [`UNKNOWN_SERIAL_WAIT`]: answer 503, so the provider retries.
    TimedOut,
}

/// Every certificate stored in `platform_certificate` not expired at `now`, installed in its
/// provider (the service at start-up, `paynotify explain`); how many were new.
pub async fn load_stored(
    sources: &[Arc<dyn KeySource>],
    store: &Store,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let mut loaded = 0;
    for source in sources {
        let stored = store.certificates(source.channel(), now).await?;
        loaded += source.install(&stored, now);
    }
    Ok(loaded)
}

/// The merchants whose last key expires within [`EXPIRY_WARNING_SECS`] of `now` (or has
/// expired), with that expiry: a merchant with a key that does not expire (a public key) is
/// never among them.
pub fn expiring(keys: &[KnownKey], now: Timestamp) -> Vec<(ChannelId, String, i64)> {
    let mut latest: HashMap<(ChannelId, String), Option<i64>> = HashMap::new();
    for key in keys {
        let expiry = key.expire_at.map(|at| at.unix_seconds());
        let entry = latest
            .entry((key.channel, key.mchid.clone()))
            .or_insert(Some(i64::MIN));
        *entry = match (*entry, expiry) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let mut soon: Vec<(ChannelId, String, i64)> = latest
        .into_iter()
        .filter_map(|((channel, mchid), last)| {
            last.filter(|at| at - now.unix_seconds() < EXPIRY_WARNING_SECS)
                .map(|at| (channel, mchid, at))
        })
        .collect();
    soon.sort_by(|a, b| a.1.cmp(&b.1));
    soon
}

/// One merchant's downloads: when the last one an unknown serial called for began. Held while
/// a download runs, so requests that name an unknown serial meanwhile wait for it instead of
/// starting their own.
type Flight = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// Every provider's downloadable keys, and the store they are kept in.
pub struct Certificates {
    sources: Vec<Arc<dyn KeySource>>,
    store: Store,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    refresh_every: Duration,
    on_unknown: Duration,
    flights: HashMap<(ChannelId, String), Flight>,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("downloading", &self.flights.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Certificates {
    pub fn new(
        sources: Vec<Arc<dyn KeySource>>,
        store: Store,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        settings: &CertificateSettings,
    ) -> Arc<Self> {
        let flights = sources
            .iter()
            .flat_map(|s| {
                s.downloading()
                    .into_iter()
                    .map(|account| ((s.channel(), account), Flight::default()))
            })
            .collect();
        Arc::new(Self {
            sources,
            store,
            metrics,
            clock,
            refresh_every: Duration::from_secs(settings.refresh_secs),
            on_unknown: Duration::from_secs(settings.on_unknown_serial_secs),
            flights,
        })
    }

    /// Whether any merchant downloads its certificates (else there is no refresh job).
    pub fn downloads(&self) -> bool {
        !self.flights.is_empty()
    }

    pub fn refresh_every(&self) -> Duration {
        self.refresh_every
    }

    /// Start-up: every stored certificate not expired, so a restart needs no network.
    pub async fn load(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let loaded = load_stored(&self.sources, &self.store, now).await?;
        self.observe(now);
        Ok(loaded)
    }

    /// Every key each provider verifies with, configured and downloaded.
    pub fn keys(&self) -> Vec<KnownKey> {
        self.sources.iter().flat_map(|s| s.keys()).collect()
    }

    /// Fetches every downloading merchant's certificates now (the refresh job, and
    /// `POST /admin/certificates/refresh`), one merchant after another; each merchant's result.
    pub async fn refresh_all(self: &Arc<Self>) -> Vec<(ChannelId, String, Result<usize, Failure>)> {
        let mut results = Vec::new();
        for source in &self.sources {
            for account in source.downloading() {
                let result = Arc::clone(self)
                    .refresh_one(Arc::clone(source), account.clone(), true)
                    .await
                    .map(Option::unwrap_or_default);
                results.push((source.channel(), account, result));
            }
        }
        // Also when every download failed: the warning of a certificate about to expire
        // must go on while nothing can be fetched.
        self.observe(self.clock.now());
        results
    }

    /// A notification or an answer named a serial no key is known for: fetch the
    /// certificates of `account` (or, for a notification, whose serial is what names the
    /// merchant, of every downloading merchant of `channel`), unless that was done within
    /// `certificates.on_unknown_serial_secs`, and wait at most [`UNKNOWN_SERIAL_WAIT`]. The
    /// downloads run to their end even when the wait does not.
    pub async fn unknown_serial(
        self: &Arc<Self>,
        channel: ChannelId,
        account: Option<&str>,
    ) -> Learned {
        let mut downloads = Vec::new();
        for source in self.sources.iter().filter(|s| s.channel() == channel) {
            for named in source.downloading() {
                if account.is_none_or(|a| a == named) {
                    let this = Arc::clone(self);
                    let source = Arc::clone(source);
                    downloads.push(tokio::spawn(async move {
                        this.refresh_one(source, named, false).await
                    }));
                }
            }
        }
        if downloads.is_empty() {
            return Learned::Nobody;
        }
        let all = async {
            for download in downloads {
                let _ = download.await;
            }
        };
        match tokio::time::timeout(UNKNOWN_SERIAL_WAIT, all).await {
            Ok(()) => Learned::Asked,
            Err(_) => Learned::TimedOut,
        }
    }

    /// Fetches `account`'s certificates in its flight: unless `force`, not again within
    /// `on_unknown_serial_secs` of the last unforced one (`Ok(None)`: asked moments ago). The
    /// number of certificates not known before.
    async fn refresh_one(
        self: Arc<Self>,
        source: Arc<dyn KeySource>,
        account: String,
        force: bool,
    ) -> Result<Option<usize>, Failure> {
        let Some(flight) = self.flights.get(&(source.channel(), account.clone())) else {
            return Err(Failure::Unexpected(format!(
                "merchant {account} does not download its certificates"
            )));
        };
        let mut last = flight.lock().await;
        if !force {
            if last.is_some_and(|at| at.elapsed() < self.on_unknown) {
                return Ok(None);
            }
            // Only these count against on_unknown_serial_secs: a refresh an operator or the
            // job made just before a rotation must not hold back the one it calls for.
            *last = Some(Instant::now());
        }
        self.fetch(source.as_ref(), &account).await.map(Some)
    }

    /// What another instance stored first, then a download; what it brought is stored and
    /// used, each refusal logged and counted.
    async fn fetch(&self, source: &dyn KeySource, account: &str) -> Result<usize, Failure> {
        let channel = source.channel();
        let now = self.clock.now();
        let mut added = match self.store.certificates(channel, now).await {
            Ok(stored) => {
                let mine: Vec<_> = stored
                    .into_iter()
                    .filter(|c| c.account == account)
                    .collect();
                source.install(&mine, now)
            }
            Err(e) => {
                tracing::warn!(%channel, mchid = account, error = %e, "stored platform certificates not read; downloading them");
                0
            }
        };
        let download = match source.download(account, now).await {
            Ok(download) => download,
            Err(failure) => {
                let result = match failure {
                    Failure::Unreachable(_) => RefreshResult::Unreachable,
                    Failure::BadSignature(_) | Failure::UnknownKey(_) => {
                        RefreshResult::BadSignature
                    }
                    Failure::Unexpected(_) => RefreshResult::Unexpected,
                };
                self.metrics.certificate_refreshed(channel, result);
                tracing::warn!(%channel, mchid = account, result = result.label(), detail = failure.detail(), "platform certificates not refreshed; the keys known keep working");
                return Err(failure);
            }
        };
        for why in &download.refused {
            self.metrics
                .certificate_refreshed(channel, RefreshResult::RefusedCertificate);
            tracing::warn!(%channel, mchid = account, %why, "platform certificate refused: not used");
        }
        if download.first_use {
            tracing::warn!(%channel, mchid = account, "first use: no platform key of this merchant was known, so the certificate list was verified with a certificate it carries (decrypted with the merchant's APIv3 key), as the official SDKs do");
        }
        if let Err(e) = self.store.save_certificates(&download.certificates).await {
            tracing::warn!(%channel, mchid = account, error = %e, "downloaded platform certificates not stored: this instance uses them; the next refresh stores them");
        }
        added += source.install(&download.certificates, now);
        source.refreshed(account, now);
        self.metrics
            .certificate_refreshed(channel, RefreshResult::Ok);
        tracing::info!(%channel, mchid = account, certificates = download.certificates.len(), new = added, "platform certificates refreshed");
        self.observe(now);
        Ok(added)
    }

    /// The expiry gauges of every key, and a warning for each merchant whose last valid
    /// certificate expires within [`EXPIRY_WARNING_SECS`] (see [`expiring`]).
    pub fn observe(&self, now: Timestamp) {
        let keys = self.keys();
        for key in &keys {
            self.metrics
                .certificate_expiry
                .with_label_values(&[key.channel.as_str(), &key.mchid, &key.serial])
                .set(
                    key.expire_at
                        .map_or(f64::INFINITY, |at| at.unix_seconds() as f64),
                );
        }
        for (channel, mchid, last) in expiring(&keys, now) {
            tracing::warn!(%channel, mchid, expires_at = last, "the last valid platform certificate of this merchant expires within 7 days (or has expired): refresh (POST /admin/certificates/refresh), install the new one, or switch to a WeChat Pay public key; see docs/operations.md");
        }
    }

    /// `call`, and once more after a refresh of the account's keys when its answer
    /// `names_unknown_key` (a rotated certificate): the one rule for API calls and bills.
    pub async fn relearned<A, F: Future<Output = A>>(
        self: &Arc<Self>,
        channel: ChannelId,
        account: &str,
        now: Timestamp,
        names_unknown_key: impl Fn(&A) -> bool,
        call: impl Fn(Timestamp) -> F,
    ) -> A {
        let answer = call(now).await;
        if !names_unknown_key(&answer) {
            return answer;
        }
        match self.unknown_serial(channel, Some(account)).await {
            Learned::Asked => call(self.clock.now()).await,
            Learned::Nobody | Learned::TimedOut => answer,
        }
    }

    /// `api` with its answers that name an unknown key asked again once, after a refresh
    /// of the merchant's certificates.
    pub fn guard(self: &Arc<Self>, api: Arc<dyn ProviderApi>) -> Arc<dyn ProviderApi> {
        Arc::new(Relearning {
            inner: api,
            certificates: Arc::clone(self),
        })
    }
}

/// A provider client whose answers naming an unknown key (a rotated certificate) make the
/// merchant's certificates be fetched, then the call be made once more.
struct Relearning {
    inner: Arc<dyn ProviderApi>,
    certificates: Arc<Certificates>,
}

/// An answer that may name a key not known.
trait KeyedAnswer {
    fn names_unknown_key(&self) -> bool;
}

/// Every provider answer fails with a [`Failure`] the same way, `Failed(…)`.
macro_rules! keyed_answer {
    ($($answer:ty),+) => {$(
        impl KeyedAnswer for $answer {
            fn names_unknown_key(&self) -> bool {
                matches!(self, Self::Failed(Failure::UnknownKey(_)))
            }
        }
    )+};
}

keyed_answer!(
    TradeAnswer,
    CloseAnswer,
    CombineAnswer,
    RefundReply,
    RefundAnswer,
    TransferReply,
    TransferAnswer,
    CancelReply
);

impl Relearning {
    /// `call`, and once more after a refresh when its answer names an unknown key.
    async fn asked<'a, A: KeyedAnswer>(
        &'a self,
        account: &'a str,
        now: Timestamp,
        call: impl Fn(Timestamp) -> ApiFuture<'a, A>,
    ) -> A {
        self.certificates
            .relearned(
                self.inner.channel(),
                account,
                now,
                A::names_unknown_key,
                call,
            )
            .await
    }
}

impl ProviderApi for Relearning {
    fn channel(&self) -> ChannelId {
        self.inner.channel()
    }

    fn accounts(&self) -> Vec<String> {
        self.inner.accounts()
    }

    fn query<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, TradeAnswer> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner.query(account, out_trade_no, now)
        }))
    }

    fn close<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, CloseAnswer> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner.close(account, out_trade_no, now)
        }))
    }

    fn combine_query<'a>(
        &'a self,
        account: &'a str,
        combine_out_trade_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, CombineAnswer> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner.combine_query(account, combine_out_trade_no, now)
        }))
    }

    /// Sent again after a refresh: closing a closed combination is closing it.
    fn combine_close<'a>(
        &'a self,
        account: &'a str,
        combine_out_trade_no: &'a str,
        combine_appid: &'a str,
        subs: &'a [(String, String)],
        now: Timestamp,
    ) -> ApiFuture<'a, CloseAnswer> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner
                .combine_close(account, combine_out_trade_no, combine_appid, subs, now)
        }))
    }

    fn refund_query<'a>(
        &'a self,
        account: &'a str,
        out_trade_no: &'a str,
        out_refund_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, RefundAnswer> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner
                .refund_query(account, out_trade_no, out_refund_no, now)
        }))
    }

    /// Sent again after a refresh: the provider deduplicates on the refund number.
    fn refund<'a>(
        &'a self,
        account: &'a str,
        call: &'a RefundCall,
        now: Timestamp,
    ) -> ApiFuture<'a, RefundReply> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner.refund(account, call, now)
        }))
    }

    fn transfer_apps(&self, account: &str) -> Result<Vec<String>, String> {
        self.inner.transfer_apps(account)
    }

    /// Sent again after a refresh: the provider deduplicates on `out_bill_no`, and the
    /// name is encrypted again with the key learned.
    fn transfer<'a>(
        &'a self,
        account: &'a str,
        call: &'a TransferCall,
        now: Timestamp,
    ) -> ApiFuture<'a, TransferReply> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner.transfer(account, call, now)
        }))
    }

    fn transfer_query<'a>(
        &'a self,
        account: &'a str,
        out_bill_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, TransferAnswer> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner.transfer_query(account, out_bill_no, now)
        }))
    }

    /// Sent again after a refresh: a cancel of a bill already canceling is accepted again.
    fn transfer_cancel<'a>(
        &'a self,
        account: &'a str,
        out_bill_no: &'a str,
        now: Timestamp,
    ) -> ApiFuture<'a, CancelReply> {
        Box::pin(self.asked(account, now, move |now| {
            self.inner.transfer_cancel(account, out_bill_no, now)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::platform::KeyOrigin;

    fn key(mchid: &str, serial: &str, expire_at: Option<i64>) -> KnownKey {
        let at = |s: i64| Timestamp::new(chrono::DateTime::from_timestamp(s, 0).expect("time"));
        KnownKey {
            channel: ChannelId::Wechat,
            mchid: mchid.to_owned(),
            serial: serial.to_owned(),
            source: KeyOrigin::Downloaded,
            effective_at: expire_at.map(|_| at(0)),
            expire_at: expire_at.map(at),
            fetched_at: None,
        }
    }

    #[test]
    fn only_a_merchant_whose_last_key_expires_within_a_week_is_expiring() {
        let now = Timestamp::new(chrono::DateTime::from_timestamp(1_000_000_000, 0).expect("t"));
        let day = 86_400;
        let n = now.unix_seconds();
        let keys = [
            // Its old certificate expires tomorrow, its new one in 30 days: fine.
            key("A", "A1", Some(n + day)),
            key("A", "A2", Some(n + 30 * day)),
            // Both within the week: warned, with the later of the two.
            key("B", "B1", Some(n + day)),
            key("B", "B2", Some(n + 6 * day)),
            // A certificate expiring, but a public key beside it: fine.
            key("C", "C1", Some(n + day)),
            key("C", "PUB_KEY_ID_C", None),
            // Expired already: warned.
            key("D", "D1", Some(n - day)),
            // Exactly seven days left: not within.
            key("E", "E1", Some(n + 7 * day)),
        ];
        let soon = expiring(&keys, now);
        assert_eq!(
            soon,
            [
                (ChannelId::Wechat, "B".to_owned(), n + 6 * day),
                (ChannelId::Wechat, "D".to_owned(), n - day),
            ]
        );
    }
}
