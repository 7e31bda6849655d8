//! Every link into the documentation resolves. The alerts' runbook URLs, the man page, the
//! code and the pages themselves point at `docs/*.md#anchor` sections; a section renamed or
//! moved to another page breaks them silently, and the person on call lands at the top of a
//! 1,000-line page at 3 a.m.
//!
//! Read from the files: every Markdown file of the repository (README.md, docs/, ...) gives its
//! anchors (its headings, by GitHub's rule: lowercase, spaces to `-`, punctuation dropped, a
//! repeated heading numbered `-1`, `-2`..., and `<a id=...>`/`<a name=...>`). Checked: in those
//! files every relative link `[text](path)`, `[text](path#anchor)` and `[text](#anchor)` (the
//! file must exist, the anchor must be one of its), and in deploy/, src/, packaging/, systemd/
//! and config/ every `NAME.md#anchor` (also the installed copy
//! `/usr/share/doc/oobfence/NAME.md#anchor`, and the alert rules' templated URL).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Directories never read: build output, VCS data, vendored caches.
const SKIPPED_DIRS: [&str; 3] = ["target", ".git", "node_modules"];
/// Where the packages install the documentation (Cargo.toml's deb assets, the RPM spec).
const INSTALLED_DOCS: &str = "/usr/share/doc/oobfence/";
/// Trees whose non-Markdown files may name `NAME.md#anchor`.
const CODE_TREES: [&str; 5] = ["deploy", "src", "packaging", "systemd", "config"];

/// GitHub's anchor for a heading: its text without Markdown link syntax, lowercased; letters,
/// digits, `-` and `_` kept, each space a `-`, everything else dropped.
fn slug(heading: &str) -> String {
    strip_link_targets(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `[text](target)` → `text`: a heading's anchor comes from what it shows.
fn strip_link_targets(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        out.push_str(&rest[..at]);
        match rest[at..].find(')') {
            Some(end) => rest = &rest[at + end + 1..],
            None => {
                rest = &rest[at..];
                break;
            }
        }
    }
    out.push_str(rest);
    out.replace('[', "")
}

/// A fence opening or closing a code block: its character and length.
fn fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let c = trimmed.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = trimmed.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n))
}

/// The lines of a Markdown file outside code blocks, with their numbers (1-based).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        match (open, fence(line)) {
            (None, Some(f)) => open = Some(f),
            (Some((c, n)), Some((c2, n2))) if c == c2 && n2 >= n && line.trim().len() == n2 => {
                open = None
            }
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// An ATX heading's text (`## Text ##` → `Text`).
fn atx_heading(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let level = trimmed.chars().take_while(|&c| c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &trimmed[level..];
    if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
        return None;
    }
    let rest = rest.trim();
    // A closing sequence of #s, after a space, is not part of the text.
    let without_closing = rest.trim_end_matches('#');
    Some(
        if without_closing.len() < rest.len()
            && (without_closing.is_empty() || without_closing.ends_with(' '))
        {
            without_closing.trim_end()
        } else {
            rest
        },
    )
}

/// Every anchor a Markdown file offers.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let lines = prose_lines(text);
    let mut add = |base: String, found: &mut BTreeSet<String>| {
        let n = seen.entry(base.clone()).or_insert(0);
        found.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    };
    for (k, &(number, line)) in lines.iter().enumerate() {
        if let Some(text) = atx_heading(line) {
            add(slug(text), &mut found);
            continue;
        }
        // A setext heading: a paragraph line underlined with = or -.
        let underline = line.trim();
        let is_underline = !underline.is_empty()
            && (underline.chars().all(|c| c == '=') || underline.chars().all(|c| c == '-'));
        if is_underline && k > 0 {
            let (prev_number, prev) = lines[k - 1];
            let starts_block =
                |s: &str| s.starts_with(['|', '-', '*', '#', '>', '+']) || s.trim().is_empty();
            if prev_number + 1 == number && !starts_block(prev.trim_start()) {
                add(slug(prev), &mut found);
            }
        }
        for key in ["<a id=\"", "<a name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(key) {
                rest = &rest[at + key.len()..];
                if let Some(end) = rest.find('"') {
                    found.insert(rest[..end].to_string());
                }
            }
        }
    }
    found
}

/// A line without its inline code spans: a path in backticks is no link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find('`') {
        out.push_str(&rest[..at]);
        let ticks = rest[at..].chars().take_while(|&c| c == '`').count();
        let after = &rest[at + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link targets of a Markdown file: `[text](target)`, `![alt](target)` and reference
/// definitions `[label]: target`, with their line numbers.
fn markdown_links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].trim().trim_start_matches('<');
            let target = target.split([' ', '>']).next().unwrap_or("");
            out.push((number, target.to_string()));
            rest = &rest[end..];
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]: ")
        {
            let target = trimmed[close + 3..].split_whitespace().next().unwrap_or("");
            out.push((number, target.to_string()));
        }
    }
    out
}

/// `NAME.md#anchor` references in a file that is not Markdown (code, YAML, JSON, TOML).
fn code_references(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/._-:".contains(c);
    let anchor_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    for (i, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find(".md") {
            let md_end = from + at + 3;
            from = md_end;
            let start = line[..md_end - 3]
                .char_indices()
                .rev()
                .take_while(|&(_, c)| path_char(c))
                .last()
                .map_or(md_end - 3, |(j, _)| j);
            let mut after = &line[md_end..];
            // The alert rules: `...runbook.md{{ end }}#anchor`.
            if after.starts_with("{{")
                && let Some(close) = after.find("}}")
            {
                after = &after[close + 2..];
            }
            let Some(anchor_text) = after.strip_prefix('#') else {
                continue;
            };
            let anchor: String = anchor_text
                .chars()
                .take_while(|&c| anchor_char(c))
                .collect();
            if anchor.is_empty() || start == md_end - 3 {
                continue;
            }
            // The Grafana dashboard: `${runbook}/runbook.md#anchor`, its variable `runbook`
            // being the installed pages' directory unless an operator serves them elsewhere.
            let dir = if line[..start].ends_with("${runbook}") {
                INSTALLED_DOCS.trim_end_matches('/')
            } else {
                ""
            };
            out.push((i + 1, format!("{dir}{}#{anchor}", &line[start..md_end])));
        }
    }
    out
}

/// The repository file a link target names, seen from `from` (a file), if it exists.
fn resolve(root: &Path, from: &Path, target: &str) -> Option<PathBuf> {
    let target = target.strip_prefix("file://").unwrap_or(target);
    if let Some(name) = target.strip_prefix(INSTALLED_DOCS) {
        let installed = if name == "README.md" {
            root.join(name)
        } else {
            root.join("docs").join(name)
        };
        return installed.exists().then_some(installed);
    }
    if target.starts_with('/') {
        return None;
    }
    let beside = from.parent().unwrap_or(root).join(target);
    if beside.exists() {
        return Some(beside);
    }
    // Code names documents from the repository's top (`docs/runbook.md#...`).
    let from_top = root.join(target);
    from_top.exists().then_some(from_top)
}

fn is_external(target: &str) -> bool {
    let scheme = target.split(':').next().unwrap_or("");
    target.contains(':')
        && !target.starts_with("file://")
        && !scheme.is_empty()
        && scheme.chars().all(|c| c.is_ascii_alphabetic())
}

fn files_under(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !SKIPPED_DIRS.contains(&name) {
                files_under(&path, keep, out);
            }
        } else if keep(&path) {
            out.push(path);
        }
    }
}

fn is_markdown(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "md")
}

/// Every broken link in the tree at `root`, each naming its file, line, target and what is
/// wrong.
fn broken_links(root: &Path) -> Vec<String> {
    let mut markdown = Vec::new();
    files_under(root, &is_markdown, &mut markdown);
    let mut code = Vec::new();
    for tree in CODE_TREES {
        files_under(&root.join(tree), &|p| !is_markdown(p), &mut code);
    }
    let mut anchor_cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut anchors_of = |path: &Path| -> BTreeSet<String> {
        anchor_cache
            .entry(path.to_path_buf())
            .or_insert_with(|| anchors(&std::fs::read_to_string(path).unwrap_or_default()))
            .clone()
    };
    let shown = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut problems = Vec::new();
    let mut check = |file: &Path, number: usize, target: &str, problems: &mut Vec<String>| {
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target, None),
        };
        let document = if path.is_empty() {
            file.to_path_buf()
        } else {
            match resolve(root, file, path) {
                Some(found) => found,
                None => {
                    problems.push(format!(
                        "{}:{number}: links to {target}: no file {path}, beside it or from \
                         the repository's top",
                        shown(file)
                    ));
                    return;
                }
            }
        };
        if let Some(anchor) = anchor.filter(|a| !a.is_empty())
            && is_markdown(&document)
            && !anchors_of(&document).contains(anchor)
        {
            problems.push(format!(
                "{}:{number}: links to {target}: {} has no section with the anchor #{anchor}",
                shown(file),
                shown(&document)
            ));
        }
    };
    for file in &markdown {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (number, target) in markdown_links(&text) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            check(file, number, &target, &mut problems);
        }
    }
    for file in &code {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not text
        };
        for (number, target) in code_references(&text) {
            if is_external(&target) {
                continue;
            }
            check(file, number, &target, &mut problems);
        }
    }
    problems
}

#[test]
fn every_link_into_the_documentation_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let problems = broken_links(root);
    assert!(
        problems.is_empty(),
        "{} broken documentation link(s); point each at the page and section that now holds \
         the text (anchors are GitHub's: lowercase, spaces to -, punctuation dropped):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_alerts_and_the_pages_are_read() {
    // A parser that finds nothing checks nothing: the alert rules name the runbook, and the
    // README links to the pages.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules =
        std::fs::read_to_string(root.join("deploy/prometheus/oobfence-rules.yaml")).unwrap();
    let refs = code_references(&rules);
    assert!(
        refs.len() >= 20 && refs.iter().all(|(_, r)| r.contains("runbook.md#oobfence")),
        "the alert rules' runbook URLs were not read: {refs:?}"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let links = markdown_links(&readme);
    for page in [
        "install",
        "runbook",
        "power-sources",
        "decisions",
        "configuration",
        "developing",
    ] {
        let want = format!("docs/{page}.md");
        assert!(
            links.iter().any(|(_, t)| t.starts_with(&want)),
            "README.md does not link to {want}: {links:?}"
        );
    }
}

#[test]
fn anchors_follow_githubs_rule() {
    let text = "# oobfence\n\
                ## Is it this node's machine? (identity attestation)\n\
                ### `[actuation]`: power off, [then on](x.md)\n\
                ```sh\n# not a heading\n```\n\
                ## Notes\n## Notes\n\
                Setext title\n------------\n\
                <a id=\"kept-id\"></a>\n";
    let found = anchors(text);
    let want: BTreeSet<String> = [
        "oobfence",
        "is-it-this-nodes-machine-identity-attestation",
        "actuation-power-off-then-on",
        "notes",
        "notes-1",
        "setext-title",
        "kept-id",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, want);
}

#[test]
fn a_broken_file_or_anchor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::create_dir_all(root.join("deploy")).unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Front\n\n## Good section\n\n[ok](docs/page.md#real-one) [ok too](#good-section)\n\
         [bad anchor](docs/page.md#gone) [bad file](docs/missing.md) [here](#nowhere)\n\
         `[in code](docs/missing-in-code.md)` [web](https://example.org/x.md#y)\n\
         ```\n[in a block](docs/missing-in-block.md)\n```\n",
    )
    .unwrap();
    std::fs::write(root.join("docs/page.md"), "# Page\n\n## Real one\n").unwrap();
    std::fs::write(
        root.join("deploy/rules.yaml"),
        "url: '{{ else }}file:///usr/share/doc/oobfence/page.md{{ end }}#real-one'\n\
         url: '{{ else }}file:///usr/share/doc/oobfence/page.md{{ end }}#moved-away'\n\
         see docs/page.md#real-one and docs/page.md#also-moved\n",
    )
    .unwrap();
    let problems = broken_links(root);
    let want = [
        "README.md:6: links to docs/page.md#gone: docs/page.md has no section with the anchor #gone",
        "README.md:6: links to docs/missing.md: no file docs/missing.md, beside it or from the repository's top",
        "README.md:6: links to #nowhere: README.md has no section with the anchor #nowhere",
        "deploy/rules.yaml:2: links to file:///usr/share/doc/oobfence/page.md#moved-away: docs/page.md has no section with the anchor #moved-away",
        "deploy/rules.yaml:3: links to docs/page.md#also-moved: docs/page.md has no section with the anchor #also-moved",
    ];
    assert_eq!(problems, want);
}

#[test]
fn every_picture_is_drawn_from_its_source() {
    // The SVGs are committed beside their Graphviz sources; one edited without the other
    // shows a picture the text no longer describes. `scripts/docs-pictures` redraws them.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/pictures");
    let mut sources = Vec::new();
    files_under(
        &dir,
        &|p| p.extension().is_some_and(|e| e == "dot"),
        &mut sources,
    );
    assert!(
        sources.len() >= 2,
        "no Graphviz sources in {}",
        dir.display()
    );
    for source in sources {
        let svg_path = source.with_extension("svg");
        let committed = std::fs::read_to_string(&svg_path)
            .unwrap_or_else(|e| panic!("{}: {e}; run scripts/docs-pictures", svg_path.display()));
        let drawn = std::process::Command::new("dot")
            .arg("-Tsvg")
            .arg(&source)
            .output()
            .expect("run dot (Debian package graphviz; scripts/install-deps installs it)");
        assert!(
            drawn.status.success(),
            "dot -Tsvg {}: {}",
            source.display(),
            String::from_utf8_lossy(&drawn.stderr)
        );
        assert!(
            String::from_utf8_lossy(&drawn.stdout) == committed,
            "{} is not what {} draws: run scripts/docs-pictures and commit the result",
            svg_path.display(),
            source.display()
        );
    }
}
