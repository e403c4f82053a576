//! Integration tests: the real service, real PostgreSQL and SQLite, one binary.

mod health;
mod helpers;
mod ledger;
mod notify;
mod orders;
mod test_channel;
mod wechat;
mod wechat_vectors;
