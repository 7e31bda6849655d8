//! Where in the file a key is: the TOML read with its spans, each section deserialized on its
//! own (so one bad section does not hide the errors of the others), every error given the line
//! of its key, and serde's wording turned into an operator's (an unknown key with the known key
//! it is nearest to).

use std::collections::HashMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use super::ConfigError;

/// The line of every key and array entry of a file, by dotted path (`policy.confirm_reads`,
/// `bmc[3]`, `bmc[3].address`).
#[derive(Debug, Default)]
pub(super) struct Lines {
    /// Byte offset at which each line starts.
    starts: Vec<usize>,
    keys: HashMap<String, usize>,
}

impl Lines {
    pub(super) fn new(text: &str) -> Lines {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Lines {
            starts,
            keys: HashMap::new(),
        }
    }

    /// The 1-based line of a byte offset.
    pub(super) fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset).max(1)
    }

    /// Records the line of every key under `table`, whose path is `prefix`.
    pub(super) fn index(&mut self, prefix: &str, table: &DeTable<'_>) {
        for (k, v) in table {
            let path = join(prefix, k.get_ref());
            self.keys.insert(path.clone(), self.line_of(k.span().start));
            self.index_value(&path, v);
        }
    }

    fn index_value(&mut self, path: &str, v: &Spanned<DeValue<'_>>) {
        match v.get_ref() {
            DeValue::Table(t) => self.index(path, t),
            DeValue::Array(a) => {
                for (i, item) in a.iter().enumerate() {
                    let p = format!("{path}[{i}]");
                    let line = self.line_of(item.span().start);
                    self.keys.entry(p.clone()).or_insert(line);
                    self.index_value(&p, item);
                }
            }
            _ => {}
        }
    }

    /// The line of `key`, or of the nearest enclosing key or entry written in the file (a
    /// missing `bmc[3].address` is on the line of `[[bmc]]` entry 3).
    pub(super) fn lookup(&self, key: &str) -> Option<usize> {
        let mut k = key;
        loop {
            if let Some(&l) = self.keys.get(k) {
                return Some(l);
            }
            k = &k[..k.rfind(['.', '['])?];
        }
    }

    /// Sets the line of every error that has none from its key.
    pub(super) fn locate(&self, errors: &mut [ConfigError]) {
        for e in errors.iter_mut().filter(|e| e.line.is_none()) {
            e.line = self.lookup(&e.key);
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Deserializes one value of the file (a section, one `[[bmc]]` entry) as `T`; on failure,
/// records its errors (their keys under `prefix`, their lines) and returns `None`. A key in
/// error is taken out and the rest read again, so that each of its keys in error is reported,
/// not only the first.
pub(super) fn section<T: DeserializeOwned>(
    value: &Spanned<DeValue<'_>>,
    prefix: &str,
    path: &Path,
    lines: &Lines,
    errors: &mut Vec<ConfigError>,
) -> Option<T> {
    let mut value = value.clone();
    let mut failed = false;
    // A table has a few dozen keys at most: each pass takes one out.
    for _ in 0..64 {
        let e = match serde_path_to_error::deserialize(ValueDeserializer::from(value.clone())) {
            Ok(v) => return (!failed).then_some(v),
            Err(e) => e,
        };
        let message = e.inner().message().trim().to_string();
        // Once a key is out, a required one reads as missing: that is not the file's error.
        if failed && message.starts_with("missing field") {
            return None;
        }
        failed = true;
        let sub = e.path().to_string();
        let key = match sub.as_str() {
            "." => prefix.to_string(),
            s if s.starts_with('[') => format!("{prefix}{s}"),
            s => join(prefix, s),
        };
        let line = e
            .inner()
            .span()
            .map(|s| lines.line_of(s.start))
            .or_else(|| lines.lookup(&key));
        errors.push(ConfigError {
            file: path.to_owned(),
            key,
            line,
            problem: plain(&message),
        });
        let segments: Vec<String> = e
            .path()
            .iter()
            .map(|s| match s {
                serde_path_to_error::Segment::Map { key } => key.clone(),
                other => other.to_string(),
            })
            .collect();
        if !remove(&mut value, &segments) {
            return None;
        }
    }
    None
}

/// Takes the key at `path` (table keys) out of `value`; `false` when there is none.
fn remove(value: &mut Spanned<DeValue<'_>>, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut v = value;
    for p in parents {
        let DeValue::Table(t) = v.get_mut() else {
            return false;
        };
        let Some(next) = t.get_mut(p.as_str()) else {
            return false;
        };
        v = next;
    }
    match v.get_mut() {
        DeValue::Table(t) => t.remove(last.as_str()).is_some(),
        _ => false,
    }
}

/// serde's and toml's words in an operator's: an unknown key or value names the nearest known
/// one, Rust type names become what to write.
pub(super) fn plain(message: &str) -> String {
    for (what, word) in [("unknown field", "key"), ("unknown variant", "value")] {
        if let Some(rest) = message.strip_prefix(what) {
            let quoted = backquoted(rest);
            let Some((given, known)) = quoted.split_first() else {
                break;
            };
            let list = known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let accepted = if known.is_empty() {
                "this table takes no keys".to_string()
            } else if word == "key" {
                format!("this table's keys are {list}")
            } else {
                format!("accepted values: {list}")
            };
            return match nearest(given, known) {
                Some(near) => {
                    format!("unknown {word} `{given}`: did you mean {near}? ({accepted})")
                }
                None => format!("unknown {word} `{given}` ({accepted})"),
            };
        }
    }
    let mut out = message.replace("missing field", "missing key");
    for (rust, words) in [
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u32", "expected a whole number of 0 or more"),
        ("expected u64", "expected a whole number of 0 or more"),
        ("expected usize", "expected a whole number of 0 or more"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
    ] {
        if out.ends_with(rust) {
            out = format!("{}{words}", &out[..out.len() - rust.len()]);
        }
    }
    out
}

/// The `quoted` words of a serde message, in order.
fn backquoted(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

/// The known names nearest to a mistyped one, quoted (`` `a` `` or `` `a` or `b` ``), if any
/// is near enough to be what was meant: a few letters off (`confirm_read`), or one word of
/// a longer key (`password`: `password_file` or `password_credential`).
pub(super) fn nearest(given: &str, known: &[&str]) -> Option<String> {
    let given_l = given.to_ascii_lowercase().replace('-', "_");
    let close = known
        .iter()
        .map(|k| {
            let d = strsim::damerau_levenshtein(&given_l, &k.to_ascii_lowercase());
            (d, *k)
        })
        .filter(|(d, k)| *d <= 2.max(k.len() / 4) && *d < k.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| vec![k]);
    let words = || {
        let found: Vec<&str> = known
            .iter()
            .copied()
            .filter(|k| {
                given_l.len() >= 3
                    && (k.starts_with(&format!("{given_l}_"))
                        || k.ends_with(&format!("_{given_l}")))
            })
            .collect();
        (!found.is_empty() && found.len() <= 3).then_some(found)
    };
    close.or_else(words).map(|found| {
        found
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(" or ")
    })
}

/// A TOML syntax error: its line, and the key a duplicate-key error is about.
pub(super) fn syntax_error(e: &toml::de::Error, text: &str, path: &Path) -> ConfigError {
    let lines = Lines::new(text);
    let span = e.span();
    let mut problem = e.message().trim().to_string();
    if problem == "duplicate key"
        && let Some(s) = &span
        && let Some(key) = text.get(s.clone())
    {
        problem = format!(
            "duplicate key `{}`: it is already set above in the same table (each key once per table)",
            key.trim()
        );
    }
    ConfigError {
        file: path.to_owned(),
        key: String::new(),
        line: span.map(|s| lines.line_of(s.start)),
        problem: format!(
            "invalid TOML: {problem} (nothing else in the file is checked until this is fixed)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_names_the_nearest_known_one() {
        let m = plain(
            "unknown field `confirm_read`, expected one of `not_ready_grace`, `confirm_reads`, `dry_run`",
        );
        assert!(
            m.starts_with("unknown key `confirm_read`: did you mean `confirm_reads`?"),
            "{m}"
        );
        let m = plain(
            "unknown field `password`, expected one of `username`, `password_file`, `password_credential`",
        );
        assert!(
            m.contains("did you mean `password_file` or `password_credential`?"),
            "{m}"
        );
        let m = plain("unknown field `zzzzzz`, expected `a` or `b`");
        assert_eq!(m, "unknown key `zzzzzz` (this table's keys are `a`, `b`)");
    }

    #[test]
    fn lines_of_offsets() {
        let l = Lines::new("a\nb\n\nc");
        assert_eq!(l.line_of(0), 1);
        assert_eq!(l.line_of(2), 2);
        assert_eq!(l.line_of(5), 4);
    }
}
