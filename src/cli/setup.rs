//! Setting oobfence up: `make-kubeconfig` (a ServiceAccount token for the daemon, written as
//! a kubeconfig).

use std::process::ExitCode;

use super::fail;

pub(super) async fn make_kubeconfig(
    req: &crate::kubeconfig::Request,
) -> Result<ExitCode, ExitCode> {
    use crate::kubeconfig::MintError;
    let minted = crate::kubeconfig::make(req).await.map_err(|e| match e {
        MintError::TooShort(_) => {
            eprintln!("oobfence: {e}");
            ExitCode::from(2)
        }
        e => fail(e),
    })?;
    println!(
        "{}: kubeconfig for ServiceAccount {}/{}, token valid until {}",
        req.output.display(),
        req.namespace,
        req.service_account,
        minted.expires
    );
    if let Some((asked, got)) = minted.shortened {
        // Whole hours as a token's duration is usually written ("8760h"), else minutes.
        let minutes = |d: std::time::Duration| {
            let m = (d.as_secs() + 30) / 60;
            if m.is_multiple_of(60) {
                format!("{}h", m / 60)
            } else {
                format!("{m}m")
            }
        };
        eprintln!(
            "oobfence: warning: asked for a token valid {}, the API server issued one valid {} \
             (its --service-account-max-token-expiration caps them): mint a new one and reload \
             (systemctl reload) before {}; the OobfenceKubeconfigTokenExpiring alert warns ahead",
            minutes(asked),
            minutes(got),
            minted.expires
        );
    }
    for p in &minted.excess {
        eprintln!(
            "oobfence: warning: this ServiceAccount may {p}, which oobfence never needs: \
             it is bound to more than deploy/rbac.yaml grants"
        );
    }
    if !minted.missing.is_empty() {
        for p in &minted.missing {
            eprintln!("oobfence: this ServiceAccount may not {p}");
        }
        return Err(fail(
            "the token lacks permissions the daemon needs: apply deploy/rbac.yaml, then the \
             same kubeconfig works (no need to mint a new one)",
        ));
    }
    println!(
        "install it on the management host: install -m 0640 -g oobfence {} /etc/oobfence/DC.kubeconfig",
        req.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
