//! The daemon's log lines: JSON or text, and under systemd each line written whole with its
//! journal priority. The other commands print their own words: no library's log line (the
//! AWS SDK's INFO about the credentials it loaded, say) mixes into what they print.

use super::{LogFormat, LogLevel};

/// `daemon`: the command is `run`; `level`: `--log-level`, when given.
pub(super) fn init_logging(format: LogFormat, level: Option<LogLevel>, daemon: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("OOBFENCE_LOG").unwrap_or_else(|_| {
        EnvFilter::new(if daemon {
            // --log-level sets oobfence's own level; the libraries stay as quiet as by default.
            crate::DEFAULT_LOG_FILTER.replacen(
                "info",
                &format!("info,oobfence={}", level.unwrap_or(LogLevel::Info).as_str()),
                1,
            )
        } else {
            format!("off,oobfence={}", level.unwrap_or(LogLevel::Warn).as_str())
        })
    });
    // Under systemd the journal adds its own timestamps, colours mean nothing, and each line
    // carries its priority so that `journalctl -p warning` and friends work.
    let journald = stderr_is_journal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(LogWriter {
            priorities: journald,
        })
        .with_ansi(!journald && std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text if journald => builder.without_time().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// True when stderr is the systemd journal's stream: `JOURNAL_STREAM` names stderr's device
/// and inode (a child of a service inherits the variable with another stderr).
pub(super) fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Log output to stderr, one event at a time; with `priorities`, every line starts with the
/// syslog priority of the event's level (sd-daemon `<N>` prefixes), which journald strips and
/// records as the entry's priority.
#[derive(Clone, Copy)]
struct LogWriter {
    priorities: bool,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogEvent;

    fn make_writer(&'a self) -> LogEvent {
        LogEvent {
            prefix: self.priorities.then_some("<6>"),
            buf: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> LogEvent {
        let prefix = match *meta.level() {
            tracing::Level::ERROR => "<3>",
            tracing::Level::WARN => "<4>",
            tracing::Level::INFO => "<6>",
            _ => "<7>",
        };
        LogEvent {
            prefix: self.priorities.then_some(prefix),
            buf: Vec::new(),
        }
    }
}

/// One formatted event, written to stderr in one piece when dropped.
struct LogEvent {
    prefix: Option<&'static str>,
    buf: Vec<u8>,
}

impl std::io::Write for LogEvent {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let out = match self.prefix {
            None => std::mem::take(&mut self.buf),
            Some(p) => {
                let mut out = Vec::with_capacity(self.buf.len() + 8);
                for line in self.buf.split_inclusive(|b| *b == b'\n') {
                    out.extend_from_slice(p.as_bytes());
                    out.extend_from_slice(line);
                }
                out
            }
        };
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), &out);
    }
}
