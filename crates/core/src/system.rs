//! A snapshot of the machine a run was measured on (CPU, cores, memory, kernel, governor, load),
//! read from /proc and /sys; every field is optional because not every system exposes it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct SystemSnapshot {
    pub cpu_model: Option<String>,
    pub logical_cpus: Option<u32>,
    pub physical_cores: Option<u32>,
    pub cpu_flags: Vec<String>,
    pub mem_total_bytes: Option<u64>,
    pub mem_available_bytes: Option<u64>,
    pub kernel: Option<String>,
    pub governor: Option<String>,
    pub load_avg: Option<[f64; 3]>,
    pub hostname: Option<String>,
}

/// CPU flags worth recording for kernels' code paths.
const FLAGS_OF_INTEREST: [&str; 10] = [
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "amx_int8",
    "bmi2",
];

impl SystemSnapshot {
    pub fn take() -> SystemSnapshot {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mut snap = parse_cpuinfo(&cpuinfo);
        snap.mem_total_bytes = meminfo_kib(&meminfo, "MemTotal").map(|k| k * 1024);
        snap.mem_available_bytes = meminfo_kib(&meminfo, "MemAvailable").map(|k| k * 1024);
        snap.logical_cpus = snap.logical_cpus.or_else(|| {
            std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as u32)
        });
        snap.kernel = read_trim("/proc/sys/kernel/osrelease");
        snap.governor = read_trim("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor");
        snap.hostname = read_trim("/proc/sys/kernel/hostname");
        snap.load_avg = read_trim("/proc/loadavg").and_then(|s| {
            let v: Vec<f64> = s
                .split_whitespace()
                .take(3)
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() == 3).then(|| [v[0], v[1], v[2]])
        });
        snap
    }
}

/// This process's peak resident set size (`VmHWM`), where /proc tells it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    meminfo_kib(&status, "VmHWM").map(|k| k * 1024)
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// `MemTotal:  24576000 kB` -> 24576000.
pub fn meminfo_kib(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// CPU model, logical CPUs, physical cores and flags from /proc/cpuinfo text.
pub fn parse_cpuinfo(text: &str) -> SystemSnapshot {
    let mut snap = SystemSnapshot::default();
    let mut logical = 0u32;
    let mut cores = std::collections::BTreeSet::new();
    let mut physical_id = String::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "processor" => logical += 1,
            "model name" if snap.cpu_model.is_none() => snap.cpu_model = Some(v.to_string()),
            "physical id" => physical_id = v.to_string(),
            "core id" => {
                cores.insert((physical_id.clone(), v.to_string()));
            }
            "flags" if snap.cpu_flags.is_empty() => {
                let all: Vec<&str> = v.split_whitespace().collect();
                snap.cpu_flags = FLAGS_OF_INTEREST
                    .iter()
                    .filter(|f| all.contains(f))
                    .map(|f| f.to_string())
                    .collect();
            }
            _ => {}
        }
    }
    snap.logical_cpus = (logical > 0).then_some(logical);
    snap.physical_cores = (!cores.is_empty()).then_some(cores.len() as u32);
    snap
}

/// The inodes of the TCP sockets listening on `port` in a `/proc/net/tcp` or `tcp6` table.
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit_once(':')?.1;
            let listening = *f.get(3)? == "0A";
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The loopback ports a table's established connections of these socket inodes lead to.
pub fn loopback_peer_ports(table: &str, inodes: &[u64]) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, port) = f.get(2)?.rsplit_once(':')?;
            let established = *f.get(3)? == "01";
            let inode: u64 = f.get(9)?.parse().ok()?;
            // 127.0.0.0/8 in /proc's little-endian hex: the last byte of the first word is 7F
            let loopback = addr.len() == 8 && addr.ends_with("7F");
            (established && loopback && inodes.contains(&inode))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// The socket inodes a process holds (its /proc/<pid>/fd links `socket:[N]`).
pub fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| {
            let l = std::fs::read_link(fd.path()).ok()?;
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The processes of this machine listening on TCP `port` (through /proc; empty where it is
/// not there or the sockets belong to processes this one cannot inspect).
pub fn listening_pids(port: u16) -> Vec<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(t) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&t, port));
        }
    }
    if inodes.is_empty() {
        return Vec::new();
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    processes()
        .filter(|(_, dir)| {
            std::fs::read_dir(dir.join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|l| wanted.iter().any(|w| l.as_os_str() == w.as_str()))
                })
            })
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// The processes of this machine: each pid with its /proc folder (none where /proc is not
/// there).
pub fn processes() -> impl Iterator<Item = (u32, std::path::PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flat_map(|procs| procs.flatten())
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, entry.path()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpuinfo_and_meminfo() {
        let cpu = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nphysical id\t: 0\ncore id\t: 0\nflags\t: fpu avx avx2 fma f16c\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\nphysical id\t: 0\ncore id\t: 1\nflags\t: fpu avx avx2 fma f16c\n";
        let s = parse_cpuinfo(cpu);
        assert_eq!(s.cpu_model.as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(s.logical_cpus, Some(2));
        assert_eq!(s.physical_cores, Some(2));
        assert_eq!(s.cpu_flags, vec!["avx", "avx2", "fma", "f16c"]);
        let mem = "MemTotal:       24576000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_kib(mem, "MemTotal"), Some(24_576_000));
        assert_eq!(meminfo_kib(mem, "MemAvailable"), Some(20_000_000));
        assert_eq!(meminfo_kib(mem, "Nope"), None);
    }

    #[test]
    fn listening_sockets_by_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1677 1 0 100 0 0 10 0\n   1: 0100007F:C38E 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 22917 1 0 100 0 0 10 0\n   3: 0100007F:AECE 0100007F:C38E 01 00000000:00000000 03:00000816 00000000     0        0 555 3 0\n";
        // 0xC38E = 50062: the listening socket, not the connection to it
        assert_eq!(listening_inodes(table, 50062), vec![22917]);
        assert_eq!(listening_inodes(table, 2024), vec![1677]);
        assert!(listening_inodes(table, 44750).is_empty());
        // the connection from port 44750 (0xAECE) leads to 50062; a listening socket leads nowhere
        assert_eq!(loopback_peer_ports(table, &[555]), vec![50062]);
        assert!(loopback_peer_ports(table, &[22917]).is_empty());
        assert!(loopback_peer_ports(table, &[9]).is_empty());
    }
}
