//! Reading a 1,000,000-row Alipay bill: the zip of GBK CSVs written to a temporary file first
//! (not measured), then read through `read_archive`, the code an Alipay `BillFile::read` runs,
//! every row handed to a callback. Prints the time and the peak RSS (VmHWM).
//!
//! `cargo bench --bench bill_alipay`

use std::io::{Seek, Write};
use std::time::Instant;

use encoding_rs::GBK;
use paynotify::channel::alipay::bill::read_archive;
use paynotify::channel::bill::BillError;

const ROWS: u64 = 1_000_000;
const SELLER: &str = "2088000000000001";

const HEADER: &str = "支付宝交易号,商户订单号,业务类型,商品名称,创建时间,完成时间,门店编号,门店名称,操作员,终端号,对方账户,订单金额（元）,商家实收（元）,支付宝红包（元）,集分宝（元）,支付宝优惠（元）,商家优惠（元）,券核销金额（元）,券名称,商家红包消费金额（元）,卡消费金额（元）,退款批次号/请求号,服务费（元）,分润（元）,备注";

fn yuan(fen: i64) -> String {
    let sign = if fen < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", fen.abs() / 100, fen.abs() % 100)
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Every tenth row a refund of the row before; amounts and fees vary.
fn write_bill(file: &mut std::fs::File) {
    let mut zip = zip::ZipWriter::new(&mut *file);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    zip.start_file(format!("{SELLER}0156_20261130_业务明细.csv"), options)
        .expect("entry");
    let head = format!(
        "#支付宝业务明细查询\n#账号：[{SELLER}0156]\n#起始日期：[2026年11月30日 00:00:00]   终止日期：[2026年12月01日 00:00:00]\n#-----------------------------------------业务明细列表----------------------------------------\n{HEADER}\n"
    );
    zip.write_all(&GBK.encode(&head).0).expect("write");
    let (mut payments, mut refunds) = ((0i64, 0i64), (0i64, 0i64));
    let (mut order, mut fee) = (0i64, 0i64);
    let mut text = String::with_capacity(1 << 20);
    for i in 0..ROWS {
        let refund = i % 10 == 9;
        let no = if refund { i - 1 } else { i };
        let fen = 100 + (no as i64 * 37) % 50_000;
        let (kind, stated, refund_no, row_fee) = if refund {
            ("退款", -fen, format!("R{no:012}"), -(fen * 6 / 1000))
        } else {
            ("交易", fen, String::new(), fen * 6 / 1000)
        };
        if refund {
            refunds = (refunds.0 + 1, refunds.1 + stated);
        } else {
            payments = (payments.0 + 1, payments.1 + stated);
        }
        order += stated;
        fee += row_fee;
        let secs = i % 86_400;
        let at = format!(
            "2026-11-30 {:02}:{:02}:{:02}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        text += &format!(
            "2026113022001400{no:012}\t,ORD{no:012}\t,{kind}\t,商品{no},{at},{at},\t,\t,\t,\t,*沙箱(159****3821)\t,{},{},0.00,0.00,0.00,0.00,0.00,,0.00\t,0.00,{refund_no}\t,{},0.00,\n",
            yuan(stated),
            yuan(stated),
            yuan(row_fee)
        );
        if text.len() > (1 << 20) - 512 {
            zip.write_all(&GBK.encode(&text).0).expect("write");
            text.clear();
        }
    }
    text += "#-----------------------------------------业务明细列表结束------------------------------------\n";
    text += &format!(
        "#交易合计：{}笔，商家实收共{}元，商家优惠共0.00元\n#退款合计：{}笔，商家实收退款共{}元，商家优惠退款共0.00元\n#导出时间：[2026年12月01日 06:27:10]\n",
        payments.0,
        yuan(payments.1),
        refunds.0,
        yuan(refunds.1)
    );
    zip.write_all(&GBK.encode(&text).0).expect("write");
    zip.start_file(format!("{SELLER}0156_20261130_业务明细(汇总).csv"), options)
        .expect("entry");
    let summary = format!(
        "#支付宝业务汇总查询\n#账号：[{SELLER}0156]\n#-----------------------------------------业务汇总列表----------------------------------------\n门店编号,门店名称,交易订单总笔数,退款订单总笔数,订单金额（元）,商家实收（元）,支付宝优惠（元）,商家优惠（元）,卡消费金额（元）,服务费（元）,分润（元）,实收净额（元）\n合计\t,\t,{},{},{},{},0.00,0.00,0.00,{},0.00,{}\n#----------------------------------------业务汇总列表结束-------------------------------------\n",
        payments.0,
        refunds.0,
        yuan(order),
        yuan(order),
        yuan(fee),
        yuan(order - fee)
    );
    zip.write_all(&GBK.encode(&summary).0).expect("write");
    zip.finish().expect("zip");
}

fn main() {
    let mut file = tempfile::tempfile().expect("temp file");
    let started = Instant::now();
    write_bill(&mut file);
    let size = file.stream_position().expect("size");
    file.rewind().expect("rewind");
    println!(
        "wrote {ROWS} rows: {:.1} MB zip in {:.1} s (not measured); VmHWM so far {} kB",
        size as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        peak_rss_kb()
    );

    let started = Instant::now();
    let mut rows = 0u64;
    let totals = read_archive(file, SELLER, &mut |line| {
        rows += 1;
        std::hint::black_box(line);
        Ok::<(), BillError>(())
    })
    .expect("the bill reads and balances");
    let elapsed = started.elapsed();
    println!(
        "read {rows} rows ({} payments, {} refunds) in {:.2} s; peak RSS (VmHWM) {:.1} MB",
        totals.count,
        totals.refund_count,
        elapsed.as_secs_f64(),
        peak_rss_kb() as f64 / 1024.0
    );
}
