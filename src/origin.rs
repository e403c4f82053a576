//! Who sent a request, as far as its headers tell: relayed by a proxy, naming another host,
//! sent by a browser from a page of another site. The internal API (its bearer token check)
//! and the console (`console::auth`) refuse on the same rules.

use actix_web::HttpRequest;

/// Headers a reverse proxy adds to what it relays. With no token configured (loopback
/// only), a request carrying one came from beyond this machine through a proxy, and the
/// loopback address no longer says who sent it.
pub const PROXY_HEADERS: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// Whether a browser says it sent the request from a page of another site: `Sec-Fetch-Site`
/// (every current browser), else an `Origin` that is not this host. A page of a sibling on
/// the same host (`same-site`) counts as another site. Requests from programs carry neither.
pub fn from_another_site(req: &HttpRequest) -> bool {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    match (header("origin"), header("host")) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_none_or(|(_, authority)| authority != host),
        _ => false,
    }
}

/// Why a request that changes something is refused whatever its credential: a browser says
/// it sent it from a page of another site ([`from_another_site`]). A gateway in front may add
/// the bearer header to every request of a browser, so the header alone does not show that
/// an operator meant it. Logged once. Every `POST` of the internal API and the console
/// (their [`Authorized`] and the console's forms) goes through here; reads do not, since a
/// page of another site cannot read what it is answered.
pub fn refused_from_another_site(req: &HttpRequest) -> Option<&'static str> {
    if !from_another_site(req) {
        return None;
    }
    tracing::warn!(
        method = %req.method(),
        path = req.path(),
        "request a browser sent from another site refused"
    );
    Some("requests a browser sends from another site are refused")
}

/// Whether the request names a host other than this machine (`Host`, or the HTTP/2
/// authority): a page of `evil.example` whose name was made to resolve to 127.0.0.1 (DNS
/// rebinding) is the same origin to the browser, and only its `Host` gives it away.
fn names_another_host(req: &HttpRequest) -> bool {
    let host = req
        .headers()
        .get(actix_web::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    let Some(host) = host else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    !(name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()))
}

/// Why a request is refused when `server.api_token` is empty (config allows that on a
/// loopback listen address only): relayed by a proxy (which would open the service to
/// whoever reaches the proxy), naming another host (DNS rebinding), or sent by a browser
/// from a page of another site (a web page open on this machine posting a form). Logged
/// once with the reason.
pub fn refused_without_token(req: &HttpRequest) -> Option<&'static str> {
    if let Some(header) = PROXY_HEADERS
        .iter()
        .find(|name| req.headers().contains_key(**name))
    {
        tracing::warn!(
            header,
            path = req.path(),
            "request relayed by a proxy refused: server.api_token is empty"
        );
        return Some("server.api_token is empty: requests relayed by a proxy are refused");
    }
    if names_another_host(req) {
        tracing::warn!(
            path = req.path(),
            "request naming another host refused: server.api_token is empty"
        );
        return Some(
            "server.api_token is empty: requests naming a host other than this machine are refused",
        );
    }
    if from_another_site(req) {
        tracing::warn!(
            path = req.path(),
            "request a browser sent from another site refused: server.api_token is empty"
        );
        return Some(
            "server.api_token is empty: requests a browser sends from another site are refused",
        );
    }
    None
}
