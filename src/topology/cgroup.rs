//! Which CPUs and how much CPU time the cgroup lets this process have, for
//! cgroup v1 (cpuset, cpu controllers, and the old `cpuset` filesystem) and v2,
//! found the way the kernel describes it: `proc/self/cgroup` (or the older
//! `proc/self/cpuset`) for the path, `proc/mounts` for where each hierarchy is.
//! Everything is read below a root directory so that dumps work like the host.

use std::path::{Path, PathBuf};

use super::{CgroupVersion, fsread};
use crate::cpuset::CpuSet;

/// What the cgroups say about this process.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CgroupLimits {
    pub version: Option<CgroupVersion>,
    pub path: Option<String>,
    pub cpuset: Option<CpuSet>,
    /// quota / period, in CPUs.
    pub quota: Option<f64>,
}

#[derive(Debug)]
struct Mount {
    point: String,
    fstype: String,
    options: Vec<String>,
}

fn read(root: &Path, rel: &str) -> Option<String> {
    fsread::read_under(root, rel)
}

fn read_file(path: &Path) -> Option<String> {
    fsread::read_kernel_file(path, fsread::MAX_SYSFS_FILE).ok()
}

fn mounts(root: &Path) -> Vec<Mount> {
    let Some(text) = read(root, "proc/mounts") else {
        return vec![];
    };
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 4 {
                return None;
            }
            Some(Mount {
                point: f[1].replace("\\040", " "),
                fstype: f[2].to_string(),
                options: f[3].split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// `(controllers, path)` pairs from proc/self/cgroup; v2 has empty controllers.
fn membership(root: &Path) -> Vec<(Vec<String>, String)> {
    let Some(text) = read(root, "proc/self/cgroup") else {
        return vec![];
    };
    text.lines()
        .filter_map(|line| {
            let mut it = line.splitn(3, ':');
            let _id = it.next()?;
            let ctrls = it.next()?;
            let path = it.next()?;
            let ctrls = ctrls
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Some((ctrls, path.trim().to_string()))
        })
        .collect()
}

/// The cgroup v2 directory this process is in (below `root`), from
/// proc/mounts and proc/self/cgroup: where `run` makes its job cgroup.
pub(crate) fn own_v2_dir(root: &Path) -> Result<PathBuf, String> {
    let mount = mounts(root)
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .ok_or("no cgroup2 filesystem is mounted")?;
    let path = membership(root)
        .into_iter()
        .find_map(|(ctrls, path)| ctrls.is_empty().then_some(path))
        .ok_or("this process is in no cgroup v2")?;
    let rel = path.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return Err(format!("odd cgroup path {rel:?}"));
    }
    let base = fsread::under(root, &mount.point).ok_or("odd cgroup2 mount point")?;
    Ok(base.join(rel))
}

/// The directories from `mount/path` up to `mount`, deepest first.
fn ancestry(root: &Path, mount: &str, path: &str) -> Vec<PathBuf> {
    // A mount point with `..` would read outside the root: no directories.
    let Some(base) = fsread::under(root, mount) else {
        return vec![];
    };
    let mut out = vec![];
    let mut rel: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != "..")
        .collect();
    loop {
        let mut p = base.clone();
        for part in &rel {
            p.push(part);
        }
        out.push(p);
        if rel.pop().is_none() {
            break;
        }
    }
    out
}

/// The first readable, non-empty cpuset file found walking up from the cgroup.
fn cpuset_up(dirs: &[PathBuf], files: &[&str]) -> Option<CpuSet> {
    for dir in dirs {
        for f in files {
            if let Some(text) = read_file(&dir.join(f))
                && let Ok(set) = CpuSet::parse_list(&text)
                && !set.is_empty()
            {
                return Some(set);
            }
        }
    }
    None
}

/// The tightest quota along the path: a parent's limit binds its children too.
fn quota_up_v2(dirs: &[PathBuf]) -> Option<f64> {
    dirs.iter()
        .filter_map(|d| read_file(&d.join("cpu.max")))
        .filter_map(|t| parse_cpu_max(&t))
        .min_by(f64::total_cmp)
}

fn quota_up_v1(dirs: &[PathBuf]) -> Option<f64> {
    dirs.iter()
        .filter_map(|d| {
            let q = read_file(&d.join("cpu.cfs_quota_us"))?;
            let p = read_file(&d.join("cpu.cfs_period_us"))?;
            parse_cfs(&q, &p)
        })
        .min_by(f64::total_cmp)
}

/// `cpu.max`: "max 100000" (no limit) or "50000 100000".
pub(crate) fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut it = text.split_whitespace();
    let quota = it.next()?;
    let period: f64 = it.next().map_or(Some(100000.0), |p| p.parse().ok())?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    let q: f64 = quota.parse().ok()?;
    (q > 0.0).then_some(q / period)
}

/// v1 `cpu.cfs_quota_us` (-1 = no limit) over `cpu.cfs_period_us`.
pub(crate) fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    let q: i64 = quota.trim().parse().ok()?;
    let p: i64 = period.trim().parse().ok()?;
    (q > 0 && p > 0).then(|| q as f64 / p as f64)
}

/// Where the process's cgroups are: the mounts, its membership, the legacy
/// `/proc/self/cpuset` path.
struct Where<'a> {
    root: &'a Path,
    mounts: Vec<Mount>,
    members: Vec<(Vec<String>, String)>,
    old_cpuset_path: Option<String>,
}

impl Where<'_> {
    /// The unified (v2) hierarchy's path.
    fn v2_path(&self) -> Option<String> {
        self.members
            .iter()
            .find(|(c, _)| c.is_empty())
            .map(|(_, p)| p.clone())
    }
    fn v1_path(&self, ctrl: &str) -> Option<String> {
        self.members
            .iter()
            .find(|(c, _)| c.iter().any(|x| x == ctrl))
            .map(|(_, p)| p.clone())
    }
    fn v1_mount(&self, ctrl: &str) -> Option<&Mount> {
        self.mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == ctrl))
    }
    fn v2_mount(&self) -> Option<&Mount> {
        self.mounts.iter().find(|m| m.fstype == "cgroup2")
    }
}

/// Read the cgroup limits of the process whose `/proc/self` is under `root`.
pub(crate) fn probe(root: &Path) -> CgroupLimits {
    let w = Where {
        root,
        mounts: mounts(root),
        members: membership(root),
        old_cpuset_path: read(root, "proc/self/cpuset").map(|s| s.trim().to_string()),
    };
    let mut out = CgroupLimits::default();
    cpuset_limit(&w, &mut out);
    quota_limit(&w, &mut out);
    out
}

/// cpuset: v1 cpuset controller, then the legacy cpuset fs, then v2.
fn cpuset_limit(w: &Where, out: &mut CgroupLimits) {
    let root = w.root;
    if let Some(m) = w.v1_mount("cpuset") {
        let path = w.v1_path("cpuset").or(w.old_cpuset_path.clone());
        if let Some(path) = path {
            let dirs = ancestry(root, &m.point, &path);
            // v1 keeps the configured set in cpuset.cpus (what hwloc reads
            // too); mounted with `noprefix`, the files are cpus, effective_cpus.
            let files: &[&str] = if m.options.iter().any(|o| o == "noprefix") {
                &["cpus", "effective_cpus"]
            } else {
                &["cpuset.cpus", "cpuset.effective_cpus"]
            };
            out.cpuset = cpuset_up(&dirs, files);
            if out.cpuset.is_some() {
                out.version = Some(CgroupVersion::V1);
                out.path = Some(path);
            }
        }
    } else if let Some(m) = w.mounts.iter().find(|m| m.fstype == "cpuset") {
        if let Some(path) = w.old_cpuset_path.clone() {
            let dirs = ancestry(root, &m.point, &path);
            out.cpuset = cpuset_up(&dirs, &["cpus", "cpuset.cpus"]);
            if out.cpuset.is_some() {
                out.version = Some(CgroupVersion::V1);
                out.path = Some(path);
            }
        }
    }
    if out.cpuset.is_none()
        && let Some(m) = w.v2_mount()
        && let Some(path) = w.v2_path().or(w.old_cpuset_path.clone())
    {
        let dirs = ancestry(root, &m.point, &path);
        out.cpuset = cpuset_up(&dirs, &["cpuset.cpus.effective", "cpuset.cpus"]);
        if out.cpuset.is_some() {
            out.version = Some(CgroupVersion::V2);
            out.path = Some(path);
        }
    }
}

/// CPU quota: v1 cpu controller, then v2.
fn quota_limit(w: &Where, out: &mut CgroupLimits) {
    let root = w.root;
    if let Some(m) = w.v1_mount("cpu")
        && let Some(path) = w.v1_path("cpu")
    {
        out.quota = quota_up_v1(&ancestry(root, &m.point, &path));
        if out.quota.is_some() {
            out.version.get_or_insert(CgroupVersion::V1);
            out.path.get_or_insert(path);
        }
    }
    // v2's path, or (dumps with only proc/self/cpuset) the cpuset's, which
    // in the unified hierarchy is the same cgroup.
    if out.quota.is_none()
        && let Some(m) = w.v2_mount()
        && let Some(path) = w.v2_path().or(w.old_cpuset_path.clone())
    {
        out.quota = quota_up_v2(&ancestry(root, &m.point, &path));
        if out.quota.is_some() {
            out.version.get_or_insert(CgroupVersion::V2);
            out.path.get_or_insert(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fsread::fake_root;

    #[test]
    fn quota_forms() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("250000 100000"), Some(2.5));
        assert_eq!(parse_cpu_max("garbage"), None);
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("50000", "100000"), Some(0.5));
        assert_eq!(parse_cfs("x", "100000"), None);
    }

    #[test]
    fn v2_cpuset_and_quota_from_a_fake_root() {
        let dir = fake_root(&[
            ("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"),
            ("proc/self/cgroup", "0::/job/step\n"),
            ("sys/fs/cgroup/job/cpuset.cpus.effective", "2-3\n"),
            ("sys/fs/cgroup/job/cpu.max", "150000 100000\n"),
            ("sys/fs/cgroup/job/step/cpu.max", "max 100000\n"),
        ]);
        let l = probe(dir.path());
        assert_eq!(l.version, Some(CgroupVersion::V2));
        assert_eq!(l.cpuset.unwrap().to_string(), "2-3");
        assert_eq!(l.quota, Some(1.5));
        assert_eq!(
            own_v2_dir(dir.path()).unwrap(),
            dir.path().join("sys/fs/cgroup/job/step")
        );
    }

    #[test]
    fn own_v2_dir_needs_a_v2_mount_and_membership() {
        let no_mount = fake_root(&[("proc/self/cgroup", "0::/a\n")]);
        assert!(
            own_v2_dir(no_mount.path())
                .unwrap_err()
                .contains("no cgroup2")
        );
        let v1_only = fake_root(&[
            ("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"),
            ("proc/self/cgroup", "3:cpuset:/slurm/job1\n"),
        ]);
        assert!(
            own_v2_dir(v1_only.path())
                .unwrap_err()
                .contains("no cgroup v2")
        );
        let odd = fake_root(&[
            ("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"),
            ("proc/self/cgroup", "0::/a/../../etc\n"),
        ]);
        assert!(
            own_v2_dir(odd.path())
                .unwrap_err()
                .contains("odd cgroup path")
        );
    }

    #[test]
    fn v1_cpuset_mounted_with_noprefix() {
        let d = fake_root(&[
            (
                "proc/mounts",
                "cgroup /dev/cpuset cgroup rw,relatime,cpuset,noprefix 0 0\n",
            ),
            ("proc/self/cgroup", "3:cpuset:/slurm/job1\n"),
            ("dev/cpuset/slurm/job1/cpus", "4-5\n"),
            ("dev/cpuset/slurm/job1/mems", "0\n"),
        ]);
        let l = probe(d.path());
        assert_eq!(l.version, Some(CgroupVersion::V1));
        assert_eq!(l.cpuset.unwrap().to_string(), "4-5");
    }

    #[test]
    fn a_mount_point_cannot_leave_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("cpuset.cpus.effective"), "7\n").unwrap();
        let name = outside.path().file_name().unwrap().to_str().unwrap();
        let d = fake_root(&[
            (
                "proc/mounts",
                &format!(
                    "cgroup2 /../../../../..{} cgroup2 rw 0 0\n",
                    outside.path().display()
                ),
            ),
            ("proc/self/cgroup", "0::/\n"),
        ]);
        assert!(!name.is_empty());
        assert_eq!(probe(d.path()).cpuset, None);
    }

    #[test]
    fn nothing_found_means_no_limits() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe(dir.path()), CgroupLimits::default());
    }
}
