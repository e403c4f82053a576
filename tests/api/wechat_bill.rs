//! The WeChat Pay trade bill against the stand-in WeChat API: applied for and downloaded with
//! signed requests, checked against the signed hash, read back line by line; every bad input
//! a specific [`BillError`], nothing read from a bill that failed a check.

use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;
use paynotify::channel::api::Failure;
use paynotify::channel::bill::{BillError, BillLine, BillSource, BillTotals, Fetched, LineKind};
use paynotify::config::Settings;
use paynotify::time::Timestamp;

use crate::support::keys::{private_key_path, rsa_key};
use crate::support::provider::{
    BillFault, FakeBill, FakeLine, FakeProvider, MERCHANT_KEY, MERCHANT_SERIAL,
};

const MCHID: &str = "1900000001";
const DATE: &str = "2026-11-30";
const TIMEOUT: Duration = Duration::from_secs(10);

async fn fake() -> FakeProvider {
    let platform = crate::wechat::sandbox('A');
    FakeProvider::start(
        (
            &platform.mchid,
            &platform.appid,
            &platform.serial,
            platform.private_key,
        ),
        ("2021000000000001", "alipay"),
    )
    .await
}

/// The WeChat bill source of merchant 1900000001 with API credentials at `url`.
fn bills(url: &str, now: Timestamp) -> Arc<dyn BillSource> {
    bills_answering_within(url, now, 5000)
}

/// [`bills`], the API calls given `timeout_ms` (`provider_api.timeout_ms`).
fn bills_answering_within(url: &str, now: Timestamp, timeout_ms: u64) -> Arc<dyn BillSource> {
    let mut s = Settings {
        wechat: crate::wechat::settings(),
        ..Settings::default()
    };
    let m = &mut s.wechat.merchants[0];
    rsa_key(MERCHANT_KEY);
    m.private_key_file = Some(private_key_path(MERCHANT_KEY));
    m.merchant_serial = Some(MERCHANT_SERIAL.into());
    m.api_base = Some(url.to_owned());
    s.provider_api.max_qps = 1000;
    s.provider_api.timeout_ms = timeout_ms;
    let client = paynotify::providers::client_settings(&s);
    paynotify::channel::wechat::mount(&s.wechat, &client, now)
        .expect("mount")
        .bills
        .expect("a bill source with API credentials")
}

fn line(out_trade_no: &str, refund: Option<&str>, fen: i64, fee: i64, at: &str) -> FakeLine {
    FakeLine {
        out_trade_no: out_trade_no.into(),
        transaction_id: format!("4200002{out_trade_no}"),
        out_refund_no: refund.map(str::to_owned),
        amount_fen: fen,
        fee_milli_fen: fee,
        at: at.into(),
    }
}

fn good_lines() -> Vec<FakeLine> {
    vec![
        line("WB-1", None, 19900, 119400, "2026-11-30 09:15:02"),
        line("WB-2", None, 1, 6, "2026-11-30 23:59:59"),
        line("WB-0", Some("R-WB-0"), 5000, -30000, "2026-11-30 00:00:07"),
    ]
}

fn date(text: &str) -> NaiveDate {
    NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("date")
}

fn now() -> Timestamp {
    Timestamp::new(chrono::Utc::now())
}

/// Fetches the bill of `day` and reads it; the error of whichever step failed.
async fn fetch_and_read(
    source: &dyn BillSource,
    day: &str,
    timeout: Duration,
) -> Result<(Vec<BillLine>, BillTotals), BillError> {
    match source.fetch(MCHID, date(day), timeout, now()).await? {
        Fetched::NoBill(why) => panic!("{day}: no bill: {why}"),
        Fetched::Bill(file) => {
            let mut lines = Vec::new();
            let totals = file.read(&mut |l| {
                lines.push(l);
                Ok(())
            })?;
            Ok((lines, totals))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_bill_is_read_back_line_by_line_with_its_totals() {
    let fake = fake().await;
    let source = bills(&fake.url, now());
    assert_eq!(source.accounts(), vec![MCHID.to_owned()]);
    fake.state.set_bill(
        DATE,
        FakeBill {
            lines: good_lines(),
            fault: None,
        },
    );

    let (lines, totals) = fetch_and_read(source.as_ref(), DATE, TIMEOUT)
        .await
        .expect("a good bill");

    let got: Vec<(LineKind, &str, Option<&str>, i64, i64)> = lines
        .iter()
        .map(|l| {
            (
                l.kind,
                l.out_trade_no.as_str(),
                l.out_refund_no.as_deref(),
                l.amount_fen,
                l.fee_milli_fen,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (LineKind::Payment, "WB-1", None, 19900, 119400),
            (LineKind::Payment, "WB-2", None, 1, 6),
            (LineKind::Refund, "WB-0", Some("R-WB-0"), 5000, -30000),
        ]
    );
    assert_eq!(lines[0].transaction_id, "4200002WB-1");
    // 23:59:59 in Beijing is 15:59:59 UTC, on the bill's own date.
    let at = lines[1].at.expect("at").as_datetime();
    assert_eq!(at.to_rfc3339(), "2026-11-30T15:59:59+00:00");
    assert_eq!(
        totals,
        BillTotals {
            count: 2,
            amount_fen: 19901,
            refund_count: 1,
            refund_fen: 5000,
            // 1.19400 + 0.00006 - 0.30000 yuan = 89.406 fen.
            fee_fen: 89,
        }
    );
    assert_eq!(
        *fake.state.bill_downloads.lock().expect("downloads"),
        vec![DATE.to_owned()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_without_a_bill_is_no_bill() {
    let fake = fake().await;
    let source = bills(&fake.url, now());
    fake.state.set_bill(
        "2026-11-29",
        FakeBill {
            lines: good_lines(),
            fault: Some(BillFault::NoBill),
        },
    );
    for day in ["2026-11-28", "2026-11-29"] {
        match source.fetch(MCHID, date(day), TIMEOUT, now()).await {
            Ok(Fetched::NoBill(why)) => assert!(why.contains("NO_STATEMENT_EXIST"), "{why}"),
            Ok(Fetched::Bill(_)) => panic!("{day}: a bill"),
            Err(e) => panic!("{day}: {e}"),
        }
    }
    assert!(
        fake.state
            .bill_downloads
            .lock()
            .expect("downloads")
            .is_empty()
    );
}

/// Whether an error is the variant a fault must give.
type IsIt = fn(&BillError) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_bill_is_its_own_error() {
    let fake = fake().await;
    let source = bills(&fake.url, now());
    let cases: Vec<(BillFault, IsIt, &str)> = vec![
        (
            BillFault::WrongHash,
            |e| matches!(e, BillError::Hash(_)),
            "SHA1",
        ),
        (
            BillFault::Truncated,
            |e| matches!(e, BillError::Archive(_)),
            "truncated",
        ),
        (
            BillFault::MissingColumn("商户订单号"),
            |e| matches!(e, BillError::Format(_)),
            "lacks column 商户订单号",
        ),
        (
            BillFault::UnknownColumn,
            |e| matches!(e, BillError::Format(_)),
            "优惠标记",
        ),
        (
            BillFault::SummaryOff,
            |e| matches!(e, BillError::Summary(_)),
            "总交易单数 states 4",
        ),
        (
            BillFault::BadCharset,
            |e| matches!(e, BillError::Format(_)),
            "line 2, field 21",
        ),
        (
            BillFault::OtherMerchant,
            |e| matches!(e, BillError::OtherAccount(_)),
            "1900009999",
        ),
        (
            BillFault::Redirect,
            |e| matches!(e, BillError::Download(_)),
            "HTTP 302 to http://127.0.0.2",
        ),
        (
            BillFault::Unsigned,
            |e| matches!(e, BillError::Failed(Failure::BadSignature(_))),
            "without Wechatpay-",
        ),
        (
            BillFault::WrongSignature,
            |e| matches!(e, BillError::Failed(Failure::BadSignature(_))),
            "does not verify",
        ),
    ];
    for (n, (fault, is_it, says)) in cases.into_iter().enumerate() {
        let day = format!("2026-10-{:02}", n + 1);
        fake.state.set_bill(
            &day,
            FakeBill {
                lines: good_lines(),
                fault: Some(fault.clone()),
            },
        );
        let mut seen = 0;
        let got = match source.fetch(MCHID, date(&day), TIMEOUT, now()).await {
            Err(e) => Err(e),
            Ok(Fetched::NoBill(why)) => panic!("{fault:?}: no bill: {why}"),
            Ok(Fetched::Bill(file)) => file.read(&mut |_| {
                seen += 1;
                Ok(())
            }),
        };
        let e = got.expect_err(&format!("{fault:?} is refused"));
        assert!(is_it(&e), "{fault:?}: {e:?}");
        assert!(e.to_string().contains(says), "{fault:?}: {e}");
        // A file that fails before its first row hands none on.
        if !matches!(fault, BillFault::SummaryOff) {
            assert_eq!(seen, 0, "{fault:?}: rows handed on");
        }
    }
    // Only the downloads whose signed answer verified were asked for.
    let downloads = fake.state.bill_downloads.lock().expect("downloads").clone();
    assert_eq!(downloads.len(), 8, "{downloads:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_that_hangs_gives_up_at_the_download_timeout() {
    let fake = fake().await;
    let source = bills(&fake.url, now());
    fake.state.set_bill(
        DATE,
        FakeBill {
            lines: good_lines(),
            fault: Some(BillFault::Hang),
        },
    );
    let started = std::time::Instant::now();
    let e = fetch_and_read(source.as_ref(), DATE, Duration::from_secs(2))
        .await
        .expect_err("a hanging download");
    assert_eq!(
        e,
        BillError::Download("not downloaded within 2 s (bills.download_timeout_secs)".into())
    );
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

/// The download has `bills.download_timeout_secs`, not the API calls' `provider_api.timeout_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_slower_than_the_api_timeout_is_read() {
    let fake = fake().await;
    let source = bills_answering_within(&fake.url, now(), 1000);
    fake.state.set_bill(
        DATE,
        FakeBill {
            lines: good_lines(),
            fault: Some(BillFault::Trickle(Duration::from_millis(2500))),
        },
    );
    let (lines, _) = fetch_and_read(source.as_ref(), DATE, Duration::from_secs(6))
        .await
        .expect("a bill slower than provider_api.timeout_ms");
    assert_eq!(lines.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merchant_without_api_credentials_has_no_bill() {
    let fake = fake().await;
    let source = bills(&fake.url, now());
    let e = match source.fetch("1900000099", date(DATE), TIMEOUT, now()).await {
        Err(e) => e,
        Ok(_) => panic!("a merchant without credentials"),
    };
    assert!(
        matches!(e, BillError::Failed(Failure::Unexpected(_))),
        "{e:?}"
    );
}
