//! The page shell every console page is drawn in: the navigation, the signed-in viewer's
//! sign-out, and the forms' CSRF field.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use maud::{Markup, html};

use super::auth::Viewer;
use super::html::document;

/// A console page: the navigation `nav` (its entry for `path` marked), then `body`.
pub fn page(
    viewer: &Viewer,
    nav: &[(&str, &str)],
    path: &str,
    title: &str,
    body: Markup,
) -> HttpResponse {
    let content = html! {
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
    };
    document(StatusCode::OK, title, content)
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
