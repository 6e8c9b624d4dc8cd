//! Facts about the host that are not topology: which allocator libraries are
//! installed, looked up in the places loaders and package managers put them.

use std::path::{Path, PathBuf};

use crate::plan::{Allocator, AllocatorKind};

/// Library directories to search, most specific first.
pub fn library_dirs(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut dirs = vec![];
    for var in ["CONDA_PREFIX", "VIRTUAL_ENV"] {
        if let Some(p) = env(var).filter(|p| !p.is_empty()) {
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

/// Allocator libraries found in `dirs`, tcmalloc's full and minimal builds and
/// jemalloc, versioned names first (the unversioned ones come with -dev only).
pub fn find_allocators_in(dirs: &[PathBuf]) -> Vec<Allocator> {
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
    let mut out = vec![];
    for (kind, files) in names {
        'found: for dir in dirs {
            for f in files {
                let p = dir.join(f);
                if p.is_file() {
                    out.push(Allocator {
                        kind,
                        path: p.display().to_string(),
                    });
                    break 'found;
                }
            }
        }
    }
    out
}

/// Allocators on this machine.
pub fn find_allocators() -> Vec<Allocator> {
    find_allocators_in(&library_dirs(&|k| std::env::var(k).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_versioned_names_in_given_dirs() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("libjemalloc.so.2"), b"").unwrap();
        let found = find_allocators_in(&[d.path().to_path_buf()]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, AllocatorKind::Jemalloc);
        assert!(found[0].path.ends_with("libjemalloc.so.2"));
        let dirs = library_dirs(&|k| (k == "CONDA_PREFIX").then(|| "/opt/conda".to_string()));
        assert_eq!(dirs[0], PathBuf::from("/opt/conda/lib"));
    }
}
