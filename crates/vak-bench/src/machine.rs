//! The machine and its processes as /proc describes them: cores, memory, CPU
//! model, descriptor limits, and a process's resident memory and CPU time.

use std::fmt;

/// What BENCHMARKS.md records about where it was measured.
#[derive(Clone, Debug)]
pub(crate) struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub mem_total_kib: u64,
    pub kernel: String,
    /// RLIMIT_NOFILE (soft, hard) as the bench found it, i.e. `ulimit -n` / `ulimit -Hn`.
    pub nofile_before: (u64, u64),
    /// RLIMIT_NOFILE soft limit after the bench raised it (the server inherits it).
    pub nofile_after: u64,
    /// /proc/loadavg when the bench started: other work on the machine skews every figure.
    pub load_at_start: String,
}

impl Machine {
    pub(crate) fn probe(nofile_before: (u64, u64), nofile_after: u64) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total_kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Machine {
            cpu_model,
            cores,
            mem_total_kib,
            kernel,
            nofile_before,
            nofile_after,
            load_at_start: load_average(),
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cores, {:.1} GiB RAM, {}, Linux {}; ulimit -n {} (hard {}), raised to {} for the bench and the server; load average {} at the start",
            self.cores,
            self.mem_total_kib as f64 / (1024.0 * 1024.0),
            self.cpu_model,
            self.kernel,
            self.nofile_before.0,
            self.nofile_before.1,
            self.nofile_after,
            self.load_at_start
        )
    }
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Raises this process's RLIMIT_NOFILE soft limit to its hard limit, so the
/// bench can hold 10 000 connections and the server it spawns inherits the
/// same limit. Returns ((soft, hard) before, soft after).
pub(crate) fn raise_nofile() -> ((u64, u64), u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return ((0, 0), 0);
        }
        let before = (lim.rlim_cur, lim.rlim_max);
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return (before, before.0);
        }
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut now);
        (before, now.rlim_cur)
    }
}

/// This process's RLIMIT_NOFILE soft limit now (0 if unknown).
pub(crate) fn nofile_soft() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX),
        _ => 0,
    }
}

/// One field of /proc/<pid>/status in KiB (VmRSS, VmHWM).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| {
        v.trim_start_matches(':')
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// Resident memory now.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS")
}

/// The threads a process has now.
pub(crate) fn threads(pid: u32) -> Option<u64> {
    status_kib(pid, "Threads")
}

/// Peak resident memory since the process started.
pub(crate) fn hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM")
}

/// Resets a process's VmHWM to its current RSS (writing 5 to
/// /proc/<pid>/clear_refs, Linux 4.0 and later), so a later VmHWM is the
/// peak of what came after. False when the kernel refused.
pub(crate) fn reset_hwm(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The soft "Max open files" of a process, from /proc/<pid>/limits.
pub(crate) fn nofile_of(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = s.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// User + system CPU seconds a process has used (0 = this process).
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let path = if pid == 0 {
        "/proc/self/stat".to_string()
    } else {
        format!("/proc/{pid}/stat")
    };
    let Ok(s) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // The command name may contain spaces; fields restart after its ')'.
    let Some(rest) = s.rfind(')').map(|i| &s[i + 1..]) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// CPU seconds the whole machine has been busy (all cores: /proc/stat minus idle and iowait).
pub(crate) fn machine_busy_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = s.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let busy: u64 =
        v.iter().take(8).sum::<u64>() - v.get(3).copied().unwrap_or(0) - v.get(4).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy as f64 / hz
}

/// CPU time of a process, of the bench itself and of the machine at one moment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuMark {
    server: f64,
    bench: f64,
    machine: f64,
    at: std::time::Instant,
}

/// CPU used between two marks, in seconds: the server, the bench, everything
/// else on the machine (other people's work competes for the same cores), and the wall time.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuUse {
    pub server: f64,
    pub bench: f64,
    pub others: f64,
    pub wall: f64,
}

impl CpuMark {
    pub(crate) fn now(server_pid: u32) -> CpuMark {
        CpuMark {
            server: cpu_seconds(server_pid),
            bench: cpu_seconds(0),
            machine: machine_busy_seconds(),
            at: std::time::Instant::now(),
        }
    }

    pub(crate) fn since(&self, server_pid: u32) -> CpuUse {
        let server = cpu_seconds(server_pid) - self.server;
        let bench = cpu_seconds(0) - self.bench;
        let machine = machine_busy_seconds() - self.machine;
        CpuUse {
            server,
            bench,
            others: (machine - server - bench).max(0.0),
            wall: self.at.elapsed().as_secs_f64(),
        }
    }
}
