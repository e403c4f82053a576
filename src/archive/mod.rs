//! Orders past their lifetime (`retention.orders_keep_days`, at least 366 days: a refund may
//! come up to a year after the payment): a final order (`PAID`, `REFUNDED`, `CLOSED`) with no
//! refund in flight, created before the window, is written with everything recorded of it to
//! the archive and then removed, its callback rows, accounts, refund requests and anomalies
//! with it. Inside the window nothing changes; a late repeat of an archived order's
//! notification is answered as any unknown order's (interface.md: 404, the provider retries).
//!
//! The archive is JSON lines, gzip, under `retention.archive_dir`: a file per UTC day of the
//! orders' creation and per run, `orders-YYYYMMDD-<run>.jsonl.gz`; each batch is one gzip
//! member appended to it and flushed to disk before the transaction that deletes its rows
//! commits (docs/operations.md, "The order archive"). Files, not a table: the point is to
//! take the rows out of the database, and a file per day is what an auditor asks for, moves
//! to cold storage, and reads with `zcat` and `jq`.

pub mod store;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::NaiveDate;
use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use crate::store::Store;
use crate::time::{Clock, Timestamp};
use store::{ArchivedOrder, BatchDone, BatchError};

/// Orders per transaction: their rows are locked while the batch's file is written.
pub const BATCH: i64 = 500;
/// The pause between batches, so the hot path never waits on the archive.
const PAUSE: Duration = Duration::from_millis(50);

/// The archive job's settings (`[retention]`).
#[derive(Debug, Clone)]
pub struct Archiver {
    pub dir: PathBuf,
    pub keep_days: u32,
    pub batch: i64,
    /// The daily bill runs' differences (`bill_item`) are kept this many days past their
    /// bill date (`retention.bill_items_keep_days`).
    pub bill_items_keep_days: u32,
    /// Bill rows a run left behind (`bill_line`: a run that died) are deleted this many days
    /// past their bill date (`retention.bill_lines_keep_days`), unless a run holds them.
    pub bill_lines_keep_days: u32,
}

/// `retention.bill_items_keep_days` by default (config/default.toml).
pub const BILL_ITEMS_KEEP_DAYS: u32 = 400;
/// `retention.bill_lines_keep_days` by default (config/default.toml).
pub const BILL_LINES_KEEP_DAYS: u32 = 31;

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Archived {
    pub orders: usize,
    /// Rows deleted, the orders' own included.
    pub rows: usize,
    /// Anomalies of orders not here, archived and removed.
    pub anomalies: usize,
    /// The files written to, in name order.
    pub files: Vec<PathBuf>,
    /// Bill differences (`bill_item`) and bill rows left behind (`bill_line`) deleted.
    pub bill_items: usize,
    pub bill_lines: usize,
}

impl Archiver {
    pub fn new(dir: impl Into<PathBuf>, keep_days: u32) -> Self {
        Self {
            dir: dir.into(),
            keep_days,
            batch: BATCH,
            bill_items_keep_days: BILL_ITEMS_KEEP_DAYS,
            bill_lines_keep_days: BILL_LINES_KEEP_DAYS,
        }
    }

    /// Archives every order past the window, a batch at a time, then the anomalies past it
    /// whose order is not here; then deletes the bill differences and the bill rows past
    /// theirs. A batch whose file could not be written deletes nothing and ends the run with
    /// its error; the next run writes it again (to a file of its own).
    pub async fn run(&self, store: &Store, clock: &dyn Clock) -> Result<Archived, BatchError> {
        let now = clock.now();
        let cutoff = now.plus_seconds(-i64::from(self.keep_days) * 86_400);
        let run = run_name(now);
        let mut done = Archived::default();
        loop {
            let dir = self.dir.clone();
            let run = run.clone();
            let BatchDone { orders, rows } = store
                .archive_batch(cutoff, self.batch, async move |archived| {
                    write_batch(&dir, &run, archived).await
                })
                .await?;
            done.orders += orders;
            done.rows += rows;
            if (orders as i64) < self.batch {
                break;
            }
            tokio::time::sleep(PAUSE).await;
        }
        loop {
            let dir = self.dir.clone();
            let run = run.clone();
            let (written, deleted) = store
                .archive_orphan_anomalies(cutoff, self.batch, async move |anomalies| {
                    let lines = anomalies
                        .into_iter()
                        .map(|a| (a.anomaly.created_at.as_datetime().date_naive(), a))
                        .collect();
                    write_lines(&dir, ANOMALIES, &run, lines).await
                })
                .await?;
            done.anomalies += deleted;
            done.rows += deleted;
            if (written as i64) < self.batch {
                break;
            }
            tokio::time::sleep(PAUSE).await;
        }
        if done.orders + done.anomalies > 0 {
            done.files = files_of_run(&self.dir, &run);
        }
        let items_before = bill_date_before(now, self.bill_items_keep_days);
        loop {
            let deleted = store.purge_bill_items_of_a_date(&items_before).await?;
            if deleted == 0 {
                break;
            }
            done.bill_items += deleted;
            tokio::time::sleep(PAUSE).await;
        }
        let lines_before = bill_date_before(now, self.bill_lines_keep_days);
        while let Some(deleted) = store.purge_bill_lines_of_a_date(&lines_before, now).await? {
            done.bill_lines += deleted;
            tokio::time::sleep(PAUSE).await;
        }
        Ok(done)
    }
}

/// A run's part of the file names: its start, and random letters so two instances starting
/// in the same second write files of their own.
fn run_name(now: Timestamp) -> String {
    let suffix = crate::random::token(b"abcdefghijklmnopqrstuvwxyz0123456789", 6)
        .unwrap_or_else(|_| std::process::id().to_string());
    format!("{}-{suffix}", now.as_datetime().format("%Y%m%dT%H%M%SZ"))
}

/// The first day of bill dates (`YYYY-MM-DD`) kept `keep_days` at `now`.
fn bill_date_before(now: Timestamp, keep_days: u32) -> String {
    now.plus_seconds(-i64::from(keep_days) * 86_400)
        .as_datetime()
        .format("%Y-%m-%d")
        .to_string()
}

/// The file names' first part: the orders' files, and the anomalies' of orders not here.
const ORDERS: &str = "orders";
pub const ANOMALIES: &str = "anomalies";

/// The file an order created on `day` goes to in run `run`.
pub fn file_name(day: NaiveDate, run: &str) -> String {
    file_name_of(ORDERS, day, run)
}

fn file_name_of(kind: &str, day: NaiveDate, run: &str) -> String {
    format!("{kind}-{}-{run}.jsonl.gz", day.format("%Y%m%d"))
}

fn files_of_run(dir: &Path, run: &str) -> Vec<PathBuf> {
    let suffix = format!("-{run}.jsonl.gz");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                [ORDERS, ANOMALIES]
                    .iter()
                    .any(|kind| n.starts_with(&format!("{kind}-")))
                    && n.ends_with(&suffix)
            })
        })
        .collect();
    files.sort();
    files
}

/// One batch of orders: a gzip member per creation day, each appended to its file and synced.
async fn write_batch(dir: &Path, run: &str, archived: Vec<ArchivedOrder>) -> std::io::Result<()> {
    let lines = archived
        .into_iter()
        .map(|order| (order.order.created_at.as_datetime().date_naive(), order))
        .collect();
    write_lines(dir, ORDERS, run, lines).await
}

/// `lines`, each of its day, as a gzip member per day appended to that day's file of `kind`
/// and synced.
async fn write_lines<T: serde::Serialize>(
    dir: &Path,
    kind: &str,
    run: &str,
    lines: Vec<(NaiveDate, T)>,
) -> std::io::Result<()> {
    let mut by_day: BTreeMap<NaiveDate, Vec<u8>> = BTreeMap::new();
    for (day, line) in &lines {
        let bytes = by_day.entry(*day).or_default();
        serde_json::to_writer(&mut *bytes, line)?;
        bytes.push(b'\n');
    }
    let members: Vec<(PathBuf, Vec<u8>)> = by_day
        .into_iter()
        .map(|(day, lines)| {
            let mut gz = GzEncoder::new(Vec::new(), Compression::default());
            gz.write_all(&lines)?;
            Ok((dir.join(file_name_of(kind, day, run)), gz.finish()?))
        })
        .collect::<std::io::Result<_>>()?;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        for (path, member) in &members {
            append(&dir, path, member)?;
        }
        Ok(())
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Appends `member` to `path` and syncs it (and the directory, for a new file). A failed
/// write is cut off again, so the file stays a sequence of whole gzip members.
fn append(dir: &Path, path: &Path, member: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let before = file.metadata()?.len();
    if let Err(e) = file.write_all(member).and_then(|()| file.sync_data()) {
        let _ = file.set_len(before);
        return Err(e);
    }
    if before == 0 {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// What [`find`] read.
#[derive(Debug, Default)]
pub struct Found {
    /// Each record of the order, as written (one per run that archived it: a run that
    /// stopped between writing and committing leaves a copy the next run writes again).
    pub records: Vec<serde_json::Value>,
    pub files_read: usize,
    /// Files that could not be read to the end (a damaged tail), with the reason.
    pub damaged: Vec<(PathBuf, String)>,
}

/// The longest line an archive file may have: a record is one order with its callbacks,
/// refunds and anomalies, a few KiB. A longer line is not a record, and reading that file
/// stops there instead of holding it in memory (a file without a line end would be held
/// whole).
pub const MAX_RECORD_BYTES: usize = 16 << 20;

/// The lines of an archive file, each at most [`MAX_RECORD_BYTES`], one at a time.
struct RecordLines<R> {
    input: BufReader<R>,
    buf: Vec<u8>,
    number: u64,
}

impl<R: std::io::Read> RecordLines<R> {
    fn new(input: R) -> Self {
        Self {
            input: BufReader::new(input),
            buf: Vec::new(),
            number: 0,
        }
    }

    /// The next line without its line end; an error for a line longer than
    /// [`MAX_RECORD_BYTES`] or one that is not UTF-8.
    fn next(&mut self) -> std::io::Result<Option<&str>> {
        use std::io::Read;
        self.buf.clear();
        let n = (&mut self.input)
            .take(MAX_RECORD_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)?;
        if n == 0 {
            return Ok(None);
        }
        self.number += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
        } else if n > MAX_RECORD_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "line {} is longer than {MAX_RECORD_BYTES} bytes: not an archive record",
                    self.number
                ),
            ));
        }
        std::str::from_utf8(&self.buf).map(Some).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {} is not UTF-8: {e}", self.number),
            )
        })
    }
}

/// The archived records of `order_no` in `dir`: in the files of its creation day when `day`
/// is given, else in every archive file.
pub fn find(dir: &Path, order_no: &str, day: Option<NaiveDate>) -> std::io::Result<Found> {
    let prefix = match day {
        Some(day) => format!("orders-{}-", day.format("%Y%m%d")),
        None => "orders-".to_owned(),
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".jsonl.gz"))
        })
        .collect();
    files.sort();
    let mut found = Found::default();
    // A line holds the number as it is unless JSON escapes it.
    let plain = !order_no.contains(['"', '\\']) && !order_no.contains(char::is_control);
    for path in files {
        found.files_read += 1;
        let mut lines = RecordLines::new(MultiGzDecoder::new(std::fs::File::open(&path)?));
        loop {
            let line = match lines.next() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) => {
                    found.damaged.push((path.clone(), e.to_string()));
                    break;
                }
            };
            // A cheap test first: most lines are other orders'.
            if plain && !line.contains(order_no) {
                continue;
            }
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(record) if record["order"]["order_no"] == order_no => found.records.push(record),
                Ok(_) => {}
                Err(e) => {
                    found
                        .damaged
                        .push((path.clone(), format!("a line is not JSON: {e}")));
                    break;
                }
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::orders::PayCallback;
    use chrono::TimeZone;
    use store::OrderRow;

    fn at(day: u32, hour: u32) -> Timestamp {
        Timestamp::new(
            chrono::Utc
                .with_ymd_and_hms(2025, 10, day, hour, 0, 0)
                .single()
                .expect("time"),
        )
    }

    fn archived(order_no: &str, created_at: Timestamp) -> ArchivedOrder {
        ArchivedOrder {
            format: store::FORMAT,
            order: OrderRow {
                order_no: order_no.to_owned(),
                status: "PAID".to_owned(),
                amount_fen: 100,
                refunded_fen: 0,
                currency: "CNY".to_owned(),
                subject: "a \"quoted\" subject".to_owned(),
                channel: Some("wechat".to_owned()),
                transaction_id: Some(format!("T-{order_no}")),
                created_at,
                paid_at: Some(created_at),
                closed_at: None,
                expire_at: created_at,
                next_query_at: None,
                close_attempts: 0,
            },
            accounts: Vec::new(),
            pay_callbacks: vec![PayCallback {
                out_trade_no: order_no.to_owned(),
                channel: "wechat".to_owned(),
                transaction_id: format!("T-{order_no}"),
                amount_fen: 100,
                digest: "d".to_owned(),
                created_at,
                occurred_at: Some(created_at),
            }],
            refund_callbacks: Vec::new(),
            status_callbacks: Vec::new(),
            refund_requests: Vec::new(),
            anomalies: Vec::new(),
        }
    }

    #[tokio::test]
    async fn batches_append_members_a_file_per_creation_day_and_are_found_again() {
        let dir = tempfile::tempdir().expect("dir");
        let run = "20261203T000000Z-abc";
        write_batch(
            dir.path(),
            run,
            vec![archived("A-1", at(1, 8)), archived("A-2", at(2, 8))],
        )
        .await
        .expect("first batch");
        write_batch(dir.path(), run, vec![archived("A-3", at(1, 9))])
            .await
            .expect("second batch");
        let files = files_of_run(dir.path(), run);
        let names: Vec<_> = files
            .iter()
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect();
        assert_eq!(
            names,
            [
                "orders-20251001-20261203T000000Z-abc.jsonl.gz",
                "orders-20251002-20261203T000000Z-abc.jsonl.gz"
            ]
        );
        // Two members in the first day's file, read as one stream.
        let found = find(dir.path(), "A-3", None).expect("read");
        assert_eq!(found.records.len(), 1);
        assert_eq!(found.records[0]["order"]["subject"], "a \"quoted\" subject");
        assert_eq!(
            found.records[0]["pay_callbacks"][0]["transaction_id"],
            "T-A-3"
        );
        assert_eq!(found.files_read, 2);
        // Only the day asked for is read.
        let on_day =
            find(dir.path(), "A-1", Some(at(1, 0).as_datetime().date_naive())).expect("read");
        assert_eq!((on_day.records.len(), on_day.files_read), (1, 1));
        assert!(
            find(dir.path(), "A-1", Some(at(2, 0).as_datetime().date_naive()))
                .expect("read")
                .records
                .is_empty()
        );
        // A number that only begins another's is not that order.
        assert!(
            find(dir.path(), "A-", None)
                .expect("read")
                .records
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_damaged_tail_is_reported_and_what_precedes_it_still_read() {
        let dir = tempfile::tempdir().expect("dir");
        let run = "r";
        write_batch(dir.path(), run, vec![archived("D-1", at(1, 8))])
            .await
            .expect("batch");
        let path = dir
            .path()
            .join(file_name(at(1, 8).as_datetime().date_naive(), run));
        // A member cut short, as a crash in the middle of a write leaves it.
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(b"{\"order\":{\"order_no\":\"D-2\"}}\n")
            .expect("gz");
        let member = gz.finish().expect("gz");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        file.write_all(&member[..member.len() / 2]).expect("write");
        drop(file);
        let found = find(dir.path(), "D-1", None).expect("read");
        assert_eq!(found.records.len(), 1, "the whole member before the cut");
        assert_eq!(found.damaged.len(), 1, "{:?}", found.damaged);
        assert_eq!(found.damaged[0].0, path);
    }
}
