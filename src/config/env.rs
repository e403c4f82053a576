//! `PAYNOTIFY__SECTION__KEY` variables: the key each sets, the variable named in an error
//! about it, and warnings for variables that configure nothing.

use std::collections::HashMap;

use super::Settings;
use super::value::ConfigError;

/// Environment variables with this prefix (then `SECTION__KEY`) override the file.
pub const ENV_PREFIX: &str = "PAYNOTIFY";

/// The key a deserialisation error is about: serde's path (`wechat.merchants[0].mchid`),
/// without the empty last segment an empty field name leaves (`"" = 1`, a variable named
/// just `PAYNOTIFY__`): the field is reported at its parent, `.` for the top.
pub(super) fn error_key(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut segments: Vec<&Segment> = path.iter().collect();
    if matches!(segments.last(), Some(Segment::Map { key }) if key.is_empty()) {
        segments.pop();
    }
    if segments.is_empty() {
        return ".".to_owned();
    }
    let mut key = String::new();
    for (i, segment) in segments.into_iter().enumerate() {
        if i > 0 && !matches!(segment, Segment::Seq { .. }) {
            key.push('.');
        }
        key.push_str(&segment.to_string());
    }
    key
}

/// The configuration key an environment variable `PAYNOTIFY__SECTION__KEY` sets
/// (`section.key`), or `None` for any other name.
pub fn env_var_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix(ENV_PREFIX)?.strip_prefix("__")?;
    Some(rest.to_ascii_lowercase().replace("__", "."))
}

/// Adds "set by environment variable …" to an error about a key an override set: the
/// key itself (a bad value), or, for an unknown field, the variable that named it.
pub(super) fn name_env_source(
    error: ConfigError,
    overrides: &HashMap<String, String>,
) -> ConfigError {
    let ConfigError::Invalid { key, message } = error else {
        return error;
    };
    let mut names: Vec<&String> = overrides.keys().collect();
    names.sort();
    let source = names.into_iter().find(|name| {
        let Some(set) = env_var_key(name) else {
            return false;
        };
        if set == key {
            return true;
        }
        // An unknown field is reported at its parent (`database`) or at the top (`.`).
        let (parent, field) = set.rsplit_once('.').unwrap_or(("", set.as_str()));
        let parent_matches = parent == key || (key == "." && parent.is_empty());
        parent_matches && message.contains(&format!("`{field}`"))
    });
    match source {
        Some(name) => ConfigError::Invalid {
            key,
            message: format!("{message} (set by environment variable {name})"),
        },
        None => ConfigError::Invalid { key, message },
    }
}

/// Variables the tests and tools read themselves; never configuration keys.
const OTHER_PAYNOTIFY_VARS: [&str; 3] = [
    "PAYNOTIFY_CONFIG",
    "PAYNOTIFY_TEST_PG_URL",
    "PAYNOTIFY_WRITE_OPENAPI",
];

/// One warning per `PAYNOTIFY…` variable in `vars` that configures nothing: not
/// `PAYNOTIFY__SECTION__KEY` (one underscore, say, as in `PAYNOTIFY_SERVER_LISTEN`) and not
/// a variable paynotify reads otherwise. Unknown keys under the right spelling
/// (`PAYNOTIFY__SERVER__LISEN`) already stop start-up with the key named.
pub fn unused_env_vars(vars: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    let defaults = Settings::default();
    let sections = defaults.sections();
    let mut warnings: Vec<String> = vars
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with(ENV_PREFIX))
        .filter(|name| !OTHER_PAYNOTIFY_VARS.contains(&name.as_str()))
        .filter(|name| {
            // Well formed: PAYNOTIFY__SECTION__KEY with non-empty parts.
            env_var_key(name)
                .is_none_or(|key| key.split('.').count() < 2 || key.split('.').any(str::is_empty))
        })
        .map(|name| {
            let rest = name
                .trim_start_matches(ENV_PREFIX)
                .trim_start_matches('_')
                .to_ascii_lowercase();
            let hint = sections
                .iter()
                .find_map(|(section, _)| {
                    let key = rest
                        .strip_prefix(section)?
                        .strip_prefix('_')?
                        .trim_start_matches('_');
                    (!key.is_empty()).then(|| {
                        format!(
                            "; did you mean {ENV_PREFIX}__{}__{}?",
                            section.to_ascii_uppercase(),
                            key.to_ascii_uppercase()
                        )
                    })
                })
                .unwrap_or_default();
            format!(
                "environment variable {name} is ignored: configuration variables are written \
                 {ENV_PREFIX}__SECTION__KEY (two underscores each){hint}"
            )
        })
        .collect();
    warnings.sort();
    warnings
}
