//! Who may see the console, and proof that a form was posted from it.
//!
//! A request carrying `Authorization: Bearer <server.api_token>` is let in as on any `/admin`
//! endpoint. A browser signs in once with the token (`/admin/console/login`) and gets a
//! session cookie instead: `HttpOnly`, `SameSite=Strict`, `Secure` (unless
//! `server.console_plain_http` says the console is opened over plain http on this machine),
//! valid for [`SESSION_SECS`]. The cookie holds an expiry and its HMAC, never
//! the token; the HMAC key is derived from the token, so every instance sharing the token
//! accepts it and changing the token signs everyone out. Every form carries a CSRF token,
//! the HMAC of the session it was rendered for. With no token configured (loopback only) the
//! console is open like the rest of `/admin`, its forms signed with a key of this process.

use std::future::{Ready, ready};

use actix_web::cookie::{Cookie, SameSite, time::Duration as CookieDuration};
use actix_web::http::header::{AUTHORIZATION, LOCATION};
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde::Deserialize;

use super::error::ConsoleError;
use super::html::{secured, sign_in_page};
use crate::app::App;
use crate::config::Secret;
use crate::notice::Digest;
use crate::origin::{PROXY_HEADERS, refused_from_another_site, refused_without_token};

/// The session cookie's name; its path is the console's.
const COOKIE: &str = "paynotify_console";
/// How long a sign-in lasts.
pub const SESSION_SECS: i64 = 8 * 3600;
const CONSOLE: &str = "/admin/console";

/// The key sessions and CSRF tokens are signed with, and how the session cookie is sent.
pub struct Keys {
    key: hmac::Key,
    /// `server.console_plain_http` (see [`session_cookie`]).
    plain_http: bool,
}

impl Keys {
    /// Derived from `server.api_token`; a random key of this process when it is empty.
    /// The session cookie is `Secure` (see [`Keys::plain_http`]).
    pub fn new(api_token: &Secret) -> Result<Self, ring::error::Unspecified> {
        let secret = if api_token.is_empty() {
            crate::random::bytes::<32>()?
        } else {
            let derive = hmac::Key::new(hmac::HMAC_SHA256, api_token.expose().as_bytes());
            let tag = hmac::sign(&derive, b"paynotify console key v1");
            let mut out = [0u8; 32];
            out.copy_from_slice(tag.as_ref());
            out
        };
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            plain_http: false,
        })
    }

    /// `server.console_plain_http`: the console is opened over plain http on this machine,
    /// so a request straight from loopback gets its session cookie without `Secure`.
    pub fn plain_http(mut self, plain_http: bool) -> Self {
        self.plain_http = plain_http;
        self
    }

    fn sign(&self, purpose: &str, data: &str) -> String {
        let tag = hmac::sign(&self.key, format!("{purpose}|{data}").as_bytes());
        URL_SAFE_NO_PAD.encode(tag.as_ref())
    }

    fn verify(&self, purpose: &str, data: &str, presented: &str) -> bool {
        URL_SAFE_NO_PAD.decode(presented).is_ok_and(|tag| {
            hmac::verify(&self.key, format!("{purpose}|{data}").as_bytes(), &tag).is_ok()
        })
    }

    /// A session cookie's value, valid until `expires` (unix seconds).
    fn session(&self, expires: i64) -> String {
        format!("{expires}.{}", self.sign("session", &expires.to_string()))
    }

    /// Whether `value` is a session this key signed that has not expired at `now`.
    fn valid_session(&self, value: &str, now: i64) -> bool {
        value.split_once('.').is_some_and(|(expires, tag)| {
            expires.parse::<i64>().is_ok_and(|e| e > now) && self.verify("session", expires, tag)
        })
    }
}

/// How a request was let in.
#[derive(Debug, Clone)]
enum Access {
    Bearer,
    Session(String),
    /// No token configured: loopback only, as for the rest of `/admin`.
    Open,
}

/// A request allowed to see the console, with the CSRF token its forms carry.
pub struct Viewer {
    access: Access,
    csrf: String,
}

impl Viewer {
    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether the viewer signed in with a cookie (and so has a session to end).
    pub fn signed_in(&self) -> bool {
        matches!(self.access, Access::Session(_))
    }

    /// A form posted by this viewer came from a console page. Whatever the credential, a
    /// browser saying it posted from another site is refused (a gateway in front may add the
    /// bearer header to every request of a browser). A bearer request carries its credential
    /// in a header no other site can make a browser send; a cookie or an open console needs
    /// the CSRF token its page was rendered with.
    pub fn check_form(&self, req: &HttpRequest, presented: &str) -> Result<(), ConsoleError> {
        if let Some(why) = refused_from_another_site(req) {
            return Err(ConsoleError::Forbidden(why));
        }
        if matches!(self.access, Access::Bearer) {
            return Ok(());
        }
        let keys = keys(req)?;
        if keys.verify("csrf", self.access.bound_to(), presented) {
            Ok(())
        } else {
            tracing::warn!(
                path = req.path(),
                "console form refused: wrong or missing CSRF token"
            );
            Err(ConsoleError::Forbidden(
                "the form's CSRF token is wrong or missing: reload the page",
            ))
        }
    }
}

impl Access {
    /// What a CSRF token is bound to.
    fn bound_to(&self) -> &str {
        match self {
            Self::Bearer => "bearer",
            Self::Session(value) => value,
            Self::Open => "open",
        }
    }
}

fn keys(req: &HttpRequest) -> Result<&Keys, ConsoleError> {
    req.app_data::<web::Data<Keys>>()
        .map(|k| k.get_ref())
        .ok_or(ConsoleError::Internal("console keys not configured"))
}

fn state(req: &HttpRequest) -> Result<&App, ConsoleError> {
    req.app_data::<web::Data<App>>()
        .map(|s| s.get_ref())
        .ok_or(ConsoleError::Internal("application state not configured"))
}

/// Whether `presented` is the API token (compared as digests: timing independent of it).
fn is_token(state: &App, presented: &str) -> bool {
    let expected = state.api_token.expose();
    !expected.is_empty() && Digest::of(presented.as_bytes()) == Digest::of(expected.as_bytes())
}

fn proxied(req: &HttpRequest) -> Option<&'static str> {
    PROXY_HEADERS
        .iter()
        .copied()
        .find(|name| req.headers().contains_key(*name))
}

fn admit(req: &HttpRequest) -> Result<Viewer, ConsoleError> {
    let (state, keys) = (state(req)?, keys(req)?);
    let access = if state.api_token.is_empty() {
        if let Some(why) = refused_without_token(req) {
            return Err(ConsoleError::Forbidden(why));
        }
        Access::Open
    } else if let Some(bearer) = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        if !is_token(state, bearer) {
            return Err(ConsoleError::SignIn);
        }
        Access::Bearer
    } else {
        let now = state.clock.now().unix_seconds();
        match req.cookie(COOKIE) {
            Some(cookie) if keys.valid_session(cookie.value(), now) => {
                Access::Session(cookie.value().to_owned())
            }
            _ => return Err(ConsoleError::SignIn),
        }
    };
    let csrf = keys.sign("csrf", access.bound_to());
    Ok(Viewer { access, csrf })
}

impl FromRequest for Viewer {
    type Error = ConsoleError;
    type Future = Ready<Result<Self, ConsoleError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        ready(admit(req))
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/admin/console/login", web::get().to(login_form))
        .route("/admin/console/login", web::post().to(login))
        .route("/admin/console/logout", web::post().to(logout));
}

async fn login_form(req: HttpRequest) -> HttpResponse {
    match admit(&req) {
        Ok(_) => see_other(CONSOLE),
        Err(_) => sign_in_page(actix_web::http::StatusCode::OK, false),
    }
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(req: HttpRequest, form: web::Form<LoginForm>) -> Result<HttpResponse, ConsoleError> {
    let (state, keys) = (state(&req)?, keys(&req)?);
    if state.api_token.is_empty() {
        return Ok(see_other(CONSOLE));
    }
    if let Some(why) = refused_from_another_site(&req) {
        return Err(ConsoleError::Forbidden(why));
    }
    if !is_token(state, &form.token) {
        let peer = req.peer_addr().map(|a| a.ip().to_string());
        tracing::warn!(peer, "console sign-in refused: wrong token");
        return Ok(sign_in_page(
            actix_web::http::StatusCode::UNAUTHORIZED,
            true,
        ));
    }
    let expires = state.clock.now().unix_seconds() + SESSION_SECS;
    let cookie = session_cookie(&req, keys, keys.session(expires), SESSION_SECS);
    tracing::info!("console session started");
    let mut response = see_other(CONSOLE);
    response
        .add_cookie(&cookie)
        .map_err(|_| ConsoleError::Internal("session cookie not representable"))?;
    Ok(response)
}

/// A console form that posts nothing but its CSRF token.
#[derive(Deserialize)]
pub struct CsrfForm {
    /// Missing is the same as wrong: 403.
    #[serde(default)]
    pub csrf: String,
}

async fn logout(
    req: HttpRequest,
    viewer: Viewer,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let mut response = see_other("/admin/console/login");
    response
        .add_cookie(&session_cookie(&req, keys(&req)?, String::new(), 0))
        .map_err(|_| ConsoleError::Internal("session cookie not representable"))?;
    Ok(response)
}

/// `Secure`, whoever asks: a TLS proxy on this machine (nginx's default `proxy_pass`,
/// stunnel, haproxy in tcp mode) adds no forwarding header, so a loopback peer does not show
/// that the browser used plain http, and the 8-hour session must not travel over it. Only
/// `server.console_plain_http` (a console opened as `http://127.0.0.1`, allowed with a
/// loopback listen address only) leaves it off, and then only for a request straight from
/// loopback that no proxy relayed.
fn session_cookie(req: &HttpRequest, keys: &Keys, value: String, max_age: i64) -> Cookie<'static> {
    let plain = keys.plain_http
        && req.peer_addr().is_some_and(|a| a.ip().is_loopback())
        && proxied(req).is_none();
    Cookie::build(COOKIE, value)
        .path(CONSOLE)
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(!plain)
        .max_age(CookieDuration::seconds(max_age))
        .finish()
}

/// A redirect after a form (303: the browser follows it with a GET).
pub fn see_other(to: &str) -> HttpResponse {
    secured(HttpResponse::SeeOther())
        .insert_header((LOCATION, to))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(token: &str) -> Keys {
        Keys::new(&Secret::new(token)).unwrap()
    }

    #[test]
    fn a_session_is_valid_until_it_expires_and_only_under_its_token() {
        let k = keys("token-a");
        let value = k.session(1_000);
        assert!(k.valid_session(&value, 999));
        assert!(!k.valid_session(&value, 1_000), "expired");
        assert!(
            !keys("token-b").valid_session(&value, 0),
            "another token's key"
        );
        assert!(
            keys("token-a").valid_session(&value, 0),
            "same token, another instance"
        );
    }

    #[test]
    fn a_changed_expiry_or_a_forged_tag_is_no_session() {
        let k = keys("token-a");
        let value = k.session(1_000);
        let (_, tag) = value.split_once('.').unwrap();
        assert!(!k.valid_session(&format!("9999999999.{tag}"), 0));
        assert!(!k.valid_session("1000.AAAA", 0));
        assert!(!k.valid_session("1000", 0));
        assert!(!k.valid_session("", 0));
    }

    #[test]
    fn a_csrf_token_is_bound_to_its_session() {
        let k = keys("token-a");
        let (one, two) = (k.session(1_000), k.session(2_000));
        let token = k.sign("csrf", &one);
        assert!(k.verify("csrf", &one, &token));
        assert!(!k.verify("csrf", &two, &token));
        assert!(!k.verify("session", &one, &token), "purposes do not mix");
    }

    #[test]
    fn an_empty_token_gives_each_process_its_own_key() {
        let (a, b) = (keys(""), keys(""));
        assert!(!b.valid_session(&a.session(1_000), 0));
    }
}
