//! `[merchants]` and `[secrets]`: how often each instance reads the accounts changed through
//! `/admin/merchants`, and the master key their stored keys are sealed under.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

use crate::config::value::{ConfigError, Secret, Validate, invalid};
use crate::merchants::seal::MasterKey;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MerchantSettings {
    /// Each instance reads the accounts changed since its last read this often.
    pub reload_secs: u64,
}

impl Default for MerchantSettings {
    fn default() -> Self {
        Self { reload_secs: 5 }
    }
}

impl Validate for MerchantSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=300).contains(&self.reload_secs) {
            return Err(invalid(
                "merchants.reload_secs",
                "must be between 1 and 300",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsSettings {
    /// Base64 of exactly 32 random bytes: the AES-256-GCM key that seals stored keys. Given
    /// as `PAYNOTIFY__SECRETS__MASTER_KEY`, not in the file.
    pub master_key: Secret,
    /// Or a file whose first line is that base64 (mode 0600); `""` in the file: none.
    #[serde(deserialize_with = "empty_is_none")]
    pub master_key_file: Option<PathBuf>,
}

impl SecretsSettings {
    /// The key `[secrets]` gives: `master_key`, or the first line of `master_key_file`;
    /// `None` when neither is set.
    pub fn master_key(&self) -> Result<Option<MasterKey>, ConfigError> {
        let s = self;
        match (s.master_key.is_empty(), &s.master_key_file) {
            (false, Some(_)) => Err(invalid(
                "secrets.master_key_file",
                "set either secrets.master_key or secrets.master_key_file, not both",
            )),
            (false, None) => {
                MasterKey::from_base64("secrets.master_key", s.master_key.expose()).map(Some)
            }
            (true, Some(path)) => MasterKey::from_file("secrets.master_key_file", path).map(Some),
            (true, None) => Ok(None),
        }
    }
}

impl Validate for SecretsSettings {
    /// Everything a start-up with this key would find: both set, a value that is not a key,
    /// a file that cannot be read.
    fn validate(&self) -> Result<(), ConfigError> {
        self.master_key().map(|_| ())
    }
}

/// A path where `""` means none, as the shipped file writes an unset one.
fn empty_is_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let path = Option::<PathBuf>::deserialize(d)?;
    Ok(path.filter(|p| !p.as_os_str().is_empty()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;

    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

    use super::*;
    use crate::config::Settings;

    fn load(contents: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(contents.as_bytes()).expect("write temp file");
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::load_from(f.path(), env)
    }

    #[test]
    fn the_defaults_reload_every_five_seconds_without_a_key() {
        let s = load("", &[]).expect("defaults");
        assert_eq!(s.merchants.reload_secs, 5);
        assert!(s.secrets.master_key.is_empty());
        assert!(s.secrets.master_key_file.is_none());
        let s = load(
            "[secrets]\nmaster_key = \"\"\nmaster_key_file = \"\"\n",
            &[],
        )
        .expect("empty strings are unset");
        assert!(s.secrets.master_key_file.is_none());
    }

    #[test]
    fn reload_secs_outside_1_to_300_names_its_key() {
        for bad in ["0", "301"] {
            let err = load(&format!("[merchants]\nreload_secs = {bad}\n"), &[])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("merchants.reload_secs"), "{err}");
        }
        let s = load("[merchants]\nreload_secs = 300\n", &[]).expect("300");
        assert_eq!(s.merchants.reload_secs, 300);
    }

    #[test]
    fn the_master_key_comes_from_the_environment() {
        let key = STANDARD.encode([5u8; 32]);
        let s = load("", &[("PAYNOTIFY__SECRETS__MASTER_KEY", &key)]).expect("from env");
        assert_eq!(s.secrets.master_key.expose(), key);
        assert!(!format!("{s:?}").contains(&key));
        let s = load("", &[("PAYNOTIFY__MERCHANTS__RELOAD_SECS", "30")]).expect("from env");
        assert_eq!(s.merchants.reload_secs, 30);

        let short = STANDARD.encode([5u8; 31]);
        let err = load("", &[("PAYNOTIFY__SECRETS__MASTER_KEY", &short)])
            .expect_err("31 bytes")
            .to_string();
        assert!(err.contains("secrets.master_key"), "{err}");
        assert!(err.contains("PAYNOTIFY__SECRETS__MASTER_KEY"), "{err}");
        assert!(!err.contains(&short), "{err}");
    }

    #[test]
    fn a_key_and_a_key_file_together_name_the_file() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        writeln!(file, "{}", STANDARD.encode([5u8; 32])).expect("write");
        let config = format!(
            "[secrets]\nmaster_key_file = \"{}\"\n",
            file.path().display()
        );
        assert!(load(&config, &[]).is_ok());
        let err = load(
            &config,
            &[(
                "PAYNOTIFY__SECRETS__MASTER_KEY",
                &STANDARD.encode([5u8; 32]),
            )],
        )
        .expect_err("both")
        .to_string();
        assert!(err.contains("secrets.master_key_file"), "{err}");
    }

    #[test]
    fn a_key_file_is_read_only_to_its_first_line_end() {
        use crate::merchants::seal::{KEY_FILE_MAX, MasterKey};
        let b64 = STANDARD.encode([4u8; 32]);
        // A key file whose first line ends within the limit opens, whatever follows it.
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        let tail = vec![b'x'; 3 * KEY_FILE_MAX as usize];
        file.write_all(format!("{b64}\n").as_bytes())
            .expect("write");
        file.write_all(&tail).expect("write");
        let key = MasterKey::from_file("secrets.master_key_file", file.path()).expect("opens");
        assert_eq!(
            key.id(),
            MasterKey::from_base64("k", &b64).expect("key").id()
        );
        // No line end in the first KEY_FILE_MAX bytes: not a key file, named by its field.
        let mut long = tempfile::NamedTempFile::new().expect("temp file");
        long.write_all(&tail).expect("write");
        let err = MasterKey::from_file("secrets.master_key_file", long.path())
            .expect_err("too long")
            .to_string();
        assert!(err.contains("secrets.master_key_file"), "{err}");
        assert!(err.contains("no line end"), "{err}");
        // A device that never ends is refused the same way, not read whole.
        let err = MasterKey::from_file("--new-key-file", std::path::Path::new("/dev/zero"))
            .expect_err("a device")
            .to_string();
        assert!(err.contains("--new-key-file"), "{err}");
        // A key without a line end at all is the whole (short) file.
        let mut bare = tempfile::NamedTempFile::new().expect("temp file");
        bare.write_all(b64.as_bytes()).expect("write");
        assert!(MasterKey::from_file("secrets.master_key_file", bare.path()).is_ok());
    }

    #[test]
    fn the_settings_give_one_key_or_none() {
        use crate::config::value::Secret;
        let b64 = STANDARD.encode([3u8; crate::merchants::seal::KEY_LEN]);
        let none = SecretsSettings::default();
        assert!(none.master_key().expect("none").is_none());

        let inline = SecretsSettings {
            master_key: Secret::new(b64.clone()),
            master_key_file: None,
        };
        let from_inline = inline.master_key().expect("ok").expect("a key");

        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut file, format!("{b64}\nsecond line\n").as_bytes())
            .expect("write");
        let in_file = SecretsSettings {
            master_key: Secret::default(),
            master_key_file: Some(file.path().to_path_buf()),
        };
        let from_file = in_file.master_key().expect("ok").expect("a key");
        assert_eq!(from_file.id(), from_inline.id());

        let both = SecretsSettings {
            master_key: Secret::new(b64),
            master_key_file: Some(file.path().to_path_buf()),
        };
        let err = both.master_key().expect_err("both").to_string();
        assert!(err.contains("secrets.master_key_file"), "{err}");

        let missing = SecretsSettings {
            master_key: Secret::default(),
            master_key_file: Some(file.path().with_extension("absent")),
        };
        let err = missing.master_key().expect_err("unreadable").to_string();
        assert!(err.contains("secrets.master_key_file"), "{err}");
    }
}
