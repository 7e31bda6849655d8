//! Connecting: the kubeconfig `[kubernetes]` names, the credentials the requests carry, the
//! User-Agent the API server records writes under, and the count of requests by method.

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{ClusterError, Credentials};
use crate::api_error;
use crate::config::KubernetesConfig;
use crate::metrics::{KUBERNETES_REQUESTS, MethodLabels};

/// What oobfence's requests say they are; the API server records its writes under
/// `oobfence` (the part before the slash) in each object's managedFields.
pub const USER_AGENT: &str = concat!("oobfence/", env!("CARGO_PKG_VERSION"));

/// Builds a client from `[kubernetes]`.
pub async fn connect(cfg: &KubernetesConfig) -> Result<Client, ClusterError> {
    Ok(connect_with_credentials(cfg).await?.0)
}

/// Reads the kubeconfig `[kubernetes]` names (or the standard one) into kube's config.
pub async fn load_kube_config(cfg: &KubernetesConfig) -> Result<kube::Config, ClusterError> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..Default::default()
    };
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClusterError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|source| ClusterError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None if cfg.context.is_some() => {
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|source| ClusterError::Kubeconfig {
                    path: "$KUBECONFIG or ~/.kube/config".into(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(ClusterError::Infer)?,
    };
    Ok(config)
}

/// Builds the daemon's client from `[kubernetes]`, and the [`Credentials`] its requests carry:
/// a reload replaces the kubeconfig's inline token there, for every request from then on.
pub async fn connect_with_credentials(
    cfg: &KubernetesConfig,
) -> Result<(Client, Credentials), ClusterError> {
    let mut config = load_kube_config(cfg).await?;
    let credentials = Credentials::take_from(&mut config).map_err(ClusterError::Credentials)?;
    // The API server names a write's field manager after the User-Agent: without one,
    // oobfence's taints show in managedFields (and audit logs) as written by "unknown".
    config.headers.push((
        reqwest::header::USER_AGENT,
        reqwest::header::HeaderValue::from_static(USER_AGENT),
    ));
    let counted = tower::util::MapRequestLayer::new(|req: http::Request<kube::client::Body>| {
        KUBERNETES_REQUESTS
            .get_or_create(&MethodLabels {
                method: method_label(req.method()),
            })
            .inc();
        req
    });
    // Every failed connection names the API server and why (refused, DNS, TLS, timeout).
    let server = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let named = tower::util::MapErrLayer::new(move |e: tower::BoxError| -> tower::BoxError {
        match api_error::connection_cause(e.as_ref()) {
            Some(cause) => Box::new(api_error::Unreachable {
                server: server.clone(),
                cause,
            }),
            None => e,
        }
    });
    let carried = credentials.clone();
    let auth = tower::util::MapRequestLayer::new(move |req| carried.apply(req));
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(ClusterError::Client)?
        .with_layer(&named)
        .with_layer(&auth)
        .with_layer(&counted)
        .build();
    Ok((client, credentials))
}

fn method_label(m: &http::Method) -> &'static str {
    match *m {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        _ => "other",
    }
}
