//! What the benchmark drivers (`examples/bench_*.rs`) share: their output format and the
//! process figures they read from /proc.

/// A size from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One figure, as `figure<TAB>value<TAB>unit`: the bench scripts tabulate these lines.
pub fn figure(name: &str, value: impl std::fmt::Display, unit: &str) {
    println!("{name}\t{value}\t{unit}");
}

/// Progress, on stderr (not part of the table).
pub fn note(what: &str) {
    eprintln!("bench: {what}");
}

/// CPU seconds (user + system) process `pid` ("self" for this one) has used so far.
pub fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the 14th field overall.
    let after = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // USER_HZ is 100 on every Linux this runs on (sysconf would need libc).
    (ticks(11) + ticks(12)) as f64 / 100.0
}
