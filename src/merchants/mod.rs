//! Provider accounts as data: those added through `/admin/merchants`, stored with their keys sealed.

pub mod rotate;
pub mod seal;
pub mod settings;
pub mod store;
