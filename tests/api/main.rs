//! Integration tests: the real service, real PostgreSQL and SQLite, one binary.

mod alipay;
mod alipay_vectors;
mod amqp;
mod certificates;
mod cli;
mod commit;
mod container;
mod gate;
mod gate_cluster;
mod health;
mod imports;
mod ledger;
mod migrations;
mod notify;
mod openapi;
mod orders;
mod qa;
mod readme;
mod receipts;
mod reconcile;
mod relay;
mod service;
mod shutdown;
mod support;
mod wechat;
mod wechat_vectors;
