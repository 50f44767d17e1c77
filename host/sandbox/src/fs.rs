//! `wasi:filesystem` as the guest sees it: wasmtime-wasi's implementation,
//! wrapped so that every call is recorded and every escape is refused by
//! the host before it reaches the disk.
//!
//! The wrapper implements the generated `Host` traits by delegating each
//! function to wasmtime-wasi's own implementation, so the compiler makes
//! sure no filesystem function goes unrecorded. Before delegating it
//! refuses absolute paths, paths whose `..` leave the mount, and writes
//! under a read-only mount; cap-std (inside wasmtime-wasi) still confines
//! what it lets through, and a path it refuses (a symlink leading out) is
//! recorded as a refusal too. Knows nothing of policy files: the mounts it
//! enforces come from the invocation's grants.
//!
//! It also keeps what the guest can make the host hold within the call's
//! limits: a path (argument or resolved) longer than [`MAX_PATH_BYTES`] is
//! refused with `name-too-long` before it is resolved; files and directory
//! listings open at once are counted against `open_files`; bytes written
//! (through `write`, `set-size` growth, and the streams `write-via-stream`
//! and `append-via-stream` hand out, which it wraps) and entries created
//! ([`ENTRY_BYTES`] each) against `disk_bytes`; a directory or file created
//! deeper than [`MAX_DIRECTORY_DEPTH`] below its mount is refused; and a
//! directory listing, which the host reads whole, is charged to the call's
//! memory while it is open. Past a limit the guest is trapped with
//! [`LimitHit`] (or the memory limit's own error): a quota is not an
//! error code a guest may ignore.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, Descriptor, DescriptorFlags, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
    OpenFlags,
};
use wasmtime_wasi::p2::{FsError, FsResult};
use wasmtime_wasi_io::bytes::Bytes;
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{
    DynInputStream, DynOutputStream, OutputStream, StreamError, StreamResult,
};

use crate::limits::{
    LimitHit, MAX_DIRECTORY_DEPTH, MAX_PATH_BYTES, MemoryLimiter, Resource as Bounded,
};
use crate::record::{Journal, Refusal, cut};

const TYPES: &str = "wasi:filesystem/types";
const PREOPENS: &str = "wasi:filesystem/preopens";

/// One granted mount, as the wrapper enforces it.
#[derive(Debug, Clone)]
pub(crate) struct Mount {
    /// Guest path, e.g. `/data`.
    pub guest: String,
    pub writable: bool,
    /// The capability in text form, for refusals.
    pub capability: String,
}

/// What creating one directory entry (a directory, a file, a link) costs
/// against the disk quota: about an inode and a block, whatever its size.
pub(crate) const ENTRY_BYTES: u64 = 4096;

/// The call's disk quota, shared with the streams it hands out.
#[derive(Debug)]
pub(crate) struct DiskBudget {
    used: AtomicU64,
    limit: u64,
}

impl DiskBudget {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(DiskBudget {
            used: AtomicU64::new(0),
            limit,
        })
    }

    /// Charges `bytes`, or says the quota is spent (charging nothing).
    pub fn charge(&self, bytes: u64) -> Result<(), LimitHit> {
        let hit = LimitHit {
            resource: Bounded::DiskBytes,
            limit: self.limit,
        };
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map(drop)
            .map_err(|_| hit)
    }

    /// Bytes charged so far.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

/// Per-invocation filesystem state: the mounts, the guest path behind each
/// open descriptor, what the call holds open, and its disk quota.
#[derive(Debug)]
pub(crate) struct FsTracker {
    pub mounts: Vec<Mount>,
    paths: HashMap<u32, String>,
    /// Descriptors opened by `open-at` (the preopens are the host's).
    opened: HashSet<u32>,
    /// Open directory listings and the memory each is charged.
    listings: HashMap<u32, u64>,
    /// How many of the two may be open at once.
    open_files: usize,
    pub disk: Arc<DiskBudget>,
}

impl FsTracker {
    pub fn new(open_files: u32, disk_bytes: u64) -> Self {
        FsTracker {
            mounts: Vec::new(),
            paths: HashMap::new(),
            opened: HashSet::new(),
            listings: HashMap::new(),
            open_files: usize::try_from(open_files).unwrap_or(usize::MAX),
            disk: DiskBudget::new(disk_bytes),
        }
    }

    /// Traps the guest if it holds as many files and listings open as it
    /// may.
    fn room_to_open(&self) -> Result<(), FsError> {
        if self.opened.len() + self.listings.len() >= self.open_files {
            return Err(FsError::trap(LimitHit {
                resource: Bounded::OpenFiles,
                limit: self.open_files as u64,
            }));
        }
        Ok(())
    }

    fn path_of(&self, fd: &Resource<Descriptor>) -> String {
        self.paths
            .get(&fd.rep())
            .cloned()
            .unwrap_or_else(|| "<unknown descriptor>".to_owned())
    }

    fn mount_of(&self, path: &str) -> Option<&Mount> {
        self.mounts
            .iter()
            .filter(|m| path == m.guest || path.starts_with(&format!("{}/", m.guest)))
            .max_by_key(|m| m.guest.len())
    }
}

/// `path` resolved lexically against the descriptor's guest path `base`,
/// or why it may not be: it is absolute, or its `..` leave the mount.
fn resolve(mount: &Mount, base: &str, path: &str) -> Result<String, &'static str> {
    if path.starts_with('/') {
        return Err("absolute paths are not resolved against a mount");
    }
    let floor = mount.guest.split('/').filter(|c| !c.is_empty()).count();
    let mut parts: Vec<&str> = base.split('/').filter(|c| !c.is_empty()).collect();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.len() <= floor {
                    return Err("`..` leaves the mount");
                }
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// How many components `target` lies below `mount`.
fn depth_below(mount: &Mount, target: &str) -> usize {
    let count = |p: &str| p.split('/').filter(|c| !c.is_empty()).count();
    count(target).saturating_sub(count(&mount.guest))
}

fn code(e: &FsError) -> String {
    match e.downcast_ref() {
        Some(c) => format!("error: {c:?}"),
        None => format!("trap: {e}"),
    }
}

fn ok_or<T>(r: &FsResult<T>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => code(e),
    }
}

/// Whether cap-std refused a path for leaving the directory (it reports
/// `NotPermitted`, or `CrossDevice` where the kernel's `RESOLVE_BENEATH`
/// does the refusing).
fn confinement_refused<T>(r: &FsResult<T>) -> bool {
    matches!(r, Err(e) if matches!(e.downcast_ref(), Some(ErrorCode::NotPermitted | ErrorCode::CrossDevice)))
}

/// The data the generated `add_to_linker` hands each call.
pub(crate) struct RecordingFs<'a> {
    pub inner: WasiFilesystemCtxView<'a>,
    pub tracker: &'a mut FsTracker,
    pub journal: &'a Journal,
    pub limiter: &'a mut MemoryLimiter,
}

/// Marker for `add_to_linker`.
pub(crate) struct RecordedFilesystem;

impl HasData for RecordedFilesystem {
    type Data<'a> = RecordingFs<'a>;
}

impl RecordingFs<'_> {
    /// Checks a path-taking call on `fd`; returns the guest path it names,
    /// or records the refusal and returns the error the guest gets.
    fn check(
        &mut self,
        function: &str,
        fd: &Resource<Descriptor>,
        path: &str,
        write: bool,
    ) -> Result<String, FsError> {
        let base = self.tracker.path_of(fd);
        if path.len() > MAX_PATH_BYTES {
            return Err(self.too_long(function, &base, path));
        }
        let Some(mount) = self.tracker.mount_of(&base).cloned() else {
            return Ok(format!("{base}/{path}"));
        };
        let (why, attempted) = match resolve(&mount, &base, path) {
            Ok(target) if target.len() > MAX_PATH_BYTES => {
                return Err(self.too_long(function, &base, path));
            }
            Ok(target) if write && !mount.writable => ("the mount is read-only", target),
            Ok(target) => return Ok(target),
            Err(why) => (why, format!("{base} + {path}")),
        };
        self.refuse(function, &mount.capability, attempted, why);
        Err(ErrorCode::NotPermitted.into())
    }

    /// As [`check`](Self::check) for a call that creates an entry: it must
    /// lie within [`MAX_DIRECTORY_DEPTH`] of its mount, and costs
    /// [`ENTRY_BYTES`] of the disk quota.
    fn check_create(
        &mut self,
        function: &str,
        fd: &Resource<Descriptor>,
        path: &str,
    ) -> Result<String, FsError> {
        let target = self.check(function, fd, path, true)?;
        let base = self.tracker.path_of(fd);
        if let Some(mount) = self.tracker.mount_of(&base)
            && depth_below(mount, &target) > MAX_DIRECTORY_DEPTH
        {
            return Err(FsError::trap(LimitHit {
                resource: Bounded::DirectoryDepth,
                limit: MAX_DIRECTORY_DEPTH as u64,
            }));
        }
        self.tracker
            .disk
            .charge(ENTRY_BYTES)
            .map_err(FsError::trap)?;
        Ok(target)
    }

    /// Records a path refused for its length (cut, for the record) and
    /// returns the guest's error.
    fn too_long(&mut self, function: &str, base: &str, path: &str) -> FsError {
        let shown = cut(path.chars().take(64).collect(), 64);
        self.journal.call(
            TYPES,
            function,
            format!("{base} + {shown} ({} bytes)", path.len()),
            format!("refused: longer than {MAX_PATH_BYTES} bytes"),
        );
        ErrorCode::NameTooLong.into()
    }

    fn refuse(&mut self, function: &str, capability: &str, attempted: String, why: &str) {
        self.journal.call(
            TYPES,
            function,
            attempted.clone(),
            format!("refused: {why}"),
        );
        self.journal.refuse(Refusal {
            capability: capability.to_owned(),
            attempted: format!("{function} {attempted}"),
            why: why.to_owned(),
        });
    }

    /// Records a call whose arguments are just its descriptor.
    fn note<T>(&mut self, function: &str, fd_path: String, r: &FsResult<T>) {
        self.journal.call(TYPES, function, fd_path, ok_or(r));
    }

    /// Records a path-taking call; a confinement refusal by cap-std becomes
    /// a refusal of the invocation.
    fn note_path<T>(
        &mut self,
        function: &str,
        fd: &Resource<Descriptor>,
        target: &str,
        r: &FsResult<T>,
    ) {
        if confinement_refused(r) {
            let capability = self
                .tracker
                .mount_of(&self.tracker.path_of(fd))
                .map_or_else(|| "filesystem".to_owned(), |m| m.capability.clone());
            self.refuse(
                function,
                &capability,
                target.to_owned(),
                "the path leads outside the mount (a symlink?)",
            );
        } else {
            self.journal
                .call(TYPES, function, target.to_owned(), ok_or(r));
        }
    }

    /// Refuses a write through `fd` when its mount is read-only.
    fn check_write(
        &mut self,
        function: &str,
        fd: &Resource<Descriptor>,
    ) -> Result<String, FsError> {
        let path = self.tracker.path_of(fd);
        match self.tracker.mount_of(&path) {
            Some(m) if !m.writable => {
                let capability = m.capability.clone();
                self.refuse(function, &capability, path, "the mount is read-only");
                Err(ErrorCode::NotPermitted.into())
            }
            _ => Ok(path),
        }
    }
}

impl preopens::Host for RecordingFs<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let dirs = preopens::Host::get_directories(&mut self.inner)?;
        for (fd, name) in &dirs {
            self.tracker.paths.insert(fd.rep(), name.clone());
        }
        let names: Vec<&str> = dirs.iter().map(|(_, n)| n.as_str()).collect();
        self.journal.call(
            PREOPENS,
            "get-directories",
            String::new(),
            format!("ok: {}", names.join(", ")),
        );
        Ok(dirs)
    }
}

impl types::Host for RecordingFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.inner, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        let r = types::Host::filesystem_error_code(&mut self.inner, err);
        let result = match &r {
            Ok(c) => format!("ok: {c:?}"),
            Err(e) => format!("trap: {e}"),
        };
        self.journal
            .call(TYPES, "filesystem-error-code", String::new(), result);
        r
    }
}

fn writes(oflags: OpenFlags, flags: DescriptorFlags) -> bool {
    oflags.intersects(OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::EXCLUSIVE)
        || flags.intersects(DescriptorFlags::WRITE | DescriptorFlags::MUTATE_DIRECTORY)
}

impl HostDescriptor for RecordingFs<'_> {
    async fn advise(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::advise(&mut self.inner, fd, offset, len, advice).await;
        self.note("[method]descriptor.advise", p, &r);
        r
    }

    async fn sync_data(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::sync_data(&mut self.inner, fd).await;
        self.note("[method]descriptor.sync-data", p, &r);
        r
    }

    async fn get_flags(&mut self, fd: Resource<Descriptor>) -> FsResult<DescriptorFlags> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::get_flags(&mut self.inner, fd).await;
        self.note("[method]descriptor.get-flags", p, &r);
        r
    }

    async fn get_type(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorType> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::get_type(&mut self.inner, fd).await;
        self.note("[method]descriptor.get-type", p, &r);
        r
    }

    async fn set_size(&mut self, fd: Resource<Descriptor>, size: types::Filesize) -> FsResult<()> {
        let p = self.check_write("[method]descriptor.set-size", &fd)?;
        let now = HostDescriptor::stat(&mut self.inner, fd.clone_handle())
            .await
            .map_or(0, |s| s.size);
        self.tracker
            .disk
            .charge(size.saturating_sub(now))
            .map_err(FsError::trap)?;
        let r = HostDescriptor::set_size(&mut self.inner, fd, size).await;
        self.note(
            "[method]descriptor.set-size",
            format!("{p} size={size}"),
            &r,
        );
        r
    }

    async fn set_times(
        &mut self,
        fd: Resource<Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        let p = self.check_write("[method]descriptor.set-times", &fd)?;
        let r = HostDescriptor::set_times(&mut self.inner, fd, atim, mtim).await;
        self.note("[method]descriptor.set-times", p, &r);
        r
    }

    async fn read(
        &mut self,
        fd: Resource<Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::read(&mut self.inner, fd, len, offset).await;
        let result = match &r {
            Ok((bytes, end)) => format!(
                "ok: {} bytes{}",
                bytes.len(),
                if *end { ", end" } else { "" }
            ),
            Err(e) => code(e),
        };
        self.journal.call(
            TYPES,
            "[method]descriptor.read",
            format!("{p} len={len} offset={offset}"),
            result,
        );
        r
    }

    async fn write(
        &mut self,
        fd: Resource<Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        let p = self.check_write("[method]descriptor.write", &fd)?;
        let n = buf.len();
        self.tracker.disk.charge(n as u64).map_err(FsError::trap)?;
        let r = HostDescriptor::write(&mut self.inner, fd, buf, offset).await;
        self.note(
            "[method]descriptor.write",
            format!("{p} bytes={n} offset={offset}"),
            &r,
        );
        r
    }

    async fn read_directory(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        let p = self.tracker.path_of(&fd);
        self.tracker.room_to_open()?;
        // The host reads a listing whole into memory: measured first, and
        // charged to the call's memory for as long as it is open.
        let bytes = match self.inner.table.get(&fd)? {
            wasmtime_wasi::filesystem::Descriptor::Dir(d) => {
                let dir = d.dir.clone();
                tokio::task::spawn_blocking(move || listing_bytes(&dir))
                    .await
                    .unwrap_or(0)
            }
            wasmtime_wasi::filesystem::Descriptor::File(_) => 0,
        };
        self.limiter.charge_host(bytes).map_err(FsError::trap)?;
        let r = HostDescriptor::read_directory(&mut self.inner, fd).await;
        match &r {
            Ok(stream) => {
                self.tracker.listings.insert(stream.rep(), bytes);
            }
            Err(_) => self.limiter.release_host(bytes),
        }
        self.note("[method]descriptor.read-directory", p, &r);
        r
    }

    async fn sync(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::sync(&mut self.inner, fd).await;
        self.note("[method]descriptor.sync", p, &r);
        r
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        const F: &str = "[method]descriptor.create-directory-at";
        let target = self.check_create(F, &fd, &path)?;
        let r = HostDescriptor::create_directory_at(&mut self.inner, fd.clone_handle(), path).await;
        self.note_path(F, &fd, &target, &r);
        r
    }

    async fn stat(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorStat> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::stat(&mut self.inner, fd)
            .await
            .map(virtual_times);
        self.note("[method]descriptor.stat", p, &r);
        r
    }

    async fn stat_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        const F: &str = "[method]descriptor.stat-at";
        let target = self.check(F, &fd, &path, false)?;
        let r = HostDescriptor::stat_at(&mut self.inner, fd.clone_handle(), path_flags, path)
            .await
            .map(virtual_times);
        self.note_path(F, &fd, &format!("{target} {path_flags:?}"), &r);
        r
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        const F: &str = "[method]descriptor.set-times-at";
        let target = self.check(F, &fd, &path, true)?;
        let r = HostDescriptor::set_times_at(
            &mut self.inner,
            fd.clone_handle(),
            path_flags,
            path,
            atim,
            mtim,
        )
        .await;
        self.note_path(F, &fd, &target, &r);
        r
    }

    async fn link_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path_flags: types::PathFlags,
        old_path: String,
        new_descriptor: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        const F: &str = "[method]descriptor.link-at";
        let from = self.check(F, &fd, &old_path, true)?;
        let to = self.check_create(F, &new_descriptor, &new_path)?;
        let r = HostDescriptor::link_at(
            &mut self.inner,
            fd.clone_handle(),
            old_path_flags,
            old_path,
            new_descriptor,
            new_path,
        )
        .await;
        self.note_path(F, &fd, &format!("{from} -> {to}"), &r);
        r
    }

    async fn open_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: OpenFlags,
        flags: DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        const F: &str = "[method]descriptor.open-at";
        let target = if oflags.contains(OpenFlags::CREATE) {
            self.check_create(F, &fd, &path)?
        } else {
            self.check(F, &fd, &path, writes(oflags, flags))?
        };
        self.tracker.room_to_open()?;
        let r = HostDescriptor::open_at(
            &mut self.inner,
            fd.clone_handle(),
            path_flags,
            path,
            oflags,
            flags,
        )
        .await;
        if let Ok(new) = &r {
            self.tracker.paths.insert(new.rep(), target.clone());
            self.tracker.opened.insert(new.rep());
        }
        self.note_path(
            F,
            &fd,
            &format!("{target} {path_flags:?} {oflags:?} {flags:?}"),
            &r,
        );
        r
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        self.tracker.paths.remove(&fd.rep());
        self.tracker.opened.remove(&fd.rep());
        HostDescriptor::drop(&mut self.inner, fd)
    }

    async fn readlink_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<String> {
        const F: &str = "[method]descriptor.readlink-at";
        let target = self.check(F, &fd, &path, false)?;
        let r = HostDescriptor::readlink_at(&mut self.inner, fd.clone_handle(), path).await;
        self.note_path(F, &fd, &target, &r);
        r
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        const F: &str = "[method]descriptor.remove-directory-at";
        let target = self.check(F, &fd, &path, true)?;
        let r = HostDescriptor::remove_directory_at(&mut self.inner, fd.clone_handle(), path).await;
        self.note_path(F, &fd, &target, &r);
        r
    }

    async fn rename_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path: String,
        new_fd: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        const F: &str = "[method]descriptor.rename-at";
        let from = self.check(F, &fd, &old_path, true)?;
        let to = self.check_create(F, &new_fd, &new_path)?;
        let r = HostDescriptor::rename_at(
            &mut self.inner,
            fd.clone_handle(),
            old_path,
            new_fd,
            new_path,
        )
        .await;
        self.note_path(F, &fd, &format!("{from} -> {to}"), &r);
        r
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        const F: &str = "[method]descriptor.symlink-at";
        if src_path.len() > MAX_PATH_BYTES {
            let base = self.tracker.path_of(&fd);
            return Err(self.too_long(F, &base, &src_path));
        }
        let to = self.check_create(F, &fd, &dest_path)?;
        let r = HostDescriptor::symlink_at(
            &mut self.inner,
            fd.clone_handle(),
            src_path.clone(),
            dest_path,
        )
        .await;
        self.note_path(F, &fd, &format!("{to} -> {src_path}"), &r);
        r
    }

    async fn unlink_file_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        const F: &str = "[method]descriptor.unlink-file-at";
        let target = self.check(F, &fd, &path, true)?;
        let r = HostDescriptor::unlink_file_at(&mut self.inner, fd.clone_handle(), path).await;
        self.note_path(F, &fd, &target, &r);
        r
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynInputStream>> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::read_via_stream(&mut self.inner, fd, offset);
        self.note(
            "[method]descriptor.read-via-stream",
            format!("{p} offset={offset}"),
            &r,
        );
        r
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        let p = self.check_write("[method]descriptor.write-via-stream", &fd)?;
        let r = HostDescriptor::write_via_stream(&mut self.inner, fd, offset)
            .and_then(|stream| self.metered(stream));
        self.note(
            "[method]descriptor.write-via-stream",
            format!("{p} offset={offset}"),
            &r,
        );
        r
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let p = self.check_write("[method]descriptor.append-via-stream", &fd)?;
        let r = HostDescriptor::append_via_stream(&mut self.inner, fd)
            .and_then(|stream| self.metered(stream));
        self.note("[method]descriptor.append-via-stream", p, &r);
        r
    }

    async fn is_same_object(
        &mut self,
        a: Resource<Descriptor>,
        b: Resource<Descriptor>,
    ) -> wasmtime::Result<bool> {
        let args = format!("{} {}", self.tracker.path_of(&a), self.tracker.path_of(&b));
        let r = HostDescriptor::is_same_object(&mut self.inner, a, b).await;
        let result = match &r {
            Ok(same) => format!("ok: {same}"),
            Err(e) => format!("trap: {e}"),
        };
        self.journal
            .call(TYPES, "[method]descriptor.is-same-object", args, result);
        r
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        let p = self.tracker.path_of(&fd);
        let r = HostDescriptor::metadata_hash(&mut self.inner, fd).await;
        self.note("[method]descriptor.metadata-hash", p, &r);
        r
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        const F: &str = "[method]descriptor.metadata-hash-at";
        let target = self.check(F, &fd, &path, false)?;
        let r =
            HostDescriptor::metadata_hash_at(&mut self.inner, fd.clone_handle(), path_flags, path)
                .await;
        self.note_path(F, &fd, &target, &r);
        r
    }
}

impl HostDirectoryEntryStream for RecordingFs<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<types::DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        let r = HostDirectoryEntryStream::read_directory_entry(&mut self.inner, stream).await;
        let result = match &r {
            Ok(Some(e)) => format!("ok: {}", e.name),
            Ok(None) => "ok: end".to_owned(),
            Err(e) => code(e),
        };
        self.journal.call(
            TYPES,
            "[method]directory-entry-stream.read-directory-entry",
            String::new(),
            result,
        );
        r
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        if let Some(bytes) = self.tracker.listings.remove(&stream.rep()) {
            self.limiter.release_host(bytes);
        }
        HostDirectoryEntryStream::drop(&mut self.inner, stream)
    }
}

impl RecordingFs<'_> {
    /// Puts a file's output stream behind the disk quota: the same
    /// resource, its stream wrapped.
    fn metered(
        &mut self,
        stream: Resource<DynOutputStream>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let inner = self.inner.table.delete(stream)?;
        let wrapped: DynOutputStream = Box::new(Metered {
            inner,
            disk: self.tracker.disk.clone(),
        });
        Ok(self.inner.table.push(wrapped)?)
    }
}

/// A file's output stream whose every byte is charged to the call's disk
/// quota; past it, the guest is trapped.
struct Metered {
    inner: DynOutputStream,
    disk: Arc<DiskBudget>,
}

#[wasmtime_wasi_io::async_trait]
impl Pollable for Metered {
    async fn ready(&mut self) {
        self.inner.ready().await;
    }
}

#[wasmtime_wasi_io::async_trait]
impl OutputStream for Metered {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.disk
            .charge(bytes.len() as u64)
            .map_err(|hit| StreamError::Trap(hit.into()))?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await;
    }
}

/// Roughly what the host holds to list `dir`: each entry's name and the
/// few dozen bytes around it.
fn listing_bytes(dir: &std::fs::File) -> u64 {
    use rustix::fs::{Mode, OFlags};
    const PER_ENTRY: u64 = 64;
    // The descriptor may be open for lookups only: list through a fresh one.
    let Ok(entries) = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .and_then(rustix::fs::Dir::new) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_bytes().len() as u64 + PER_ENTRY)
        .sum()
}

/// A borrowed copy of a descriptor handle, to keep using it for the record
/// after the original is passed on.
trait CloneHandle {
    fn clone_handle(&self) -> Self;
}

impl CloneHandle for Resource<Descriptor> {
    fn clone_handle(&self) -> Self {
        Resource::new_borrow(self.rep())
    }
}

/// The time every file's timestamps show, in seconds since the Unix epoch:
/// the frozen wall clock of `wasi:clocks` (`state::FROZEN_WALL_CLOCK`,
/// which checks at compile time that the two agree).
pub(crate) const FROZEN_STAT_SECS: u64 = 946_684_800;

/// A file's timestamps as the guest sees them: the frozen wall clock of
/// `wasi:clocks` ([`FROZEN_STAT_SECS`]), never the disk's —
/// a real mtime would make the same call on the same bytes answer
/// differently, which is the one thing a recorded call must not do.
fn virtual_times(mut stat: types::DescriptorStat) -> types::DescriptorStat {
    let frozen = wasmtime_wasi::p2::bindings::clocks::wall_clock::Datetime {
        seconds: FROZEN_STAT_SECS,
        nanoseconds: 0,
    };
    stat.data_access_timestamp = Some(frozen);
    stat.data_modification_timestamp = Some(frozen);
    stat.status_change_timestamp = Some(frozen);
    stat
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(guest: &str) -> Mount {
        Mount {
            guest: guest.into(),
            writable: false,
            capability: format!("fs-read:{guest}"),
        }
    }

    #[test]
    fn paths_resolve_inside_the_mount_only() {
        let m = mount("/data");
        assert_eq!(resolve(&m, "/data", "a/b.txt"), Ok("/data/a/b.txt".into()));
        assert_eq!(resolve(&m, "/data/sub", "../x"), Ok("/data/x".into()));
        assert_eq!(resolve(&m, "/data", "./a/./b"), Ok("/data/a/b".into()));
        assert_eq!(resolve(&m, "/data", "."), Ok("/data".into()));
        assert!(resolve(&m, "/data", "../secret").is_err());
        assert!(resolve(&m, "/data", "a/../../secret").is_err());
        assert!(
            resolve(&m, "/data", "../data/x").is_err(),
            "leaving and coming back is leaving"
        );
        assert!(resolve(&m, "/data", "/etc/passwd").is_err());
        assert!(resolve(&mount("/a/b"), "/a/b", "..").is_err());
    }

    #[test]
    fn the_longest_mount_wins() {
        let mut t = FsTracker::new(8, 1 << 20);
        t.mounts = vec![mount("/data"), mount("/data/inner")];
        assert_eq!(
            t.mount_of("/data/inner/x").map(|m| m.guest.as_str()),
            Some("/data/inner")
        );
        assert_eq!(
            t.mount_of("/data/x").map(|m| m.guest.as_str()),
            Some("/data")
        );
        assert!(t.mount_of("/datax").is_none());
    }

    #[test]
    fn depth_is_counted_below_the_mount() {
        let m = mount("/data");
        assert_eq!(depth_below(&m, "/data"), 0);
        assert_eq!(depth_below(&m, "/data/a/b"), 2);
        assert_eq!(depth_below(&mount("/a/b"), "/a/b/c"), 1);
    }

    #[test]
    fn the_disk_quota_is_charged_up_to_its_limit_and_no_further() {
        let d = DiskBudget::new(10);
        assert_eq!(d.charge(6), Ok(()));
        let hit = d.charge(5).expect_err("over");
        assert_eq!((hit.resource, hit.limit), (Bounded::DiskBytes, 10));
        assert_eq!(d.used(), 6, "a refused charge charges nothing");
        assert_eq!(d.charge(4), Ok(()));
        assert!(d.charge(u64::MAX).is_err(), "no overflow");
    }

    #[test]
    fn open_flags_that_write() {
        assert!(!writes(OpenFlags::empty(), DescriptorFlags::READ));
        assert!(!writes(OpenFlags::DIRECTORY, DescriptorFlags::READ));
        assert!(writes(OpenFlags::CREATE, DescriptorFlags::READ));
        assert!(writes(OpenFlags::empty(), DescriptorFlags::WRITE));
        assert!(writes(
            OpenFlags::empty(),
            DescriptorFlags::MUTATE_DIRECTORY
        ));
    }
}
