//! The http adapter: `Verifier::verify` on its own, then a real actix server on a free
//! loopback port whose handler applies each event through `apply_once` (SQLite and
//! PostgreSQL), fed by paynotify's own `HttpSink` and by hand-made requests.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, ResponseError, web};
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use paynotify::relay::Sink;
use paynotify::relay::sink::SinkError;
use paynotify::relay::sinks::HttpSink;
use paynotify_consumer::http::{Refusal, SignedEvent, Verifier, resource};
use paynotify_consumer::inbox::{self, InboxError};
use paynotify_consumer::{Event, Failure, apply_once};
use ring::hmac;
use support::{PgDb, Sqlite, SqliteDb};
use tokio::sync::Mutex;

const SECRET: &str = "a-long-random-http-secret-for-tests";
const CONSUMER: &str = "http-test";

// ---------------------------------------------------------------------------------------
// Signing, independently of the crate under test.

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac(secret: &str, t: &str, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(body);
    hex(hmac::sign(&key, &message).as_ref())
}

fn signed(secret: &str, t: i64, body: &[u8]) -> String {
    format!("t={t},v1={}", mac(secret, &t.to_string(), body))
}

fn unix_now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs(),
    )
    .expect("fits")
}

/// A fixed "now" for the unit tests.
const NOW: i64 = 1_700_000_000;

fn at(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).expect("positive"))
}

fn event_json(id: i64, topic: &str, biz_key: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": id,
        "topic": topic,
        "biz_key": biz_key,
        "payload": {"order_no": biz_key, "amount": 1999},
        "created_at": "2026-01-02T03:04:05+00:00",
    }))
    .expect("json")
}

fn verifier() -> Verifier {
    Verifier::new(SECRET.as_bytes())
}

// ---------------------------------------------------------------------------------------
// verify

#[test]
fn a_valid_signature_yields_the_event() {
    let body = event_json(7, "ORDER_PAID", "O1");
    let event = verifier()
        .verify(Some(&signed(SECRET, NOW, &body)), &body, at(NOW))
        .expect("valid");
    assert_eq!(event.id, 7);
    assert_eq!(event.topic, "ORDER_PAID");
    assert_eq!(event.biz_key, "O1");
    assert_eq!(event.payload["amount"], 1999);
    assert_eq!(event.created_at, "2026-01-02T03:04:05+00:00");
    assert_eq!(event.message_id(), "ORDER_PAID:O1");
}

#[test]
fn a_tampered_body_is_refused() {
    let body = event_json(7, "ORDER_PAID", "O1");
    let header = signed(SECRET, NOW, &body);
    let tampered = event_json(7, "ORDER_PAID", "O2");
    assert_eq!(
        verifier().verify(Some(&header), &tampered, at(NOW)),
        Err(Refusal::BadSignature)
    );
    // One byte more (trailing whitespace a proxy might add) is a different body too.
    let mut longer = body.clone();
    longer.push(b' ');
    assert_eq!(
        verifier().verify(Some(&header), &longer, at(NOW)),
        Err(Refusal::BadSignature)
    );
}

#[test]
fn another_secret_is_refused() {
    let body = event_json(7, "ORDER_PAID", "O1");
    let header = signed("some-other-secret", NOW, &body);
    assert_eq!(
        verifier().verify(Some(&header), &body, at(NOW)),
        Err(Refusal::BadSignature)
    );
}

#[test]
fn during_a_rotation_a_delivery_signed_with_either_secret_verifies() {
    const NEXT: &str = "the-next-long-random-http-secret";
    let body = event_json(7, "ORDER_PAID", "O1");
    let rotating = Verifier::from_secrets([NEXT, SECRET]).expect("two secrets");
    assert_eq!(rotating.secrets(), 2);
    let built = verifier().also_accept(NEXT.as_bytes());
    for v in [&rotating, &built] {
        for secret in [SECRET, NEXT] {
            let event = v
                .verify(Some(&signed(secret, NOW, &body)), &body, at(NOW))
                .expect(secret);
            assert_eq!(event.message_id(), "ORDER_PAID:O1");
        }
        let other = signed("some-other-secret", NOW, &body);
        assert_eq!(
            v.verify(Some(&other), &body, at(NOW)),
            Err(Refusal::BadSignature)
        );
        let shown = format!("{v:?}");
        assert!(!shown.contains(SECRET) && !shown.contains(NEXT), "{shown}");
    }
    // Once paynotify signs with the next secret only, the old one is dropped.
    let after = Verifier::from_secrets([NEXT]).expect("one secret");
    assert_eq!(
        after.verify(Some(&signed(SECRET, NOW, &body)), &body, at(NOW)),
        Err(Refusal::BadSignature)
    );
    assert_eq!(
        Verifier::from_secrets(Vec::<&[u8]>::new()).map(|_| ()),
        Err(paynotify_consumer::http::NoSecret)
    );
}

#[test]
fn the_timestamp_is_signed_too() {
    // A replay with a fresh t= and the old v1= does not verify.
    let body = event_json(7, "ORDER_PAID", "O1");
    let old = mac(SECRET, &(NOW - 1000).to_string(), &body);
    let header = format!("t={NOW},v1={old}");
    assert_eq!(
        verifier().verify(Some(&header), &body, at(NOW)),
        Err(Refusal::BadSignature)
    );
}

#[test]
fn a_stale_timestamp_is_refused_and_the_bound_is_accepted() {
    let body = event_json(7, "ORDER_PAID", "O1");
    assert_eq!(
        verifier().verify(Some(&signed(SECRET, NOW - 301, &body)), &body, at(NOW)),
        Err(Refusal::Expired {
            age_secs: 301,
            tolerance_secs: 300
        })
    );
    assert!(
        verifier()
            .verify(Some(&signed(SECRET, NOW - 300, &body)), &body, at(NOW))
            .is_ok()
    );
    // A very old one (t=0) too, without overflow.
    assert!(matches!(
        verifier().verify(Some(&signed(SECRET, 0, &body)), &body, at(NOW)),
        Err(Refusal::Expired { age_secs, .. }) if age_secs == 1_700_000_000
    ));
}

#[test]
fn a_future_timestamp_is_refused_and_the_bound_is_accepted() {
    let body = event_json(7, "ORDER_PAID", "O1");
    assert_eq!(
        verifier().verify(Some(&signed(SECRET, NOW + 301, &body)), &body, at(NOW)),
        Err(Refusal::Future {
            ahead_secs: 301,
            tolerance_secs: 300
        })
    );
    assert!(
        verifier()
            .verify(Some(&signed(SECRET, NOW + 300, &body)), &body, at(NOW))
            .is_ok()
    );
    assert!(matches!(
        verifier().verify(Some(&signed(SECRET, i64::MAX, &body)), &body, at(NOW)),
        Err(Refusal::Future { .. })
    ));
}

#[test]
fn the_tolerance_can_be_set() {
    let body = event_json(7, "ORDER_PAID", "O1");
    let v = verifier().with_tolerance(Duration::from_secs(30));
    assert_eq!(v.tolerance(), Duration::from_secs(30));
    assert_eq!(
        v.verify(Some(&signed(SECRET, NOW - 31, &body)), &body, at(NOW)),
        Err(Refusal::Expired {
            age_secs: 31,
            tolerance_secs: 30
        })
    );
    assert_eq!(
        v.verify(Some(&signed(SECRET, NOW + 31, &body)), &body, at(NOW)),
        Err(Refusal::Future {
            ahead_secs: 31,
            tolerance_secs: 30
        })
    );
    assert!(
        v.verify(Some(&signed(SECRET, NOW - 30, &body)), &body, at(NOW))
            .is_ok()
    );
}

#[test]
fn a_missing_header_is_refused() {
    let body = event_json(7, "ORDER_PAID", "O1");
    assert_eq!(
        verifier().verify(None, &body, at(NOW)),
        Err(Refusal::Missing)
    );
}

#[test]
fn malformed_headers_are_refused() {
    let body = event_json(7, "ORDER_PAID", "O1");
    let good = mac(SECRET, &NOW.to_string(), &body);
    let cases = [
        String::new(),
        "garbage".to_owned(),
        format!("v1={good}"),
        format!("t={NOW}"),
        format!("t={NOW},"),
        format!(",t={NOW},v1={good}"),
        format!("t={NOW},,v1={good}"),
        format!("t={NOW}, v1={good}"),
        format!(" t={NOW},v1={good}"),
        format!("T={NOW},v1={good}"),
        format!("t={NOW},t={NOW},v1={good}"),
        format!("t=,v1={good}"),
        format!("t=abc,v1={good}"),
        format!("t=-{NOW},v1={good}"),
        format!("t=+{NOW},v1={good}"),
        format!("t={NOW}.5,v1={good}"),
        format!("t=99999999999999999999,v1={good}"),
        format!("t={NOW},v1="),
        format!("t={NOW},v1={}", &good[..63]),
        format!("t={NOW},v1={good}0"),
        format!("t={NOW},v1={}zz", &good[..62]),
        format!("t={NOW},v1={good},=x"),
        format!("t={NOW},v1={good},v2"),
    ];
    for header in &cases {
        let got = verifier().verify(Some(header), &body, at(NOW));
        assert!(
            matches!(got, Err(Refusal::Malformed(_))),
            "{header:?} gave {got:?}"
        );
        assert!(got.unwrap_err().is_unauthenticated());
    }
}

#[test]
fn any_of_several_v1_signatures_may_match() {
    let body = event_json(7, "ORDER_PAID", "O1");
    let right = mac(SECRET, &NOW.to_string(), &body);
    let wrong = mac("the-old-secret", &NOW.to_string(), &body);
    for header in [
        format!("t={NOW},v1={wrong},v1={right}"),
        format!("t={NOW},v1={right},v1={wrong}"),
        format!("v1={wrong},t={NOW},v1={right}"),
        // Unknown keys are ignored, whatever their value.
        format!("t={NOW},v0=not-hex-at-all,v1={right},v9={wrong}"),
        // Either case of hex.
        format!("t={NOW},v1={}", right.to_uppercase()),
    ] {
        assert!(
            verifier().verify(Some(&header), &body, at(NOW)).is_ok(),
            "{header}"
        );
    }
    assert_eq!(
        verifier().verify(
            Some(&format!("t={NOW},v1={wrong},v1={wrong}")),
            &body,
            at(NOW)
        ),
        Err(Refusal::BadSignature)
    );
    let many = std::iter::repeat_n(format!("v1={wrong}"), 9)
        .collect::<Vec<_>>()
        .join(",");
    assert!(matches!(
        verifier().verify(Some(&format!("t={NOW},{many},v1={right}")), &body, at(NOW)),
        Err(Refusal::Malformed(_))
    ));
}

#[test]
fn a_signed_body_that_is_not_an_event_is_its_own_refusal() {
    for body in [
        &b"not json"[..],
        br#"{"id": 1, "topic": "ORDER_PAID"}"#,
        br#"{"id": "1", "topic": "T", "biz_key": "K", "payload": null, "created_at": "x"}"#,
        b"",
    ] {
        let got = verifier().verify(Some(&signed(SECRET, NOW, body)), body, at(NOW));
        assert!(matches!(got, Err(Refusal::NotAnEvent(_))), "{got:?}");
        assert!(!got.unwrap_err().is_unauthenticated());
        // Unsigned, the same body is refused for its signature: it is never decoded.
        assert_eq!(
            verifier().verify(Some(&signed("wrong", NOW, body)), body, at(NOW)),
            Err(Refusal::BadSignature)
        );
    }
}

#[test]
fn refusals_map_to_statuses_and_never_show_the_secret() {
    use actix_web::http::StatusCode;
    let cases = [
        (Refusal::Missing, StatusCode::UNAUTHORIZED),
        (Refusal::Malformed("x"), StatusCode::UNAUTHORIZED),
        (
            Refusal::Expired {
                age_secs: 1,
                tolerance_secs: 0,
            },
            StatusCode::UNAUTHORIZED,
        ),
        (
            Refusal::Future {
                ahead_secs: 1,
                tolerance_secs: 0,
            },
            StatusCode::UNAUTHORIZED,
        ),
        (Refusal::BadSignature, StatusCode::UNAUTHORIZED),
        (Refusal::NotAnEvent("x".into()), StatusCode::BAD_REQUEST),
        (
            Refusal::TooLarge { limit: 1 },
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (Refusal::Unreadable("x".into()), StatusCode::BAD_REQUEST),
    ];
    for (refusal, status) in cases {
        assert_eq!(refusal.status_code(), status, "{refusal:?}");
        assert_eq!(refusal.error_response().status(), status);
    }
    let debug = format!("{:?}", verifier());
    assert!(!debug.contains(SECRET), "{debug}");
}

// ---------------------------------------------------------------------------------------
// A real server

/// The consumer's database: an effect table without a unique key, so a double
/// application shows as two rows of one message id.
#[derive(Clone)]
enum Db {
    /// One connection shared by the deliveries (like the example), and the file, which
    /// [`Db::state`] opens afresh so that it sees only what was committed.
    Sqlite(Arc<Mutex<Sqlite>>, String),
    /// A connection per delivery. The `audit` row references `parent` through a deferred
    /// foreign key: with `switch.fail` set, the violation surfaces only at COMMIT.
    Pg(String),
}

impl Db {
    async fn sqlite(file: &SqliteDb) -> Self {
        let mut conn = file.connect().await;
        conn.batch_execute(
            "CREATE TABLE effect (message_id TEXT NOT NULL, delta INTEGER NOT NULL);",
        )
        .await
        .expect("effect table");
        inbox::create_table(&mut conn).await.expect("inbox");
        Db::Sqlite(Arc::new(Mutex::new(conn)), file.path.clone())
    }

    async fn pg(db: &PgDb) -> Self {
        let mut conn = db.connect().await;
        conn.batch_execute(
            "CREATE TABLE effect (message_id TEXT NOT NULL, delta INTEGER NOT NULL); \
             CREATE TABLE parent (id INTEGER PRIMARY KEY); INSERT INTO parent VALUES (1); \
             CREATE TABLE audit (message_id TEXT NOT NULL, parent_id INTEGER NOT NULL \
                 REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED); \
             CREATE TABLE switch (fail BOOLEAN NOT NULL); INSERT INTO switch VALUES (false);",
        )
        .await
        .expect("tables");
        inbox::create_table(&mut conn).await.expect("inbox");
        Db::Pg(db.url.clone())
    }

    /// `(message_id, rows in effect)`, and the inbox's row count.
    async fn state(&self) -> (Vec<(String, i64)>, i64) {
        const EFFECTS: &str = "SELECT message_id, CAST(COUNT(*) AS BIGINT) AS n FROM effect \
                               GROUP BY message_id ORDER BY message_id";
        const INBOX: &str = "SELECT 'inbox' AS message_id, CAST(COUNT(*) AS BIGINT) AS n \
                             FROM processed_message";
        let (effects, inbox): (Vec<Count>, Vec<Count>) = match self {
            Db::Sqlite(_, path) => {
                let mut conn = Sqlite::establish(path).await.expect("open");
                (
                    diesel::sql_query(EFFECTS)
                        .load(&mut conn)
                        .await
                        .expect("effects"),
                    diesel::sql_query(INBOX)
                        .load(&mut conn)
                        .await
                        .expect("inbox"),
                )
            }
            Db::Pg(url) => {
                let mut conn = AsyncPgConnection::establish(url).await.expect("connect");
                (
                    diesel::sql_query(EFFECTS)
                        .load(&mut conn)
                        .await
                        .expect("effects"),
                    diesel::sql_query(INBOX)
                        .load(&mut conn)
                        .await
                        .expect("inbox"),
                )
            }
        };
        (
            effects.into_iter().map(|c| (c.message_id, c.n)).collect(),
            inbox[0].n,
        )
    }

    async fn set_fail(&self, fail: bool) {
        let Db::Pg(url) = self else {
            panic!("PostgreSQL only")
        };
        let mut conn = AsyncPgConnection::establish(url).await.expect("connect");
        diesel::sql_query("UPDATE switch SET fail = $1")
            .bind::<diesel::sql_types::Bool, _>(fail)
            .execute(&mut conn)
            .await
            .expect("switch");
    }
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// How often the handler ran.
fn runs(calls: &AtomicUsize) -> usize {
    AtomicUsize::load(calls, Ordering::SeqCst)
}

/// The topics that make the test handler fail, after writing its effect.
const TRANSIENT: &str = "TEST_TRANSIENT";
const PERMANENT: &str = "TEST_PERMANENT";
const PANIC: &str = "TEST_PANIC";

fn injected(topic: &str) -> Result<(), Failure> {
    match topic {
        TRANSIENT => Err(Failure::Transient("injected".into())),
        PERMANENT => Err(Failure::Permanent("injected".into())),
        PANIC => panic!("injected panic"),
        _ => Ok(()),
    }
}

/// The handler's own failure keeps its kind; the inbox's errors convert as usual.
fn failure(e: InboxError<Failure>) -> Failure {
    match e {
        InboxError::Handler(f) => f,
        other => other.into(),
    }
}

/// One unit leaves stock per event, through the inbox, in one transaction.
async fn apply(db: Db, event: Event) -> Result<(), Failure> {
    let message_id = event.message_id();
    let topic = event.topic.clone();
    match db {
        Db::Sqlite(conn, _) => {
            let mut conn = conn.lock().await;
            apply_once(&mut *conn, CONSUMER, &message_id, async |tx| {
                diesel::sql_query("INSERT INTO effect (message_id, delta) VALUES ($1, -1)")
                    .bind::<Text, _>(message_id.clone())
                    .execute(tx)
                    .await
                    .map_err(|e| Failure::Transient(e.to_string()))?;
                injected(&topic)
            })
            .await
            .map_err(failure)?;
        }
        Db::Pg(url) => {
            let mut conn = AsyncPgConnection::establish(&url)
                .await
                .map_err(|e| Failure::Transient(e.to_string()))?;
            apply_once(&mut conn, CONSUMER, &message_id, async |tx| {
                diesel::sql_query("INSERT INTO effect (message_id, delta) VALUES ($1, -1)")
                    .bind::<Text, _>(message_id.clone())
                    .execute(tx)
                    .await
                    .map_err(|e| Failure::Transient(e.to_string()))?;
                // Deferred: with `fail` set this succeeds now and the COMMIT fails.
                diesel::sql_query(
                    "INSERT INTO audit (message_id, parent_id) \
                     SELECT $1, CASE WHEN fail THEN -1 ELSE 1 END FROM switch",
                )
                .bind::<Text, _>(message_id.clone())
                .execute(tx)
                .await
                .map_err(|e| Failure::Transient(e.to_string()))?;
                injected(&topic)
            })
            .await
            .map_err(failure)?;
        }
    }
    Ok(())
}

/// An actix server on a free loopback port; stopped when dropped, passed or failed.
struct Server {
    addr: SocketAddr,
    handle: ServerHandle,
}

impl Server {
    fn start<F>(make: F) -> Self
    where
        F: Fn() -> actix_web::Resource + Send + Clone + 'static,
    {
        let server = HttpServer::new(move || App::new().service(make()))
            .workers(1)
            .disable_signals()
            .shutdown_timeout(5)
            .bind(("127.0.0.1", 0))
            .expect("bind a free port");
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Self { addr, handle }
    }

    /// The resource `/events` handing every verified event to `apply` on `db`, counting
    /// the handler's runs.
    fn events(db: Db, verifier: Verifier, calls: Arc<AtomicUsize>) -> Self {
        Self::start(move || {
            let (db, calls) = (db.clone(), calls.clone());
            resource("/events", verifier.clone(), move |event: Event| {
                calls.fetch_add(1, Ordering::SeqCst);
                apply(db.clone(), event)
            })
        })
    }

    fn url(&self) -> String {
        format!("http://{}/events", self.addr)
    }

    async fn stop(self) {
        self.handle.stop(true).await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The command is sent at once; nothing waits for it here.
        drop(self.handle.stop(false));
    }
}

fn sink(url: &str, secret: &str) -> HttpSink {
    HttpSink::new(
        url,
        &paynotify::config::Secret::new(secret),
        &paynotify::https::ClientSettings {
            connect_timeout_ms: 5_000,
            timeout_ms: 10_000,
            ca_file: None,
            max_qps: 100,
        },
    )
    .expect("sink")
}

fn outbox_event(id: i64, topic: &str, biz_key: &str) -> paynotify::relay::sink::Event {
    paynotify::relay::sink::Event {
        id,
        topic: topic.to_owned(),
        biz_key: biz_key.to_owned(),
        payload: serde_json::json!({"order_no": biz_key}),
        created_at: chrono::Utc::now().to_rfc3339(),
    }
}

/// One request by hand: `(status, JSON body or null)`.
async fn raw(
    addr: SocketAddr,
    method: &str,
    headers: Headers,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let method = method.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut request = format!(
            "{method} /events HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).expect("write");
        stream.write_all(&body).expect("write body");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).expect("read");
        let answer = String::from_utf8(answer).expect("utf-8");
        let status: u16 = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {answer:?}"));
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let json = if body.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{body:?}: {e}"))
        };
        (status, json)
    })
    .await
    .expect("request")
}

type Headers = Vec<(&'static str, String)>;

fn signature(value: String) -> Headers {
    vec![("Paynotify-Signature", value)]
}

async fn published_twice_applies_each_once(db: Db) {
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Server::events(db.clone(), verifier(), calls.clone());
    let sink = sink(&server.url(), SECRET);
    let events = [
        outbox_event(1, "ORDER_PAID", "O1"),
        outbox_event(2, "ORDER_PAID", "O2"),
        outbox_event(3, "ORDER_REFUNDED", "O1:R1"),
    ];
    for round in 0..2 {
        let results = sink.publish(&events).await;
        assert!(
            results.iter().all(Result::is_ok),
            "round {round}: {results:?}"
        );
    }
    // A redriven dead letter: a new outbox id, the same message.
    let redriven = [outbox_event(99, "ORDER_PAID", "O1")];
    let results = sink.publish(&redriven).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(runs(&calls), 7);
    let (effects, inbox) = db.state().await;
    assert_eq!(
        effects,
        vec![
            ("ORDER_PAID:O1".to_owned(), 1),
            ("ORDER_PAID:O2".to_owned(), 1),
            ("ORDER_REFUNDED:O1:R1".to_owned(), 1),
        ]
    );
    assert_eq!(inbox, 3);
    server.stop().await;
}

#[actix_web::test]
async fn sqlite_sink_deliveries_published_twice_are_applied_once() {
    let file = SqliteDb::create();
    published_twice_applies_each_once(Db::sqlite(&file).await).await;
}

#[actix_web::test]
async fn postgres_sink_deliveries_published_twice_are_applied_once() {
    let pg = PgDb::create();
    published_twice_applies_each_once(Db::pg(&pg).await).await;
}

#[actix_web::test]
async fn forged_stale_unsigned_and_tampered_deliveries_are_401_and_change_nothing() {
    let file = SqliteDb::create();
    let db = Db::sqlite(&file).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Server::events(db.clone(), verifier(), calls.clone());
    let body = event_json(5, "ORDER_PAID", "O5");
    let now = unix_now();
    let refused: Vec<(&str, Headers, Vec<u8>, &str)> = vec![
        (
            "forged",
            signature(format!("t={now},v1={}", "ab".repeat(32))),
            body.clone(),
            "signature_mismatch",
        ),
        (
            "another secret",
            signature(signed("not-the-secret", now, &body)),
            body.clone(),
            "signature_mismatch",
        ),
        (
            "stale",
            signature(signed(SECRET, now - 3600, &body)),
            body.clone(),
            "signature_expired",
        ),
        (
            "future",
            signature(signed(SECRET, now + 3600, &body)),
            body.clone(),
            "signature_in_future",
        ),
        ("missing", vec![], body.clone(), "signature_missing"),
        (
            "malformed",
            signature(format!("v1={}", mac(SECRET, &now.to_string(), &body))),
            body.clone(),
            "signature_malformed",
        ),
        (
            "tampered",
            signature(signed(SECRET, now, &body)),
            event_json(5, "ORDER_REFUNDED", "O5:R1"),
            "signature_mismatch",
        ),
    ];
    for (what, headers, body, code) in refused {
        let (status, json) = raw(server.addr, "POST", headers, body).await;
        assert_eq!(status, 401, "{what}: {json}");
        assert_eq!(json["error"], code, "{what}: {json}");
        let reason = json["reason"].as_str().expect("a reason");
        assert!(!reason.contains(SECRET), "{what}: {reason}");
    }
    assert_eq!(runs(&calls), 0);
    assert_eq!(db.state().await, (vec![], 0));

    // The same client with a right signature is accepted, and its replay is a duplicate.
    let good = signature(signed(SECRET, now, &body));
    for _ in 0..2 {
        let (status, json) = raw(server.addr, "POST", good.clone(), body.clone()).await;
        assert_eq!(status, 200, "{json}");
        assert_eq!(json["message_id"], "ORDER_PAID:O5");
    }
    assert_eq!(runs(&calls), 2);
    assert_eq!(db.state().await, (vec![("ORDER_PAID:O5".to_owned(), 1)], 1));
    server.stop().await;
}

#[actix_web::test]
async fn a_signed_non_event_is_400_an_oversized_body_413_and_other_methods_405() {
    let file = SqliteDb::create();
    let db = Db::sqlite(&file).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Server::events(db.clone(), verifier().with_body_limit(1024), calls.clone());
    let now = unix_now();
    let not_event = br#"{"hello": "world"}"#.to_vec();
    let (status, json) = raw(
        server.addr,
        "POST",
        signature(signed(SECRET, now, &not_event)),
        not_event,
    )
    .await;
    assert_eq!(
        (status, json["error"].as_str()),
        (400, Some("not_an_event"))
    );
    let big = vec![b' '; 2048];
    let (status, json) = raw(
        server.addr,
        "POST",
        signature(signed(SECRET, now, &big)),
        big,
    )
    .await;
    assert_eq!(
        (status, json["error"].as_str()),
        (413, Some("body_too_large"))
    );
    let body = event_json(6, "ORDER_PAID", "O6");
    for method in ["GET", "PUT"] {
        let (status, _) = raw(
            server.addr,
            method,
            signature(signed(SECRET, now, &body)),
            body.clone(),
        )
        .await;
        assert_eq!(status, 405, "{method}");
    }
    assert_eq!(runs(&calls), 0);
    assert_eq!(db.state().await, (vec![], 0));
    server.stop().await;
}

#[actix_web::test]
async fn transient_is_503_permanent_is_422_and_nothing_is_applied() {
    let file = SqliteDb::create();
    let db = Db::sqlite(&file).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Server::events(db.clone(), verifier(), calls.clone());
    let sink = sink(&server.url(), SECRET);
    let events = [
        outbox_event(1, TRANSIENT, "O1"),
        outbox_event(2, PERMANENT, "O2"),
        outbox_event(3, "ORDER_PAID", "O3"),
    ];
    let results = sink.publish(&events).await;
    assert!(
        matches!(results[0], Err(SinkError::HttpStatus(503))),
        "{results:?}"
    );
    assert!(
        matches!(results[1], Err(SinkError::HttpStatus(422))),
        "{results:?}"
    );
    assert!(results[2].is_ok(), "{results:?}");
    // The failures' effects rolled back with their inbox rows: only O3 applied.
    assert_eq!(runs(&calls), 3);
    assert_eq!(db.state().await, (vec![("ORDER_PAID:O3".to_owned(), 1)], 1));
    // Delivered again, they fail again (nothing was remembered) and still apply nothing.
    let results = sink.publish(&events[..2]).await;
    assert!(
        matches!(
            results[..],
            [
                Err(SinkError::HttpStatus(503)),
                Err(SinkError::HttpStatus(422))
            ]
        ),
        "{results:?}"
    );
    assert_eq!(runs(&calls), 5);
    assert_eq!(db.state().await, (vec![("ORDER_PAID:O3".to_owned(), 1)], 1));
    server.stop().await;
}

/// On PostgreSQL, where each delivery has a connection of its own: a panic mid-transaction
/// on a shared connection would leave that connection inside the transaction.
#[actix_web::test]
async fn postgres_a_panicking_handler_answers_500_and_the_server_goes_on() {
    let pg = PgDb::create();
    let db = Db::pg(&pg).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Server::events(db.clone(), verifier(), calls.clone());
    let sink = sink(&server.url(), SECRET);
    let results = sink.publish(&[outbox_event(1, PANIC, "O1")]).await;
    assert!(
        matches!(results[0], Err(SinkError::HttpStatus(500))),
        "{results:?}"
    );
    assert_eq!(db.state().await, (vec![], 0));
    let results = sink.publish(&[outbox_event(2, "ORDER_PAID", "O2")]).await;
    assert!(results[0].is_ok(), "{results:?}");
    assert_eq!(runs(&calls), 2);
    assert_eq!(db.state().await, (vec![("ORDER_PAID:O2".to_owned(), 1)], 1));
    server.stop().await;
}

/// On one shared SQLite connection, the hazard itself: the panic leaves the connection
/// inside its transaction. The next delivery on it must never be a 2xx (its "commit" would
/// only release a savepoint of the dead transaction): `apply_once` refuses the connection,
/// the answer is 503, and nothing is applied.
#[actix_web::test]
async fn sqlite_after_a_panic_on_a_shared_connection_nothing_uncommitted_is_acknowledged() {
    let file = SqliteDb::create();
    let db = Db::sqlite(&file).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Server::events(db.clone(), verifier(), calls.clone());
    let sink = sink(&server.url(), SECRET);
    let results = sink.publish(&[outbox_event(1, PANIC, "O1")]).await;
    assert!(
        matches!(results[0], Err(SinkError::HttpStatus(500))),
        "{results:?}"
    );
    for id in 2..4 {
        let results = sink.publish(&[outbox_event(id, "ORDER_PAID", "O2")]).await;
        assert!(
            matches!(results[0], Err(SinkError::HttpStatus(503))),
            "{results:?}"
        );
    }
    assert_eq!(db.state().await, (vec![], 0));
    server.stop().await;
}

#[actix_web::test]
async fn a_failed_commit_answers_503_applies_nothing_and_the_next_delivery_applies_it() {
    let pg = PgDb::create();
    let db = Db::pg(&pg).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Server::events(db.clone(), verifier(), calls.clone());
    let sink = sink(&server.url(), SECRET);
    let events = [outbox_event(1, "ORDER_PAID", "O1")];

    db.set_fail(true).await;
    let results = sink.publish(&events).await;
    assert!(
        matches!(results[0], Err(SinkError::HttpStatus(503))),
        "{results:?}"
    );
    assert_eq!(runs(&calls), 1);
    assert_eq!(db.state().await, (vec![], 0));

    db.set_fail(false).await;
    for _ in 0..2 {
        let results = sink.publish(&events).await;
        assert!(results[0].is_ok(), "{results:?}");
    }
    assert_eq!(runs(&calls), 3);
    assert_eq!(db.state().await, (vec![("ORDER_PAID:O1".to_owned(), 1)], 1));
    server.stop().await;
}

/// A handler of one's own with the extractor; the verifier as `web::Data`.
async fn own_handler(SignedEvent(event): SignedEvent) -> HttpResponse {
    HttpResponse::Accepted().body(event.message_id())
}

#[actix_web::test]
async fn the_extractor_verifies_for_a_handler_of_ones_own() {
    let data = web::Data::new(verifier());
    let server = Server::start(move || {
        web::resource("/events")
            .app_data(data.clone())
            .route(web::post().to(own_handler))
    });
    let results = sink(&server.url(), SECRET)
        .publish(&[outbox_event(1, "ORDER_PAID", "O1")])
        .await;
    assert!(results[0].is_ok(), "{results:?}");
    let results = sink(&server.url(), "not-the-secret")
        .publish(&[outbox_event(1, "ORDER_PAID", "O1")])
        .await;
    assert!(
        matches!(results[0], Err(SinkError::HttpStatus(401))),
        "{results:?}"
    );
    server.stop().await;

    // Without a verifier nothing is accepted, signed or not.
    let server = Server::start(|| web::resource("/events").route(web::post().to(own_handler)));
    let results = sink(&server.url(), SECRET)
        .publish(&[outbox_event(1, "ORDER_PAID", "O1")])
        .await;
    assert!(
        matches!(results[0], Err(SinkError::HttpStatus(500))),
        "{results:?}"
    );
    server.stop().await;
}
