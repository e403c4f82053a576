//! Integration tests: the real service, real PostgreSQL and SQLite, one binary.

mod alipay;
mod alipay_vectors;
mod amqp;
mod cli;
mod commit;
mod container;
mod gate;
mod gate_cluster;
mod health;
mod helpers;
mod keys;
mod ledger;
mod notify;
mod openapi;
mod orders;
mod provider;
mod qa;
mod readme;
mod receipts;
mod reconcile;
mod relay;
mod service;
mod shutdown;
mod test_channel;
mod wechat;
mod wechat_vectors;
