//! The crate's modules import one another without a circle, level by level: among the modules
//! of one parent (the crate's top-level modules; the files of `daemon/`; ...), one that uses
//! another is never, through any chain of uses, used by it. A circle is concerns that cannot
//! be read, tested or changed apart; the shared piece belongs where both can use it. A module
//! and its own children may use each other (a parent builds from its parts, which share its
//! types): that is one concern, split into files.
//!
//! Read from the source: each `src/` file is a module, and a path it names — `crate::a::b`,
//! `super::x`, `self::x` or one of its own child modules — is a use of the longest module that
//! path starts with. A use of `a::x::y` by `b::z` is, one level up, a use of `a` by `b`. Unit
//! tests (`mod tests` blocks and files) are left out: a test may use anything. Comments are
//! left out too (a doc link is no dependency).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every module of the crate, by path (`daemon::pass`; the crate root is ""), and its file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("read src/").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("lib" | "main" | "mod")
            ) {
                parts.pop();
            }
            found.insert(parts.join("::"), path);
        }
    }
    found
}

/// The source without comments, string literals and unit-test modules.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<usize> = None;
    let mut depth = 0usize;
    let mut pending_cfg_test = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let trimmed = code.trim();
        if trimmed.starts_with("#[cfg(test)]") {
            pending_cfg_test = true;
            continue;
        }
        if pending_cfg_test && trimmed.starts_with("mod ") && skip_depth.is_none() {
            pending_cfg_test = false;
            if trimmed.ends_with(';') {
                continue;
            }
            skip_depth = Some(depth);
        } else if !trimmed.is_empty() && !trimmed.starts_with("#[") {
            pending_cfg_test = false;
        }
        let mut kept = String::new();
        let mut in_string = false;
        let mut prev = ' ';
        for ch in code.chars() {
            if ch == '"' && prev != '\\' {
                in_string = !in_string;
            } else if !in_string {
                kept.push(ch);
            }
            prev = ch;
        }
        depth += kept.matches('{').count();
        depth = depth.saturating_sub(kept.matches('}').count());
        match skip_depth {
            Some(d) if depth <= d && kept.contains('}') => skip_depth = None,
            Some(_) => {}
            None => {
                out.push_str(&kept);
                out.push('\n');
            }
        }
    }
    out
}

/// The path expressions of `code` that start with `crate`, `super`, `self` or one of `heads`,
/// with each item of a `{...}` group as a path of its own.
fn paths_in(code: &str, heads: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == ':')) {
            i += 1;
            continue;
        }
        // A path: ident(::ident)* and maybe ::{group}.
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            segs.push(bytes[start..j].iter().collect::<String>());
            if j + 2 < bytes.len() && bytes[j] == ':' && bytes[j + 1] == ':' {
                j += 2;
                if bytes[j] == '{' {
                    let end = (j..bytes.len()).find(|&k| bytes[k] == '}').unwrap_or(j);
                    let group: String = bytes[j + 1..end].iter().collect();
                    if !segs.is_empty() && is_head(&segs[0], heads) {
                        for item in group.split(',') {
                            let first = item.trim().split("::").next().unwrap_or("").trim();
                            let first = first.split_whitespace().next().unwrap_or("");
                            let mut p = segs.clone();
                            if !first.is_empty() && first != "self" {
                                p.push(first.to_string());
                            }
                            paths.push(p);
                        }
                    }
                    j = end;
                    segs.clear();
                    break;
                }
                if j < bytes.len() && ident(bytes[j]) {
                    continue;
                }
            }
            break;
        }
        if segs.len() > 1 && is_head(&segs[0], heads) {
            paths.push(segs);
        }
        i = j.max(i + 1);
    }
    paths
}

fn is_head(first: &str, heads: &BTreeSet<String>) -> bool {
    matches!(first, "crate" | "super" | "self") || heads.contains(first)
}

/// Each module's uses of other modules.
fn uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let is_test = file.file_name().is_some_and(|f| f == "tests.rs")
            || file.components().any(|c| c.as_os_str() == "tests");
        if is_test {
            continue;
        }
        let here: Vec<String> = if module.is_empty() {
            Vec::new()
        } else {
            module.split("::").map(String::from).collect()
        };
        // Its child modules, which it names without a prefix.
        let children: BTreeSet<String> = modules
            .keys()
            .filter_map(|m| {
                let rest = if module.is_empty() {
                    Some(m.as_str())
                } else {
                    m.strip_prefix(module.as_str())?.strip_prefix("::")
                };
                rest.filter(|r| !r.is_empty() && !r.contains("::"))
                    .map(String::from)
            })
            .collect();
        let text = std::fs::read_to_string(file).expect("read a source file");
        for path in paths_in(&code_of(&text), &children) {
            let mut resolved: Vec<String> = match path[0].as_str() {
                "crate" => Vec::new(),
                "super" => here[..here.len().saturating_sub(1)].to_vec(),
                _ => here.clone(),
            };
            let rest = if matches!(path[0].as_str(), "crate" | "super" | "self") {
                &path[1..]
            } else {
                &path[..]
            };
            for seg in rest {
                if seg == "super" {
                    resolved.pop();
                } else {
                    resolved.push(seg.clone());
                }
            }
            let target = (0..=resolved.len())
                .rev()
                .map(|n| resolved[..n].join("::"))
                .find(|m| modules.contains_key(m));
            if let Some(target) = target
                && &target != module
            {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// Each use between modules that are not one another's ancestor, as a use between the two
/// children of their nearest common ancestor that contain them (siblings).
fn between_siblings(
    edges: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let split = |m: &str| -> Vec<String> {
        if m.is_empty() {
            Vec::new()
        } else {
            m.split("::").map(String::from).collect()
        }
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in edges {
        let f = split(from);
        for to in tos {
            let t = split(to);
            let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if common == f.len() || common == t.len() {
                continue;
            }
            out.entry(f[..=common].join("::"))
                .or_default()
                .insert(t[..=common].join("::"));
        }
    }
    out
}

/// The circles of `edges`: each strongly connected set of more than one module.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Reachability closure is enough at this size (a hundred modules).
    let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flatten()).collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut placed = BTreeSet::new();
    for n in &nodes {
        if placed.contains(*n) {
            continue;
        }
        let mut set: Vec<String> = reached[n]
            .iter()
            .filter(|m| reached.get(m).is_some_and(|r| r.contains(*n)))
            .cloned()
            .collect();
        if set.len() > 1 {
            set.sort();
            placed.extend(set.iter().cloned());
            out.push(set);
        }
    }
    out
}

#[test]
fn no_module_uses_a_module_that_uses_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = between_siblings(&uses(&src));
    assert!(
        edges.len() > 20
            && edges
                .get("daemon::pass")
                .is_some_and(|e| e.contains("daemon::state")),
        "the module graph was not read (found {} modules with uses)",
        edges.len()
    );
    let found = circles(&edges);
    let described: Vec<String> = found
        .iter()
        .map(|set| {
            let members: BTreeSet<&String> = set.iter().collect();
            let within: Vec<String> = set
                .iter()
                .map(|m| {
                    let to: Vec<&String> =
                        edges[m].iter().filter(|t| members.contains(t)).collect();
                    format!("  {m} uses {to:?}")
                })
                .collect();
            within.join("\n")
        })
        .collect();
    assert!(
        found.is_empty(),
        "modules that use each other (move what they share where both can use it):\n{}",
        described.join("\n\n")
    );
}

/// The reader itself: a circle planted in a scratch tree is found, and a test module's uses
/// and a comment's are not edges.
#[test]
fn the_reader_finds_a_planted_circle_and_ignores_tests_and_comments() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "mod inner;\nuse inner::Thing;\n// crate::c::X is only a comment\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "use crate::b::B;\npub struct Thing;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct B;\nfn f() -> crate::a::Thing { crate::a::Thing }\n#[cfg(test)]\nmod tests {\n    use crate::c::C;\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub struct C;\nuse super::b::{self, B};\n",
    )
    .unwrap();
    let edges = uses(src);
    assert_eq!(
        edges.get("b"),
        Some(&BTreeSet::from(["a".to_string()])),
        "{edges:?}"
    );
    assert_eq!(edges.get("c"), Some(&BTreeSet::from(["b".to_string()])));
    assert!(
        !edges.get("a").is_some_and(|e| e.contains("c")),
        "{edges:?}"
    );
    let siblings = between_siblings(&edges);
    assert_eq!(
        siblings.get("a"),
        Some(&BTreeSet::from(["b".to_string()])),
        "a::inner's use of b is a's, one level up; a's use of its child is no edge"
    );
    assert_eq!(
        circles(&siblings),
        vec![vec!["a".to_string(), "b".to_string()]]
    );
}
