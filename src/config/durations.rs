//! The durations of the configuration as `Duration`s: each key's unit is read in one place,
//! so a caller never multiplies or guesses it. Their ranges are checked at load
//! (`validate.rs`), so a mistake is still a start-up error naming the key.

use std::time::Duration;

use super::{ProviderApiSettings, RelaySettings, RetentionSettings, ServerSettings};

impl ServerSettings {
    /// `server.body_timeout_ms`: how long a request body may take to arrive.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }
}

impl RelaySettings {
    /// `relay.interval_ms`: how often the relay ticks.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }
}

impl RetentionSettings {
    /// `retention.every_secs`: how often the retention job runs.
    pub fn every(&self) -> Duration {
        Duration::from_secs(self.every_secs)
    }
}

impl ProviderApiSettings {
    /// `provider_api.timeout_ms`: how long one provider call may take, answer included.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// `provider_api.connect_timeout_ms`.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::load;
    use super::*;

    #[test]
    fn each_duration_is_read_in_the_unit_of_its_key() {
        let s = load(
            "[server]\nbody_timeout_ms = 900\n[relay]\ninterval_ms = 250\n[retention]\nevery_secs = 120\n[provider_api]\ntimeout_ms = 1500\nconnect_timeout_ms = 700\n",
            &[],
        )
        .expect("loads");
        assert_eq!(s.server.body_timeout(), Duration::from_millis(900));
        assert_eq!(s.relay.interval(), Duration::from_millis(250));
        assert_eq!(s.retention.every(), Duration::from_secs(120));
        assert_eq!(s.provider_api.timeout(), Duration::from_millis(1500));
        assert_eq!(s.provider_api.connect_timeout(), Duration::from_millis(700));
    }
}
