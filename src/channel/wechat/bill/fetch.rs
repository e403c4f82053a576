//! Asking WeChat Pay for a day's trade bill and downloading it: the signed application,
//! then a signed download from the merchant's API host.

use std::time::Duration;

use chrono::NaiveDate;
use serde::Deserialize;

use super::verified_tradebill;
use crate::channel::api::{ApiFuture, Failure};
use crate::channel::bill::{self, BillError, BillSource, Fetched};
use crate::channel::wechat::api::{ApiMerchant, WechatApi, not_for_sub};
use crate::notice::ChannelId;
use crate::time::Timestamp;

/// The signed answer to the bill application.
#[derive(Deserialize)]
struct TradeBillAnswer {
    hash_type: String,
    hash_value: String,
    download_url: String,
}

impl BillSource for WechatApi {
    fn channel(&self) -> ChannelId {
        ChannelId::Wechat
    }

    /// A sub-merchant's bill is its service provider's to fetch: sub-merchants are not listed.
    fn accounts(&self) -> Vec<String> {
        self.merchants
            .list()
            .iter()
            .filter(|m| m.sub_mchid.is_none())
            .map(|m| m.merchant.mchid.clone())
            .collect()
    }

    fn fetch<'a>(
        &'a self,
        account: &'a str,
        date: NaiveDate,
        download_timeout: Duration,
        now: Timestamp,
    ) -> ApiFuture<'a, Result<Fetched, BillError>> {
        Box::pin(async move {
            let m = self.merchants.get(account)?;
            not_for_sub(&m)?;
            let Some(answer) = self.apply(&m, date, now).await? else {
                return Ok(Fetched::NoBill(format!(
                    "NO_STATEMENT_EXIST: WeChat has no bill of {date} for merchant {account}"
                )));
            };
            let (path, url) = same_origin(&m.base, &answer.download_url)?;
            // WeChat signs the download like any GET: the download URL's path and query.
            let authorization = Self::authorization(&m, "GET", &path, "", now)?;
            let request = self
                .merchants
                .plumbing()
                .client()
                .get(url)
                .header("Authorization", authorization);
            let (file, _) =
                bill::download(self.merchants.plumbing(), request, download_timeout).await?;
            let mchid = m.merchant.mchid.clone();
            // Decompressing and hashing a large file is blocking work.
            let checked = tokio::task::spawn_blocking(move || {
                verified_tradebill(file, &answer.hash_value, &mchid)
            })
            .await
            .map_err(|e| BillError::Archive(format!("the hash check did not finish: {e}")))??;
            Ok(Fetched::Bill(checked))
        })
    }
}

impl WechatApi {
    /// Applies for the bill of `date`: its verified answer, or `None` when WeChat says there
    /// is none (`NO_STATEMENT_EXIST`).
    async fn apply(
        &self,
        m: &ApiMerchant,
        date: NaiveDate,
        now: Timestamp,
    ) -> Result<Option<TradeBillAnswer>, BillError> {
        let path = format!(
            "/v3/bill/tradebill?bill_date={}&bill_type=ALL&tar_type=GZIP",
            date.format("%Y-%m-%d")
        );
        let r = self.call(m, false, &path, "", now).await?;
        if !(200..300).contains(&r.status) {
            // An error body is unsigned: only its documented codes count.
            return match Self::error_code(&r)?.as_str() {
                "NO_STATEMENT_EXIST" => Ok(None),
                "STATEMENT_CREATING" => Err(Failure::Unreachable(format!(
                    "bill not ready yet (STATEMENT_CREATING): WeChat builds the bill of {date} from about 10:00 the next day"
                ))
                .into()),
                _ => Err(Self::unexpected(&r).into()),
            };
        }
        self.verify(m, &r, now)?;
        let answer: TradeBillAnswer = serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("tradebill answer: {e}")))?;
        if !answer.hash_type.eq_ignore_ascii_case("SHA1") {
            return Err(Failure::Unexpected(format!(
                "tradebill answer: hash_type {} (only SHA1 is known)",
                answer.hash_type
            ))
            .into());
        }
        Ok(Some(answer))
    }
}

/// The download URL, if it is on the merchant's API host (same scheme, host and port: our
/// signed `Authorization` header goes nowhere else), and the path and query to sign.
pub(super) fn same_origin(
    base: &str,
    download_url: &str,
) -> Result<(String, reqwest::Url), BillError> {
    let elsewhere = |why: &str| {
        BillError::Download(format!(
            "download_url {download_url} refused: {why} (the API is at {base})"
        ))
    };
    let url = reqwest::Url::parse(download_url).map_err(|e| elsewhere(&e.to_string()))?;
    let api = reqwest::Url::parse(base).map_err(|e| elsewhere(&e.to_string()))?;
    if url.scheme() != api.scheme()
        || url.host_str() != api.host_str()
        || url.port_or_known_default() != api.port_or_known_default()
    {
        return Err(elsewhere("another scheme, host or port"));
    }
    let path = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    Ok((path, url))
}
