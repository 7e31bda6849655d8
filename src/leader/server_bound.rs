//! `[ha]`: writes that ask the API server to give up on them in time.
//!
//! Our side cuts every write off after `write_timeout`, but a request it gave up on may
//! already be at the API server, which goes on with it: without being told otherwise it
//! allows a write 34 s (30 s on older servers), longer than a lease. Every write of a leader
//! therefore carries the `timeout` parameter, which the API server's create, update, patch and
//! delete handlers honour: so a write started before the leader's deadline has landed or been
//! given up on by both sides within [`crate::config::HaConfig::write_settled_within`].

use std::time::Duration;

use kube::Client;

/// `inner`, except that every request but a GET carries `timeout=<limit>`.
pub fn server_bounded(inner: Client, limit: Duration) -> Client {
    // Seconds, as Go's time.ParseDuration reads them ("7.5s").
    let timeout = format!("timeout={}s", limit.as_secs_f64());
    let namespace = inner.default_namespace().to_string();
    let service = tower::service_fn(move |mut req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        if req.method() != http::Method::GET {
            let uri = req.uri().to_string();
            let joined = if uri.contains('?') { '&' } else { '?' };
            if let Ok(bounded) = format!("{uri}{joined}{timeout}").parse() {
                *req.uri_mut() = bounded;
            }
        }
        async move { inner.send(req).await }
    });
    Client::new(service, namespace)
}
