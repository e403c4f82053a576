//! The `paynotify` command: parses the command line and calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use paynotify::config::Settings;
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
}

/// How long the relay may finish its batch in flight after SIGTERM before it gives its
/// leases back.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> ExitCode {
    paynotify::telemetry::init();
    let result = match Cli::parse().command {
        Command::Serve { config } => serve(config).await,
        Command::Migrate { config } => migrate(config).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("paynotify: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    let options = Options::default();
    let clock = Arc::clone(&options.clock);
    let app = Application::build(&settings, options).await?;
    let jobs = app.start_jobs(&settings, clock).await?;
    tracing::info!(
        listen = %settings.server.listen,
        port = app.port(),
        backend = app.store().backend(),
        "paynotify serving"
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
    let settings = Settings::load(config.as_deref())?;
    let store = Store::connect(&settings.database)?;
    let applied = store.migrate().await?;
    println!(
        "{} migration(s) applied on {}",
        applied.len(),
        store.backend()
    );
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
