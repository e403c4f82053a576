//! Integration tests: the real service, real PostgreSQL and SQLite, one binary.

mod alipay;
mod alipay_vectors;
mod amqp;
mod gate;
mod gate_cluster;
mod health;
mod helpers;
mod keys;
mod ledger;
mod notify;
mod openapi;
mod orders;
mod qa;
mod relay;
mod service;
mod test_channel;
mod wechat;
mod wechat_vectors;
