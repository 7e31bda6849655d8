//! `[kubernetes] node_selector`: checked at load the way the API server parses a label
//! selector (k8s.io/apimachinery `labels.Parse`), so that a typo is a config error naming the
//! requirement, not a watch that fails with HTTP 400 after the daemon started.

/// Checks a label selector: requirements separated by commas, each `key`, `!key`, `key=value`,
/// `key==value`, `key!=value`, `key in (v1,v2)`, `key notin (v1,v2)`, `key>N` or `key<N`.
pub fn check(selector: &str) -> Result<(), String> {
    for requirement in split_top_level(selector)? {
        check_requirement(requirement.trim())
            .map_err(|problem| format!("{problem} in requirement {:?}", requirement.trim()))?;
    }
    Ok(())
}

/// Splits at the commas outside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("a ')' without its '('".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '(' without its ')'".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn check_requirement(r: &str) -> Result<(), String> {
    if r.is_empty() {
        return Err("an empty requirement (a stray comma?)".into());
    }
    if let Some(key) = r.strip_prefix('!') {
        return check_key(key.trim());
    }
    // Set-based: `key in (...)`, `key notin (...)`.
    if let Some(open) = r.find('(') {
        let head = r[..open].trim_end();
        let Some(close) = r.rfind(')').filter(|c| r[c + 1..].trim().is_empty()) else {
            return Err("text after the closing ')'".into());
        };
        let (key, op) = match head.rsplit_once(char::is_whitespace) {
            Some((key, op)) => (key.trim(), op),
            None => return Err("expected `KEY in (VALUES)` or `KEY notin (VALUES)`".into()),
        };
        if op != "in" && op != "notin" {
            return Err(format!("unknown operator {op:?} (in, notin)"));
        }
        check_key(key)?;
        for v in r[open + 1..close].split(',') {
            check_value(v.trim())?;
        }
        return Ok(());
    }
    for op in ["!=", "==", "=", ">", "<"] {
        if let Some((key, value)) = r.split_once(op) {
            check_key(key.trim())?;
            let value = value.trim();
            if matches!(op, ">" | "<") {
                value
                    .parse::<i64>()
                    .map_err(|_| format!("{value:?} after {op:?} is not an integer"))?;
                return Ok(());
            }
            return check_value(value);
        }
    }
    if r.split_whitespace().count() > 1 {
        return Err(
            "expected an operator (=, ==, !=, in, notin, >, <) between key and value".into(),
        );
    }
    check_key(r)
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "label key prefix {p:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.')"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!("label key {key:?} has no name"));
    }
    check_name_chars(name).map_err(|why| format!("label key {key:?} {why}"))
}

/// A label value: empty, or at most 63 name characters.
fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name_chars(value).map_err(|why| format!("label value {value:?} {why}"))
}

fn check_name_chars(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("is longer than 63 characters".into());
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || !edge_ok(s.chars().next())
        || !edge_ok(s.chars().last())
    {
        return Err(
            "must be letters, digits, '-', '_' or '.', and begin and end with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn selectors_the_api_server_accepts_pass() {
        for s in [
            "topology.kubernetes.io/zone=dc1",
            "zone==dc1,role!=gpu",
            "oobfence.io/managed",
            "!node-role.kubernetes.io/control-plane",
            "zone in (dc1, dc2),tier notin (edge)",
            "rack>3,rack<10",
            "zone=",
        ] {
            assert_eq!(check(s), Ok(()), "{s}");
        }
    }

    #[test]
    fn malformed_selectors_say_what_is_wrong() {
        for (s, says) in [
            ("zone=dc1,", "empty requirement"),
            ("zone = dc 1", "label value \"dc 1\""),
            ("zone in (dc1", "'(' without"),
            ("zone in dc1)", "')' without"),
            ("zone is (dc1)", "unknown operator \"is\""),
            ("Zone.Example/zone=dc1", "prefix \"Zone.Example\""),
            ("zone=-dc1", "begin and end"),
            ("rack>three", "not an integer"),
            ("zone dc1", "expected an operator"),
        ] {
            let e = check(s).expect_err(s);
            assert!(e.contains(says), "{s}: {e}");
        }
    }
}
