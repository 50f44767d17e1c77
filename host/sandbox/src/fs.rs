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

use std::collections::HashMap;

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, Descriptor, DescriptorFlags, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
    OpenFlags,
};
use wasmtime_wasi::p2::{FsError, FsResult};
use wasmtime_wasi_io::streams::{DynInputStream, DynOutputStream};

use crate::record::{Journal, Refusal};

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

/// Per-invocation filesystem state: the mounts and the guest path behind
/// each open descriptor.
#[derive(Debug, Default)]
pub(crate) struct FsTracker {
    pub mounts: Vec<Mount>,
    paths: HashMap<u32, String>,
}

impl FsTracker {
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
        let Some(mount) = self.tracker.mount_of(&base).cloned() else {
            return Ok(format!("{base}/{path}"));
        };
        let (why, attempted) = match resolve(&mount, &base, path) {
            Ok(target) if write && !mount.writable => ("the mount is read-only", target),
            Ok(target) => return Ok(target),
            Err(why) => (why, format!("{base} + {path}")),
        };
        self.refuse(function, &mount.capability, attempted, why);
        Err(ErrorCode::NotPermitted.into())
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
        let r = HostDescriptor::read_directory(&mut self.inner, fd).await;
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
        let target = self.check(F, &fd, &path, true)?;
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
        let to = self.check(F, &new_descriptor, &new_path, true)?;
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
        let target = self.check(F, &fd, &path, writes(oflags, flags))?;
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
        let to = self.check(F, &new_fd, &new_path, true)?;
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
        let to = self.check(F, &fd, &dest_path, true)?;
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
        let r = HostDescriptor::write_via_stream(&mut self.inner, fd, offset);
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
        let r = HostDescriptor::append_via_stream(&mut self.inner, fd);
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
        HostDirectoryEntryStream::drop(&mut self.inner, stream)
    }
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
        let t = FsTracker {
            mounts: vec![mount("/data"), mount("/data/inner")],
            paths: HashMap::new(),
        };
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
