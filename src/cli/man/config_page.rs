//! oobfence.toml(5), made from config/example-dc.toml, the example that documents every key:
//! its sections become the page's subsections, its keys (set or commented out) the entries,
//! and the comments above a key (or after it, on its line) the entry's description. The page
//! therefore says what the example says, and cannot fall behind it.
//!
//! How the example is read, line by line:
//! - `[name]`, `[[name]]`, also behind "# ": a section starts; the comment paragraphs before it
//!   are its introduction;
//! - `key = value`, also behind "# " (then optional): an entry; a `# text` after the value, and
//!   indented `#   # text` lines below it, add to its description;
//! - `# text`: prose for the next entry; a bare `#` separates paragraphs, and before a
//!   section's first key all but the last paragraph introduce the section; `#   text`
//!   (indented) is kept as written (lists, commands);
//! - the comment block at the top of the file describes the file.

use super::escape;

const EXAMPLE: &str = include_str!("../../../config/example-dc.toml");

/// One paragraph: prose (lines joined) or verbatim lines.
#[derive(Debug, Default)]
struct Paragraph {
    lines: Vec<String>,
    verbatim: bool,
}

#[derive(Debug, Default)]
struct Entry {
    key: String,
    value: String,
    optional: bool,
    text: Vec<Paragraph>,
}

#[derive(Debug, Default)]
struct Section {
    header: String,
    intro: Vec<Paragraph>,
    entries: Vec<Entry>,
}

/// Comment paragraphs not yet given to an entry or a section.
#[derive(Debug, Default)]
struct Pending(Vec<Paragraph>);

impl Pending {
    fn push_line(&mut self, line: &str) {
        let verbatim = line.starts_with(' ');
        match self.0.last_mut() {
            Some(p) if p.verbatim == verbatim && !p.lines.is_empty() => p.lines.push(line.into()),
            _ => self.0.push(Paragraph {
                lines: vec![line.into()],
                verbatim,
            }),
        }
    }

    fn break_paragraph(&mut self) {
        if self.0.last().is_some_and(|p| !p.lines.is_empty()) {
            self.0.push(Paragraph::default());
        }
    }

    fn take(&mut self) -> Vec<Paragraph> {
        std::mem::take(&mut self.0)
            .into_iter()
            .filter(|p| !p.lines.is_empty())
            .collect()
    }
}

/// `[name]` or `[[name]]` alone on the line.
fn section_header(line: &str) -> Option<&str> {
    let name = line.strip_prefix('[')?.strip_suffix(']')?;
    let name = name.trim_start_matches('[').trim_end_matches(']');
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')).then_some(line)
}

/// `key = value  # comment`: (key, value, comment).
fn key_line(line: &str) -> Option<(&str, &str, Option<&str>)> {
    let (key, rest) = line.split_once(" = ")?;
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return None;
    }
    // A `#` outside a string starts the line's comment.
    let mut in_string = false;
    for (i, c) in rest.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string && rest[..i].ends_with(' ') => {
                return Some((key, rest[..i].trim_end(), Some(rest[i + 1..].trim())));
            }
            _ => {}
        }
    }
    Some((key, rest.trim_end(), None))
}

/// The example, read into its header paragraphs and sections (the first: its top-level keys).
fn parse(text: &str) -> (Vec<Paragraph>, Vec<Section>) {
    let mut header = Vec::new();
    let mut sections = vec![Section::default()];
    let mut pending = Pending::default();
    let mut at_top = true;
    for raw in text.lines() {
        let commented = raw.starts_with('#');
        let line = raw
            .strip_prefix('#')
            .map_or(raw, |l| l.strip_prefix(' ').unwrap_or(l));
        if raw.trim().is_empty() {
            if at_top {
                header = pending.take();
                at_top = false;
            }
            pending.break_paragraph();
            continue;
        }
        if !commented {
            at_top = false;
        }
        if let Some(h) = section_header(line) {
            sections.push(Section {
                header: h.to_owned(),
                intro: pending.take(),
                entries: Vec::new(),
            });
            continue;
        }
        if let Some((key, value, comment)) = key_line(line) {
            let section = sections.last_mut().expect("the top level is a section");
            let mut text = pending.take();
            if section.entries.is_empty() && text.len() > 1 {
                let last = text.pop();
                section.intro.append(&mut text);
                text.extend(last);
            }
            if let Some(c) = comment {
                text.push(Paragraph {
                    lines: vec![c.to_owned()],
                    verbatim: false,
                });
            }
            section.entries.push(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
                optional: commented,
                text,
            });
            continue;
        }
        // `#      # more`: the comment after the last key goes on.
        if let Some(more) = line.trim_start().strip_prefix("# ")
            && line.starts_with("  ")
            && let Some(entry) = sections.last_mut().and_then(|s| s.entries.last_mut())
            && pending.0.iter().all(|p| p.lines.is_empty())
        {
            match entry.text.last_mut() {
                Some(p) if !p.verbatim => p.lines.push(more.to_owned()),
                _ => entry.text.push(Paragraph {
                    lines: vec![more.to_owned()],
                    verbatim: false,
                }),
            }
            continue;
        }
        if commented && line.is_empty() {
            pending.break_paragraph();
        } else if commented {
            pending.push_line(line);
        }
    }
    (header, sections)
}

fn paragraphs(out: &mut String, paragraphs: &[Paragraph], first_macro: &str) {
    for (i, p) in paragraphs.iter().enumerate() {
        if i > 0 || !first_macro.is_empty() {
            out.push_str(if i == 0 { first_macro } else { ".IP\n" });
        }
        if p.verbatim {
            out.push_str(".nf\n");
            out.push_str(&escape(&p.lines.join("\n")));
            out.push_str("\n.fi\n");
        } else {
            out.push_str(&escape(&p.lines.join("\n")));
            out.push('\n');
        }
    }
}

/// The page, in roff.
pub(super) fn render() -> String {
    let (header, sections) = parse(EXAMPLE);
    let mut out = format!(
        ".TH oobfence.toml 5 \"\" \"oobfence {}\" \"File formats\"\n\
         .SH NAME\noobfence.toml \\- the configuration of one oobfence datacenter\n\
         .SH SYNOPSIS\n/etc/oobfence/\\fIDC\\fR.toml\n.SH DESCRIPTION\n",
        env!("CARGO_PKG_VERSION")
    );
    paragraphs(&mut out, &header, "");
    out.push_str(
        ".PP\nThe file is TOML. Each entry below shows a key with the value of the example \
         installed as /usr/share/doc/oobfence/examples/example-dc.toml, from which this page \
         is made; an entry marked (optional) is commented out there. Unknown keys are errors.\n\
         .SH KEYS\n",
    );
    for section in &sections {
        if section.header.is_empty() {
            out.push_str(".SS \"Top level\"\n");
        } else {
            out.push_str(&format!(".SS \"{}\"\n", section.header));
        }
        paragraphs(&mut out, &section.intro, ".PP\n");
        for entry in &section.entries {
            // Unpaddable spaces around `=`: a long value (a path, an inline table) must not
            // have them stretched by justification, nor a line break at them.
            out.push_str(&format!(
                ".TP\n\\fB{}\\fR\\ =\\ {}{}\n",
                escape(&entry.key),
                escape(&entry.value),
                if entry.optional { " (optional)" } else { "" }
            ));
            paragraphs(&mut out, &entry.text, "");
        }
    }
    out.push_str(
        ".SH FILES\n.TP\n/etc/oobfence/\\fIDC\\fR.toml\nThe config of oobfence@\\fIDC\\fR.service.\n\
         .TP\n/usr/share/doc/oobfence/examples/example-dc.toml\nThe example this page is made from.\n\
         .SH \"SEE ALSO\"\noobfence(1), oobfence-check-config(1), oobfence-run(1)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailing_comment_is_cut_outside_strings_only() {
        assert_eq!(
            key_line(r#"nodes = ["rack1-*"]    # globs: *, ?, [0-9]"#),
            Some(("nodes", r#"["rack1-*"]"#, Some("globs: *, ?, [0-9]")))
        );
        assert_eq!(
            key_line(r#"path = "/a#b" # c"#),
            Some(("path", r#""/a#b""#, Some("c")))
        );
        assert_eq!(key_line("Counts are = prose"), None);
    }

    #[test]
    fn prose_goes_to_the_next_key_and_leading_paragraphs_to_the_section() {
        let (header, sections) = parse(
            "# The file.\n\ntop = 1\n[s]\n# About s.\n#\n# About k,\n# on two lines.\nk = 2\n\
             # k2 = \"x\"   # optional k2\n#           # more on k2\n",
        );
        assert_eq!(header[0].lines, ["The file."]);
        assert_eq!(sections[0].entries[0].key, "top");
        let s = &sections[1];
        assert_eq!(s.header, "[s]");
        assert_eq!(s.intro[0].lines, ["About s."]);
        assert_eq!(s.entries[0].text[0].lines, ["About k,", "on two lines."]);
        assert!(!s.entries[0].optional);
        assert!(s.entries[1].optional);
        assert_eq!(s.entries[1].text[0].lines, ["optional k2", "more on k2"]);
    }
}
