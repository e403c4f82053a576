//! WeChat's bill as it is downloaded: a gzip, decompressed streaming and never past a limit,
//! and the SHA1 of what it decompresses to.

use std::io::{BufReader, Read};

use ring::digest::{Context, SHA1_FOR_LEGACY_USE_ONLY};

use crate::channel::bill::{self, BillError};

/// The SHA1 of everything `input` gives, in lower-case hex.
pub(super) fn sha1_hex(mut input: impl Read) -> Result<String, BillError> {
    let mut context = Context::new(&SHA1_FOR_LEGACY_USE_ONLY);
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = input.read(&mut buffer).map_err(archive)?;
        if n == 0 {
            break;
        }
        context.update(&buffer[..n]);
    }
    Ok(crate::text::hex(context.finish().as_ref()))
}

/// The decompressed bytes of a gzip file, refused past `limit` (a gzip bomb).
pub(super) fn decompress(
    file: impl Read,
    limit: u64,
) -> Capped<flate2::read::GzDecoder<BufReader<impl Read>>> {
    Capped {
        inner: flate2::read::GzDecoder::new(BufReader::with_capacity(64 * 1024, file)),
        left: limit,
        limit,
    }
}

/// A reader that fails once more than `limit` bytes came out of it.
pub(super) struct Capped<R> {
    inner: R,
    left: u64,
    limit: u64,
}

/// The marker of [`Capped`]'s refusal, told apart from the gzip's own errors.
#[derive(Debug)]
struct TooLarge(u64);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the decompressed bill is larger than {} bytes", self.0)
    }
}

impl std::error::Error for TooLarge {}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        match self.left.checked_sub(n as u64) {
            Some(left) => {
                self.left = left;
                Ok(n)
            }
            None => Err(std::io::Error::other(TooLarge(self.limit))),
        }
    }
}

/// What reading the gzip came to: cut off, corrupt, or too large.
pub(super) fn archive(e: std::io::Error) -> BillError {
    if let Some(too_long) = bill::line_too_long(&e) {
        return too_long;
    }
    if let Some(too_large) = e.get_ref().and_then(|i| i.downcast_ref::<TooLarge>()) {
        return BillError::Archive(too_large.to_string());
    }
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            BillError::Archive(format!("the gzip is truncated: {e}"))
        }
        _ => BillError::Archive(format!("the gzip is corrupt: {e}")),
    }
}
