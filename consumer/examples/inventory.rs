//! A stock keeper that consumes paynotify's events: one unit of `--sku` leaves stock once
//! per `ORDER_PAID` and comes back once per `ORDER_REFUNDED`, however often paynotify
//! delivers them. Every effect is applied through [`apply_once`] in one SQLite transaction
//! with its inbox row, and acknowledged only after that commit.
//!
//! ```text
//! cargo run -p paynotify-consumer --example inventory -- --sink redis
//! cargo run -p paynotify-consumer --example inventory -- --sink amqp --amqp-url amqp://guest:guest@127.0.0.1:5672/%2f
//! cargo run -p paynotify-consumer --example inventory -- --sink http --listen 127.0.0.1:9090 --secret S
//! ```
//!
//! The tables it keeps (`--database`, default `inventory.db`): `stock(sku, on_hand)`, and
//! `stock_move(message_id, sku, delta)`, one row per applied event (deliberately without a
//! unique key: a double application would show there).

use std::sync::Arc;

use clap::{Parser, ValueEnum};
use diesel::ConnectionError;
use diesel::sqlite::SqliteConnection;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use paynotify_consumer::{Event, Failure, Outcome, apply_once, inbox, topics};

type Sqlite = SyncConnectionWrapper<SqliteConnection>;

/// The inbox's consumer name: one per consuming service.
const CONSUMER: &str = "inventory";

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Sink {
    Redis,
    Amqp,
    Http,
}

#[derive(Parser, Debug)]
#[command(about = "Keeps stock from paynotify's ORDER_PAID / ORDER_REFUNDED events, once each")]
struct Args {
    /// The sink paynotify's relay writes to (its `relay.sink`).
    #[arg(long, value_enum)]
    sink: Sink,
    /// The SQLite file holding stock, stock moves and the inbox.
    #[arg(long, default_value = "inventory.db")]
    database: String,
    /// The SKU every order takes one unit of.
    #[arg(long, default_value = "SKU-1")]
    sku: String,
    /// Units of `--sku` when the database is new.
    #[arg(long, default_value_t = 100)]
    initial_stock: i64,
    /// `--sink redis`: the stream's Redis.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// `--sink redis`: paynotify's `relay.redis_stream`.
    #[arg(long, default_value = "paynotify:events")]
    stream: String,
    /// `--sink redis`: the consumer group.
    #[arg(long, default_value = "inventory")]
    group: String,
    /// `--sink redis`: this process's name in the group (default:
    /// inventory-{hostname}-{pid}, so two hosts never share one). A restarted process that
    /// keeps its name finishes the entries it held.
    #[arg(long)]
    name: Option<String>,
    /// `--sink redis`: entries another consumer left pending longer than this are taken
    /// over (`XAUTOCLAIM`).
    #[arg(long, default_value_t = 60_000)]
    claim_idle_ms: u64,
    /// `--sink redis`: entries per read.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// `--sink redis`: where the group starts when it does not exist yet: `$` (only
    /// events written from now on) or `0` (the stream's whole history).
    #[arg(long, default_value = "$")]
    start_id: String,
    /// Deliveries of an event that keeps failing before it is parked (`{stream}:parked`,
    /// `{queue}.parked`).
    #[arg(long, default_value_t = 5)]
    max_attempts: u32,
    /// `--sink amqp`: the broker (paynotify's `relay.amqp_url`).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// `--sink amqp`: paynotify's `relay.amqp_exchange`.
    #[arg(long, default_value = "paynotify.events")]
    exchange: String,
    /// `--sink amqp`: this consumer's queue.
    #[arg(long, default_value = "inventory")]
    queue: String,
    /// `--sink amqp`: a routing key the queue is bound with (repeatable; default `#`, all).
    #[arg(long = "binding")]
    bindings: Vec<String>,
    /// `--sink amqp`: unacknowledged messages in hand at once (`basic.qos`).
    #[arg(long, default_value_t = 32)]
    prefetch: u16,
    /// `--sink amqp`: where poison messages go (default `{queue}.parked`).
    #[arg(long)]
    parked_queue: Option<String>,
    /// `--sink http`: where paynotify's `relay.http_url` points.
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: String,
    /// `--sink http`: paynotify's `relay.http_secret`.
    #[arg(long, env = "PAYNOTIFY_HTTP_SECRET", default_value = "")]
    secret: String,
}

/// The stock keeper, on a pool of one SQLite connection (SQLite has one writer anyway). A
/// pool, not a shared connection: a connection a handler left inside its transaction (a
/// panic, a cancelled future) is discarded by the pool instead of serving the next event.
struct Inventory {
    db: Pool<Sqlite>,
    sku: String,
}

impl Inventory {
    async fn open(path: &str, sku: &str, initial: i64) -> anyhow::Result<Self> {
        let mut config = ManagerConfig::<Sqlite>::default();
        config.custom_setup = Box::new(|path| {
            Box::pin(async move {
                let mut conn = Sqlite::establish(path).await?;
                conn.batch_execute("PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL;")
                    .await
                    .map_err(ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        let manager = AsyncDieselConnectionManager::new_with_config(path, config);
        let pool = Pool::builder(manager).max_size(1).build()?;
        let mut db = pool.get().await?;
        db.batch_execute(
            "CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, on_hand INTEGER NOT NULL); \
             CREATE TABLE IF NOT EXISTS stock_move (message_id TEXT NOT NULL, sku TEXT NOT NULL, \
                 delta INTEGER NOT NULL);",
        )
        .await?;
        inbox::create_table(&mut *db).await?;
        diesel::sql_query("INSERT INTO stock (sku, on_hand) VALUES (?, ?) ON CONFLICT DO NOTHING")
            .bind::<diesel::sql_types::Text, _>(sku.to_owned())
            .bind::<diesel::sql_types::BigInt, _>(initial)
            .execute(&mut *db)
            .await?;
        drop(db);
        Ok(Self {
            db: pool,
            sku: sku.to_owned(),
        })
    }

    /// Applies one event once; `Ok` only after its transaction committed (or it was
    /// applied before).
    async fn handle(&self, event: Event) -> Result<(), Failure> {
        let delta: i64 = match event.topic.as_str() {
            topics::ORDER_PAID => -1,
            topics::ORDER_REFUNDED => 1,
            // Recorded as processed all the same: a redelivery is a duplicate.
            _ => 0,
        };
        let message_id = event.message_id();
        let sku = self.sku.clone();
        let mut db = self
            .db
            .get()
            .await
            .map_err(|e| Failure::Transient(format!("database: {e}")))?;
        let outcome = apply_once(&mut *db, CONSUMER, &message_id, async |tx| {
            if delta != 0 {
                diesel::sql_query("UPDATE stock SET on_hand = on_hand + ? WHERE sku = ?")
                    .bind::<diesel::sql_types::BigInt, _>(delta)
                    .bind::<diesel::sql_types::Text, _>(sku.clone())
                    .execute(tx)
                    .await?;
                diesel::sql_query(
                    "INSERT INTO stock_move (message_id, sku, delta) VALUES (?, ?, ?)",
                )
                .bind::<diesel::sql_types::Text, _>(message_id.clone())
                .bind::<diesel::sql_types::Text, _>(sku.clone())
                .bind::<diesel::sql_types::BigInt, _>(delta)
                .execute(tx)
                .await?;
            }
            Ok::<i64, diesel::result::Error>(delta)
        })
        .await?;
        match outcome {
            Outcome::Applied(delta) => println!("applied {message_id} delta={delta}"),
            Outcome::Duplicate(delta) => println!("duplicate {message_id} delta={delta}"),
        }
        Ok(())
    }
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let inventory = Arc::new(Inventory::open(&args.database, &args.sku, args.initial_stock).await?);
    let handler = move |event: Event| {
        let inventory = inventory.clone();
        async move { inventory.handle(event).await }
    };
    match args.sink {
        Sink::Redis => {
            use paynotify_consumer::redis_streams::{StreamConsumer, StreamSettings};
            let name = args.name.unwrap_or_else(|| {
                let host = whoami::hostname().unwrap_or_else(|_| "unknown-host".to_owned());
                format!("inventory-{host}-{}", std::process::id())
            });
            let mut settings = StreamSettings::new(&args.stream, &args.group, &name);
            settings.claim_idle = std::time::Duration::from_millis(args.claim_idle_ms);
            settings.claim_every = settings.claim_idle.min(settings.claim_every);
            settings.batch = args.batch;
            settings.start_id = args.start_id.clone();
            settings.max_attempts = args.max_attempts;
            println!(
                "reading {} as {name} in group {}",
                settings.stream, settings.group
            );
            StreamConsumer::new(&args.redis_url, settings)?
                .run(handler, shutdown())
                .await?;
        }
        Sink::Amqp => {
            use paynotify_consumer::amqp::{QueueConsumer, QueueSettings};
            let mut settings = QueueSettings::new(&args.queue);
            settings.exchange = args.exchange.clone();
            if !args.bindings.is_empty() {
                settings.bindings = args.bindings.clone();
            }
            settings.prefetch = args.prefetch;
            settings.max_attempts = args.max_attempts;
            if let Some(parked) = &args.parked_queue {
                settings.parked_queue = parked.clone();
            }
            QueueConsumer::new(&args.amqp_url, settings)?
                .run(handler, shutdown())
                .await?;
        }
        Sink::Http => {
            use paynotify_consumer::http::{Verifier, resource};
            anyhow::ensure!(
                !args.secret.is_empty(),
                "--sink http needs --secret (paynotify's relay.http_secret)"
            );
            let verifier = Verifier::new(args.secret.as_bytes());
            let handler = Arc::new(handler);
            let listen = args.listen.clone();
            println!("listening on http://{listen}/events");
            actix_web::HttpServer::new(move || {
                let handler = handler.clone();
                actix_web::App::new().service(resource(
                    "/events",
                    verifier.clone(),
                    move |e: Event| {
                        let handler = handler.clone();
                        async move { handler(e).await }
                    },
                ))
            })
            .workers(1)
            .bind(&listen)?
            .run()
            .await?;
        }
    }
    Ok(())
}
