//! The alert rules and the dashboard (`deploy/`): every metric they name is one a running
//! service exports, and the rules pass `promtool check rules` and their unit tests.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use paynotify::metrics::{
    Counted, ExpiryResult, GateResult, ProviderCall, ReceiptResult, RefreshResult, Refusal,
};
use paynotify::notice::{AnomalyReason, ChannelId, Outcome};
use paynotify::transfer::TransferStatus;

use crate::support::helpers::{Backend, spawn_app};

const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus");
const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/paynotify.json");

/// Every `paynotify_…` name in `text`, a histogram's series names as their family's.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("paynotify_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        names.insert(family.to_owned());
        rest = &tail[end..];
    }
    names
}

/// The families a scrape holds (`# TYPE name kind`).
fn families(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let app = spawn_app(Backend::Sqlite).await;
    // A labelled family appears once it has a series: one of each, through the recording
    // calls the service makes.
    let m = &app.metrics;
    m.notified(ChannelId::Wechat, Counted::Ledger(Outcome::Applied));
    m.notified(
        ChannelId::Wechat,
        Counted::Ledger(Outcome::Anomaly(AnomalyReason::AmountMismatch)),
    );
    m.refused(ChannelId::Wechat, Refusal::BadSignature);
    m.receipts(ReceiptResult::Written, 1);
    m.provider_call(ChannelId::Wechat, ProviderCall::Query, "paid");
    m.certificate_refreshed(ChannelId::Wechat, RefreshResult::Ok);
    m.certificate_expiry
        .with_label_values(&["wechat", "1900000001", "SERIAL"])
        .set(1.0);
    m.bill_run(ChannelId::Wechat, "balanced");
    m.bill_item(ChannelId::Wechat, "MISSING_HERE");
    m.refund_started("wechat");
    m.refund_final("wechat", "SUCCESS");
    m.payment_recovered(ChannelId::Wechat);
    m.transfer_started(ChannelId::Wechat);
    m.transfer_final(ChannelId::Wechat, "success");
    m.transfer_anomaly(ChannelId::Wechat, AnomalyReason::UnknownTransfer);
    m.transfers_open_oldest(ChannelId::Wechat, TransferStatus::Processing, 0);
    m.expired(ExpiryResult::ClosedLocally);
    m.gate_result(GateResult::Hit);
    m.accounts
        .with_label_values(&["wechat", "direct", "api", "enabled"])
        .set(1);
    // A notify route's latency, as the providers meet it.
    let _ = app
        .client
        .post(app.url("/notify/wechat/pay"))
        .body("{}")
        .send()
        .await
        .expect("notify");
    let url = app.url("/metrics");
    let _ = app.client.get(&url).send().await.expect("scrape");
    let scrape = app
        .client
        .get(&url)
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    let exported = families(&scrape);

    let rules = std::fs::read_to_string(Path::new(RULES).join("alerts.yml")).expect("rules");
    let dashboard = std::fs::read_to_string(DASHBOARD).expect("dashboard");
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let panels = json["panels"].as_array().expect("panels");
    let mut exprs = String::new();
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}: no query", panel["title"]);
        for target in targets {
            exprs.push_str(target["expr"].as_str().expect("expr"));
            exprs.push('\n');
        }
    }
    for (what, text) in [("alerts.yml", rules.as_str()), ("paynotify.json", &exprs)] {
        let named = names_in(text);
        assert!(named.len() >= 8, "{what} names {named:?}");
        let missing: Vec<_> = named.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{what} names metrics /metrics does not export: {missing:?}"
        );
    }
    // The slow-notify alert reads the 5 s bucket by its label as the service writes it.
    assert!(
        scrape.lines().any(
            |l| l.starts_with("paynotify_http_request_duration_seconds_bucket{")
                && l.contains("route=\"/notify/wechat/pay\"")
                && l.contains("le=\"5\"")
        ),
        "no 5 s bucket of /notify/wechat/pay in the scrape"
    );
    // And names nothing made up: a name the service does not export is caught.
    assert!(!exported.contains("paynotify_notifications"));
    assert!(names_in("rate(paynotify_made_up_total[5m])").contains("paynotify_made_up_total"));
}

/// `promtool check rules` and `promtool test rules` (Debian's `prometheus` package; the test
/// command installs it when missing).
#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts_test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(RULES)
            .output()
            .expect("promtool runs (Debian: apt-get install prometheus; tests/run.sh installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
