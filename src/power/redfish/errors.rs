//! What went wrong on the way to an answer: a transport failure classified from the error
//! chain (TLS, timeout, refused, credentials), a status line, and text from the BMC quoted
//! short and escaped.

use std::error::Error as StdError;
use std::io;

use reqwest::StatusCode;

use super::QUOTE_CHARS;
use crate::power::{PowerState, ReadErrorKind};

/// Maps a transport failure to an error kind, from the reqwest/hyper/rustls error chain.
pub(super) fn classify(err: reqwest::Error, path: &str) -> PowerState {
    let err = err.without_url();
    let chain = error_chain(&err);
    let mut io_kinds = Vec::new();
    // rustls' own words for a TLS failure print Unix seconds and enum names: said again in
    // words and dates where oobfence knows better (crate::pinning::tls_error_text).
    let mut tls_words: Option<String> = None;
    visit_chain(&err, &mut |e| {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            io_kinds.push(io.kind());
        }
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            tls_words = tls_words
                .take()
                .or_else(|| crate::pinning::tls_error_text(tls));
        }
    });
    let chain = tls_words.unwrap_or(chain);
    let has = |k: io::ErrorKind| io_kinds.contains(&k);
    let (kind, what) = if err.is_timeout() || has(io::ErrorKind::TimedOut) {
        (ReadErrorKind::Timeout, "timed out")
    } else if err.is_connect() {
        if has(io::ErrorKind::InvalidData) || mentions_tls(&chain) {
            // rustls reports handshake and certificate failures as InvalidData.
            (ReadErrorKind::Tls, "TLS handshake failed")
        } else if has(io::ErrorKind::UnexpectedEof)
            || has(io::ErrorKind::ConnectionReset)
            || has(io::ErrorKind::ConnectionAborted)
        {
            // TCP was up and the peer dropped it before TLS was established.
            (
                ReadErrorKind::Tls,
                "connection closed during the TLS handshake",
            )
        } else {
            (ReadErrorKind::Unreachable, "cannot connect")
        }
    } else if has(io::ErrorKind::InvalidData) && mentions_tls(&chain) {
        (ReadErrorKind::Tls, "TLS failure")
    } else if err.is_body() || err.is_decode() {
        (ReadErrorKind::Protocol, "reply body broken")
    } else {
        (ReadErrorKind::Protocol, "request failed")
    };
    PowerState::error(kind, format!("GET {path}: {what}: {chain}"))
}

fn mentions_tls(chain: &str) -> bool {
    let lower = chain.to_ascii_lowercase();
    ["certificate", "tls", "handshake", "alert"]
        .iter()
        .any(|w| lower.contains(w))
}

/// Calls `f` on an error and everything behind it. `io::Error::source` skips the error an
/// `io::Error` wraps (where rustls puts its own), so that one is visited through `get_ref`.
fn visit_chain<'a>(
    err: &'a (dyn StdError + 'static),
    f: &mut dyn FnMut(&'a (dyn StdError + 'static)),
) {
    let mut cur: Option<&'a (dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        f(e);
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            visit_chain(inner, f);
        }
        cur = e.source();
    }
}

/// `a: b: c` from an error and its sources, without repeats, bounded in length.
pub(super) fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        let text = e.to_string();
        // Wrapper messages that say nothing an operator can act on.
        let noise = matches!(
            text.as_str(),
            "error sending request" | "client error (Connect)"
        );
        if !noise && !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = e.source();
    }
    truncate(&parts.join(": "), 300)
}

pub(super) fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// A short, escaped quotation of text that came from the BMC.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    let mut chars = s.chars();
    for c in chars.by_ref().take(QUOTE_CHARS) {
        out.extend(c.escape_debug());
    }
    out.push('"');
    if chars.next().is_some() {
        out.push_str("...");
    }
    out
}

pub(super) fn quote_bytes(body: &[u8]) -> String {
    let head = &body[..body.len().min(QUOTE_CHARS * 4)];
    quote(&String::from_utf8_lossy(head))
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}
