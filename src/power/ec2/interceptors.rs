//! The SDK's interceptors: every attempt and every throttle counted ([`Ec2Stats`]), and the
//! access key id each call was signed with (so a reader names the credentials it used).

use std::sync::Arc;

use aws_sdk_ec2::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ec2::error::BoxError;
use prometheus_client::metrics::counter::Counter;

/// Request and throttle counts. They are Prometheus counters so the daemon can register the
/// same ones it hands to the reader.
#[derive(Default, Debug, Clone)]
pub struct Ec2Stats {
    pub describe_instances_calls: Counter,
    pub describe_volumes_calls: Counter,
    /// HTTP attempts, retries included.
    pub attempts: Counter,
    /// Attempts answered with a throttling status (503 RequestLimitExceeded, 429).
    pub throttled: Counter,
}

#[derive(Debug)]
pub(super) struct CountAttempts(pub(super) Arc<Ec2Stats>);

impl Intercept for CountAttempts {
    fn name(&self) -> &'static str {
        "oobfence::CountAttempts"
    }

    fn read_after_transmit(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.attempts.inc();
        let status = context.response().status().as_u16();
        if status == 503 || status == 429 {
            self.0.throttled.inc();
        }
        Ok(())
    }
}

/// Records the access key id one call was signed with (the `Credential=` of its Authorization
/// header, as sent): the SDK re-reads a credentials file while it runs, so only the request
/// itself tells which credentials, and so which account, an answer came from.
#[derive(Debug, Clone, Default)]
pub(super) struct SignedWith(pub(super) Arc<std::sync::Mutex<Vec<Option<String>>>>);

impl SignedWith {
    /// The one key every attempt of the call was signed with; `None` when unsigned, unknown
    /// or not the same across attempts.
    pub(super) fn key(&self) -> Option<String> {
        let keys = self.0.lock().map(|k| k.clone()).unwrap_or_default();
        let first = keys.first()?.clone()?;
        keys.iter()
            .all(|k| k.as_deref() == Some(first.as_str()))
            .then_some(first)
    }
}

impl Intercept for SignedWith {
    fn name(&self) -> &'static str {
        "oobfence::SignedWith"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let key = context
            .request()
            .headers()
            .get("authorization")
            .and_then(signing_key_id)
            .map(String::from);
        if let Ok(mut keys) = self.0.lock() {
            keys.push(key);
        }
        Ok(())
    }
}

/// The access key id in a SigV4 Authorization header
/// (`AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/ec2/aws4_request, ...`).
pub fn signing_key_id(authorization: &str) -> Option<&str> {
    let start = authorization.find("Credential=")? + "Credential=".len();
    authorization[start..]
        .split('/')
        .next()
        .filter(|k| !k.is_empty() && !k.contains([',', ' ']))
}
