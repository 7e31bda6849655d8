//! `oobfence man` and `oobfence completions`: what the packages ship beside the binary.
//!
//! The man pages are clap_mangen's rendering of the command line, with the sections it cannot
//! know added: EXIT STATUS, ENVIRONMENT, FILES, EXAMPLES and SEE ALSO; and oobfence.toml(5),
//! made from config/example-dc.toml by `config_page`.

use std::path::Path;
use std::process::ExitCode;

use super::{Cli, fail};

mod config_page;

/// A roff entry list: `.TP`, the tag in bold, then its description.
fn entries(out: &mut String, items: &[(&str, &str)]) {
    for (tag, text) in items {
        out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", escape(tag), escape(text)));
    }
}

/// Text made safe for roff: backslashes escaped, other than ASCII as groff's Unicode escapes,
/// no line starting with a control character.
pub(super) fn escape(text: &str) -> String {
    let text: String = text
        .chars()
        .map(|c| match c {
            '\\' => "\\e".to_owned(),
            c if c.is_ascii() => c.to_string(),
            c => format!("\\[u{:04X}]", u32::from(c)),
        })
        .collect();
    text.lines()
        .map(|l| {
            if l.starts_with(['.', '\'']) {
                format!("\\&{l}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const EXIT_STATUS: &[(&str, &str)] = &[
    (
        "0",
        "Success. check-config: the config is valid (with --probe, every mapped node was \
         read; with --strict, and there is no warning); run: the daemon stopped on SIGTERM or \
         SIGINT.",
    ),
    (
        "1",
        "A failure at run time: the API server or a BMC could not be reached or read, no \
         daemon answered (why, nodes), a file could not be written, the token lacks a \
         permission the daemon needs (make-kubeconfig, check-config --probe); check-config \
         --strict: a warning; drill: \
         something stands in the way of a fence of the node (its FAIL lines); run: the daemon \
         stopped on an error, such as an API server unreachable at start. The unit restarts \
         it (Restart=on-failure).",
    ),
    (
        "2",
        "The config or the command line is wrong: the file does not parse or a key is \
         invalid, a password file, credential or the kubeconfig it names cannot be read, the \
         kubeconfig's token has expired, a file it names that the daemon's user cannot read \
         (check-config run as root), an unknown option or value; run: a [server] listen \
         address that cannot be bound. Restarting cannot mend \
         that: the unit says RestartPreventExitStatus=2, so oobfence@DC stays failed and \
         `journalctl -u oobfence@DC` shows the one line that says what is wrong.",
    ),
    (
        "3",
        "why, nodes, pause, resume, drill: the daemon answering on the config's [server] \
         listen is not the daemon of that config (another datacenter's, or one started from \
         another file), or does not say who it is (GET /whoami). The message names both and \
         what to do: use the other daemon's config, or give this one a [server] listen of its \
         own. pause and resume have set or removed the switch all the same. A config edited \
         and not yet reloaded is still its daemon's (a note says so).",
    ),
];

const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "OOBFENCE_CONFIG",
        "The config file, for every command that takes --config.",
    ),
    (
        "OOBFENCE_DAEMON_USER",
        "check-config --daemon-user: the user the daemon runs as (default oobfence), whom \
         check-config run as root checks every file the config names as; \"root\" skips it.",
    ),
    (
        "OOBFENCE_LOG",
        "A full log filter (\"info,kube=warn\"); it wins over --log-level. The unit sets one \
         that keeps the libraries quiet.",
    ),
    (
        "CREDENTIALS_DIRECTORY",
        "Set by systemd for LoadCredential= and LoadCredentialEncrypted=: \
         password_credential = \"NAME\" reads $CREDENTIALS_DIRECTORY/NAME.",
    ),
    (
        "KUBECONFIG",
        "The kubeconfig used when [kubernetes] kubeconfig is not set, and by make-kubeconfig \
         without --kubeconfig; then ~/.kube/config (HOME).",
    ),
    (
        "KUBERNETES_SERVICE_HOST",
        "In a pod, with no kubeconfig found: the pod's ServiceAccount is used.",
    ),
    (
        "JOURNAL_STREAM",
        "Set by systemd: when it names stderr, every log line carries its journal priority \
         and no time stamp.",
    ),
    (
        "NOTIFY_SOCKET",
        "Set by systemd for Type=notify: READY=1, STATUS= and the watchdog's WATCHDOG=1 go \
         there. Without it nothing is sent.",
    ),
    (
        "AWS_ACCESS_KEY_ID",
        "With AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_CONFIG_FILE, \
         AWS_SHARED_CREDENTIALS_FILE, AWS_EC2_METADATA_DISABLED: the standard AWS credential \
         chain, for [aws] without a profile key. The region is always the config's.",
    ),
    (
        "PATH",
        "Where a fence agent named without a directory is looked for (then /usr/sbin, /sbin).",
    ),
    (
        "SUDO_USER",
        "With USER: who paused, recorded with the pause (pause), and who confirmed a node off \
         (confirm-off, unless --by names them).",
    ),
    (
        "MALLOC_ARENA_MAX",
        "glibc's; the unit sets 2, which keeps a mostly idle daemon's memory small.",
    ),
];

const FILES: &[(&str, &str)] = &[
    (
        "/etc/oobfence/DC.toml",
        "The config of datacenter DC, read by oobfence@DC.service; see oobfence.toml(5).",
    ),
    (
        "/etc/oobfence/example.toml",
        "A starting config, kept across upgrades once edited.",
    ),
    (
        "/etc/oobfence/DC.kubeconfig",
        "The daemon's kubeconfig, written by make-kubeconfig; mode 0640, group oobfence.",
    ),
    (
        "/etc/oobfence/secrets/",
        "BMC password files (password_file); the directory is 0750 root:oobfence.",
    ),
    (
        "/etc/oobfence/DC.paused",
        "The default pause file: while it exists the daemon writes nothing.",
    ),
    (
        "/var/lib/oobfence/DC.journal.jsonl",
        "The decision journal (the unit's StateDirectory=), one JSON line per action taken or \
         refused and per change of the daemon's own (pause, reload, leadership, storm, freeze, \
         budget spent); kept when the package is removed. Rotated beside it as DC.journal.jsonl.1, \
         .2.gz...; timeline and why read them all.",
    ),
    (
        "/etc/logrotate.d/oobfence",
        "Rotates the decision journals monthly or at 100 MiB, keeps 24, compresses all but the \
         newest rotated one; the daemon opens a new file by itself (no signal, no copytruncate).",
    ),
    (
        "/usr/lib/systemd/system/oobfence@.service",
        "The unit template: the instance is the datacenter.",
    ),
    (
        "/usr/lib/sysusers.d/oobfence.conf",
        "The system user oobfence the daemon runs as.",
    ),
    (
        "/usr/lib/tmpfiles.d/oobfence.conf",
        "/etc/oobfence and /etc/oobfence/secrets, 0750 root:oobfence.",
    ),
    (
        "/usr/share/doc/oobfence/",
        "README.md (the front door), CHANGELOG.md (every release, with its upgrade notes), \
         runbook.md (what to do, alert by alert), install.md, \
         power-sources.md, decisions.md (how it decides, with pictures/), configuration.md, \
         benchmarks.md, and examples/: example-dc.toml (every key), rbac.yaml, \
         oobfence-rules.yaml (alert rules), alertmanager-example.yaml (routing, grouping, \
         inhibitions), oobfence-dashboard.json (Grafana).",
    ),
];

/// Each command's examples: (what it does, the command line).
fn examples(command: &str) -> &'static [(&'static str, &'static str)] {
    match command {
        "oobfence" => &[
            (
                "Check a datacenter's config, then start its daemon:",
                "oobfence check-config --config /etc/oobfence/dc1.toml\n\
                 systemctl enable --now oobfence@dc1",
            ),
            (
                "Why a node is (not) fenced, and every fenced node:",
                "oobfence why --config /etc/oobfence/dc1.toml rack1-node3\n\
                 oobfence nodes --config /etc/oobfence/dc1.toml --state fenced",
            ),
            (
                "Stop every write during maintenance, then resume:",
                "oobfence pause --config /etc/oobfence/dc1.toml --reason \"rack 7 rewiring\"\n\
                 oobfence resume --config /etc/oobfence/dc1.toml",
            ),
            (
                "The incident, in order, from the journal (no daemon needed):",
                "oobfence timeline --since 2h --config /etc/oobfence/dc1.toml",
            ),
            ("The daemon's log:", "journalctl -u oobfence@dc1"),
        ],
        "run" => &[
            (
                "What oobfence@dc1.service runs:",
                "oobfence run --config /etc/oobfence/dc1.toml",
            ),
            (
                "In the foreground, with debug logs:",
                "oobfence run --log-level debug --config ./dc1.toml",
            ),
        ],
        "check-config" => &[
            (
                "Validate a config:",
                "oobfence check-config --config /etc/oobfence/dc1.toml",
            ),
            (
                "The same as one JSON document (errors with their lines, warnings):",
                "oobfence check-config --json --config /etc/oobfence/dc1.toml",
            ),
            (
                "Also list the nodes and read every mapped machine's power once:",
                "oobfence check-config --probe --config /etc/oobfence/dc1.toml",
            ),
            (
                "As a deploy gate: a warning fails too (exit 1):",
                "oobfence check-config --strict --config /etc/oobfence/dc1.toml",
            ),
            (
                "Run as root, check the files as the unit's user when a drop-in sets another:",
                "oobfence check-config --daemon-user fencer --config /etc/oobfence/dc1.toml",
            ),
        ],
        "probe" => &[(
            "Read one node's power state, login and TLS version:",
            "oobfence probe --config /etc/oobfence/dc1.toml rack1-node3",
        )],
        "drill" => &[
            (
                "The fire drill for one node, after a change of its BMC, the config or the RBAC:",
                "oobfence drill --config /etc/oobfence/dc1.toml rack1-node3",
            ),
            (
                "As JSON, for a script that drills every node:",
                "for n in $(kubectl get nodes -o name); do\n\
                 \x20   oobfence drill --json --config /etc/oobfence/dc1.toml \"${n#node/}\"\n\
                 done",
            ),
        ],
        "why" => &[
            (
                "What the daemon thinks of a node, and its last journal records:",
                "oobfence why --config /etc/oobfence/dc1.toml rack1-node3",
            ),
            (
                "Its last 30 records (older ones from the rotated journal files):",
                "oobfence why --records 30 --config /etc/oobfence/dc1.toml rack1-node3",
            ),
        ],
        "timeline" => &[
            (
                "The night, in order: every read, decision, write, pause, storm and reload of \
                 the last 8 hours:",
                "oobfence timeline --since 8h --config /etc/oobfence/dc1.toml",
            ),
            (
                "One node's story, with the datacenter's events around it:",
                "oobfence timeline --node rack1-node3 --since 2026-11-28T02:00:00Z \\\n\
                 \x20   --config /etc/oobfence/dc1.toml",
            ),
            (
                "As JSON, one object a line, for jq or a ticket:",
                "oobfence timeline --json --since 2h --config /etc/oobfence/dc1.toml \\\n\
                 \x20   | jq -c 'select(.kind == \"daemon\")'",
            ),
        ],
        "nodes" => &[(
            "Every fenced node:",
            "oobfence nodes --config /etc/oobfence/dc1.toml --state fenced",
        )],
        "pause" => &[(
            "Hold every write while a rack is rewired:",
            "oobfence pause --config /etc/oobfence/dc1.toml --reason \"rack 7 rewiring\"",
        )],
        "resume" => &[(
            "Let the daemon write again:",
            "oobfence resume --config /etc/oobfence/dc1.toml",
        )],
        "confirm-off" => &[
            (
                "Rack 12's PDU breaker tripped and took node rack12-n3 and its BMC dark; you looked:",
                "oobfence confirm-off rack12-n3 --config /etc/oobfence/dc1.toml \\\n\
                 \x20   --reason \"rack 12 PDU breaker tripped, machine dark, checked on site\"\n\
                 oobfence why --config /etc/oobfence/dc1.toml rack12-n3",
            ),
            (
                "The same with kubectl (the API server's audit log names who wrote it):",
                "kubectl annotate node rack12-n3 oobfence.io/confirmed-off=\"$(printf \\\n\
                 \x20   '{\"bootID\":\"%s\",\"reason\":\"rack 12 PDU breaker tripped\"}' \\\n\
                 \x20   \"$(kubectl get node rack12-n3 -o jsonpath='{.status.nodeInfo.bootID}')\")\"",
            ),
            ("Withdraw it:", "oobfence confirm-off rack12-n3 --withdraw"),
        ],
        "make-kubeconfig" => &[(
            "A year's token for the ServiceAccount of deploy/rbac.yaml, installed for dc1:",
            "oobfence make-kubeconfig --kubeconfig admin.conf --duration 8760h --output dc1.kubeconfig\n\
             install -m 0640 -g oobfence dc1.kubeconfig /etc/oobfence/dc1.kubeconfig",
        )],
        "completions" => &[(
            "Completions for the current user's bash, zsh and fish (the packages install \
             them system-wide):",
            "oobfence completions bash > ~/.local/share/bash-completion/completions/oobfence\n\
             oobfence completions zsh > ~/.zfunc/_oobfence\n\
             oobfence completions fish > ~/.config/fish/completions/oobfence.fish",
        )],
        _ => &[],
    }
}

/// The sections clap_mangen cannot know, for COMMAND ("oobfence" for the main page).
fn extra_sections(command: &str, subcommands: &[String]) -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    entries(&mut out, EXIT_STATUS);
    if command == "oobfence" {
        out.push_str(".SH ENVIRONMENT\n");
        entries(&mut out, ENVIRONMENT);
        out.push_str(".SH FILES\n");
        entries(&mut out, FILES);
    }
    out.push_str(".SH EXAMPLES\n");
    for (what, lines) in examples(command) {
        out.push_str(&format!(
            ".PP\n{}\n.PP\n.RS 4\n.EX\n{}\n.EE\n.RE\n",
            escape(what),
            escape(lines)
        ));
    }
    let mut see_also: Vec<String> = if command == "oobfence" {
        subcommands
            .iter()
            .map(|s| format!("oobfence-{s}(1)"))
            .collect()
    } else {
        vec!["oobfence(1)".into()]
    };
    see_also.extend(["oobfence.toml(5)", "systemctl(1)", "journalctl(1)"].map(String::from));
    out.push_str(&format!(
        ".SH \"SEE ALSO\"\n{}\n.PP\n/usr/share/doc/oobfence/README.md, \
         /usr/share/doc/oobfence/runbook.md, /usr/share/doc/oobfence/install.md, \
         /usr/share/doc/oobfence/decisions.md, /usr/share/doc/oobfence/configuration.md\n",
        see_also.join(", ")
    ));
    out
}

/// COMMAND's page: clap_mangen's, with `extra_sections` before its VERSION section.
fn render(command: &str, cmd: clap::Command, subcommands: &[String]) -> Result<String, String> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut out)
        .map_err(|e| e.to_string())?;
    let mut page = String::from_utf8(out).map_err(|e| e.to_string())?;
    let extra = extra_sections(command, subcommands);
    match page.find("\n.SH VERSION") {
        Some(at) => page.insert_str(at + 1, &extra),
        None => page.push_str(&extra),
    }
    Ok(page)
}

/// oobfence.1, oobfence-COMMAND.1 for each command that is not hidden, and oobfence.toml.5.
pub(super) fn man_pages(dir: &Path) -> Result<ExitCode, ExitCode> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)
        .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let cmd = Cli::command();
    let write = |file: &str, page: Result<String, String>| -> Result<(), ExitCode> {
        let page = page.map_err(|e| fail(format!("cannot render {file}: {e}")))?;
        let path = dir.join(file);
        std::fs::write(&path, page)
            .map_err(|e| fail(format!("cannot write {}: {e}", path.display())))
    };
    let visible: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    let names: Vec<String> = visible.iter().map(|s| s.get_name().to_owned()).collect();
    write("oobfence.1", render("oobfence", cmd.clone(), &names))?;
    for sub in visible {
        let name = format!("oobfence-{}", sub.get_name());
        let page = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("oobfence {}", sub.get_name()));
        write(&format!("{name}.1"), render(sub.get_name(), page, &names))?;
    }
    write("oobfence.toml.5", Ok(config_page::render()))?;
    Ok(ExitCode::SUCCESS)
}

/// `oobfence completions SHELL`: the completion script on stdout.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<ExitCode, ExitCode> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "oobfence", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
