//! The three things every part of the configuration uses: the error that names its key, the
//! `Secret` that never prints, and a section's [`Validate`] checks. Kept apart from `Settings`
//! so the sections defined by the providers (`channel::*`) can use them without depending on
//! the whole configuration.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// A configuration section's own checks, those serde cannot express; every section has one
/// (`Settings::validate` runs them all), so a provider's section is checked like the others.
pub trait Validate {
    /// The first mistake, naming its key. By default none: serde checks all there is.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// A value that must never be printed: tokens, keys, passwords in URLs.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("Secret(<empty>)")
        } else {
            f.write_str("Secret(<redacted>)")
        }
    }
}
