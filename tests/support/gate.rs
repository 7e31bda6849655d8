//! A TCP relay on 127.0.0.1 that can be cut and restored: a BMC (or any server) that becomes
//! unreachable from oobfence, then reachable again, without touching the server itself.
//! While cut, every new connection is accepted and dropped at once, and the open ones are
//! closed: to a client, the peer is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

pub struct Gate {
    pub port: u16,
    upstream_port: u16,
    open: Arc<AtomicBool>,
    /// Bumped on every cut, so that connections opened before it end.
    epoch: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    /// A relay to `127.0.0.1:upstream_port`, open or cut from the start.
    pub async fn start(upstream_port: u16, open: bool) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Gate::serve(listener, upstream_port, open)
    }

    fn serve(listener: TcpListener, upstream_port: u16, open: bool) -> Gate {
        let port = listener.local_addr().unwrap().port();
        let is_open = Arc::new(AtomicBool::new(open));
        let epoch = Arc::new(AtomicU64::new(0));
        let (o, e) = (is_open.clone(), epoch.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    return;
                };
                if !o.load(Ordering::SeqCst) {
                    let _ = down.shutdown().await;
                    continue;
                }
                let (o, e) = (o.clone(), e.clone());
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                        return;
                    };
                    let started = e.load(Ordering::SeqCst);
                    let cut = async {
                        // Bounded: a relayed connection lives at most 10 minutes.
                        for _ in 0..6000 {
                            if !o.load(Ordering::SeqCst) || e.load(Ordering::SeqCst) != started {
                                return;
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        _ = cut => {}
                    }
                });
            }
        });
        Gate {
            port,
            upstream_port,
            open: is_open,
            epoch,
            task,
        }
    }

    pub fn base_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Cuts the relayed connections and closes the port: a new connection is refused, as by a
    /// BMC that lost its power (a cut gate accepts and drops it instead, which a TLS client
    /// reads as a handshake cut short, not as a peer that is gone).
    pub fn close(self) -> ClosedGate {
        self.cut();
        // Dropping aborts the accept loop, and with it the listening socket.
        ClosedGate {
            port: self.port,
            upstream_port: self.upstream_port,
        }
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// A gate's port, closed by [`Gate::close`].
pub struct ClosedGate {
    port: u16,
    upstream_port: u16,
}

impl ClosedGate {
    /// The gate open again on its old port: the BMC is back, at the address the config names.
    pub async fn reopen(self) -> Gate {
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("bind the closed gate's port again");
        Gate::serve(listener, self.upstream_port, true)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A copy of the test cluster's kubeconfig that reaches the API server through a [`Gate`].
pub async fn gated_kubeconfig(dir: &std::path::Path) -> (Gate, std::path::PathBuf) {
    let path = super::k8s::kubeconfig_path();
    let mut kc = kube::config::Kubeconfig::read_from(&path).expect("read the test kubeconfig");
    let cluster = kc.clusters[0].cluster.as_mut().expect("a cluster");
    let server = cluster.server.clone().expect("a server");
    let port: u16 = server
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let gate = Gate::start(port, true).await;
    cluster.server = Some(server.replace(&format!(":{port}"), &format!(":{}", gate.port)));
    let out = dir.join("gated.kubeconfig");
    // JSON is YAML: the daemon reads it as a kubeconfig.
    std::fs::write(&out, serde_json::to_string(&kc).unwrap()).unwrap();
    (gate, out)
}
