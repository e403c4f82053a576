//! Seals an account's `keys` object at rest: AES-256-GCM under `secrets.master_key`, a fresh
//! random 96-bit nonce per seal, and the account's `(channel, account)` as associated data so
//! a seal moved to another row does not open.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use crate::config::value::{ConfigError, invalid};
use crate::notice::ChannelId;

/// The length of a master key, in bytes.
pub const KEY_LEN: usize = 32;

/// The most of a master key file read: its first line is a 44-character base64 key.
pub const KEY_FILE_MAX: u64 = 4096;

/// Warns once, at start-up, when a key file can be read by its group or by everyone.
fn warn_if_shared(field: &str, path: &std::path::Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    field,
                    path = %path.display(),
                    mode = format_args!("{mode:o}"),
                    "the master key file can be read by others; make it 0600"
                );
            }
        }
    }
}

/// The length of the GCM tag that ends every seal.
const TAG_LEN: usize = 16;

/// The AES-256-GCM key that seals stored keys, and its id.
pub struct MasterKey {
    key: LessSafeKey,
    id: String,
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl MasterKey {
    /// The key `text` holds (base64 of exactly 32 bytes, surrounding white space ignored);
    /// an error names `field`, never the value.
    pub fn from_base64(field: &str, text: &str) -> Result<Self, ConfigError> {
        let bytes = STANDARD.decode(text.trim()).map_err(|_| {
            invalid(
                field,
                format!("must be the base64 of exactly {KEY_LEN} bytes (it is not base64)"),
            )
        })?;
        Self::from_bytes(&bytes).ok_or_else(|| {
            invalid(
                field,
                format!(
                    "must be the base64 of exactly {KEY_LEN} bytes (got {})",
                    bytes.len()
                ),
            )
        })
    }

    /// The key on the first line of the file at `path` (a master key file): at most
    /// [`KEY_FILE_MAX`] bytes are read, so a path naming a device or a large file is an error,
    /// not a start-up that reads it whole. A file others may read is allowed, with a warning.
    pub fn from_file(field: &str, path: &std::path::Path) -> Result<Self, ConfigError> {
        use std::io::Read;
        let unreadable =
            |e: std::io::Error| invalid(field, format!("cannot read {}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let mut head = Vec::new();
        file.take(KEY_FILE_MAX + 1)
            .read_to_end(&mut head)
            .map_err(unreadable)?;
        let line = match head.iter().position(|&b| b == b'\n') {
            Some(end) => &head[..end],
            None if head.len() as u64 > KEY_FILE_MAX => {
                return Err(invalid(
                    field,
                    format!(
                        "{} has no line end in its first {KEY_FILE_MAX} bytes: not a key file",
                        path.display()
                    ),
                ));
            }
            None => &head[..],
        };
        let line = std::str::from_utf8(line)
            .map_err(|_| invalid(field, format!("{} is not text", path.display())))?;
        warn_if_shared(field, path);
        Self::from_base64(field, line)
    }

    /// `None` unless `bytes` is exactly [`KEY_LEN`] long.
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != KEY_LEN {
            return None;
        }
        let key = UnboundKey::new(&AES_256_GCM, bytes).ok()?;
        Some(Self {
            key: LessSafeKey::new(key),
            id: key_id(bytes),
        })
    }

    /// The first 8 hex digits of the SHA-256 of the key: stored beside each seal, so a row
    /// sealed under another key is told apart from a tampered one.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Seals `plaintext` for the row `(channel, account)`.
    pub fn seal(
        &self,
        channel: ChannelId,
        account: &str,
        plaintext: &[u8],
    ) -> Result<Sealed, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError::Random)?;
        let mut bytes = Vec::with_capacity(NONCE_LEN + plaintext.len() + TAG_LEN);
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(plaintext);
        let (_, in_out) = bytes.split_at_mut(NONCE_LEN);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated_data(channel, account).as_bytes()),
                in_out,
            )
            // Only a plaintext past GCM's limit (64 GiB) fails.
            .map_err(|_| SealError::TooLong)?;
        bytes.extend_from_slice(tag.as_ref());
        Ok(Sealed {
            key_id: self.id.clone(),
            bytes,
        })
    }

    /// The plaintext of `sealed`, which must be the seal of the row `(channel, account)`
    /// under this key.
    pub fn open(
        &self,
        channel: ChannelId,
        account: &str,
        sealed: &Sealed,
    ) -> Result<Vec<u8>, SealError> {
        if sealed.key_id != self.id {
            return Err(SealError::WrongKey {
                key_id: sealed.key_id.clone(),
            });
        }
        if sealed.bytes.len() < NONCE_LEN + TAG_LEN {
            return Err(SealError::Corrupt);
        }
        let (nonce, ciphertext) = sealed.bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Corrupt)?;
        let mut in_out = ciphertext.to_vec();
        let plaintext = self
            .key
            .open_in_place(
                nonce,
                Aad::from(associated_data(channel, account).as_bytes()),
                &mut in_out,
            )
            .map_err(|_| SealError::DoesNotOpen)?;
        Ok(plaintext.to_vec())
    }
}

/// What a seal is bound to: its row.
fn associated_data(channel: ChannelId, account: &str) -> String {
    format!("paynotify/merchant/{channel}/{account}")
}

fn key_id(key: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key);
    digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A sealed value: `nonce ‖ ciphertext ‖ tag`, and the id of the key that sealed it.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub bytes: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("key_id", &self.key_id)
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl Sealed {
    /// `bytes` as stored in a text column.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(&self.bytes)
    }

    /// A seal read back from a text column.
    pub fn from_base64(key_id: impl Into<String>, text: &str) -> Result<Self, SealError> {
        let bytes = STANDARD.decode(text).map_err(|_| SealError::Corrupt)?;
        Ok(Self {
            key_id: key_id.into(),
            bytes,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Sealed under another master key.
    #[error("sealed with key id {key_id}")]
    WrongKey { key_id: String },
    /// Not a seal at all: not base64, or too short to hold a nonce and a tag.
    #[error("the sealed value is malformed")]
    Corrupt,
    /// The tag does not verify: a seal of another row, or changed since it was sealed.
    #[error("the sealed value does not open: it belongs to another account or was altered")]
    DoesNotOpen,
    #[error("the system random number generator failed")]
    Random,
    #[error("the value is too long to seal")]
    TooLong,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> MasterKey {
        MasterKey::from_base64("secrets.master_key", &STANDARD.encode([byte; KEY_LEN]))
            .expect("a 32-byte key")
    }

    #[test]
    fn a_seal_opens_to_its_plaintext() {
        let k = key(7);
        let sealed = k
            .seal(ChannelId::Wechat, "1900000101", b"{\"apiv3_key\":\"x\"}")
            .expect("seal");
        assert_eq!(sealed.key_id, k.id());
        assert_eq!(sealed.bytes.len(), NONCE_LEN + 17 + TAG_LEN);
        let opened = k
            .open(ChannelId::Wechat, "1900000101", &sealed)
            .expect("open");
        assert_eq!(opened, b"{\"apiv3_key\":\"x\"}");
        let stored = Sealed::from_base64(sealed.key_id.clone(), &sealed.to_base64()).expect("b64");
        assert_eq!(stored, sealed);
    }

    #[test]
    fn two_seals_of_the_same_plaintext_differ() {
        let k = key(7);
        let a = k.seal(ChannelId::Alipay, "2021", b"same").expect("seal");
        let b = k.seal(ChannelId::Alipay, "2021", b"same").expect("seal");
        assert_ne!(a.bytes[..NONCE_LEN], b.bytes[..NONCE_LEN]);
        assert_ne!(a.bytes, b.bytes);
    }

    #[test]
    fn a_seal_moved_to_another_row_does_not_open() {
        let k = key(7);
        let sealed = k
            .seal(ChannelId::Wechat, "1900000101", b"keys")
            .expect("seal");
        assert_eq!(
            k.open(ChannelId::Wechat, "1900000102", &sealed),
            Err(SealError::DoesNotOpen)
        );
        assert_eq!(
            k.open(ChannelId::Alipay, "1900000101", &sealed),
            Err(SealError::DoesNotOpen)
        );
    }

    #[test]
    fn a_flipped_byte_does_not_open() {
        let k = key(7);
        let sealed = k
            .seal(ChannelId::Wechat, "1900000101", b"keys")
            .expect("seal");
        for i in 0..sealed.bytes.len() {
            let mut altered = sealed.clone();
            altered.bytes[i] ^= 0x01;
            assert_eq!(
                k.open(ChannelId::Wechat, "1900000101", &altered),
                Err(SealError::DoesNotOpen),
                "byte {i}"
            );
        }
        let mut short = sealed.clone();
        short.bytes.truncate(NONCE_LEN + TAG_LEN - 1);
        assert_eq!(
            k.open(ChannelId::Wechat, "1900000101", &short),
            Err(SealError::Corrupt)
        );
    }

    #[test]
    fn another_key_does_not_open_and_says_which_key_sealed_it() {
        let (k, other) = (key(7), key(8));
        let sealed = k
            .seal(ChannelId::Wechat, "1900000101", b"keys")
            .expect("seal");
        assert_eq!(
            other.open(ChannelId::Wechat, "1900000101", &sealed),
            Err(SealError::WrongKey {
                key_id: k.id().to_owned()
            })
        );
        // The same id with another key (a collision, or an edited key_id) still fails the tag.
        let mut relabelled = sealed;
        relabelled.key_id = other.id().to_owned();
        assert_eq!(
            other.open(ChannelId::Wechat, "1900000101", &relabelled),
            Err(SealError::DoesNotOpen)
        );
    }

    #[test]
    fn the_key_id_is_the_first_eight_hex_digits_of_its_sha256() {
        // SHA-256 of 32 zero bytes: 66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925.
        assert_eq!(key(0).id(), "66687aad");
        assert_ne!(key(1).id(), key(0).id());
    }

    #[test]
    fn a_key_of_another_length_names_its_field_and_never_the_value() {
        let text = STANDARD.encode([9u8; 31]);
        let err = MasterKey::from_base64("secrets.master_key", &text)
            .expect_err("31 bytes")
            .to_string();
        assert!(err.contains("secrets.master_key"), "{err}");
        assert!(err.contains("got 31"), "{err}");
        assert!(!err.contains(&text), "{err}");
        let err = MasterKey::from_base64("secrets.master_key_file", "not base64!")
            .expect_err("not base64")
            .to_string();
        assert!(err.contains("secrets.master_key_file"), "{err}");
        // Padded by white space, as a file line or a variable often is.
        let padded = format!("  {}\n", STANDARD.encode([9u8; KEY_LEN]));
        assert!(MasterKey::from_base64("secrets.master_key", &padded).is_ok());
    }

    #[test]
    fn its_debug_shows_the_id_only() {
        let k = key(0);
        let shown = format!("{k:?}");
        assert!(shown.contains("66687aad"), "{shown}");
        assert!(!shown.contains("AAAA"), "{shown}");
    }
}
