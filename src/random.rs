//! Random bytes and tokens from the operating system's generator (ring's `SystemRandom`).

use ring::error::Unspecified;
use ring::rand::{SecureRandom, SystemRandom};

/// `N` random bytes.
pub fn bytes<const N: usize>() -> Result<[u8; N], Unspecified> {
    let mut out = [0u8; N];
    SystemRandom::new().fill(&mut out)?;
    Ok(out)
}

/// `len` characters drawn from `alphabet`.
pub fn token(alphabet: &[u8], len: usize) -> Result<String, Unspecified> {
    let mut raw = vec![0u8; len];
    SystemRandom::new().fill(&mut raw)?;
    Ok(raw
        .iter()
        .map(|b| char::from(alphabet[usize::from(*b) % alphabet.len()]))
        .collect())
}
