//! Files the user names for our output (tune reports, saved plans, rank logs),
//! written safely although we usually run as root: a regular file is replaced
//! atomically through an unpredictable, exclusively created temporary beside
//! it; a device, FIFO or socket (`/dev/stdout`, `/dev/null`, a pipe) is written
//! in place and never replaced; a symbolic link to a regular file is refused,
//! since a link planted where a report goes would make root overwrite its
//! target.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    #[error("{path} is a symbolic link to a regular file; threadwise does not write through it")]
    Symlink { path: PathBuf },
    #[error("{path} is a directory")]
    Directory { path: PathBuf },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl FileError {
    pub(crate) fn advice(&self) -> &'static str {
        match self {
            FileError::Symlink { .. } => "give the link's target, or remove the link",
            FileError::Directory { .. } => "give a file name",
            FileError::Io { .. } => "check the path, its directory's permissions and free space",
        }
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What `path` is now, following at most the link itself.
enum Target {
    Missing,
    Regular,
    /// A device, FIFO or socket, directly or behind a link: write in place.
    Special,
}

fn target(path: &Path) -> Result<Target, FileError> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::Missing),
        r => r.map_err(io(path))?,
    };
    let ft = meta.file_type();
    if ft.is_symlink() {
        // /dev/stdout and /dev/fd/N are links to pipes, terminals or files:
        // only the special ones are written through.
        return match std::fs::metadata(path) {
            Ok(m) if is_special(&m.file_type()) => Ok(Target::Special),
            _ => Err(FileError::Symlink {
                path: path.to_path_buf(),
            }),
        };
    }
    if ft.is_dir() {
        return Err(FileError::Directory {
            path: path.to_path_buf(),
        });
    }
    Ok(if is_special(&ft) {
        Target::Special
    } else {
        Target::Regular
    })
}

fn is_special(ft: &std::fs::FileType) -> bool {
    ft.is_char_device() || ft.is_block_device() || ft.is_fifo() || ft.is_socket()
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Check before any work that `write_output(path)` can succeed: not a
/// directory, not a link to a regular file, in an existing directory.
pub(crate) fn check_output(path: &Path) -> Result<(), FileError> {
    match target(path)? {
        Target::Special => Ok(()),
        Target::Missing | Target::Regular => {
            let dir = parent(path);
            if dir.is_dir() {
                Ok(())
            } else {
                Err(FileError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no directory {}", dir.display()),
                    ),
                })
            }
        }
    }
}

/// Write `bytes` to `path` whole: atomically for a regular file, in place for
/// a device or FIFO.
pub(crate) fn write_output(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    match target(path)? {
        Target::Special => {
            let mut f = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io(path))?;
            f.write_all(bytes).and_then(|_| f.flush()).map_err(io(path))
        }
        Target::Missing | Target::Regular => replace(path, bytes, true),
    }
}

/// Replace `path` with `bytes` in one rename (readers see the old file or
/// the new one, never half); `durable`: on disk before the rename, for what
/// must survive a crash (results), not for what lives as long as a process.
pub(crate) fn replace(path: &Path, bytes: &[u8], durable: bool) -> Result<(), FileError> {
    let dir = parent(path);
    // tempfile: a random name created with O_EXCL, mode 0600.
    let mut tmp = tempfile::Builder::new()
        .prefix(".threadwise-")
        .tempfile_in(dir)
        .map_err(io(path))?;
    tmp.write_all(bytes)
        .and_then(|_| match durable {
            true => tmp.as_file().sync_data(),
            false => Ok(()),
        })
        .map_err(io(path))?;
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(io(path))?;
    tmp.persist(path).map_err(|e| io(path)(e.error))?;
    Ok(())
}

/// Create `dir` and the directories above it that are missing, each readable
/// by its owner alone (0700), as torchrun's own log directory is; a
/// directory already there keeps its mode (the user's word on who reads).
pub(crate) fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Open a log file for writing without following a symbolic link at its name
/// (a planted `rank-0.stdout` link must not truncate its target). The rule
/// for who may read it: the file is its owner's alone (0600) unless its
/// directory lets others in, then they may read it as they may list the
/// directory (the directory's group and other read bits); the umask applies
/// on top, as it does to every file.
pub(crate) fn create_log(path: &Path) -> Result<File, FileError> {
    use std::os::unix::fs::MetadataExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let open_to = dir
        .and_then(|d| std::fs::metadata(d).ok())
        .map_or(0, |m| m.mode() & 0o044);
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600 | open_to)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                FileError::Symlink {
                    path: path.to_path_buf(),
                }
            } else {
                io(path)(e)
            }
        })
}

impl crate::error::Hinted for FileError {
    fn hint(&self) -> String {
        self.advice().into()
    }
    fn kind(&self) -> crate::error::Kind {
        crate::error::Kind::Environment
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_replaced_atomically_and_nothing_is_left() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.json");
        write_output(&p, b"one").unwrap();
        write_output(&p, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_link_to_a_regular_file_is_refused_and_its_target_kept() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = d.path().join("r.csv");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = write_output(&link, b"x").unwrap_err();
        assert!(matches!(e, FileError::Symlink { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let e = create_log(&link).unwrap_err();
        assert!(matches!(e, FileError::Symlink { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }

    #[test]
    fn a_device_is_written_in_place() {
        write_output(Path::new("/dev/null"), b"x").unwrap();
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        let e = write_output(Path::new("/dev/full"), b"x").unwrap_err();
        assert!(e.to_string().contains("/dev/full"), "{e}");
        assert!(
            std::fs::metadata("/dev/full")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        let e = write_output(Path::new("/tmp"), b"x").unwrap_err();
        assert!(matches!(e, FileError::Directory { .. }));
    }
}
