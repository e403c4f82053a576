//! Text from outside made storable: control characters written out as visible escapes. And
//! bytes written as text: [`hex`], the one hex encoder of the crate.
//!
//! PostgreSQL refuses a NUL in `text` and `\u0000` in `jsonb`, so one NUL in a value a
//! request carried failed the whole statement (and, for receipts, the whole batch). Every
//! control character, not only NUL, is escaped: none belongs in an id, a status or a reason,
//! and written out they cannot corrupt a log line or a terminal showing the row either.
//!
//! The escape is marked, not reversible: a backslash is kept as it is, so a value that
//! already held the four characters `\x00` reads the same as one that held a NUL. Nothing
//! needs the original back: a receipt keeps its raw body byte for byte (base64), and a
//! provider's ids are compared with what the same provider sends next, escaped the same way.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with each control character (C0, DEL, C1) as `\xNN` (below U+0080) or `\u{NN}`.
pub fn storable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        let n = u32::from(c);
        // Writing to a String cannot fail.
        if !c.is_control() {
            out.push(c);
        } else if n < 0x80 {
            let _ = write!(out, "\\x{n:02x}");
        } else {
            let _ = write!(out, "\\u{{{n:x}}}");
        }
    }
    Cow::Owned(out)
}

/// Lower-case hex of `bytes` (digests, signatures, serials: upper-case is
/// `hex(…).to_ascii_uppercase()`).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}

/// [`storable`] in place.
pub fn make_storable(text: &mut String) {
    if let Cow::Owned(escaped) = storable(text) {
        *text = escaped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn control_characters_are_written_out_and_other_text_is_untouched() {
        assert!(matches!(storable("2026RN-P 年货"), Cow::Borrowed(_)));
        assert_eq!(storable("app_id \0"), "app_id \\x00");
        assert_eq!(
            storable("a\u{7}\tb\r\n\u{7f}"),
            "a\\x07\\x09b\\x0d\\x0a\\x7f"
        );
        assert_eq!(storable("c1 \u{85}"), "c1 \\u{85}");
        let mut s = String::from("x\0");
        make_storable(&mut s);
        assert_eq!(s, "x\\x00");
    }
}
