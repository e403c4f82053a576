//! What every provider's API client shares: why a call failed, the live set of accounts with
//! API credentials, and the HTTPS plumbing (rustls on ring, the system's roots plus
//! `provider_api.ca_file`, connect and overall timeouts, a per-provider rate limit).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::value::ConfigError;
use crate::https::{ClientSettings, http_client};

/// Why a call gave no usable answer. Never evidence of anything: the caller retries later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No answer: connection refused, timeout, 5xx, rate limited, "system busy".
    Unreachable(String),
    /// An answer that does not verify with the provider's key (or carries no signature):
    /// ignored and counted.
    BadSignature(String),
    /// A signed answer naming a key this client does not know (WeChat `Wechatpay-Serial`):
    /// counted as `bad_signature`; the keys are refreshed and the call made again once.
    UnknownKey(String),
    /// A verified answer that says something this client does not act on.
    Unexpected(String),
}

impl Failure {
    /// The `result` label of the query metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::BadSignature(_) | Self::UnknownKey(_) => "bad_signature",
            Self::Unexpected(_) => "unexpected",
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            Self::Unreachable(d)
            | Self::BadSignature(d)
            | Self::UnknownKey(d)
            | Self::Unexpected(d) => d,
        }
    }
}

/// One merchant or app with API credentials.
pub trait Account: Send + Sync + 'static {
    /// What the calls name it by: a WeChat `mchid`, an Alipay `app_id`.
    fn id(&self) -> &str;
    /// What a call for an account without credentials lacks, in its failure's words.
    const MISSING: &'static str;
}

/// A provider client's accounts with API credentials: those of the file, in configuration
/// order, then those added through `/admin/merchants`. A call reads an immutable snapshot
/// (an `Arc`, taken in nanoseconds); a change builds the next one and swaps it.
#[derive(Debug)]
pub struct Accounts<A> {
    live: RwLock<Arc<Snapshot<A>>>,
    plumbing: Plumbing,
}

#[derive(Debug)]
struct Snapshot<A> {
    list: Vec<Arc<A>>,
    by_id: HashMap<String, usize>,
}

impl<A: Account> Snapshot<A> {
    fn new(list: Vec<Arc<A>>) -> Self {
        let by_id = list
            .iter()
            .enumerate()
            .map(|(i, a)| (a.id().to_owned(), i))
            .collect();
        Self { list, by_id }
    }
}

impl<A: Account> Accounts<A> {
    /// The HTTPS client is built here, so a bad `provider_api.ca_file` stops start-up even
    /// before the first account with credentials is added.
    pub fn new(list: Vec<A>, settings: &ClientSettings) -> Result<Self, ConfigError> {
        Ok(Self {
            live: RwLock::new(Arc::new(Snapshot::new(
                list.into_iter().map(Arc::new).collect(),
            ))),
            plumbing: Plumbing::new(settings)?,
        })
    }

    fn snapshot(&self) -> Arc<Snapshot<A>> {
        // Writers swap whole snapshots: a poisoned lock still holds a whole one.
        Arc::clone(
            &self
                .live
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    pub fn get(&self, id: &str) -> Result<Arc<A>, Failure> {
        let snapshot = self.snapshot();
        snapshot
            .by_id
            .get(id)
            .map(|&i| Arc::clone(&snapshot.list[i]))
            .ok_or_else(|| Failure::Unexpected(format!("no {} {id}", A::MISSING)))
    }

    /// Every account, file accounts first in configuration order.
    pub fn list(&self) -> Vec<Arc<A>> {
        self.snapshot().list.clone()
    }

    pub fn ids(&self) -> Vec<String> {
        self.snapshot()
            .list
            .iter()
            .map(|a| a.id().to_owned())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().list.is_empty()
    }

    /// Replaces the accounts `put` name (or adds them, at the end) and drops `removed`, in
    /// one swap.
    pub fn change(&self, put: Vec<A>, removed: &[String]) {
        let mut live = self
            .live
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut list: Vec<Arc<A>> = live
            .list
            .iter()
            .filter(|a| !removed.iter().any(|r| r == a.id()))
            .cloned()
            .collect();
        let mut at: HashMap<String, usize> = list
            .iter()
            .enumerate()
            .map(|(i, a)| (a.id().to_owned(), i))
            .collect();
        for account in put {
            let account = Arc::new(account);
            match at.get(account.id()) {
                Some(&i) => list[i] = account,
                None => {
                    at.insert(account.id().to_owned(), list.len());
                    list.push(account);
                }
            }
        }
        *live = Arc::new(Snapshot::new(list));
    }

    pub fn plumbing(&self) -> &Plumbing {
        &self.plumbing
    }
}

/// At most `max_qps` requests a second: each caller takes the next free slot and waits for
/// it, so a burst is spread out instead of refused.
#[derive(Debug)]
pub struct RateLimiter {
    interval: Duration,
    next: tokio::sync::Mutex<tokio::time::Instant>,
}

impl RateLimiter {
    pub fn per_second(max_qps: u32) -> Self {
        Self {
            interval: Duration::from_secs(1) / max_qps.max(1),
            next: tokio::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }

    /// Waits for this caller's slot.
    pub async fn acquire(&self) {
        let slot = {
            let mut next = self.next.lock().await;
            let slot = (*next).max(tokio::time::Instant::now());
            *next = slot + self.interval;
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

/// A provider's answer as received: status, the headers a client reads, the raw body.
#[derive(Debug)]
pub struct Received {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Received {
    /// The one value of a header, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// What every provider client shares: the HTTPS client and that provider's rate limit.
#[derive(Debug)]
pub struct Plumbing {
    client: reqwest::Client,
    limiter: RateLimiter,
}

impl Plumbing {
    pub fn new(settings: &ClientSettings) -> Result<Self, ConfigError> {
        Ok(Self {
            client: http_client(settings)?,
            limiter: RateLimiter::per_second(settings.max_qps),
        })
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Waits for this provider's next rate-limit slot.
    pub async fn acquire(&self) {
        self.limiter.acquire().await;
    }

    /// Sends `request` in its rate-limit slot; no answer at all is [`Failure::Unreachable`].
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<Received, Failure> {
        self.limiter.acquire().await;
        let response = request
            .send()
            .await
            .map_err(|e| Failure::Unreachable(error_chain(&e)))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|e| Failure::Unreachable(error_chain(&e)))?
            .to_vec();
        Ok(Received {
            status,
            headers,
            body,
        })
    }
}

/// An error with its causes, on one line (reqwest's own message hides the TLS reason).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_rate_limit_spreads_a_burst() {
        let limiter = RateLimiter::per_second(20);
        let started = tokio::time::Instant::now();
        for _ in 0..11 {
            limiter.acquire().await;
        }
        // 11 slots 50 ms apart: the last one 500 ms after the first.
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(900), "{elapsed:?}");
    }
}
