//! The Alipay bill (账单): `alipay.data.dataservice.bill.downloadurl.query` for a day's
//! `trade` bill, the download of the zip it names, and the streaming read of its two GBK CSVs.
//!
//! Alipay: the zip holds `<pid>_<date>_业务明细.csv` (one row per payment or refund) and
//! `<pid>_<date>_业务明细(汇总).csv` (one row per store and a `合计` row), entry names in GBK
//! without the zip's UTF-8 flag. Both start with `#` comment lines (`#账号：[…]` names the
//! seller's account: its PID, followed by the account suffix `0156` in the files Alipay
//! hands out), then a header row; values may carry trailing tabs. No hash is given: the
//! file's own totals are what it is checked against.
//!
//! What is checked, and how (the wording as Alipay writes it, and as the projects that parse
//! these bills read it):
//! - 业务明细, after its rows: `#交易合计：N笔，商家实收共X元，商家优惠共Y元` — N the number of
//!   `交易` rows, X and Y the sums of their 商家实收（元） and 商家优惠（元）; and
//!   `#退款合计：N笔，商家实收退款共X元，商家优惠退款共Y元` — the same over the `退款` rows (whose
//!   amounts are negative, so X and Y are too). Both lines are required; a figure with any
//!   other label is a format this reader does not know.
//! - 业务明细(汇总), its `合计` row (门店编号 `合计`): 交易订单总笔数 = the `交易` rows,
//!   退款订单总笔数 = the `退款` rows, and 订单金额（元）, 商家实收（元）, 服务费（元）= the sums of
//!   those columns over every detail row as stated (refunds negative).
//!
//! A payment's fee is what Alipay keeps and a refund's is what it gives back, whichever sign
//! the file gives 服务费（元）: [`BillLine::fee_milli_fen`] is its size, positive on a
//! payment and negative on a refund.
//!
//! The folder: `fetch.rs` asks for the bill's URL and downloads it, `archive.rs` opens the
//! zip and finds its two entries, `read.rs` reads both by header name, and `checks.rs`
//! checks each entry's totals against the detail rows; here, the file between them.

use std::fs::File;

use crate::channel::bill::{BillError, BillFile, BillLine, BillTotals};

mod archive;
mod checks;
mod fetch;
mod read;

pub use archive::{MAX_ZIP_DIRECTORY_BYTES, MAX_ZIP_ENTRIES};
pub use checks::{Details, KindSums, Summary};
pub use fetch::{METHOD, download_url};
pub use read::{MAX_OTHER_LINES, read_archive, read_details, read_summary};

/// A downloaded bill whose zip opened with both entries in it.
struct AlipayBill {
    opened: archive::Opened<File>,
    seller_id: String,
}

impl BillFile for AlipayBill {
    fn read(
        self: Box<Self>,
        each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
    ) -> Result<BillTotals, BillError> {
        read::read_opened(self.opened, &self.seller_id, each)
    }
}

#[cfg(test)]
mod tests;
