//! What a failed EC2 call says: the deadline, the SDK's error mapped to an error kind, and
//! its error chain for the detail.

use std::time::Duration;

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};

use crate::power::{PowerState, ReadErrorKind};

pub(super) async fn bounded<T, E>(
    limit: Duration,
    call: impl Future<Output = Result<T, SdkError<E>>>,
) -> Result<T, PowerState>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(limit + Duration::from_millis(500), call).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(sdk_error(&e)),
        Err(_) => Err(PowerState::error(
            ReadErrorKind::Timeout,
            format!("EC2 did not answer within {limit:?}"),
        )),
    }
}

fn sdk_error<E>(e: &SdkError<E>) -> PowerState
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match e {
        SdkError::TimeoutError(_) => {
            PowerState::error(ReadErrorKind::Timeout, "EC2 call timed out")
        }
        SdkError::DispatchFailure(d) => {
            let kind = if d.is_timeout() {
                ReadErrorKind::Timeout
            } else {
                ReadErrorKind::Unreachable
            };
            PowerState::error(kind, format!("cannot reach EC2: {}", chain(e)))
        }
        SdkError::ServiceError(s) => {
            let err = s.err();
            let code = err.code().unwrap_or("unknown");
            let kind = match code {
                "AuthFailure"
                | "UnauthorizedOperation"
                | "InvalidClientTokenId"
                | "SignatureDoesNotMatch"
                | "ExpiredToken" => ReadErrorKind::Auth,
                _ => ReadErrorKind::Protocol,
            };
            let msg = err.message().unwrap_or_default();
            PowerState::error(
                kind,
                format!("EC2 {code} (HTTP {}): {msg}", s.raw().status().as_u16()),
            )
        }
        SdkError::ResponseError(_) => PowerState::error(
            ReadErrorKind::BadReply,
            format!("EC2 reply unreadable: {}", chain(e)),
        ),
        _ => {
            let text = chain(e);
            let kind = if text.contains("credential") {
                ReadErrorKind::Auth
            } else {
                ReadErrorKind::Config
            };
            PowerState::error(kind, format!("EC2 call failed: {text}"))
        }
    }
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}
