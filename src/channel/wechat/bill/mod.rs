//! WeChat Pay's trade bill (交易账单, type `ALL`): applied for with a signed call, downloaded
//! with a signed request (the file itself is unsigned), checked against the signed answer's
//! SHA1 of the decompressed bytes, then read streaming, by header name.
//!
//! WeChat Pay v3: `GET /v3/bill/tradebill?bill_date=…&bill_type=ALL&tar_type=GZIP` answers
//! `{hash_type, hash_value, download_url}`; `hash_value` is the SHA1 of the **decompressed**
//! file (wechatpay-java's `DigestBillEntity` over a `GZIPInputStream`).
//!
//! The folder: `fetch.rs` applies for the bill and downloads it, `archive.rs` decompresses
//! the gzip within a limit, `read.rs` reads its rows by header name, and `checks.rs` checks
//! its summary row against them; here, the file on disk between the hash check and the read.

use std::fs::File;
use std::io::Seek;

use crate::channel::bill::{BillError, BillFile, BillLine, BillTotals, MAX_BILL_BYTES};

mod archive;
mod checks;
mod fetch;
mod read;

pub use read::{ALL_COLUMNS, SUMMARY_COLUMNS, read_tradebill};

/// A trade bill on disk whose decompressed bytes matched the signed `hash_value`.
struct TradeBill {
    file: File,
    mchid: String,
}

impl BillFile for TradeBill {
    fn read(
        self: Box<Self>,
        each: &mut dyn FnMut(BillLine) -> Result<(), BillError>,
    ) -> Result<BillTotals, BillError> {
        let mut file = self.file;
        file.rewind()
            .map_err(|e| BillError::Archive(format!("rewinding the bill: {e}")))?;
        read_tradebill(archive::decompress(file, MAX_BILL_BYTES), &self.mchid, each)
    }
}

/// Checks a downloaded gzip bill before any row is read: the SHA1 of its decompressed bytes
/// against `hash_value` (hex, any case), decompressing the whole file streaming. A truncated
/// or corrupt gzip is [`BillError::Archive`], another digest [`BillError::Hash`]. The bill
/// of merchant `mchid`, ready to be read (what `fetch` hands over; public for the benchmark).
pub fn verified_tradebill(
    file: File,
    hash_value: &str,
    mchid: &str,
) -> Result<Box<dyn BillFile>, BillError> {
    verified_within(file, hash_value, mchid, MAX_BILL_BYTES)
}

fn verified_within(
    mut file: File,
    hash_value: &str,
    mchid: &str,
    limit: u64,
) -> Result<Box<dyn BillFile>, BillError> {
    file.rewind()
        .map_err(|e| BillError::Archive(format!("rewinding the bill: {e}")))?;
    let digest = archive::sha1_hex(archive::decompress(&file, limit))?;
    if !digest.eq_ignore_ascii_case(hash_value.trim()) {
        return Err(BillError::Hash(format!(
            "the decompressed bill's SHA1 is {digest}, the signed answer says {hash_value}"
        )));
    }
    Ok(Box::new(TradeBill {
        file,
        mchid: mchid.to_owned(),
    }))
}

#[cfg(test)]
mod tests;
