//! Refresh now: every downloading merchant's platform certificates fetched at once
//! (`POST /admin/certificates/refresh` and the console's button).

use std::sync::Arc;

use super::Certificates;

/// Some merchant's certificates could not be fetched, or their answer did not verify: each
/// of them, with why. The keys already known keep working.
#[derive(Debug, thiserror::Error)]
#[error("not refreshed: {}", .0.join("; "))]
pub struct NotRefreshed(pub Vec<String>);

impl Certificates {
    /// Downloads every downloading merchant's platform certificates now.
    pub async fn refresh_now(self: &Arc<Self>) -> Result<(), NotRefreshed> {
        let failed: Vec<String> = self
            .refresh_all()
            .await
            .iter()
            .filter_map(|(channel, account, result)| {
                result
                    .as_ref()
                    .err()
                    .map(|f| format!("{channel} {account}: {} ({})", f.label(), f.detail()))
            })
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(NotRefreshed(failed))
        }
    }
}
