//! What the tests stand on, not tests themselves: the service on a test database of its own
//! (`helpers`, its databases in `test_db`), the providers' stand-ins (`provider`, their bills in `wechat_bill` and
//! `alipay_bill`, their refund creates in `refunds`, their service-provider mode in
//! `partner`, the transfers in `wechat_transfer` and `alipay_transfer`, WeChat's combined
//! payments in `wechat_combine` and its combined notification in `combined`), a test channel
//! with its own signature (`test_channel`), throw-away keys (`keys`) and the agreement of
//! verify and explain (`agree`).

pub mod agree;
pub mod alipay_bill;
pub mod alipay_transfer;
pub mod browser;
pub mod combined;
pub mod helpers;
pub mod keys;
pub mod own_db;
pub mod partner;
pub mod provider;
pub mod refunds;
pub mod test_channel;
pub mod test_db;
pub mod wechat_bill;
pub mod wechat_combine;
pub mod wechat_transfer;
