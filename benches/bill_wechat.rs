//! A WeChat Pay trade bill (`ALL`) of 1,000,000 rows: the hash pass (gzip decompressed
//! streaming, SHA1 of the decompressed bytes) and the parse pass (decompressed again, read by
//! header name, the summary checked), through the same code `fetch` and `read` use. One long
//! measurement, so a plain `main`: the time of each pass and the process's peak RSS (VmHWM)
//! before and after.
//!
//! `cargo bench --bench bill_wechat`

use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::time::Instant;

use paynotify::channel::wechat::verified_tradebill;
use ring::digest::{Context, SHA1_FOR_LEGACY_USE_ONLY};

const ROWS: usize = 1_000_000;
const MCHID: &str = "1900000001";
/// One refund row in ten.
const REFUND_EVERY: usize = 10;

const HEADER: &str = "交易时间,公众账号ID,商户号,特约商户号,设备号,微信订单号,商户订单号,用户标识,交易类型,交易状态,付款银行,货币种类,应结订单金额,代金券金额,微信退款单号,商户退款单号,退款金额,充值券退款金额,退款类型,退款状态,商品名称,商户数据包,手续费,费率,订单金额,申请退款金额,费率备注";
const SUMMARY: &str =
    "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额";

fn yuan(fen: i64) -> String {
    format!("{}.{:02}", fen / 100, fen % 100)
}

fn fee(milli: i64) -> String {
    let sign = if milli < 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:05}",
        milli.abs() / 100_000,
        milli.abs() % 100_000
    )
}

/// Writes into `out` and hashes what it writes (the decompressed bytes).
struct Hashing<W> {
    out: W,
    sha1: Context,
    bytes: u64,
}

impl<W: Write> Hashing<W> {
    fn line(&mut self, text: &str) {
        self.sha1.update(text.as_bytes());
        self.sha1.update(b"\r\n");
        self.bytes += text.len() as u64 + 2;
        self.out.write_all(text.as_bytes()).expect("write");
        self.out.write_all(b"\r\n").expect("write");
    }
}

/// A gzip bill of [`ROWS`] rows in a temporary file, its SHA1 and decompressed size.
fn write_bill() -> (File, String, u64) {
    let file = tempfile::tempfile().expect("tempfile");
    let gzip = flate2::write::GzEncoder::new(BufWriter::new(file), flate2::Compression::fast());
    let mut w = Hashing {
        out: gzip,
        sha1: Context::new(&SHA1_FOR_LEGACY_USE_ONLY),
        bytes: 0,
    };
    w.line(HEADER);
    let (mut paid, mut refunded, mut fees) = (0i64, 0i64, 0i64);
    for n in 0..ROWS {
        let fen = 100 + (n as i64 % 50_000);
        let milli = fen * 6; // 0.60% in thousandths of a fen
        let (h, m, s) = (n / 3600 % 24, n / 60 % 60, n % 60);
        let at = format!("2026-11-30 {h:02}:{m:02}:{s:02}");
        let row = if n % REFUND_EVERY == 9 {
            refunded += fen;
            fees -= milli;
            format!(
                "`{at},`wx0000000000000001,`{MCHID},`0,`,`42000029{n:020},`T{n:012},`oUpF8uMuAJO_M2pxb1Q9zNjWeS6o,`JSAPI,`REFUND,`OTHERS,`CNY,`0.00,`0.00,`50300{n:024},`R{n:012},`{y},`0.00,`ORIGINAL,`SUCCESS,`测试商品,`,`{f},`0.60%,`0.00,`{y},`",
                y = yuan(fen),
                f = fee(-milli)
            )
        } else {
            paid += fen;
            fees += milli;
            format!(
                "`{at},`wx0000000000000001,`{MCHID},`0,`,`42000029{n:020},`T{n:012},`oUpF8uMuAJO_M2pxb1Q9zNjWeS6o,`JSAPI,`SUCCESS,`OTHERS,`CNY,`{y},`0.00,`0,`0,`0.00,`0.00,`,`,`测试商品,`,`{f},`0.60%,`{y},`0.00,`",
                y = yuan(fen),
                f = fee(milli)
            )
        };
        w.line(&row);
    }
    w.line(SUMMARY);
    w.line(&format!(
        "`{ROWS},`{p},`{r},`0.00,`{f},`{p},`{r}",
        p = yuan(paid),
        r = yuan(refunded),
        f = fee(fees)
    ));
    let Hashing { out, sha1, bytes } = w;
    let mut file = out.finish().expect("gzip").into_inner().expect("flush");
    file.rewind().expect("rewind");
    let hash = paynotify::text::hex(sha1.finish().as_ref());
    (file, hash, bytes)
}

/// The process's peak resident set (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    let started = Instant::now();
    let (file, hash, bytes) = write_bill();
    let gzip_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    println!(
        "bill_wechat: {ROWS} rows, {:.1} MiB decompressed, {:.1} MiB gzip, written in {:.2} s (not measured)",
        bytes as f64 / 1048576.0,
        gzip_bytes as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    let before = peak_rss_mib();

    let hashing = Instant::now();
    let bill = verified_tradebill(file, &hash, MCHID).expect("the hash matches");
    let hashed = hashing.elapsed();

    let parsing = Instant::now();
    let mut rows = 0u64;
    let totals = bill
        .read(&mut |line| {
            rows += 1;
            std::hint::black_box(line);
            Ok(())
        })
        .expect("the bill reads");
    let parsed = parsing.elapsed();
    let after = peak_rss_mib();

    assert_eq!(rows, ROWS as u64);
    println!(
        "bill_wechat: hash pass {:.2} s, parse pass {:.2} s, total {:.2} s ({:.0} rows/s)",
        hashed.as_secs_f64(),
        parsed.as_secs_f64(),
        (hashed + parsed).as_secs_f64(),
        ROWS as f64 / (hashed + parsed).as_secs_f64()
    );
    println!(
        "bill_wechat: peak RSS (VmHWM) {before:.1} MiB before, {after:.1} MiB after; totals {totals:?}"
    );
}
