//! The daily bills' parsers: WeChat's trade bill (the CSV inside the gzip) and Alipay's
//! details and summary CSVs (GBK), fed any bytes. Never a panic; and a bill that is read
//! totals exactly the rows it handed over, each of the account asked about's shape.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use paynotify::channel::alipay::bill::{read_details, read_summary};
use paynotify::channel::bill::{BillLine, BillTotals, LineKind};
use paynotify::channel::wechat::bill::read_tradebill;

#[derive(Debug, Arbitrary)]
enum Input {
    Wechat(Vec<u8>),
    AlipayDetails(Vec<u8>),
    AlipaySummary(Vec<u8>),
}

/// What the rows handed over add up to.
fn totals_of(lines: &[BillLine]) -> BillTotals {
    let mut totals = BillTotals::default();
    let mut fee = 0;
    for line in lines {
        totals.add(line, &mut fee);
    }
    totals
}

fn checked(lines: &[BillLine]) {
    for line in lines {
        assert!(line.amount_fen >= 0, "{line:?}");
        if line.kind == LineKind::Refund {
            assert!(line.out_refund_no.is_some(), "{line:?}");
        }
    }
}

fuzz_target!(|input: Input| {
    let mut lines = Vec::new();
    let mut each = |line: BillLine| {
        lines.push(line);
        Ok(())
    };
    match input {
        Input::Wechat(bytes) => {
            if let Ok(totals) = read_tradebill(bytes.as_slice(), "1900000001", &mut each) {
                checked(&lines);
                assert_eq!(totals, totals_of(&lines));
            }
        }
        Input::AlipayDetails(bytes) => {
            if let Ok(details) = read_details(bytes.as_slice(), "2088000000000001", &mut each) {
                checked(&lines);
                assert_eq!(details.totals, totals_of(&lines));
            }
        }
        Input::AlipaySummary(bytes) => {
            let _ = read_summary(bytes.as_slice(), "2088000000000001");
        }
    }
});
