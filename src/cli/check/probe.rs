//! `probe`: one node's power source, read now, from the config alone.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::cli::{fail, load};
use crate::cluster::ApiError;
use crate::daemon;
use crate::power::{MappedSource, PowerSources};

pub(in crate::cli) async fn probe(
    path: &Path,
    node: &str,
    json: bool,
) -> Result<ExitCode, ExitCode> {
    let cfg = Arc::new(load(path)?);
    let sources = PowerSources::new(cfg.clone(), Default::default()).await;
    // Only an EC2-mapped node needs the cluster (its providerID); a BMC is in the config.
    let provider_id = if sources.needs_node_data(node) {
        let client = daemon::client_for(&cfg).await.map_err(fail)?;
        let n = Api::<Node>::all(client).get(node).await.map_err(|e| {
            fail(format!(
                "cannot read node {node} for its providerID: {}",
                ApiError(&e)
            ))
        })?;
        n.spec.and_then(|s| s.provider_id)
    } else {
        None
    };
    let Some(MappedSource { source, deadline }) = sources.for_node(node, provider_id.as_deref())
    else {
        return Err(fail(format!(
            "no [[bmc]] entry or [aws] nodes pattern in {} matches node {node:?}",
            path.display()
        )));
    };
    let r = daemon::read_once(&source, deadline).await;
    // A Redfish session is logged out now, not left to the BMC's timeout (its slots are few).
    sources.close_sessions().await;
    let mut out = format!(
        "{node}: {} ({} {}, {:.3}s)",
        r.state,
        source.backend(),
        source.address(),
        r.latency.as_secs_f64()
    );
    out.push_str(&format!("\n  identity: {}", r.identity));
    let transport = source.transport().await;
    if let Some(transport) = &transport {
        out.push_str(&format!("\n  transport: {transport}"));
    }
    for d in &r.details {
        out.push_str(&format!("\n  {d}"));
    }
    let failed = matches!(r.state, crate::power::PowerState::Error { .. });
    if json {
        // The reading as the journal records it (state, latency, identity, details), and
        // where it was read; the exit code is the text form's.
        let doc = serde_json::json!({
            "node": node,
            "backend": source.backend(),
            "address": source.address(),
            "transport": transport,
            "reading": &r,
        });
        println!("{}", serde_json::to_string_pretty(&doc).map_err(fail)?);
        return Ok(if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    if failed {
        return Err(fail(out));
    }
    println!("{out}");
    Ok(ExitCode::SUCCESS)
}
