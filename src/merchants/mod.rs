//! Provider accounts as data: those added through `/admin/merchants`, stored with their keys
//! sealed, live in every channel without a restart.

pub mod live;
pub mod rotate;
pub mod seal;
pub mod settings;
pub mod store;
pub mod view;

pub use live::Merchants;
