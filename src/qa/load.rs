//! `paynotify load`: an open-loop load generator for the benchmarks (`bench/openloop.sh`).
//!
//! It sends a file of raw HTTP requests (`paynotify forge`'s format: a line with the length
//! in bytes, then the request) at a fixed rate, whatever the answers do: request `i` is due
//! at `start + i / rate`, a pacer thread releases it at that moment, and the first of a fixed
//! pool of keep-alive connections to be free sends it. A slow answer delays no later request
//! (it only holds its own connection), and every latency counts from when its request was due,
//! not from when a connection was free to send it — so a stall shows in the figures as long as
//! it lasts (the correction wrk2 and `oha --latency-correction` make).
//!
//! Each request is sent once. An answer is counted by its status; a connection that fails or
//! an answer later than the timeout counts as an error, and the connection is made again.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, mpsc};

/// How many of the slowest answers the report keeps.
const SLOWEST: usize = 20;

/// What to send, where and how fast.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: std::net::SocketAddr,
    /// Requests per second.
    pub rate: f64,
    /// Keep-alive connections, each with at most one request in flight.
    pub connections: usize,
    /// An answer later than this is an error (and its connection is made again).
    pub timeout: Duration,
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Status(u16),
    /// No answer: the connection failed, or the answer was unreadable or too late.
    Failed,
}

/// The run's figures.
#[derive(Debug, Clone)]
pub struct Report {
    pub sent: usize,
    /// Answers by status.
    pub statuses: BTreeMap<u16, usize>,
    /// Requests without an answer.
    pub failed: usize,
    /// From the first request's due time to the last answer.
    pub duration: Duration,
    /// Latency of every answered request, from its due time, sorted.
    pub latencies_us: Vec<u64>,
    /// How late requests left after their due time (waiting for a free connection included),
    /// sorted: when its high end is near the latencies', the connections, not the service, were
    /// the limit.
    pub send_lag_us: Vec<u64>,
    /// The slowest answers, slowest first: `(due, latency)` in µs, `due` from the first
    /// request's due time (a stall shows as several close together in time).
    pub slowest: Vec<(u64, u64)>,
}

impl Report {
    /// Answers with a 2xx status.
    pub fn ok(&self) -> usize {
        self.statuses
            .iter()
            .filter(|(status, _)| (200..300).contains(*status))
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests answered with anything but 2xx, or not answered.
    pub fn errors(&self) -> usize {
        self.sent - self.ok()
    }

    /// Answers per second over the run.
    pub fn achieved_rate(&self) -> f64 {
        let secs = self.duration.as_secs_f64();
        if secs > 0.0 {
            (self.sent - self.failed) as f64 / secs
        } else {
            0.0
        }
    }

    /// The slowest answers as `due_ms:latency_ms`, slowest first.
    pub fn slowest_line(&self) -> String {
        let answers: Vec<String> = self
            .slowest
            .iter()
            .map(|(due, latency)| format!("{}:{:.1}", due / 1000, *latency as f64 / 1000.0))
            .collect();
        format!("SLOWEST {}", answers.join(" "))
    }

    /// One line for scripts: `RESULT key=value …`, latencies in µs.
    pub fn result_line(&self, plan: &Plan) -> String {
        let statuses = if self.statuses.keys().all(|s| (200..300).contains(s)) && self.failed == 0 {
            "-".to_owned()
        } else {
            let mut parts: Vec<String> = self
                .statuses
                .iter()
                .filter(|(status, _)| !(200..300).contains(*status))
                .map(|(status, n)| format!("{status}x{n}"))
                .collect();
            if self.failed > 0 {
                parts.push(format!("failedx{}", self.failed));
            }
            parts.join(",")
        };
        format!(
            "RESULT rate={:.0} achieved={:.0} sent={} ok={} errors={} statuses={statuses} duration_us={} \
             p50_us={} p99_us={} p999_us={} max_us={} lag_p99_us={}",
            plan.rate,
            self.achieved_rate(),
            self.sent,
            self.ok(),
            self.errors(),
            self.duration.as_micros(),
            percentile(&self.latencies_us, 50.0),
            percentile(&self.latencies_us, 99.0),
            percentile(&self.latencies_us, 99.9),
            self.latencies_us.last().copied().unwrap_or(0),
            percentile(&self.send_lag_us, 99.0),
        )
    }
}

/// The `q`-th percentile (0–100) of sorted values: the smallest value at least `q` % of them
/// are at or below; 0 for none.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    // Less a hair: 99.9 % of 1,000 is 999.000…1 in floating point, and rank 999.
    let rank = (q / 100.0 * sorted.len() as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The requests of a `paynotify forge` file, in order.
pub fn read_requests(path: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    use anyhow::Context;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let mut requests = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(requests);
        }
        let length: usize = line.trim_end().parse().with_context(|| {
            format!(
                "{}: request {} has no length line (found {:?})",
                path.display(),
                requests.len() + 1,
                line.trim_end()
            )
        })?;
        let mut request = vec![0; length];
        std::io::Read::read_exact(&mut reader, &mut request).with_context(|| {
            format!(
                "{}: request {} is shorter than its {length} bytes",
                path.display(),
                requests.len() + 1
            )
        })?;
        requests.push(request);
    }
}

/// Sends every request once, at `plan.rate`, and reports.
pub async fn run(plan: &Plan, requests: Vec<Vec<u8>>) -> anyhow::Result<Report> {
    anyhow::ensure!(
        plan.rate.is_finite() && plan.rate > 0.0,
        "the rate must be a positive number of requests per second"
    );
    anyhow::ensure!(plan.connections > 0, "at least one connection is needed");
    let sent = requests.len();
    let requests = Arc::new(requests);
    let interval = Duration::from_secs_f64(1.0 / plan.rate);
    // Every request is released by the pacer at its due time; a free connection takes it.
    let (due_tx, due_rx) = mpsc::unbounded_channel::<(usize, Instant)>();
    let due_rx = Arc::new(Mutex::new(due_rx));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(usize, Answer, u64, u64)>();
    let start = Instant::now() + Duration::from_millis(20);
    let pacer = std::thread::spawn(move || pace(start, interval, sent, &due_tx));
    let mut workers = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        let (requests, due_rx, done_tx, plan) = (
            requests.clone(),
            due_rx.clone(),
            done_tx.clone(),
            plan.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut connection: Option<TcpStream> = None;
            let mut buffer = Vec::with_capacity(4096);
            loop {
                let next = due_rx.lock().await.recv().await;
                let Some((i, due)) = next else { return };
                let lag = Instant::now().saturating_duration_since(due);
                let answer = send(&plan, &mut connection, &requests[i], &mut buffer).await;
                let latency = Instant::now().saturating_duration_since(due);
                let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                if done_tx
                    .send((i, answer, micros(latency), micros(lag)))
                    .is_err()
                {
                    return;
                }
            }
        }));
    }
    drop(done_tx);
    let mut report = Report {
        sent,
        statuses: BTreeMap::new(),
        failed: 0,
        duration: Duration::ZERO,
        latencies_us: Vec::with_capacity(sent),
        send_lag_us: Vec::with_capacity(sent),
        slowest: Vec::new(),
    };
    let mut timeline = Vec::with_capacity(sent);
    let interval_us = interval.as_secs_f64() * 1e6;
    while let Some((i, answer, latency, lag)) = done_rx.recv().await {
        match answer {
            Answer::Status(status) => {
                *report.statuses.entry(status).or_default() += 1;
                report.latencies_us.push(latency);
                timeline.push(((i as f64 * interval_us) as u64, latency));
            }
            Answer::Failed => report.failed += 1,
        }
        report.send_lag_us.push(lag);
    }
    report.duration = Instant::now().saturating_duration_since(start);
    for worker in workers {
        worker.await?;
    }
    if pacer.join().is_err() {
        anyhow::bail!("the pacer thread panicked");
    }
    report.latencies_us.sort_unstable();
    report.send_lag_us.sort_unstable();
    timeline.sort_unstable_by_key(|answer| std::cmp::Reverse(answer.1));
    timeline.truncate(SLOWEST);
    report.slowest = timeline;
    Ok(report)
}

/// Releases request `i` at `start + i × interval`, all that are due at each wake-up (an OS
/// thread: its sleeps are finer than the runtime's millisecond timer).
fn pace(
    start: Instant,
    interval: Duration,
    count: usize,
    due: &mpsc::UnboundedSender<(usize, Instant)>,
) {
    let at = |i: usize| start + interval.mul_f64(i as f64);
    let mut i = 0;
    while i < count {
        let now = Instant::now();
        while i < count && at(i) <= now {
            if due.send((i, at(i))).is_err() {
                return;
            }
            i += 1;
        }
        if i < count {
            std::thread::sleep(at(i).saturating_duration_since(Instant::now()));
        }
    }
}

/// One request on the connection (made first when there is none) and its answer's status.
async fn send(
    plan: &Plan,
    connection: &mut Option<TcpStream>,
    request: &[u8],
    buffer: &mut Vec<u8>,
) -> Answer {
    let exchange = async {
        if connection.is_none() {
            let stream = TcpStream::connect(plan.target).await?;
            stream.set_nodelay(true)?;
            *connection = Some(stream);
        }
        let Some(stream) = connection.as_mut() else {
            return Err(std::io::Error::other("no connection"));
        };
        stream.write_all(request).await?;
        read_answer(stream, buffer).await
    };
    match tokio::time::timeout(plan.timeout, exchange).await {
        Ok(Ok((status, keep))) => {
            if !keep {
                *connection = None;
            }
            Answer::Status(status)
        }
        Ok(Err(_)) | Err(_) => {
            *connection = None;
            Answer::Failed
        }
    }
}

/// Reads one HTTP/1.1 answer whole; its status, and whether the connection stays open.
async fn read_answer(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<(u16, bool)> {
    buffer.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        let head = match response.parse(buffer) {
            Ok(httparse::Status::Complete(head)) => head,
            Ok(httparse::Status::Partial) => continue,
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        };
        let status = response.code.unwrap_or(0);
        let header = |name: &str| {
            response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
        };
        if header("transfer-encoding").is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a chunked answer (the service sizes its answers)",
            ));
        }
        let length: usize = match header("content-length") {
            Some(value) => value
                .parse()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?,
            None => 0,
        };
        let keep = header("connection").as_deref() != Some("close");
        let whole = head + length;
        while buffer.len() < whole {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        return Ok((status, keep));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ranks_of_the_sorted_values() {
        let values: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&values, 50.0), 500);
        assert_eq!(percentile(&values, 99.0), 990);
        assert_eq!(percentile(&values, 99.9), 999);
        assert_eq!(percentile(&values, 100.0), 1000);
        assert_eq!(percentile(&[7], 99.9), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn the_pacer_releases_each_request_at_its_due_time_in_order() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let start = Instant::now();
        let interval = Duration::from_millis(2);
        pace(start, interval, 20, &tx);
        let mut seen = Vec::new();
        while let Ok((i, due)) = rx.try_recv() {
            assert_eq!(due, start + interval.mul_f64(i as f64));
            seen.push(i);
        }
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        // The last one was due 38 ms after the start: the pacer waited for it.
        assert!(start.elapsed() >= Duration::from_millis(38));
    }

    #[test]
    fn a_forge_file_is_read_request_by_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests");
        std::fs::write(&path, b"5\nhello3\nabc").unwrap();
        let requests = read_requests(&path).unwrap();
        assert_eq!(requests, vec![b"hello".to_vec(), b"abc".to_vec()]);
        std::fs::write(&path, b"9\nshort").unwrap();
        let error = read_requests(&path).unwrap_err().to_string();
        assert!(
            error.contains("request 1 is shorter than its 9 bytes"),
            "{error}"
        );
        std::fs::write(&path, b"x\n").unwrap();
        let error = read_requests(&path).unwrap_err().to_string();
        assert!(error.contains("request 1 has no length line"), "{error}");
    }

    /// A server that answers 204 after `delay` on one connection at a time per accept.
    async fn slow_server(delay: Duration) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        tokio::time::sleep(delay).await;
                        let answer = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n";
                        if stream.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn latency_counts_from_the_due_time_when_the_connections_are_busy() {
        // One connection, answers in 20 ms, requests due every 5 ms: a closed loop would see
        // 20 ms each; from the due time, the tenth waits for the nine before it.
        let target = slow_server(Duration::from_millis(20)).await;
        let plan = Plan {
            target,
            rate: 200.0,
            connections: 1,
            timeout: Duration::from_secs(5),
        };
        let request = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n".to_vec();
        let report = run(&plan, vec![request; 10]).await.unwrap();
        assert_eq!(report.ok(), 10);
        assert_eq!(report.errors(), 0);
        let max = *report.latencies_us.last().unwrap();
        // The last is due at 45 ms and answered at 10 × 20 = 200 ms at the earliest.
        assert!(max >= 150_000, "the queueing is counted: {max} µs");
        assert!(percentile(&report.send_lag_us, 100.0) >= 100_000);
        // The slowest is the last one due (45 ms after the first), waiting for all before it.
        assert_eq!(report.slowest.len(), 10);
        assert_eq!(report.slowest[0], (45_000, max));
        assert!(report.slowest_line().starts_with("SLOWEST 45:"));
    }

    #[tokio::test]
    async fn refused_connections_are_errors_not_answers() {
        // A port nobody listens on.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = listener.local_addr().unwrap();
        drop(listener);
        let plan = Plan {
            target,
            rate: 1000.0,
            connections: 2,
            timeout: Duration::from_secs(2),
        };
        let report = run(&plan, vec![b"GET / HTTP/1.1\r\n\r\n".to_vec(); 4])
            .await
            .unwrap();
        assert_eq!(report.failed, 4);
        assert_eq!(report.ok(), 0);
        assert_eq!(report.errors(), 4);
        assert!(report.latencies_us.is_empty());
        assert!(report.result_line(&plan).contains("statuses=failedx4"));
    }
}
