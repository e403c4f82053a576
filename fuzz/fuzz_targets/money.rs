//! The yuan parser against a plain reference: digits, optionally a point and one or two
//! digits, at most i64::MAX fen; everything else refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paynotify::money::yuan_to_fen;

fn reference(text: &str) -> Option<i64> {
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) if !f.is_empty() && f.len() <= 2 => (w, f),
        Some(_) => return None,
        None => (text, ""),
    };
    if whole.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut fen: u128 = 0;
    for b in whole.bytes() {
        fen = fen.checked_mul(10)?.checked_add(u128::from(b - b'0'))?;
    }
    let mut cents: u128 = 0;
    for (i, b) in fraction.bytes().enumerate() {
        cents += u128::from(b - b'0') * if i == 0 { 10 } else { 1 };
    }
    i64::try_from(fen.checked_mul(100)?.checked_add(cents)?).ok()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = yuan_to_fen(text).ok();
    assert_eq!(parsed, reference(text), "{text:?}");
    if let Some(fen) = parsed {
        // Printed back the way Alipay prints it, it reads the same.
        assert_eq!(
            yuan_to_fen(&format!("{}.{:02}", fen / 100, fen % 100)),
            Ok(fen)
        );
    }
});
