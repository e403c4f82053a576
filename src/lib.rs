//! paynotify: verifies payment notifications and turns each into exactly one order state
//! change plus one outbox message.

pub mod app;
pub mod archive;
pub(crate) mod batch;
pub mod bills;
pub mod body_deadline;
pub mod certificates;
pub mod channel;
pub mod config;
pub mod console;
pub mod gate;
pub mod https;
pub mod intake;
pub mod jobs;
pub mod metrics;
pub mod money;
pub mod notice;
pub mod order;
pub mod origin;
pub mod outbox;
pub mod providers;
pub mod qa;
pub mod random;
pub mod receipts;
pub mod reconcile;
pub(crate) mod redis_master;
pub mod refunds;
pub mod relay;
pub mod routes;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod time;
pub mod transfer;
