//! The QA tools, kept apart from the production core: forging provider-signed notifications
//! (`forge`), sending them at a running service (`replay`; `load`, many at a fixed rate), and
//! making the sandbox key set they are signed with (`sandbox`). Nothing on the notify path
//! imports them.

pub mod forge;
pub mod load;
pub mod replay;
pub mod sandbox;
