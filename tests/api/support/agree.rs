//! `verify` and `explain` walk one list of checks: for any request, explain's first failed
//! check carries the rejection the notify route answers, and explain finds nothing refused in
//! a request that is admitted.

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use paynotify::channel::{Channel, Inbound, Provider, Rejection, Verdict};

/// Headers as they arrived, repeated names and bytes that are not visible ASCII included.
pub fn header_map(headers: &[(String, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            HeaderValue::from_bytes(value).expect("header value"),
        );
    }
    map
}

/// Asserts that `verify`, `admit` and `explain` of `request` agree, and returns what admit
/// answered (`None` for an admitted notice), so the caller can check that the request is
/// refused for the reason it was built for:
/// - verify refuses with `r` exactly when explain's first failed check carries `r`, and
///   then admit refuses with `r` too;
/// - verify accepts exactly when explain fails no check before decoding; then explain's
///   first failed check, if any, carries admit's rejection (decoding), or is the merchant
///   check of a notice admitted for another merchant.
pub fn assert_agree<C: Channel + Provider>(
    channel: &C,
    request: &Inbound<'_>,
    name: &str,
) -> Option<Rejection> {
    let verified = channel.verify(request).err();
    let admitted = Provider::admit(channel, request);
    let explained = channel.explain(request);
    let shown: Vec<String> = explained
        .checks
        .iter()
        .map(|c| {
            format!(
                "{} {}: {} [{:?}]",
                c.verdict.label(),
                c.name,
                c.detail,
                c.rejection
            )
        })
        .collect();
    let shown = shown.join("\n");
    for check in &explained.checks {
        assert_eq!(
            check.rejection.is_some(),
            check.verdict == Verdict::Fail && check.name != "merchant",
            "{name}: only a failed check refuses, and every one but the merchant's does:\n{shown}"
        );
    }
    let first = explained.first_failure();
    match &verified {
        Some(why) => {
            let first = first.unwrap_or_else(|| {
                panic!("{name}: verify refuses ({why}), explain fails nothing:\n{shown}")
            });
            assert_eq!(first.rejection.as_ref(), Some(why), "{name}:\n{shown}");
            assert_eq!(admitted.as_ref().err(), Some(why), "{name}");
        }
        None => {
            let before_decoding = explained.checks.iter().filter(|c| {
                c.verdict == Verdict::Fail && c.name != "decoded fields" && c.name != "merchant"
            });
            assert_eq!(
                before_decoding.count(),
                0,
                "{name}: verify accepts, explain fails a check:\n{shown}"
            );
            match (&admitted, first) {
                (Err(why), Some(first)) => {
                    assert_eq!(first.name, "decoded fields", "{name}:\n{shown}");
                    assert_eq!(first.rejection.as_ref(), Some(why), "{name}:\n{shown}");
                }
                (Err(why), None) => {
                    panic!("{name}: admit refuses ({why}), explain fails nothing:\n{shown}")
                }
                (Ok(notice), Some(first)) => {
                    assert_eq!(first.name, "merchant", "{name}:\n{shown}");
                    assert!(!notice.merchant_matches, "{name}:\n{shown}");
                }
                (Ok(notice), None) => {
                    assert!(notice.merchant_matches, "{name}:\n{shown}");
                    assert_eq!(explained.notice.as_ref(), Some(notice), "{name}:\n{shown}");
                }
            }
        }
    }
    admitted.err()
}

/// [`assert_agree`], and the refusal is the one the request was built for: `None` for an
/// admitted notice, else the start of the rejection's text (its kind and message).
pub fn assert_refused_as<C: Channel + Provider>(
    channel: &C,
    request: &Inbound<'_>,
    name: &str,
    expected: Option<&str>,
) {
    let got = assert_agree(channel, request, name).map(|r| r.to_string());
    match (expected, got.as_deref()) {
        (None, None) => {}
        (Some(want), Some(got)) => assert!(got.starts_with(want), "{name}: {got}, not {want}"),
        (want, got) => panic!("{name}: expected {want:?}, got {got:?}"),
    }
}

/// [`assert_agree`] on a known-answer vector: a `valid_` one is admitted, any other refused.
pub fn assert_vector_agrees<C: Channel + Provider>(channel: &C, request: &Inbound<'_>, name: &str) {
    let refused = assert_agree(channel, request, name);
    assert_eq!(
        refused.is_none(),
        name.starts_with("valid_"),
        "{name}: {refused:?}"
    );
}
