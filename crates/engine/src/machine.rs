//! What the machine lets this process use: host memory (what the system still has available,
//! within the memory limit of the process's control group — how Slurm and containers bound a
//! job — and what the process holds already), read from `/proc` and the cgroup file system
//! (v1 and v2). The GPU's free memory comes from the backend ([`grinnder_tensor::Memory`]).
//!
//! Invariant: reading never fails; a figure the system does not give is `None` and the
//! planner does without it.

use std::path::{Path, PathBuf};

/// Host memory figures, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemory {
    /// `MemAvailable` of `/proc/meminfo`: what the system can give without swapping.
    pub available: Option<u64>,
    /// The control group's memory limit (the least of it and its ancestors'), where one is set.
    pub cgroup_limit: Option<u64>,
    /// The control group's memory in use, less its page cache of files (which the system
    /// reclaims before it enforces the limit).
    pub cgroup_used: Option<u64>,
    /// This process's resident set now.
    pub process: u64,
    /// The address-space limit (`ulimit -v`, `RLIMIT_AS`), where one is set: no allocation
    /// past it succeeds, whatever the system has free.
    pub address_limit: Option<u64>,
}

/// `RLIMIT_AS`, where it is not unlimited.
fn address_limit() -> Option<u64> {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut l) } == 0;
    (ok && l.rlim_cur != libc::RLIM_INFINITY).then_some(l.rlim_cur)
}

impl HostMemory {
    /// The figures of this process now.
    pub fn read() -> HostMemory {
        let cgroup = cgroup_memory();
        HostMemory {
            available: meminfo_bytes("MemAvailable:"),
            cgroup_limit: cgroup.map(|c| c.0),
            cgroup_used: cgroup.and_then(|c| c.1),
            process: crate::process::rss_bytes(),
            address_limit: address_limit(),
        }
    }

    /// Bytes this process may hold in all: what it holds, plus what the system can still give
    /// it, within its control group's limit (whose use counts reclaimable page cache: the
    /// part of it this process's own file reads hold is taken as reclaimable too).
    pub fn usable(&self) -> Option<u64> {
        let system = self.available.map(|a| a + self.process);
        let group = self.cgroup_limit.map(|l| match self.cgroup_used {
            Some(u) => l.saturating_sub(u) + self.process,
            None => l,
        });
        [system, group, self.address_limit].into_iter().flatten().min()
    }

    /// How the figures were found, for `info` and the logs.
    pub fn describe(&self) -> String {
        let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
        let mut parts = Vec::new();
        if let Some(a) = self.available {
            parts.push(format!("{} available", gib(a)));
        }
        if let Some(l) = self.cgroup_limit {
            let used = self.cgroup_used.map_or(String::new(), |u| format!(", {} of it in use", gib(u)));
            parts.push(format!("a control-group limit of {}{used}", gib(l)));
        }
        if let Some(l) = self.address_limit {
            parts.push(format!("an address-space limit (ulimit -v) of {}", gib(l)));
        }
        parts.push(format!("{} held by this process", gib(self.process)));
        parts.join(", ")
    }
}

/// A `kB` field of `/proc/meminfo`, in bytes.
fn meminfo_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = text.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?;
    kb.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Limits above this are "no limit" (cgroup v1 writes the largest page-aligned i64).
const NO_LIMIT: u64 = 1 << 60;

/// The memory limit (the least along the path to the hierarchy's root) and use of this
/// process's control group, where a limit is set.
fn cgroup_memory() -> Option<(u64, Option<u64>)> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // v2: "0::/path" and a cgroup2 mount; v1: "N:memory:/path" and a cgroup mount with "memory"
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let v1 = controllers.split(',').any(|c| c == "memory");
        if !(v1 || controllers.is_empty()) {
            continue;
        }
        let Some(mount) = mount_point(&mounts, v1) else { continue };
        let (limit_file, used_file) = if v1 {
            ("memory.limit_in_bytes", "memory.usage_in_bytes")
        } else {
            ("memory.max", "memory.current")
        };
        let leaf = leaf_dir(&mount, path);
        let limit = leaf
            .ancestors()
            .take_while(|d| d.starts_with(&mount))
            .filter_map(|d| number(&d.join(limit_file)))
            .min();
        if let Some(limit) = limit.filter(|&l| l < NO_LIMIT) {
            // the use counts the page cache of files, which the system takes back before it
            // enforces the limit (MemAvailable counts it free likewise)
            let stat = leaf.join("memory.stat");
            let files: u64 = if v1 {
                ["total_active_file", "total_inactive_file"]
            } else {
                ["active_file", "inactive_file"]
            }
            .iter()
            .filter_map(|f| stat_field(&stat, f))
            .sum();
            let used = number(&leaf.join(used_file)).map(|u| u.saturating_sub(files));
            return Some((limit, used));
        }
    }
    None
}

/// The mount point of the memory hierarchy: a `cgroup` mount with the `memory` option (v1) or
/// the `cgroup2` mount.
fn mount_point(mountinfo: &str, v1: bool) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, options) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        let ok = if v1 {
            fstype == "cgroup" && options.split(',').any(|o| o == "memory")
        } else {
            fstype == "cgroup2"
        };
        if !ok {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The process's cgroup directory under `mount` (the mount itself where the path is not
/// there: a namespace whose root is the mount).
fn leaf_dir(mount: &Path, path: &str) -> PathBuf {
    let d = mount.join(path.trim_start_matches('/'));
    if d.is_dir() {
        d
    } else {
        mount.to_path_buf()
    }
}

/// A `name value` line of a `memory.stat` file.
fn stat_field(p: &Path, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(p).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A file holding one number (`max` is none).
fn number(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usable_memory_is_the_least_of_the_system_and_the_group() {
        let g = 1u64 << 30;
        let m = HostMemory {
            available: Some(20 * g),
            cgroup_limit: None,
            cgroup_used: None,
            process: g,
            address_limit: None,
        };
        assert_eq!(m.usable(), Some(21 * g));
        let m = HostMemory { cgroup_limit: Some(8 * g), cgroup_used: Some(3 * g), ..m };
        assert_eq!(m.usable(), Some(6 * g), "the group's room plus what the process holds");
        let m = HostMemory { available: Some(2 * g), ..m };
        assert_eq!(m.usable(), Some(3 * g));
        assert_eq!(HostMemory::default().usable(), None);
        assert!(m.describe().contains("control-group limit of 8.0 GiB"), "{}", m.describe());
        let m = HostMemory { address_limit: Some(g), ..m };
        assert_eq!(m.usable(), Some(g), "no allocation passes ulimit -v");
    }

    #[test]
    fn the_memory_hierarchy_is_found_in_mountinfo() {
        let v1 = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(mount_point(v1, true), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(mount_point(v1, false), None);
        assert_eq!(mount_point(v2, false), Some(PathBuf::from("/sys/fs/cgroup")));
        let here = HostMemory::read();
        assert!(here.available.is_some() && here.process > 0, "{here:?}");
    }
}
