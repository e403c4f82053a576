//! An HTTP endpoint of the consumer's, each event signed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ring::hmac;

use crate::config::{ConfigError, Secret, invalid};
use crate::https::{ClientSettings, client_builder};
use crate::relay::sink::{Event, Health, Published, Sink, SinkError};
use crate::text::hex;

/// `POST {url}` with the event as JSON, `Idempotency-Key: {topic}:{biz_key}` and
/// `Paynotify-Signature: t={unix},v1={hex HMAC-SHA256(secret, "{t}.{body}")}`.
pub struct HttpSink {
    client: reqwest::Client,
    url: String,
    key: hmac::Key,
    /// False while the last batch delivered nothing: the receiver is unreachable or refusing.
    last_batch_delivered: AtomicBool,
}

impl HttpSink {
    /// `http://` or `https://`; HTTPS trusts the system's roots plus `provider_api.ca_file`.
    pub fn new(url: &str, secret: &Secret, tls: &ClientSettings) -> Result<Self, ConfigError> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(
                "relay.http_url",
                "must be an http:// or https:// URL",
            ));
        }
        // A redirect is not a delivery: reqwest would repeat a POST as a body-less GET.
        let client = client_builder(tls)?
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| invalid("relay.http_url", e.to_string()))?;
        Ok(Self {
            client,
            url: url.to_owned(),
            key: hmac::Key::new(hmac::HMAC_SHA256, secret.expose().as_bytes()),
            last_batch_delivered: AtomicBool::new(true),
        })
    }
}

async fn post(
    client: reqwest::Client,
    url: String,
    key: hmac::Key,
    e: Event,
) -> Result<(), SinkError> {
    let body = serde_json::to_string(&e).map_err(|err| SinkError::Encode(Arc::new(err)))?;
    let t = chrono::Utc::now().timestamp();
    let mac = hmac::sign(&key, format!("{t}.{body}").as_bytes());
    let response = client
        .post(&url)
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", format!("{}:{}", e.topic, e.biz_key))
        .header(
            "Paynotify-Signature",
            format!("t={t},v1={}", hex(mac.as_ref())),
        )
        .body(body)
        .send()
        .await
        .map_err(|err| SinkError::Http(Arc::new(err)))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(SinkError::HttpStatus(response.status().as_u16()))
    }
}

impl Sink for HttpSink {
    fn name(&self) -> &'static str {
        "http"
    }

    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            // The whole batch at once, so a batch takes at most one timeout (10 s).
            let mut posts = tokio::task::JoinSet::new();
            for (i, e) in events.iter().enumerate() {
                let (client, url, key) = (self.client.clone(), self.url.clone(), self.key.clone());
                let e = e.clone();
                posts.spawn(async move { (i, post(client, url, key, e).await) });
            }
            let mut results = vec![Err(SinkError::NotSent); events.len()];
            while let Some(done) = posts.join_next().await {
                if let Ok((i, result)) = done {
                    results[i] = result;
                }
            }
            if !results.is_empty() {
                self.last_batch_delivered
                    .store(results.iter().any(Result::is_ok), Ordering::Relaxed);
            }
            results
        })
    }

    /// Down while the last batch delivered nothing (the receiver is not probed: a POST
    /// would be an event).
    fn is_up(&self) -> Health<'_> {
        let up = self.last_batch_delivered.load(Ordering::Relaxed);
        Box::pin(async move { up })
    }
}
