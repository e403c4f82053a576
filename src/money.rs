//! Money is integers: amounts are `i64` fen end to end. Alipay states yuan as decimal
//! strings, parsed here exactly, without floats.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a yuan amount with at most two decimals: {0:?}")]
pub struct BadAmount(pub String);

/// Parses `"199.00"` → 19900, `"0.01"` → 1, `"199"` → 19900, `"199.5"` → 19950. Refuses
/// signs, exponents, spaces, more than two decimals, an empty string, and overflow.
pub fn yuan_to_fen(text: &str) -> Result<i64, BadAmount> {
    let bad = || BadAmount(text.to_owned());
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (text, ""),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (text.contains('.') && !digits(fraction)) || fraction.len() > 2 {
        return Err(bad());
    }
    let yuan: i64 = whole.parse().map_err(|_| bad())?;
    let cents: i64 = match fraction.len() {
        0 => 0,
        1 => fraction.parse::<i64>().map_err(|_| bad())? * 10,
        _ => fraction.parse().map_err(|_| bad())?,
    };
    yuan.checked_mul(100)
        .and_then(|fen| fen.checked_add(cents))
        .ok_or_else(bad)
}

/// `19900` → `"199.00"`, `-5` → `"-0.05"`: fen as yuan with two decimals.
pub fn fen_to_yuan(fen: i64) -> String {
    let sign = if fen < 0 { "-" } else { "" };
    let abs = fen.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fen_as_yuan() {
        assert_eq!(fen_to_yuan(19900), "199.00");
        assert_eq!(fen_to_yuan(1), "0.01");
        assert_eq!(fen_to_yuan(0), "0.00");
        assert_eq!(fen_to_yuan(-5), "-0.05");
        assert_eq!(fen_to_yuan(-12345), "-123.45");
        assert_eq!(yuan_to_fen(&fen_to_yuan(987_654_321)), Ok(987_654_321));
    }

    #[test]
    fn plain_amounts() {
        for (text, fen) in [
            ("199.00", 19900),
            ("0.01", 1),
            ("199", 19900),
            ("199.5", 19950),
            ("0", 0),
            ("0.10", 10),
            ("007.07", 707),
            ("92233720368547758.07", i64::MAX),
        ] {
            assert_eq!(yuan_to_fen(text), Ok(fen), "{text}");
        }
    }

    #[test]
    fn everything_else_is_refused() {
        for text in [
            "199.001",
            "1e2",
            "-1.00",
            "+1.00",
            " 199.00",
            "199.00 ",
            "",
            "NaN",
            "inf",
            ".5",
            "5.",
            "1,00",
            "1.2.3",
            "١٢",
            "0x10",
            "92233720368547758.08",
            "99999999999999999999",
        ] {
            assert!(yuan_to_fen(text).is_err(), "{text:?} accepted");
        }
    }

    /// xorshift64*: deterministic, dependency-free randomness for the property below.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    #[test]
    fn property_parsing_agrees_with_integer_arithmetic() {
        let mut state = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..100_000 {
            let yuan = (next(&mut state) % 10_000_000_000) as i64;
            let cents = (next(&mut state) % 100) as i64;
            let expected = yuan * 100 + cents;
            assert_eq!(yuan_to_fen(&format!("{yuan}.{cents:02}")), Ok(expected));
            if cents % 10 == 0 {
                assert_eq!(yuan_to_fen(&format!("{yuan}.{}", cents / 10)), Ok(expected));
            }
            if cents == 0 {
                assert_eq!(yuan_to_fen(&yuan.to_string()), Ok(expected));
            }
            // A third decimal is always refused, even a zero.
            assert!(yuan_to_fen(&format!("{yuan}.{cents:02}0")).is_err());
        }
    }
}
