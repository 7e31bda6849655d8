//! A client of the real API server whose Lease GETs can be held up on their way there: a slow
//! network, or a slow API server, for one client only, without touching the server. A held
//! GET reaches the server late, so it reads what was written while it waited.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use tokio::sync::Notify;

pub struct SlowApi {
    pub client: Client,
    /// How long the next Lease GET waits before it goes out.
    next_get: Arc<Mutex<Option<Duration>>>,
    /// Told when a GET starts waiting.
    held: Arc<Notify>,
}

impl SlowApi {
    pub fn new(inner: Client) -> SlowApi {
        let next_get: Arc<Mutex<Option<Duration>>> = Arc::default();
        let held = Arc::new(Notify::new());
        let (n, h) = (next_get.clone(), held.clone());
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (inner, n, h) = (inner.clone(), n.clone(), h.clone());
            async move {
                let lease_get =
                    req.method() == http::Method::GET && req.uri().path().contains("/leases/");
                let wait = if lease_get {
                    n.lock().unwrap().take()
                } else {
                    None
                };
                if let Some(d) = wait {
                    h.notify_one();
                    tokio::time::sleep(d).await;
                }
                inner.send(req).await
            }
        });
        SlowApi {
            client: Client::new(service, "default"),
            next_get,
            held,
        }
    }

    /// The next Lease GET waits `d` before it goes out.
    pub fn hold_next_lease_get(&self, d: Duration) {
        *self.next_get.lock().unwrap() = Some(d);
    }

    /// Returns once a held GET has started waiting (at most `limit`).
    pub async fn until_held(&self, limit: Duration) {
        tokio::time::timeout(limit, self.held.notified())
            .await
            .expect("no Lease GET was held");
    }
}
