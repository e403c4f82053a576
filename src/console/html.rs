//! The console's building blocks: the headers every answer carries, the bare page shell, the
//! sign-in form, and how times and amounts are shown.
//!
//! Every answer carries a `Content-Security-Policy` that allows no script at all, styles only
//! from the binary's own stylesheet, forms only to this origin and no framing; and
//! `Cache-Control: no-store` (the pages show payment data). Values reach the HTML only through
//! `maud`'s escaping: a receipt's body is written by whoever sent it.

use actix_web::http::StatusCode;
use actix_web::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use actix_web::{HttpResponse, HttpResponseBuilder, web};
use maud::{DOCTYPE, Markup, html};

use crate::time::Timestamp;

pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const STYLESHEET: &str = include_str!("console.css");

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/admin/console/console.css", web::get().to(stylesheet));
}

async fn stylesheet() -> HttpResponse {
    secured(HttpResponse::Ok())
        .insert_header((CONTENT_TYPE, "text/css; charset=utf-8"))
        .body(STYLESHEET)
}

/// The headers every console answer carries.
pub fn secured(mut builder: HttpResponseBuilder) -> HttpResponseBuilder {
    builder
        .insert_header(("content-security-policy", CONTENT_SECURITY_POLICY))
        .insert_header(("x-content-type-options", "nosniff"))
        .insert_header(("x-frame-options", "DENY"))
        // Not `no-referrer`: with it a browser posts `Origin: null`, even to this origin.
        .insert_header(("referrer-policy", "same-origin"))
        .insert_header((CACHE_CONTROL, "no-store"));
    builder
}

/// The HTML document every console page is: its head (title, the stylesheet), then `content`.
pub fn document(status: StatusCode, title: &str, content: Markup) -> HttpResponse {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · paynotify" }
                link rel="stylesheet" href="/admin/console/console.css";
            }
            body { (content) }
        }
    };
    secured(HttpResponse::build(status))
        .insert_header((CONTENT_TYPE, "text/html; charset=utf-8"))
        .body(markup.into_string())
}

/// A page without the navigation (sign-in, errors).
pub fn bare(status: StatusCode, title: &str, body: Markup) -> HttpResponse {
    document(status, title, html! { main { (body) } })
}

/// The sign-in page; `failed` says the last try was wrong.
pub fn sign_in_page(status: StatusCode, failed: bool) -> HttpResponse {
    bare(
        status,
        "Sign in",
        html! {
            h1 { "paynotify console" }
            @if failed { p.error role="alert" { "That is not the API token." } }
            form method="post" action="/admin/console/login" {
                label for="token" { "API token (" code { "server.api_token" } ")" }
                input #token type="password" name="token" autocomplete="current-password" required autofocus;
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// A time as the pages show it: UTC, to the second.
pub fn at(t: Timestamp) -> String {
    t.as_datetime().format("%Y-%m-%d %H:%M:%S").to_string()
}

pub fn at_opt(t: Option<Timestamp>) -> String {
    t.map(at).unwrap_or_default()
}

/// Fen as yuan with two decimals.
pub fn yuan(fen: i64) -> String {
    crate::money::fen_to_yuan(fen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_escapes_what_it_is_given() {
        let payload = r#"<script>alert(1)</script><img src=x onerror="x()">&"#;
        let out = html! { td { (payload) } td title=(payload) {} }.into_string();
        assert!(!out.contains("<script>"), "{out}");
        assert!(!out.contains("<img"), "{out}");
        assert!(out.contains("&lt;script&gt;"), "{out}");
        assert!(out.contains("&quot;"), "{out}");
    }
}
