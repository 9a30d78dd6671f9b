//! Measurements the benchmarks share: CPU time (user + system, all threads)
//! and peak resident memory, read from `/proc` (Linux; the benchmarks say
//! "unavailable" elsewhere). CPU time, not wall time, because the machines
//! the benchmarks run on are shared.

/// CPU seconds (user + system) of this process's children that have been
/// waited for (`cutime` and `cstime`, fields 16 and 17 of stat(5), in
/// ticks of 1/100 s: `USER_HZ`, fixed at 100 by the Linux ABI).
#[allow(dead_code)] // not every benchmark runs children
pub fn children_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Peak resident set size of this process, MiB (`VmHWM`).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// CPU seconds (user + system, every thread) this process has used so far,
/// to the nanosecond (`CLOCK_PROCESS_CPUTIME_ID`: `/proc/self/stat` counts
/// in ticks of 10 ms, 2–4 % of a reference row's run).
pub fn process_cpu_seconds() -> Option<f64> {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for clock_gettime to fill.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0;
    ok.then_some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
}

/// Runs `f` and returns its result with the CPU seconds it took.
pub fn cpu_timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let before = process_cpu_seconds().unwrap_or(f64::NAN);
    let out = f();
    (out, process_cpu_seconds().unwrap_or(f64::NAN) - before)
}

/// Runs `cmd` to its end: whether it succeeded, and its peak resident set
/// size in MiB (`ru_maxrss` of `wait4`, the child's own: `/proc` holds no
/// peak for a child that has exited).
#[allow(dead_code)] // not every benchmark runs children
pub fn run_with_peak_rss(cmd: &mut std::process::Command) -> (bool, f64) {
    let child = cmd.spawn().expect("start the child");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain data that wait4 fills; `pid` is our child,
    // not yet waited for (the `Child` handle is dropped without waiting).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4 on the child");
    drop(child);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, usage.ru_maxrss as f64 / 1024.0)
}
