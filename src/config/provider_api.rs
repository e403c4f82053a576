//! `[provider_api]`: how the HTTPS client that calls the providers' APIs connects — its
//! timeouts, its extra trusted CA certificates and its rate limit per provider.
//!
//! These keys were once part of `[reconcile]`; the old names (`reconcile.max_qps`,
//! `reconcile.connect_timeout_ms`, `reconcile.timeout_ms`, `reconcile.ca_file`) are still
//! read, and each one used is reported by [`Settings::deprecations`] for a warning at
//! start-up. A file (or environment) that sets both the old and the new name of a key is a
//! start-up error naming both: which one was meant cannot be guessed.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use super::value::{ConfigError, Validate, invalid};
use super::{ReconcileSettings, Settings};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderApiSettings {
    /// Requests per second to each provider, across all its merchants/apps.
    pub max_qps: u32,
    /// How long connecting may take.
    pub connect_timeout_ms: u64,
    /// The whole request, answer included.
    pub timeout_ms: u64,
    /// A PEM file of extra CA certificates trusted beside the system's roots (a TLS-inspecting
    /// proxy, a sandbox); used by the provider clients and the `http` relay sink.
    pub ca_file: Option<PathBuf>,
}

impl Default for ProviderApiSettings {
    fn default() -> Self {
        Self {
            max_qps: 10,
            connect_timeout_ms: 3000,
            timeout_ms: 10_000,
            ca_file: None,
        }
    }
}

impl Validate for ProviderApiSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("provider_api.connect_timeout_ms", self.connect_timeout_ms),
            ("provider_api.timeout_ms", self.timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be positive"));
            }
        }
        if !(1..=10_000).contains(&self.max_qps) {
            return Err(invalid(
                "provider_api.max_qps",
                "must be between 1 and 10000",
            ));
        }
        if let Some(path) = &self.ca_file
            && !path.is_file()
        {
            return Err(invalid(
                "provider_api.ca_file",
                format!("{} is not a readable file", path.display()),
            ));
        }
        Ok(())
    }
}

/// A configuration key read under its old name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deprecation {
    pub old: &'static str,
    pub new: &'static str,
}

impl fmt::Display for Deprecation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "config key `{}` is deprecated; use `{}` (same value, same meaning)",
            self.old, self.new
        )
    }
}

/// The keys that moved from `[reconcile]` to `[provider_api]`: old name, new name.
pub(super) const MOVED: [Deprecation; 4] = [
    Deprecation {
        old: "reconcile.max_qps",
        new: "provider_api.max_qps",
    },
    Deprecation {
        old: "reconcile.connect_timeout_ms",
        new: "provider_api.connect_timeout_ms",
    },
    Deprecation {
        old: "reconcile.timeout_ms",
        new: "provider_api.timeout_ms",
    },
    Deprecation {
        old: "reconcile.ca_file",
        new: "provider_api.ca_file",
    },
];

impl Settings {
    /// The old key names this configuration used, each still read as its new one: logged
    /// once at start-up.
    pub fn deprecations(&self) -> &[Deprecation] {
        &self.deprecations
    }

    /// Moves every value set under an old `[reconcile]` name into `[provider_api]`, noting
    /// it in [`Settings::deprecations`]. `is_set(new)` says whether the file or the
    /// environment set the new key too: then neither wins, and the error names both.
    pub(super) fn move_old_keys(
        &mut self,
        is_set: impl Fn(&str) -> bool,
    ) -> Result<(), ConfigError> {
        let ReconcileSettings {
            old_max_qps,
            old_connect_timeout_ms,
            old_timeout_ms,
            old_ca_file,
            ..
        } = &mut self.reconcile;
        let api = &mut self.provider_api;
        let [max_qps, connect_timeout_ms, timeout_ms, ca_file] = MOVED;
        let mut used = Vec::new();
        let mut take = |moved: Deprecation, present: bool| -> Result<bool, ConfigError> {
            if !present {
                return Ok(false);
            }
            if is_set(moved.new) {
                return Err(invalid(
                    moved.new,
                    format!(
                        "also set under its old name `{}`; keep only `{}`",
                        moved.old, moved.new
                    ),
                ));
            }
            used.push(moved);
            Ok(true)
        };
        if take(max_qps, old_max_qps.is_some())? {
            api.max_qps = old_max_qps.take().unwrap_or(api.max_qps);
        }
        if take(connect_timeout_ms, old_connect_timeout_ms.is_some())? {
            api.connect_timeout_ms = old_connect_timeout_ms
                .take()
                .unwrap_or(api.connect_timeout_ms);
        }
        if take(timeout_ms, old_timeout_ms.is_some())? {
            api.timeout_ms = old_timeout_ms.take().unwrap_or(api.timeout_ms);
        }
        if take(ca_file, old_ca_file.is_some())? {
            api.ca_file = old_ca_file.take();
        }
        self.deprecations = used;
        Ok(())
    }

    /// A check of a moved key that failed names the key as the configuration wrote it.
    pub(super) fn name_old_key(&self, error: ConfigError) -> ConfigError {
        let ConfigError::Invalid { key, message } = error else {
            return error;
        };
        match self.deprecations.iter().find(|d| d.new == key) {
            Some(d) => invalid(d.old, format!("{message} (`{}` is now `{}`)", d.old, d.new)),
            None => ConfigError::Invalid { key, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::load;
    use super::*;

    #[test]
    fn the_new_keys_configure_the_provider_client_without_a_warning() {
        let s = load(
            "[provider_api]\nmax_qps = 7\nconnect_timeout_ms = 1500\ntimeout_ms = 4000\n",
            &[],
        )
        .expect("loads");
        assert_eq!(
            (
                s.provider_api.max_qps,
                s.provider_api.connect_timeout(),
                s.provider_api.timeout()
            ),
            (7, Duration::from_millis(1500), Duration::from_secs(4))
        );
        assert!(s.deprecations().is_empty());
    }

    #[test]
    fn the_defaults_are_those_the_reconcile_section_had() {
        let s = load("", &[]).expect("defaults");
        assert_eq!(
            (
                s.provider_api.max_qps,
                s.provider_api.connect_timeout_ms,
                s.provider_api.timeout_ms,
                s.provider_api.ca_file.as_deref()
            ),
            (10, 3000, 10_000, None)
        );
        assert!(s.deprecations().is_empty());
    }

    #[test]
    fn the_old_reconcile_keys_still_work_and_each_is_reported_once() {
        let s = load(
            "[reconcile]\nmax_qps = 7\nconnect_timeout_ms = 1500\ntimeout_ms = 4000\nevery_secs = 60\n",
            &[],
        )
        .expect("loads");
        assert_eq!(
            (
                s.provider_api.max_qps,
                s.provider_api.connect_timeout_ms,
                s.provider_api.timeout_ms
            ),
            (7, 1500, 4000)
        );
        assert_eq!(s.reconcile.every_secs, 60);
        assert_eq!(s.deprecations(), &MOVED[..3]);
        let warning = s.deprecations()[2].to_string();
        assert!(
            warning.contains("`reconcile.timeout_ms`")
                && warning.contains("`provider_api.timeout_ms`"),
            "{warning}"
        );
    }

    #[test]
    fn an_old_key_from_the_environment_works_too() {
        let s = load("", &[("PAYNOTIFY__RECONCILE__TIMEOUT_MS", "2500")]).expect("loads");
        assert_eq!(s.provider_api.timeout_ms, 2500);
        assert_eq!(s.deprecations(), &[MOVED[2]]);
    }

    #[test]
    fn an_old_and_a_new_name_of_one_key_together_are_an_error_naming_both() {
        for (toml, env) in [
            (
                "[reconcile]\ntimeout_ms = 1\n[provider_api]\ntimeout_ms = 2\n",
                &[][..],
            ),
            (
                "[reconcile]\ntimeout_ms = 1\n",
                &[("PAYNOTIFY__PROVIDER_API__TIMEOUT_MS", "2")][..],
            ),
        ] {
            let err = load(toml, env).unwrap_err().to_string();
            assert!(
                err.contains("provider_api.timeout_ms") && err.contains("reconcile.timeout_ms"),
                "{err}"
            );
        }
        // Different keys of the two names are not a conflict.
        let s = load(
            "[reconcile]\nmax_qps = 5\n[provider_api]\ntimeout_ms = 2\n",
            &[],
        )
        .expect("loads");
        assert_eq!((s.provider_api.max_qps, s.provider_api.timeout_ms), (5, 2));
    }

    #[test]
    fn a_bad_value_names_the_key_as_written() {
        let err = load("[provider_api]\ntimeout_ms = 0\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`provider_api.timeout_ms`"), "{err}");
        let err = load("[reconcile]\ntimeout_ms = 0\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`reconcile.timeout_ms`"), "{err}");
        let err = load("[reconcile]\nmax_qps = 0\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`reconcile.max_qps`"), "{err}");
        let err = load("[reconcile]\ntimeout_ms = \"soon\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("reconcile.timeout_ms"), "{err}");
        let err = load("[provider_api]\nca_file = \"/nonexistent/ca.pem\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("provider_api.ca_file"), "{err}");
    }
}
