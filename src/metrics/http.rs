//! Request latency, labelled by route pattern and a standard method, never by anything the
//! client chose.

use std::time::Instant;

use actix_web::dev::ServiceRequest;
use prometheus::Histogram;

use super::Metrics;

/// A started request: [`RequestTimer::observe`] records its latency under fixed labels.
pub struct RequestTimer {
    histogram: Histogram,
    started: Instant,
}

impl RequestTimer {
    pub fn observe(self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// The `route` label of a request that matched no registered route.
pub const ROUTE_UNMATCHED: &str = "unmatched";

/// The `method` label: one of the nine standard methods, else `other`. A made-up method
/// (`FOO`, `get`, …) must never become a label value of its own.
pub fn method_label(method: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

impl Metrics {
    /// Starts timing a request, labelled by its route pattern (or `unmatched`) and method
    /// (a standard one, else `other`): never by anything the client chose.
    pub fn time_request(&self, req: &ServiceRequest) -> RequestTimer {
        let route = req.match_pattern();
        let route = route.as_deref().unwrap_or(ROUTE_UNMATCHED);
        RequestTimer {
            histogram: self
                .request_seconds
                .with_label_values(&[route, method_label(req.method())]),
            started: Instant::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::Method;

    #[test]
    fn only_standard_methods_become_labels() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::POST), "POST");
        for made_up in ["FOO", "get", "Post", "X-1", "PROPFIND"] {
            let method = Method::from_bytes(made_up.as_bytes()).expect("a valid token");
            assert_eq!(method_label(&method), "other", "{made_up}");
        }
    }
}
