//! Alipay's bill as it is downloaded: a zip of two entries, its directory checked before the
//! zip reader reads it, its entries found by name.

use std::borrow::Cow;
use std::io::{BufReader, Read, Seek, SeekFrom};

use encoding_rs::GBK;
use zip::ZipArchive;

use crate::channel::bill::BillError;

/// The details entry's name (业务明细), after `<pid>_<date>_`.
pub(super) const DETAILS: &str = "业务明细";
/// The summary entry's name (业务明细(汇总)).
pub(super) const SUMMARY: &str = "业务明细(汇总)";

/// The bill's zip, and where its two entries are.
pub(super) struct Opened<R> {
    pub(super) zip: ZipArchive<BufReader<R>>,
    pub(super) details: usize,
    pub(super) summary: usize,
}

pub(super) fn archive(e: impl std::fmt::Display) -> BillError {
    BillError::Archive(e.to_string())
}

/// The most entries a bill zip may have (Alipay's has two): the zip reader holds every
/// entry's name and metadata (about 200 bytes each), so a zip of empty entries would cost
/// memory by the hundred thousand.
pub const MAX_ZIP_ENTRIES: u16 = 16;

/// The largest central directory a bill zip may declare (Alipay's is a few hundred bytes).
pub const MAX_ZIP_DIRECTORY_BYTES: u32 = 64 * 1024;

/// Checks, before the zip reader reads it, the central directory every end record it could
/// take declares (a signature among the last 64 KiB + 26 bytes, whose comment fits): at
/// most [`MAX_ZIP_ENTRIES`] entries in at most [`MAX_ZIP_DIRECTORY_BYTES`], and no ZIP64
/// (over 65,535 entries or 4 GiB, never a bill).
fn check_directory<R: Read + Seek>(file: &mut R) -> Result<(), BillError> {
    const END: [u8; 4] = *b"PK\x05\x06";
    const END_BYTES: usize = 22;
    let len = file.seek(SeekFrom::End(0)).map_err(archive)?;
    let start = len.saturating_sub((END_BYTES + 4 + (1 << 16)) as u64);
    file.seek(SeekFrom::Start(start)).map_err(archive)?;
    let mut tail = Vec::new();
    file.by_ref()
        .take(len - start)
        .read_to_end(&mut tail)
        .map_err(archive)?;
    file.rewind().map_err(archive)?;
    for at in 0..tail.len().saturating_sub(END_BYTES - 1) {
        let record = &tail[at..];
        if record[..4] != END {
            continue;
        }
        let u16_at = |i: usize| u16::from_le_bytes([record[i], record[i + 1]]);
        let u32_at = |i: usize| u32::from(u16_at(i)) | (u32::from(u16_at(i + 2)) << 16);
        if usize::from(u16_at(20)) + END_BYTES > record.len() {
            // Its comment would run past the end: not an end record the reader takes.
            continue;
        }
        let entries = u16_at(8).max(u16_at(10));
        let size = u32_at(12);
        if entries == u16::MAX || size == u32::MAX || u32_at(16) == u32::MAX {
            return Err(BillError::Archive(
                "a ZIP64 directory (over 65,535 entries or 4 GiB): not an Alipay bill".into(),
            ));
        }
        if entries > MAX_ZIP_ENTRIES {
            return Err(BillError::Archive(format!(
                "{entries} entries: a bill zip has at most {MAX_ZIP_ENTRIES}"
            )));
        }
        if size > MAX_ZIP_DIRECTORY_BYTES {
            return Err(BillError::Archive(format!(
                "a central directory of {size} bytes: a bill zip's is at most {MAX_ZIP_DIRECTORY_BYTES}"
            )));
        }
    }
    Ok(())
}

/// Opens the zip and finds its details and summary entries by name (GBK, or UTF-8 when the
/// name is valid UTF-8). A truncated or corrupt zip, one with more entries or a larger
/// directory than a bill's, or one without both, is [`BillError::Archive`].
pub(super) fn open<R: Read + Seek>(mut file: R) -> Result<Opened<R>, BillError> {
    check_directory(&mut file)?;
    let zip = ZipArchive::new(BufReader::new(file)).map_err(archive)?;
    if zip.len() > usize::from(MAX_ZIP_ENTRIES) {
        return Err(BillError::Archive(format!(
            "{} entries: a bill zip has at most {MAX_ZIP_ENTRIES}",
            zip.len()
        )));
    }
    let (mut details, mut summary) = (None, None);
    for (i, raw) in zip.file_names_raw().enumerate() {
        let name = match std::str::from_utf8(raw) {
            Ok(name) => Cow::Borrowed(name),
            Err(_) => GBK.decode_without_bom_handling(raw).0,
        };
        let base = name.rsplit('/').next().unwrap_or(&name);
        let slot = if base.ends_with(&format!("_{DETAILS}.csv")) {
            &mut details
        } else if base.ends_with(&format!("_{SUMMARY}.csv"))
            || base.ends_with(&format!("_{DETAILS}（汇总）.csv"))
        {
            &mut summary
        } else {
            continue;
        };
        if slot.replace(i).is_some() {
            return Err(BillError::Archive(format!("two entries like {name}")));
        }
    }
    match (details, summary) {
        (Some(details), Some(summary)) => Ok(Opened {
            zip,
            details,
            summary,
        }),
        (None, _) => Err(BillError::Archive(format!("no …_{DETAILS}.csv entry"))),
        (_, None) => Err(BillError::Archive(format!("no …_{SUMMARY}.csv entry"))),
    }
}
