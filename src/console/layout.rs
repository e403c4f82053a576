//! The page shell every console page is drawn in: the navigation, the signed-in viewer's
//! sign-out, and the forms' CSRF field.

use actix_web::HttpResponse;
use actix_web::http::header::CONTENT_TYPE;
use maud::{DOCTYPE, Markup, html};

use super::auth::Viewer;
use super::html::secured;

/// A console page: the navigation `nav` (its entry for `path` marked), then `body`.
pub fn page(
    viewer: &Viewer,
    nav: &[(&str, &str)],
    path: &str,
    title: &str,
    body: Markup,
) -> HttpResponse {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · paynotify" }
                link rel="stylesheet" href="/admin/console/console.css";
            }
            body {
                nav {
                    span.brand { "paynotify" }
                    @for (href, name) in nav {
                        @if *href == path {
                            a href=(href) aria-current="page" { (name) }
                        } @else {
                            a href=(href) { (name) }
                        }
                    }
                    @if viewer.signed_in() {
                        form.logout method="post" action="/admin/console/logout" {
                            (csrf_field(viewer))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    };
    secured(HttpResponse::Ok())
        .insert_header((CONTENT_TYPE, "text/html; charset=utf-8"))
        .body(markup.into_string())
}

/// The hidden field every form posts.
pub fn csrf_field(viewer: &Viewer) -> Markup {
    html! { input type="hidden" name="csrf" value=(viewer.csrf()); }
}

/// A button that posts to `action` (with the CSRF token).
pub fn post_button(viewer: &Viewer, action: &str, label: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            (csrf_field(viewer))
            button type="submit" { (label) }
        }
    }
}
