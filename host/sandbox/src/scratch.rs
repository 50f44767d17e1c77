//! Where calls' `scratch` directories live, and how they go away.
//!
//! Each host owns one directory under the scratch base (default
//! `$TMPDIR/poimen-scratch-UID`, one per user): `host-XXXX/`, beside a lock file
//! `host-XXXX.lock` that the host holds locked for as long as it lives. A
//! call's scratch directory is a fresh directory inside the host's, deleted
//! when the call ends — on a blocking thread, and without recursion: a
//! guest can build a tree as deep as it likes (by renames), and deleting it
//! must neither overflow a stack nor need a path longer than `PATH_MAX`.
//! When a host starts it sweeps the base: every `host-*` directory whose
//! lock it can take belonged to a host that died (its lock went with it)
//! and is deleted the same way, so a crash leaks no scratch space for long.
//!
//! This module knows nothing of WASI or of calls: it hands out directories
//! and deletes trees.

use std::ffi::{CStr, CString};
use std::fs::{File, TryLockError};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags};

/// The default scratch base: `poimen-scratch-UID` in the system's
/// temporary directory (one per user: the base is private to its owner).
pub fn default_base() -> PathBuf {
    std::env::temp_dir().join(format!(
        "poimen-scratch-{}",
        rustix::process::getuid().as_raw()
    ))
}

/// One host's scratch space: its directory and the lock that says it is
/// alive. Deleted (iteratively) when the last handle goes.
#[derive(Debug, Clone)]
pub(crate) struct ScratchRoot(Arc<RootInner>);

#[derive(Debug)]
struct RootInner {
    dir: PathBuf,
    lock_path: PathBuf,
    /// Held locked for the host's life; the lock is what a sweeper asks.
    _lock: File,
}

impl Drop for RootInner {
    fn drop(&mut self) {
        // Calls' directories are gone by now; what is left is small.
        let _ = remove_tree(&self.dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Why the scratch space cannot be set up.
#[derive(Debug)]
pub(crate) struct ScratchError {
    pub path: PathBuf,
    pub message: String,
}

impl ScratchRoot {
    /// Sweeps `base` of dead hosts' directories, then creates this host's.
    pub fn create(base: &Path) -> Result<ScratchRoot, ScratchError> {
        let err = |path: &Path, message: String| ScratchError {
            path: path.to_owned(),
            message,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)
            .map_err(|e| err(base, format!("cannot create it: {e}")))?;
        let meta = std::fs::symlink_metadata(base).map_err(|e| err(base, e.to_string()))?;
        if !meta.is_dir() {
            return Err(err(base, "is not a directory (a symlink?)".into()));
        }
        // The lock is made under a temporary name, locked, and only then
        // given its `host-*.lock` name: a sweeper never sees an unlocked
        // lock of a live host.
        let tmp = tempfile::Builder::new()
            .prefix("tmp-")
            .tempfile_in(base)
            .map_err(|e| err(base, format!("cannot create a lock file: {e}")))?;
        let mine = tmp
            .as_file()
            .metadata()
            .map_err(|e| err(base, e.to_string()))?;
        if mine.uid() != meta.uid() {
            return Err(err(
                base,
                format!(
                    "belongs to another user (uid {}); give this host a scratch directory of its own",
                    meta.uid()
                ),
            ));
        }
        tmp.as_file()
            .lock()
            .map_err(|e| err(base, format!("cannot lock: {e}")))?;
        let name = tmp
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("tmp-"))
            .unwrap_or("x")
            .to_owned();
        let lock_path = base.join(format!("host-{name}.lock"));
        let lock = tmp
            .persist(&lock_path)
            .map_err(|e| err(base, format!("cannot name the lock file: {e}")))?;
        let dir = base.join(format!("host-{name}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| err(&dir, format!("cannot create it: {e}")))?;
        Ok(ScratchRoot(Arc::new(RootInner {
            dir,
            lock_path,
            _lock: lock,
        })))
    }

    /// A fresh directory for one call.
    pub fn call_dir(&self) -> io::Result<ScratchDir> {
        let dir = tempfile::Builder::new()
            .prefix("call-")
            .tempdir_in(&self.0.dir)?
            .keep();
        Ok(ScratchDir {
            path: dir,
            _root: self.clone(),
        })
    }

    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        &self.0.dir
    }
}

/// One call's scratch directory; deleted when dropped, on a blocking thread
/// when there is a runtime to hand it to.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: PathBuf,
    /// The host's directory outlives every call's.
    _root: ScratchRoot,
}

impl ScratchDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let path = std::mem::take(&mut self.path);
        let root = self._root.clone();
        let delete = move || {
            if let Err(e) = remove_tree(&path) {
                tracing::warn!(
                    "could not delete scratch directory {}: {e} (the next host start sweeps it)",
                    path.display()
                );
            }
            drop(root);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(delete)),
            Err(_) => delete(),
        }
    }
}

/// Deletes the dead hosts' directories under `base`: each `host-*` whose
/// lock file can be locked (or has none). Returns how many were deleted.
pub(crate) fn sweep(base: &Path) -> io::Result<usize> {
    let mut swept = 0;
    let entries = match std::fs::read_dir(base) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(host) = name.strip_prefix("host-") else {
            continue;
        };
        if host.ends_with(".lock") {
            continue;
        }
        let dir = entry.path();
        let lock_path = base.join(format!("{name}.lock"));
        let held = match File::open(&lock_path) {
            Ok(f) => match f.try_lock() {
                Ok(()) => Some(f),
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(e)) => return Err(e),
            },
            // A live host creates its lock before its directory: no lock,
            // no host.
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        remove_tree(&dir)?;
        if held.is_some() {
            let _ = std::fs::remove_file(&lock_path);
        }
        swept += 1;
    }
    Ok(swept)
}

/// Deletes `path` and everything under it without recursion and without
/// ever forming a path longer than a name: it walks down by directory
/// descriptors, keeping only the names on the way, and back up by `..`.
/// Symlinks are removed, never followed.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let top = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    let mut cur: OwnedFd = match open_dir(CWD, &top) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc_enotdir()) => {
            return rustix::fs::unlinkat(CWD, &*top, AtFlags::empty()).map_err(Into::into);
        }
        Err(e) => return Err(e),
    };
    // The names from `path` down to `cur`.
    let mut names: Vec<CString> = Vec::new();
    loop {
        match first_subdirectory_after_emptying_files(cur.as_fd())? {
            Some(child) => {
                cur = open_dir(cur.as_fd(), &child)?;
                names.push(child);
            }
            None => {
                let Some(name) = names.pop() else {
                    drop(cur);
                    return rustix::fs::unlinkat(CWD, &*top, AtFlags::REMOVEDIR)
                        .map_err(Into::into);
                };
                let parent = open_dir(cur.as_fd(), c"..")?;
                drop(cur);
                rustix::fs::unlinkat(parent.as_fd(), &*name, AtFlags::REMOVEDIR)?;
                cur = parent;
            }
        }
    }
}

/// `ENOTDIR`, as `io::Error::raw_os_error` reports it.
fn libc_enotdir() -> i32 {
    rustix::io::Errno::NOTDIR.raw_os_error()
}

fn open_dir<Fd: AsFd>(at: Fd, name: &CStr) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

/// Removes every entry of `dir` that is not a directory, up to the first
/// directory, whose name it returns; `None` when `dir` is empty.
fn first_subdirectory_after_emptying_files(
    dir: std::os::fd::BorrowedFd<'_>,
) -> io::Result<Option<CString>> {
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory)?,
            _ => false,
        };
        if is_dir {
            return Ok(Some(name.to_owned()));
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `depth` directories under `top`, built by descriptors
    /// (its full path is far longer than `PATH_MAX`), with a file and a
    /// symlink out of the tree every thousand levels.
    fn deep_tree(top: &Path, depth: usize, outside: &Path) {
        std::fs::create_dir(top).expect("top");
        let mut cur =
            open_dir(CWD, &CString::new(top.as_os_str().as_bytes()).expect("c")).expect("open top");
        for i in 0..depth {
            rustix::fs::mkdirat(cur.as_fd(), c"d", Mode::from_raw_mode(0o700)).expect("mkdir");
            if i % 1000 == 0 {
                let f = rustix::fs::openat(
                    cur.as_fd(),
                    c"file",
                    OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .expect("file");
                drop(f);
                let target = CString::new(outside.as_os_str().as_bytes()).expect("c");
                rustix::fs::symlinkat(&*target, cur.as_fd(), c"out").expect("symlink");
            }
            cur = open_dir(cur.as_fd(), c"d").expect("down");
        }
    }

    #[test]
    fn a_tree_far_deeper_than_a_stack_or_path_max_is_deleted_and_symlinks_are_not_followed() {
        let base = tempfile::tempdir().expect("tmp");
        let outside = base.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("keep.txt"), "kept").expect("write");
        let top = base.path().join("tree");
        deep_tree(&top, 25_000, &outside);
        remove_tree(&top).expect("removed");
        assert!(!top.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep.txt")).expect("kept"),
            "kept"
        );
        // Gone already, or a plain file: both fine.
        remove_tree(&top).expect("absent is fine");
        let file = base.path().join("plain");
        std::fs::write(&file, "x").expect("write");
        remove_tree(&file).expect("a file");
        assert!(!file.exists());
    }

    #[test]
    fn a_sweep_deletes_dead_hosts_scratch_and_never_a_live_one() {
        let base = tempfile::tempdir().expect("tmp");
        let live = ScratchRoot::create(base.path()).expect("live host");
        let call = live.call_dir().expect("call dir");
        std::fs::write(call.path().join("x"), "live").expect("write");

        // A host that died: its lock file is there, unlocked; its tree deep.
        let dead = base.path().join("host-dead");
        deep_tree(&dead, 3_000, base.path());
        std::fs::write(base.path().join("host-dead.lock"), "").expect("lock file");
        // One that died between its lock's removal and its directory's.
        std::fs::create_dir(base.path().join("host-halfway")).expect("dir");

        assert_eq!(sweep(base.path()).expect("sweep"), 2);
        assert!(!dead.exists());
        assert!(!base.path().join("host-dead.lock").exists());
        assert!(!base.path().join("host-halfway").exists());
        assert!(call.path().join("x").exists(), "the live host's call");
        assert!(live.dir().exists());

        // A second host in this process does not sweep the first.
        let other = ScratchRoot::create(base.path()).expect("second host");
        assert!(live.dir().exists() && other.dir().exists());
        let call_path = call.path().to_owned();
        drop(call);
        assert!(!call_path.exists(), "a call's directory goes with it");
        let live_dir = live.dir().to_owned();
        drop(live);
        assert!(!live_dir.exists(), "a host's directory goes with it");
    }
}
