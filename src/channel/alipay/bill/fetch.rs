//! Asking Alipay for a day's bill and downloading it: the signed query for its URL, then a
//! plain download from a host of `alipay.bill_hosts`.

use std::time::Duration;

use chrono::NaiveDate;

use super::AlipayBill;
use super::archive::open;
use crate::channel::alipay::AlipayApi;
use crate::channel::alipay::api::not_for_authorized;
use crate::channel::api::{ApiFuture, Failure};
use crate::channel::bill::{self, BillError, BillSource, Fetched};
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The OpenAPI method that hands out a bill's download URL.
pub const METHOD: &str = "alipay.data.dataservice.bill.downloadurl.query";

/// Alipay's answer for a day without a bill (no trade, or not generated yet).
const NO_BILL: &str = "isp.bill_not_exist";

impl BillSource for AlipayApi {
    fn channel(&self) -> ChannelId {
        ChannelId::Alipay
    }

    /// The first app (configuration order) of each seller: Alipay's bill is the seller's,
    /// the same file whichever of its apps asks.
    fn accounts(&self) -> Vec<String> {
        let mut sellers: Vec<String> = Vec::new();
        let mut first = Vec::new();
        for a in self.apps.list() {
            // An authorized app's bill is its merchant's, not the ISV seller's.
            if a.authorized.is_some() {
                continue;
            }
            if !sellers.contains(&a.app.seller_id) {
                sellers.push(a.app.seller_id.clone());
                first.push(a.app.app_id.clone());
            }
        }
        first
    }

    /// Every app with API credentials of `account`'s seller, `account` first.
    fn covers(&self, account: &str) -> Vec<String> {
        let Ok(a) = self.apps.get(account) else {
            return vec![account.to_owned()];
        };
        let mut apps = vec![account.to_owned()];
        apps.extend(
            self.apps
                .list()
                .iter()
                .filter(|o| {
                    o.authorized.is_none()
                        && o.app.seller_id == a.app.seller_id
                        && o.app.app_id != account
                })
                .map(|o| o.app.app_id.clone()),
        );
        apps
    }

    /// `account` is an `app_id`; the bill is its seller's (`#账号` must name that PID).
    fn fetch<'a>(
        &'a self,
        account: &'a str,
        date: NaiveDate,
        download_timeout: Duration,
        now: Timestamp,
    ) -> ApiFuture<'a, Result<Fetched, BillError>> {
        Box::pin(async move {
            let a = self.apps.get(account)?;
            not_for_authorized(&a)?;
            let biz = serde_json::json!({
                "bill_type": "trade",
                "bill_date": date.format("%Y-%m-%d").to_string(),
            });
            let r = self.call(&a, METHOD, &biz, now).await?;
            if r.code != "10000" {
                return match r.sub_code.as_deref() {
                    Some(NO_BILL) => Ok(Fetched::NoBill(format!(
                        "{NO_BILL} {}",
                        r.sub_msg.as_deref().unwrap_or("")
                    ))),
                    _ => Err(r.failure().into()),
                };
            }
            let url = r
                .bill_download_url
                .as_deref()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| Failure::Unexpected("10000 without bill_download_url".into()))?;
            let parsed = download_url(url, &self.bill_hosts)?;
            let plumbing = self.apps.plumbing();
            // The URL carries its own token: no Authorization header, nothing to sign.
            let (file, _size) =
                bill::download(plumbing, plumbing.client().get(parsed), download_timeout).await?;
            // Reading the zip's directory is blocking work.
            let opened = tokio::task::spawn_blocking(move || open(file))
                .await
                .map_err(|e| BillError::Archive(format!("the zip was not opened: {e}")))??;
            Ok(Fetched::Bill(Box::new(AlipayBill {
                opened,
                seller_id: a.app.seller_id.clone(),
            })))
        })
    }
}

/// Where a bill is downloaded from: `bill_download_url` when it names one of `hosts`
/// (`alipay.bill_hosts`), over HTTPS. The file carries no hash or signature, so whoever
/// answers that URL writes the bill: Alipay's documented `http://dwbillcenter.alipay.com/…`
/// is fetched as `https://…`, and plain HTTP is kept only for a loopback stand-in.
pub fn download_url(url: &str, hosts: &[String]) -> Result<reqwest::Url, BillError> {
    let refused = |why: &str| BillError::Download(format!("bill_download_url {url:?} {why}"));
    let mut parsed = reqwest::Url::parse(url).map_err(|e| refused(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(refused("is not http(s)"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(refused("carries credentials"));
    }
    let host = parsed.host_str().unwrap_or_default();
    if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        return Err(refused(&format!(
            "is not on a host of alipay.bill_hosts ({})",
            hosts.join(", ")
        )));
    }
    if parsed.scheme() == "http" && !crate::https::is_loopback(&parsed) {
        parsed
            .set_scheme("https")
            .map_err(|()| refused("cannot be made https"))?;
    }
    Ok(parsed)
}
