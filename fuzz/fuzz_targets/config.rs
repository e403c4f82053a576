//! The config loader: a TOML file and `PAYNOTIFY__…` overrides through `Settings::load_from`,
//! and the URL parsers it relies on. Every outcome must be a settings value that validates
//! or a `ConfigError`; a key named in an error is never empty.
#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use paynotify::config::{
    ConfigError, DatabaseUrl, RedisNodes, Settings, check_amqp, env_var_key, unused_env_vars,
};

#[derive(Debug, Arbitrary)]
struct Input {
    toml: String,
    overrides: Vec<(String, String)>,
    /// Prefixes every override name with `PAYNOTIFY__`.
    prefixed: bool,
}

fn file() -> &'static std::path::Path {
    static FILE: OnceLock<std::path::PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        std::env::temp_dir().join(format!("paynotify-fuzz-config-{}.toml", std::process::id()))
    })
}

fuzz_target!(|input: Input| {
    for text in
        std::iter::once(input.toml.as_str()).chain(input.overrides.iter().map(|(_, v)| v.as_str()))
    {
        let _ = DatabaseUrl::parse(text).map(|u| u.backend());
        let _ = RedisNodes::parse(text);
        let _ = check_amqp(text, text);
        let _ = env_var_key(text);
    }
    let _ = unused_env_vars(input.overrides.iter().cloned());
    if std::fs::write(file(), input.toml.as_bytes()).is_err() {
        return;
    }
    let overrides: HashMap<String, String> = input
        .overrides
        .into_iter()
        .map(|(k, v)| {
            if input.prefixed {
                (format!("PAYNOTIFY__{k}"), v)
            } else {
                (k, v)
            }
        })
        .collect();
    match Settings::load_from(file(), overrides) {
        Ok(settings) => assert!(settings.validate().is_ok()),
        Err(ConfigError::Invalid { key, message }) => {
            assert!(!key.is_empty(), "an error that names no key: {message}");
        }
        Err(ConfigError::File { .. }) => {}
    }
});
