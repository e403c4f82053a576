//! Provider accounts as data: those added through `/admin/merchants`, stored with their keys sealed.

pub mod seal;
pub mod settings;
