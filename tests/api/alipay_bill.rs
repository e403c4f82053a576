//! The Alipay bill against the stand-in gateway (`support/alipay_bill.rs`): the signed
//! `bill.downloadurl.query`, the download of the zip it names and the streaming read of its
//! GBK CSVs, and every bad input the stand-in can make of a bill.

use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;
use paynotify::channel::api::Failure;
use paynotify::channel::bill::{BillError, BillLine, BillSource, BillTotals, Fetched, LineKind};
use paynotify::config::Settings;
use paynotify::notice::ChannelId;
use paynotify::time::Timestamp;

use crate::support::keys::{private_key_path, rsa_key};
use crate::support::provider::{APP_KEY, BillFault, FakeBill, FakeLine, FakeProvider};

const APP_ID: &str = "2021000000000001";
const DATE: &str = "2026-11-30";

async fn fake() -> FakeProvider {
    let platform = crate::wechat::sandbox('A');
    FakeProvider::start(
        (
            &platform.mchid,
            &platform.appid,
            &platform.serial,
            platform.private_key,
        ),
        (APP_ID, "alipay"),
    )
    .await
}

/// The Alipay channel's bills, its app with API credentials at the fake gateway.
fn bills(fake: &FakeProvider) -> Arc<dyn BillSource> {
    bills_answering_within(fake, 5000)
}

/// [`bills`], the API calls given `timeout_ms` (`provider_api.timeout_ms`).
fn bills_answering_within(fake: &FakeProvider, timeout_ms: u64) -> Arc<dyn BillSource> {
    let mut s = Settings {
        alipay: crate::alipay::settings(),
        ..Settings::default()
    };
    rsa_key(APP_KEY);
    s.alipay.apps[0].app_private_key_file = Some(private_key_path(APP_KEY));
    s.alipay.apps[0].gateway = Some(format!("{}/gateway.do", fake.url));
    s.provider_api.max_qps = 1000;
    s.provider_api.timeout_ms = timeout_ms;
    let now = Timestamp::new(chrono::Utc::now());
    paynotify::providers::mount_all(&s, now)
        .expect("providers")
        .into_iter()
        .filter_map(|m| m.bills)
        .find(|b| b.channel() == ChannelId::Alipay)
        .expect("Alipay bills")
}

fn line(no: &str, fen: i64, refund: Option<&str>, fee: i64, at: &str) -> FakeLine {
    FakeLine {
        out_trade_no: no.into(),
        transaction_id: format!("2026113022001400000000{no}"),
        out_refund_no: refund.map(Into::into),
        amount_fen: fen,
        fee_milli_fen: fee,
        at: at.into(),
    }
}

/// Two payments (one of them at 23:59:59), a partial refund and a fee of 0.6 %.
fn good_lines() -> Vec<FakeLine> {
    vec![
        line("000001", 10000, None, 60_000, "2026-11-30 10:00:07"),
        line("000002", 1999, None, 11_994, "2026-11-30 23:59:59"),
        line(
            "000001",
            3000,
            Some("R-000001"),
            18_000,
            "2026-11-30 12:00:00",
        ),
    ]
}

fn date() -> NaiveDate {
    NaiveDate::parse_from_str(DATE, "%Y-%m-%d").expect("date")
}

enum Got {
    Bill(Vec<BillLine>, BillTotals),
    NoBill(String),
}

/// Fetches `DATE`'s bill and reads every line of it.
async fn fetch_and_read(bills: &dyn BillSource, timeout: Duration) -> Result<Got, BillError> {
    let now = Timestamp::new(chrono::Utc::now());
    match bills.fetch(APP_ID, date(), timeout, now).await? {
        Fetched::NoBill(why) => Ok(Got::NoBill(why)),
        Fetched::Bill(file) => {
            let mut lines = Vec::new();
            let totals = tokio::task::spawn_blocking(move || {
                file.read(&mut |l| {
                    lines.push(l);
                    Ok(())
                })
                .map(|t| (lines, t))
            })
            .await
            .expect("read")?;
            Ok(Got::Bill(totals.0, totals.1))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_alipay_bill_reads_back_line_by_line_with_its_totals() {
    let fake = fake().await;
    let bills = bills(&fake);
    assert_eq!(bills.accounts(), [APP_ID]);
    fake.state.set_bill(
        DATE,
        FakeBill {
            lines: good_lines(),
            fault: None,
        },
    );
    let Ok(Got::Bill(lines, totals)) =
        fetch_and_read(bills.as_ref(), Duration::from_secs(10)).await
    else {
        panic!("a bill");
    };
    assert_eq!(lines.len(), 3);
    let payment = &lines[1];
    assert_eq!(payment.kind, LineKind::Payment);
    assert_eq!(payment.out_trade_no, "000002");
    assert_eq!(payment.transaction_id, "2026113022001400000000000002");
    assert_eq!(payment.amount_fen, 1999);
    assert_eq!(payment.fee_milli_fen, 11_994);
    assert_eq!(payment.status, "交易");
    assert_eq!(
        payment.at.expect("at").as_datetime().to_rfc3339(),
        "2026-11-30T15:59:59+00:00"
    );
    let refund = &lines[2];
    assert_eq!(refund.kind, LineKind::Refund);
    assert_eq!(refund.out_refund_no.as_deref(), Some("R-000001"));
    assert_eq!(refund.amount_fen, 3000);
    assert_eq!(refund.fee_milli_fen, -18_000);
    assert_eq!(
        totals,
        BillTotals {
            count: 2,
            amount_fen: 11999,
            refund_count: 1,
            refund_fen: 3000,
            // 600 + 119.94 − 180 thousandths of a yuan: 539.94 → 54 fen.
            fee_fen: 54,
        }
    );
    assert_eq!(
        *fake.state.bill_downloads.lock().expect("downloads"),
        [DATE]
    );
    let calls = fake.state.calls();
    assert_eq!(
        calls.last().map(|c| c.0.as_str()),
        Some("alipay.data.dataservice.bill.downloadurl.query")
    );
    assert_eq!(
        fake.state.refused.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_without_an_alipay_bill_is_no_bill() {
    let fake = fake().await;
    let bills = bills(&fake);
    let Ok(Got::NoBill(why)) = fetch_and_read(bills.as_ref(), Duration::from_secs(5)).await else {
        panic!("no bill");
    };
    assert!(why.contains("isp.bill_not_exist"), "{why}");
    assert!(
        fake.state
            .bill_downloads
            .lock()
            .expect("downloads")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_alipay_bill_is_refused_with_its_reason() {
    let fake = fake().await;
    let bills = bills(&fake);
    type Check = fn(&Result<Got, BillError>) -> bool;
    let cases: [(BillFault, Check); 15] = [
        (BillFault::Truncated, |r| {
            matches!(r, Err(BillError::Archive(_)))
        }),
        (
            BillFault::MissingColumn("服务费（元）"),
            |r| matches!(r, Err(BillError::Format(m)) if m.contains("missing column") && m.contains("服务费（元）")),
        ),
        (
            BillFault::UnknownColumn,
            |r| matches!(r, Err(BillError::Format(m)) if m.contains("unknown column")),
        ),
        (
            BillFault::SummaryOff,
            |r| matches!(r, Err(BillError::Summary(m)) if m.contains("#交易合计")),
        ),
        (
            BillFault::BadCharset,
            |r| matches!(r, Err(BillError::Format(m)) if m.contains("line 6") && m.contains("GBK")),
        ),
        (
            BillFault::OtherMerchant,
            |r| matches!(r, Err(BillError::OtherAccount(m)) if m.contains("2088000000009999")),
        ),
        (
            BillFault::Hang,
            |r| matches!(r, Err(BillError::Download(m)) if m.contains("within 2 s")),
        ),
        (
            BillFault::Redirect,
            |r| matches!(r, Err(BillError::Download(m)) if m.contains("302") && m.contains("dwbillcenter.example.invalid")),
        ),
        (BillFault::Unsigned, |r| {
            matches!(r, Err(BillError::Failed(Failure::BadSignature(_))))
        }),
        (BillFault::WrongSignature, |r| {
            matches!(r, Err(BillError::Failed(Failure::BadSignature(_))))
        }),
        (BillFault::NoBill, |r| matches!(r, Ok(Got::NoBill(_)))),
        // No hash vouches for the file: it comes only from the hosts Alipay serves bills from.
        (
            BillFault::ForeignHost,
            |r| matches!(r, Err(BillError::Download(m)) if m.contains("localhost") && m.contains("alipay.bill_hosts")),
        ),
        (
            BillFault::ManyEntries,
            |r| matches!(r, Err(BillError::Archive(m)) if m.contains("1002 entries") && m.contains("at most 16")),
        ),
        (
            BillFault::BlankLines,
            |r| matches!(r, Err(BillError::Format(m)) if m.contains("业务明细") && m.contains("more than 1000 blank or comment lines")),
        ),
        // Alipay gives no hash: WeChat's fault leaves an Alipay bill as it is.
        (
            BillFault::WrongHash,
            |r| matches!(r, Ok(Got::Bill(lines, _)) if lines.len() == 3),
        ),
    ];
    for (fault, expected) in cases {
        fake.state.set_bill(
            DATE,
            FakeBill {
                lines: good_lines(),
                fault: Some(fault.clone()),
            },
        );
        let started = std::time::Instant::now();
        let got = fetch_and_read(bills.as_ref(), Duration::from_secs(2)).await;
        let shown = match &got {
            Ok(Got::Bill(lines, _)) => format!("a bill of {} lines", lines.len()),
            Ok(Got::NoBill(why)) => format!("no bill: {why}"),
            Err(e) => format!("{e}"),
        };
        assert!(expected(&got), "{fault:?}: {shown}");
        assert!(started.elapsed() < Duration::from_secs(5), "{fault:?}");
    }
    // Every fault but NoBill, ForeignHost and the two unverified answers downloaded the file.
    assert_eq!(
        fake.state.bill_downloads.lock().expect("downloads").len(),
        11
    );
}

/// Only `bills.download_timeout_secs` limits a download: a bill whose body takes longer than
/// the API calls' `provider_api.timeout_ms` is read, and one slower than the download timeout
/// says which setting it ran into.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_alipay_bill_download_has_the_download_timeout_not_the_api_one() {
    let fake = fake().await;
    let bills = bills_answering_within(&fake, 1000);
    let slow = |over: Duration| FakeBill {
        lines: good_lines(),
        fault: Some(BillFault::Trickle(over)),
    };
    fake.state.set_bill(DATE, slow(Duration::from_millis(2500)));
    let got = fetch_and_read(bills.as_ref(), Duration::from_secs(6)).await;
    match &got {
        Ok(Got::Bill(lines, _)) => assert_eq!(lines.len(), 3),
        Ok(Got::NoBill(why)) => panic!("no bill: {why}"),
        Err(e) => panic!("a bill slower than provider_api.timeout_ms: {e}"),
    }

    fake.state.set_bill(DATE, slow(Duration::from_secs(6)));
    let started = std::time::Instant::now();
    match fetch_and_read(bills.as_ref(), Duration::from_secs(2)).await {
        Err(BillError::Download(m)) => assert!(
            m.contains("not downloaded within 2 s") && m.contains("bills.download_timeout_secs"),
            "{m}"
        ),
        Ok(_) => panic!("a bill slower than the download timeout was read"),
        Err(e) => panic!("not the download timeout: {e}"),
    }
    assert!(started.elapsed() < Duration::from_secs(4));
}
