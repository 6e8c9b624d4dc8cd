//! Facts about the host that are not topology: which allocator libraries are
//! installed, looked up in the places loaders and package managers put them,
//! and the planner's `Facts` made of them.

use std::path::{Path, PathBuf};

use crate::plan::{Allocator, AllocatorChoice, AllocatorKind, Facts, PlanRequest};

/// Library directories to search, most specific first. A relative
/// `$CONDA_PREFIX`/`$VIRTUAL_ENV` is left out: ld.so would resolve it against
/// each rank's working directory.
pub(crate) fn library_dirs(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut dirs = vec![];
    for var in ["CONDA_PREFIX", "VIRTUAL_ENV"] {
        if let Some(p) = env(var).filter(|p| p.starts_with('/')) {
            dirs.push(Path::new(&p).join("lib"));
        }
    }
    let triple = match std::env::consts::ARCH {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "riscv64" => "riscv64-linux-gnu",
        other => other,
    };
    for d in [
        format!("/usr/lib/{triple}"),
        format!("/lib/{triple}"),
        "/usr/lib64".to_string(),
        "/usr/local/lib".to_string(),
        "/usr/lib".to_string(),
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// Why a library must not be preloaded, or None when it may: LD_PRELOAD
/// splits at spaces and colons, and a file (or any directory above it) that
/// someone else can write would let them run code in every rank (often root's).
pub(crate) fn preload_refusal(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display().to_string();
    if !path.is_absolute() {
        return Some("not an absolute path".into());
    }
    if shown.contains([' ', ':', '\t', '\n']) {
        return Some("its path holds a space or colon, which LD_PRELOAD would split".into());
    }
    let real = match std::fs::canonicalize(path) {
        Ok(r) => r,
        Err(e) => return Some(e.to_string()),
    };
    // SAFETY: plain syscall.
    let me = unsafe { libc::geteuid() };
    let mut p: Option<&Path> = Some(&real);
    let mut first = true;
    while let Some(d) = p {
        let Ok(m) = std::fs::metadata(d) else {
            return Some(format!("cannot inspect {}", d.display()));
        };
        if first && !m.is_file() {
            return Some("not a regular file".into());
        }
        if m.uid() != 0 && m.uid() != me {
            return Some(format!("{} is owned by uid {}", d.display(), m.uid()));
        }
        // A sticky directory (/tmp) still lets others plant files: refused too.
        if m.mode() & 0o022 != 0 {
            return Some(format!(
                "{} is writable by others (mode {:o})",
                d.display(),
                m.mode() & 0o7777
            ));
        }
        first = false;
        p = d.parent();
    }
    None
}

/// The allocator libraries found, and those passed over with the reason.
#[derive(Debug, Clone, Default)]
pub(crate) struct AllocatorSearch {
    pub found: Vec<Allocator>,
    pub skipped: Vec<String>,
}

/// Allocator libraries found in `dirs`, tcmalloc's full and minimal builds and
/// jemalloc, versioned names first (the unversioned ones come with -dev only);
/// a file that fails `preload_refusal` is skipped and said.
pub(crate) fn find_allocators_in(dirs: &[PathBuf]) -> AllocatorSearch {
    let names: [(AllocatorKind, &[&str]); 2] = [
        (
            AllocatorKind::Tcmalloc,
            &[
                "libtcmalloc.so.4",
                "libtcmalloc_minimal.so.4",
                "libtcmalloc.so",
                "libtcmalloc_minimal.so",
            ],
        ),
        (
            AllocatorKind::Jemalloc,
            &["libjemalloc.so.2", "libjemalloc.so"],
        ),
    ];
    let mut out = AllocatorSearch::default();
    for (kind, files) in names {
        'found: for dir in dirs {
            for f in files {
                let p = dir.join(f);
                if !p.exists() {
                    continue;
                }
                match preload_refusal(&p) {
                    None => {
                        out.found.push(Allocator {
                            kind,
                            path: p.display().to_string(),
                        });
                        break 'found;
                    }
                    Some(why) => out
                        .skipped
                        .push(format!("{} not preloaded: {why}", p.display())),
                }
            }
        }
    }
    out
}

/// Allocators on this machine.
pub(crate) fn find_allocators() -> AllocatorSearch {
    find_allocators_in(&library_dirs(&|k| std::env::var(k).ok()))
}

/// What the planner may use besides the topology: the allocator libraries on
/// this machine, looked up only when the request asks for one.
pub(crate) fn facts(req: &PlanRequest) -> Facts {
    if req.allocator == AllocatorChoice::None {
        Facts::default()
    } else {
        facts_with_allocators()
    }
}

/// Facts with the allocator search done (tune: any configuration may ask).
pub(crate) fn facts_with_allocators() -> Facts {
    let s = find_allocators();
    Facts {
        allocators: s.found,
        skipped_allocators: s.skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory no one else can write to, all the way up (/tmp is 1777,
    /// and the checkout may be under it).
    fn private_dir() -> tempfile::TempDir {
        use std::os::unix::fs::MetadataExt;
        let private = |d: &Path| {
            d.ancestors()
                .all(|a| std::fs::metadata(a).is_ok_and(|m| m.mode() & 0o022 == 0))
        };
        let base = [env!("CARGO_MANIFEST_DIR"), "/root", "/var/cache", "/run"]
            .into_iter()
            .map(Path::new)
            .find(|d| d.is_dir() && private(d))
            .expect("a directory only root can write to");
        tempfile::tempdir_in(base).unwrap()
    }

    #[test]
    fn finds_versioned_names_in_given_dirs() {
        let d = private_dir();
        std::fs::write(d.path().join("libjemalloc.so.2"), b"").unwrap();
        let found = find_allocators_in(&[d.path().to_path_buf()]).found;
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, AllocatorKind::Jemalloc);
        assert!(found[0].path.ends_with("libjemalloc.so.2"));
        let dirs = library_dirs(&|k| (k == "CONDA_PREFIX").then(|| "/opt/conda".to_string()));
        assert_eq!(dirs[0], PathBuf::from("/opt/conda/lib"));
        let dirs = library_dirs(&|k| (k == "VIRTUAL_ENV").then(|| "env".to_string()));
        assert!(
            !dirs.contains(&PathBuf::from("env/lib")),
            "relative prefix left out"
        );
    }

    #[test]
    fn unsafe_libraries_are_skipped_with_the_reason() {
        use std::os::unix::fs::PermissionsExt;
        let d = private_dir();
        let open = d.path().join("world");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(open.join("libjemalloc.so.2"), b"").unwrap();
        let spaced = d.path().join("my env");
        std::fs::create_dir(&spaced).unwrap();
        std::fs::write(spaced.join("libtcmalloc.so.4"), b"").unwrap();
        let s = find_allocators_in(&[open.clone(), spaced.clone()]);
        assert!(s.found.is_empty(), "{:?}", s.found);
        assert!(
            s.skipped.iter().any(|w| w.contains("writable by others")),
            "{:?}",
            s.skipped
        );
        assert!(
            s.skipped.iter().any(|w| w.contains("space or colon")),
            "{:?}",
            s.skipped
        );
        let f = open.join("libjemalloc.so.2");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(preload_refusal(&f).unwrap().contains("writable by others"));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(preload_refusal(&f), None);
        let tmp = tempfile::tempdir().unwrap();
        let in_tmp = tmp.path().join("libjemalloc.so.2");
        std::fs::write(&in_tmp, b"").unwrap();
        assert!(
            preload_refusal(&in_tmp)
                .unwrap()
                .contains("/tmp is writable by others")
        );
        assert_eq!(
            preload_refusal(Path::new("/usr/lib")).as_deref(),
            Some("not a regular file")
        );
    }
}
