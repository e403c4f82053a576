//! The `paynotify` command: parses the command line and calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use paynotify::config::{Settings, SinkKind};
use paynotify::qa::replay::{Breakage, Kind, Plan};
use paynotify::startup::{Application, Options};
use paynotify::store::Store;

#[derive(Parser)]
#[command(
    name = "paynotify",
    version,
    about = "Payment notifications, applied exactly once"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service and its scheduled jobs.
    Serve {
        /// Configuration file (default: $PAYNOTIFY_CONFIG, else config/default.toml).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Apply pending database migrations and exit.
    Migrate {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// QA: forge provider-signed notifications with the sandbox keys and send them.
    Replay(ReplayArgs),
    /// Every check made of one notify request, in order, and the first that failed.
    Explain(ExplainArgs),
    /// The daily bill reconciliation (对账).
    #[command(subcommand)]
    Bills(BillsCommand),
    /// Orders past `retention.orders_keep_days`, in the archive the retention job writes.
    #[command(subcommand)]
    Archive(ArchiveCommand),
    /// The master key that seals stored provider keys (`secrets.master_key`).
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// QA: forge one signed notification per order into a file of raw HTTP requests, for a
    /// load generator to replay (`bench/run.sh`).
    Forge(ForgeArgs),
    /// QA: send a file of raw HTTP requests (`forge`'s) at a fixed rate, open loop, and
    /// print the latencies counted from each request's due time (`bench/openloop.sh`).
    Load(LoadArgs),
    /// Write a fresh sandbox key set and a matching paynotify.toml into DIR.
    SandboxKeys {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The `server.listen` written into DIR/paynotify.toml: another port than the
        /// default configuration's 127.0.0.1:8080, so both can run side by side.
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: std::net::SocketAddr,
    },
}

#[derive(Subcommand)]
enum BillsCommand {
    /// Fetch the providers' bills of a day and compare them with the ledger now; prints the
    /// reports. Exits 0 when all balanced, 1 when any is mismatched, 2 when any is
    /// unavailable (or the run could not be made).
    Reconcile {
        /// The bill date, a provider-local day (bills.timezone).
        #[arg(long, value_name = "YYYY-MM-DD")]
        date: chrono::NaiveDate,
        /// wechat or alipay; every channel with API credentials when absent.
        #[arg(long, value_parser = ["wechat", "alipay"])]
        channel: Option<String>,
        #[arg(long)]
        config: Option<PathBuf>,
        /// The reports as JSON (the admin API's shape).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ArchiveCommand {
    /// Print every archived record of an order (its row, accounts, callbacks, refund
    /// requests, anomalies), one JSON line each. Exits 0 when found, 1 when not, 2 when the
    /// archive could not be read.
    Show {
        order_no: String,
        /// Read only the files of the order's creation day (UTC); every file when absent.
        #[arg(long, value_name = "YYYY-MM-DD")]
        day: Option<chrono::NaiveDate>,
        /// The archive directory; default: `retention.archive_dir` of the configuration.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum SecretsCommand {
    /// Seal every stored account's keys again under a new master key, in one transaction.
    /// Then set `secrets.master_key` to the new key and restart every instance.
    Rotate {
        /// A file whose first line is the new key: base64 of 32 random bytes.
        #[arg(long, value_name = "FILE")]
        new_key_file: PathBuf,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("request").required(true).args(["receipt", "file"])))]
struct ExplainArgs {
    /// A stored receipt (`GET /admin/receipts`), read from the configured database.
    #[arg(long, value_name = "ID")]
    receipt: Option<i64>,
    /// A raw HTTP request (request line, headers, blank line, body byte for byte).
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// With --file: when the request arrived (RFC 3339), for the timestamp check; default now.
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
    /// The service's configuration: its keys, and its database for the order checks.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ForgeArgs {
    /// Which notification to forge.
    #[arg(value_enum)]
    kind: Kind,
    /// Order numbers are PREFIX followed by FROM, FROM+1, …
    #[arg(long)]
    prefix: String,
    #[arg(long, default_value_t = 1)]
    from: u64,
    #[arg(long)]
    count: u64,
    /// The orders' amount in fen.
    #[arg(long)]
    amount_fen: i64,
    /// Where the requests go (each after a line with its length in bytes).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct LoadArgs {
    /// The requests, each after a line with its length in bytes (`paynotify forge --out`).
    #[arg(long, value_name = "FILE")]
    requests: PathBuf,
    /// Where they go.
    #[arg(long, value_name = "HOST:PORT")]
    target: std::net::SocketAddr,
    /// Requests per second, whatever the answers do.
    #[arg(long)]
    rate: f64,
    /// Keep-alive connections, each with at most one request in flight.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// An answer later than this is an error.
    #[arg(long, default_value_t = 10)]
    timeout_secs: u64,
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// Which notification to forge.
    #[arg(value_enum)]
    kind: Kind,
    #[arg(long, required_unless_present = "combine_no")]
    order_no: Option<String>,
    /// The order amount in fen (WeChat `amount.total`, Alipay `total_amount`).
    #[arg(long, required_unless_present = "combine_no")]
    amount_fen: Option<i64>,
    /// wechat-combined: the combination's `combine_out_trade_no`.
    #[arg(long, conflicts_with_all = ["order_no", "amount_fen"], requires = "sub")]
    combine_no: Option<String>,
    /// wechat-combined: one sub-order, paid in full; repeat for each.
    #[arg(long, value_name = "ORDER_NO:AMOUNT_FEN", value_parser = parse_sub, requires = "combine_no")]
    sub: Vec<(String, i64)>,
    /// Refunds: the merchant's refund number (Alipay `out_biz_no`).
    #[arg(long)]
    out_refund_no: Option<String>,
    /// Refunds: WeChat `amount.refund`; for Alipay the `refund_fee` running total.
    #[arg(long)]
    refund_fen: Option<i64>,
    /// How many times to send the same notification.
    #[arg(long, default_value_t = 1)]
    times: usize,
    /// How many requests in flight at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Base URL of the service (default: http://{server.listen}).
    #[arg(long)]
    target: Option<String>,
    #[arg(long)]
    config: Option<PathBuf>,
    /// Create the order first through POST /orders.
    #[arg(long)]
    create_order: bool,
    /// Break the signature (expect 401).
    #[arg(long)]
    bad_signature: bool,
    /// Change the amount after signing (expect 401).
    #[arg(long)]
    tamper_amount: bool,
    /// WeChat: a timestamp ten minutes old (expect 401).
    #[arg(long)]
    stale: bool,
    /// WeChat: an unknown Wechatpay-Serial; Alipay: an unknown app_id (expect 401).
    #[arg(long)]
    unknown_serial: bool,
    /// WeChat: a WECHATPAY/SIGNTEST/ probe signature (expect 401).
    #[arg(long)]
    probe: bool,
    /// Wait up to SECS for the service's /readyz to answer 200 before sending (for a
    /// service started a moment ago).
    #[arg(long, value_name = "SECS")]
    wait: Option<u64>,
}

/// `ORDER_NO:AMOUNT_FEN`, as `--sub` takes a combined payment's sub-order.
fn parse_sub(s: &str) -> Result<(String, i64), String> {
    let (order_no, fen) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not ORDER_NO:AMOUNT_FEN"))?;
    let fen: i64 = fen
        .parse()
        .map_err(|_| format!("{fen:?} is not an amount in fen"))?;
    if order_no.is_empty() || fen <= 0 {
        return Err(format!(
            "{s:?}: an order number and a positive amount in fen"
        ));
    }
    Ok((order_no.to_owned(), fen))
}

/// How long the relay may finish its batch in flight after SIGTERM before it gives its
/// leases back.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    // reqwest is built without a TLS provider of its own: ring, before any client is built.
    paynotify::https::install_crypto();
    let result = match Cli::parse().command {
        Command::Bills(BillsCommand::Reconcile {
            date,
            channel,
            config,
            json,
        }) => {
            return exit_with(on_runtime(None, async move {
                reconcile_bills(date, channel.as_deref(), config, json).await
            }));
        }
        Command::Archive(ArchiveCommand::Show {
            order_no,
            day,
            dir,
            config,
        }) => {
            return exit_with(on_runtime(None, async move {
                show_archived(&order_no, day, dir, config)
            }));
        }
        // `serve` sizes its runtime from its configuration (`server.io_threads`).
        Command::Serve { config } => load_settings(config.as_deref()).and_then(|settings| {
            on_runtime(Some(settings.server.runtime_threads()), serve(settings))
        }),
        Command::Migrate { config } => on_runtime(None, migrate(config)),
        Command::Secrets(SecretsCommand::Rotate {
            new_key_file,
            config,
        }) => on_runtime(None, rotate_secrets(new_key_file, config)),
        Command::Replay(args) => on_runtime(None, replay(args)),
        Command::Explain(args) => on_runtime(None, explain(args)),
        Command::Forge(args) => on_runtime(None, async move { forge(args) }),
        Command::Load(args) => on_runtime(Some(1), load(args)),
        Command::SandboxKeys { out, listen } => {
            paynotify::telemetry::init();
            on_runtime(None, async move { sandbox_keys(&out, listen) })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paynotify: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `work` to its end on a multi-threaded runtime of `threads` workers (`None`: one per
/// core).
fn on_runtime<T>(
    threads: Option<usize>,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        runtime.worker_threads(threads);
    }
    runtime
        .enable_all()
        .build()
        .context("cannot start the runtime")?
        .block_on(work)
}

/// The exit code of a command that has codes of its own; 2 when it could not run.
fn exit_with(result: anyhow::Result<u8>) -> ExitCode {
    result
        .unwrap_or_else(|e| {
            eprintln!("paynotify: {e:#}");
            2
        })
        .into()
}

/// Loads the configuration, starts logging in its `log.format`, and warns about every
/// `PAYNOTIFY…` environment variable that configures nothing, every key read under its old
/// name, and a `bills.timezone` other than the providers' (Beijing).
fn load_settings(config: Option<&std::path::Path>) -> anyhow::Result<Settings> {
    let settings = Settings::load(config)?;
    paynotify::telemetry::init_with(settings.log.format);
    let vars = std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    });
    for warning in paynotify::config::unused_env_vars(vars) {
        tracing::warn!("{warning}");
    }
    for moved in settings.deprecations() {
        tracing::warn!(old = moved.old, new = moved.new, "{moved}");
    }
    if let Some(warning) = settings.bills.zone_warning() {
        tracing::warn!("{warning}");
    }
    Ok(settings)
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    let options = Options::default();
    let clock = Arc::clone(&options.clock);
    let app = Application::build(&settings, options).await?;
    let jobs = app.start_jobs(&settings, clock).await?;
    let listen = std::net::SocketAddr::new(settings.server.listen.ip(), app.port());
    let relay_sink = match settings.relay.sink {
        SinkKind::Log => "log",
        SinkKind::RedisStream => "redis-stream",
        SinkKind::Http => "http",
        SinkKind::Amqp => "amqp",
    };
    tracing::info!(
        backend = app.store().backend(),
        redis_gate = if settings.redis.is_set() { "on" } else { "off" },
        relay_sink,
        jobs = %paynotify::jobs::schedule(settings.relay.interval(), settings.retention.every()),
        %listen,
        workers = settings.server.http_workers(),
        io_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "paynotify serving on {listen}"
    );
    let handle = app.handle();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        handle.stop(true).await;
    });
    app.run_until_stopped().await.context("server")?;
    jobs.shutdown(SHUTDOWN_DRAIN).await;
    tracing::info!("stopped");
    Ok(())
}

async fn migrate(config: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = load_settings(config.as_deref())?;
    let store = Store::connect(&settings.database)?;
    store.check_server().await?;
    let applied = match store.migrate().await {
        Ok(applied) => applied,
        Err(e) => return Err(paynotify::startup::explain(&store, e).await.into()),
    };
    println!(
        "{} migration(s) applied on {}",
        applied.len(),
        store.backend()
    );
    Ok(())
}

/// `paynotify secrets rotate`: the accounts resealed under the key of `new_key_file`.
async fn rotate_secrets(new_key_file: PathBuf, config: Option<PathBuf>) -> anyhow::Result<()> {
    use paynotify::merchants::seal::MasterKey;
    let settings = load_settings(config.as_deref())?;
    let old = settings.secrets.master_key()?.context(
        "secrets.master_key is not set: the current key is needed to open the stored keys",
    )?;
    let new = MasterKey::from_file("--new-key-file", &new_key_file).map_err(|e| match e {
        paynotify::config::ConfigError::Invalid { message, .. } => {
            anyhow::anyhow!("--new-key-file {}: {message}", new_key_file.display())
        }
        other => other.into(),
    })?;
    let store = Store::connect(&settings.database)?;
    let resealed = match paynotify::merchants::rotate::rotate(&store, &old, &new).await {
        Ok(n) => n,
        Err(paynotify::merchants::rotate::RotateError::Reseal(
            paynotify::merchants::store::ResealError::Store(e),
        )) => return Err(paynotify::startup::explain(&store, e).await.into()),
        Err(e) => return Err(e.into()),
    };
    println!(
        "resealed {resealed} accounts under key id {}; set secrets.master_key to the new key and restart",
        new.id()
    );
    Ok(())
}

async fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    use paynotify::channel::{Provider, Verdict};
    use paynotify::receipts::explain::{self, ExplainError, Request};
    use paynotify::time::{Clock, SystemClock};

    let settings = load_settings(args.config.as_deref())?;
    let now = match &args.at {
        None => SystemClock.now(),
        Some(text) => chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| paynotify::time::Timestamp::new(t.with_timezone(&chrono::Utc)))
            .with_context(|| format!("--at {text:?} is not RFC 3339"))?,
    };
    let mut providers: Vec<Arc<dyn Provider>> = Vec::new();
    let mut key_sources = Vec::new();
    for mounted in paynotify::providers::mount_all(&settings, now)? {
        providers.push(mounted.provider);
        key_sources.extend(mounted.keys);
    }
    let store = Store::connect(&settings.database)?;
    // The certificates the service downloaded verify here too; without the database, only
    // the configured keys do.
    let stored = tokio::time::timeout(
        Duration::from_secs(3),
        paynotify::certificates::load_stored(&key_sources, &store, now),
    )
    .await;
    if !matches!(stored, Ok(Ok(_))) && !key_sources.is_empty() {
        eprintln!(
            "note: downloaded platform certificates not read (database.url not reachable): only the configured keys verify"
        );
    }
    let request = match (args.receipt, &args.file) {
        (Some(id), _) => {
            let receipt = match store.receipt(id).await {
                Ok(receipt) => receipt.ok_or(ExplainError::NoReceipt(id))?,
                Err(e) => return Err(paynotify::startup::explain(&store, e).await.into()),
            };
            Request::from_receipt(&receipt)?
        }
        (None, Some(path)) => {
            let raw =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            Request::from_http(&raw, &path.display().to_string(), now)?
        }
        (None, None) => anyhow::bail!("give --receipt ID or --file FILE"),
    };
    let mut report = explain::explain(&providers, request)?;
    if report.explanation.notice.is_some() {
        let reachable = tokio::time::timeout(Duration::from_secs(3), store.ping())
            .await
            .is_ok_and(|r| r.is_ok());
        let checked = if reachable {
            explain::check_order(&mut report, &store).await
        } else {
            Ok(())
        };
        if !reachable || checked.is_err() {
            report.explanation.push(
                "order",
                Verdict::Skipped,
                "the database is not reachable (database.url): amount and state not checked against the order",
            );
        }
    }
    print!("{report}");
    Ok(())
}

/// `paynotify bills reconcile`: the reports of one date, printed; the exit code they call for.
async fn reconcile_bills(
    date: chrono::NaiveDate,
    channel: Option<&str>,
    config: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<u8> {
    use paynotify::bills::report::exit_code;
    let settings = load_settings(config.as_deref())?;
    let channel = channel.and_then(paynotify::notice::ChannelId::parse);
    let clock: Arc<dyn paynotify::time::Clock> = Arc::new(paynotify::time::SystemClock);
    let bills = paynotify::app::App::build(&settings, clock).await?.bills;
    let reports = bills.reconcile(date, channel).await?;
    if reports.is_empty() {
        eprintln!("paynotify: no bill to compare: no merchant or app has API credentials");
        return Ok(2);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        for report in &reports {
            print!("{report}");
        }
    }
    Ok(exit_code(&reports))
}

async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let settings = load_settings(args.config.as_deref())?;
    let plan = Plan {
        kind: args.kind,
        order_no: args.combine_no.or(args.order_no).unwrap_or_default(),
        amount_fen: args
            .amount_fen
            .unwrap_or_else(|| args.sub.iter().map(|(_, fen)| fen).sum()),
        subs: args.sub,
        out_refund_no: args.out_refund_no,
        refund_fen: args.refund_fen,
        times: args.times,
        concurrency: args.concurrency,
        target: args.target,
        create_order: args.create_order,
        wait: args.wait.map(Duration::from_secs),
        breakage: Breakage {
            bad_signature: args.bad_signature,
            tamper_amount: args.tamper_amount,
            stale: args.stale,
            unknown_serial: args.unknown_serial,
            probe: args.probe,
        },
    };
    if paynotify::qa::replay::run(&settings, &plan).await? {
        Ok(())
    } else {
        anyhow::bail!("some responses were not what the contract says for this input")
    }
}

/// `paynotify archive show`: 0 when the order was found, 1 when not.
fn show_archived(
    order_no: &str,
    day: Option<chrono::NaiveDate>,
    dir: Option<PathBuf>,
    config: Option<PathBuf>,
) -> anyhow::Result<u8> {
    let dir = match dir {
        Some(dir) => dir,
        None => load_settings(config.as_deref())?.retention.archive_dir,
    };
    let found = paynotify::archive::find(&dir, order_no, day)
        .with_context(|| format!("cannot read the archive {}", dir.display()))?;
    for (file, reason) in &found.damaged {
        eprintln!(
            "warning: {} could not be read to the end: {reason}",
            file.display()
        );
    }
    for record in &found.records {
        println!("{record}");
    }
    if found.records.is_empty() {
        eprintln!(
            "{order_no}: not in the {} archive file(s) read under {}",
            found.files_read,
            dir.display()
        );
        return Ok(1);
    }
    Ok(0)
}

fn forge(args: ForgeArgs) -> anyhow::Result<()> {
    let settings = load_settings(args.config.as_deref())?;
    if args.count == 0 || args.amount_fen <= 0 {
        anyhow::bail!("--count and --amount-fen must be positive");
    }
    let last = args
        .from
        .checked_add(args.count - 1)
        .context("--from + --count is too large")?;
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let written = paynotify::qa::replay::forge_requests(
        &settings,
        args.kind,
        &args.prefix,
        args.from..=last,
        args.amount_fen,
        &mut out,
    )?;
    std::io::Write::flush(&mut out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!("{written} requests written to {}", args.out.display());
    Ok(())
}

async fn load(args: LoadArgs) -> anyhow::Result<()> {
    let requests = paynotify::qa::load::read_requests(&args.requests)?;
    let plan = paynotify::qa::load::Plan {
        target: args.target,
        rate: args.rate,
        connections: args.connections,
        timeout: Duration::from_secs(args.timeout_secs),
    };
    let report = paynotify::qa::load::run(&plan, requests).await?;
    println!("{}", report.result_line(&plan));
    println!("{}", report.slowest_line());
    Ok(())
}

fn sandbox_keys(out: &std::path::Path, listen: std::net::SocketAddr) -> anyhow::Result<()> {
    let config = paynotify::qa::sandbox::write(out, listen)?;
    println!(
        "sandbox keys and {} written (server.listen = {listen}); run from {}:",
        config.display(),
        out.display()
    );
    println!("  paynotify serve --config paynotify.toml");
    Ok(())
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
