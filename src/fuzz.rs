//! Fuzz-style tests on stable Rust, shared by every parser's tests: arbitrary bytes, and
//! structure-aware mutations of real samples (bytes replaced, inserted, removed, the text cut
//! short), through `proptest`.
//!
//! `OOBFENCE_FUZZ_CASES` sets the cases per parser: 512 by default, so the test command stays
//! quick; a long local run uses `OOBFENCE_FUZZ_CASES=1000000 cargo test --lib fuzz_`.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// The proptest configuration for one parser's fuzz test.
pub fn config() -> Config {
    let cases = std::env::var("OOBFENCE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    Config {
        cases,
        // Failures are shrunk and printed; nothing is written next to the sources.
        failure_persistence: None,
        ..Config::default()
    }
}

/// One edit of a sample.
#[derive(Clone, Debug)]
enum Edit {
    Replace(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
    /// Repeat a slice (duplicated keys, doubled braces).
    Repeat(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Edit::Repeat(i, n)),
    ]
}

fn apply(mut v: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = v.len();
        match *e {
            Edit::Replace(i, b) if len > 0 => v[i % len] = b,
            Edit::Insert(i, b) => v.insert(i % (len + 1), b),
            Edit::Remove(i) if len > 0 => {
                v.remove(i % len);
            }
            Edit::Truncate(i) => v.truncate(i % (len + 1)),
            Edit::Repeat(i, n) if len > 0 => {
                let start = i % len;
                let end = (start + n).min(len);
                let piece = v[start..end].to_vec();
                v.splice(end..end, piece);
            }
            _ => {}
        }
    }
    v
}

/// Bytes that are either arbitrary or `sample` with up to eight edits.
pub fn bytes_like(sample: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..512),
        4 => proptest::collection::vec(edit(), 0..8)
            .prop_map(move |edits| apply(sample.to_vec(), &edits)),
    ]
}

/// Text made the same way (invalid UTF-8 replaced), for parsers that take `&str`.
pub fn text_like(sample: &'static str) -> impl Strategy<Value = String> {
    bytes_like(sample.as_bytes()).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}
