//! Request latency, labelled by route pattern and a standard method, never by anything the
//! client chose.

use std::time::Instant;

use actix_web::HttpRequest;
use actix_web::dev::ServiceRequest;
use prometheus::HistogramVec;

use super::Metrics;

/// A started request: [`RequestTimer::observe`] records its latency under fixed labels.
pub struct RequestTimer {
    histograms: HistogramVec,
    method: &'static str,
    started: Instant,
}

impl RequestTimer {
    /// Records the latency under the route pattern `request` matched (`unmatched` for none,
    /// or without the request: an error instead of a response). Asked once the router has
    /// run: the pattern of the matched resource is then read from the request, where before
    /// routing the path would be matched against the whole route table a second time.
    pub fn observe(self, request: Option<&HttpRequest>) {
        let route = request.and_then(HttpRequest::match_pattern);
        let route = route.as_deref().unwrap_or(ROUTE_UNMATCHED);
        self.histograms
            .with_label_values(&[route, self.method])
            .observe(self.started.elapsed().as_secs_f64());
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
    /// Starts timing a request, labelled by its route pattern (or `unmatched`, see
    /// [`RequestTimer::observe`]) and method (a standard one, else `other`): never by
    /// anything the client chose.
    pub fn time_request(&self, req: &ServiceRequest) -> RequestTimer {
        RequestTimer {
            histograms: self.request_seconds.clone(),
            method: method_label(req.method()),
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
