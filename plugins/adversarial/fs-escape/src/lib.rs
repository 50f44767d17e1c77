//! Test-only component `adv-fs-escape`: asks the host, through raw
//! `wasi:filesystem` calls, to open paths outside its `fs-read:/data` grant.
//!
//! It bypasses the guest C library (which would refuse some of these paths
//! itself) so that every attempt reaches the host: `../x`, `a/../../x`,
//! absolute paths, and symlinks inside the grant that point outside it.
//! Returns the file's content if the host let it through — which it must
//! not. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde::Deserialize;
use wasip2::filesystem::preopens::get_directories;
use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};

/// The arguments: a path handed verbatim to `open-at` on the `/data`
/// preopen, and whether to write instead of read — or, with `stat`, to
/// report the file's timestamps (`stat-at` on the preopen and `stat` on the
/// opened file), which must be the host's virtual clock, never the disk's.
#[derive(Debug, Deserialize)]
pub struct Input {
    path: String,
    #[serde(default)]
    write: bool,
    #[serde(default)]
    stat: bool,
}

/// The component.
#[derive(Debug)]
pub struct FsEscape;

impl Tool for FsEscape {
    const NAME: &'static str = "adv-fs-escape";
    const DESCRIPTION: &'static str = "Test only: tries to open paths outside its grant.";
    const CAPABILITIES: &'static [&'static str] = &["fs-read:/data"];
    type Input = Input;
    type Output = String;

    fn invoke(input: Input, _call: &Call) -> Result<String, ToolError> {
        let (dir, _) = get_directories()
            .into_iter()
            .find(|(_, name)| name == "/data")
            .ok_or_else(|| ToolError::Failed("no /data preopen".into()))?;
        if input.stat {
            let at = dir
                .stat_at(PathFlags::SYMLINK_FOLLOW, &input.path)
                .map_err(|e| ToolError::Failed(format!("stat-at {}: {e:?}", input.path)))?;
            let file = dir
                .open_at(
                    PathFlags::SYMLINK_FOLLOW,
                    &input.path,
                    OpenFlags::empty(),
                    DescriptorFlags::READ,
                )
                .map_err(|e| ToolError::Failed(format!("open-at {}: {e:?}", input.path)))?;
            let own = file
                .stat()
                .map_err(|e| ToolError::Failed(format!("stat: {e:?}")))?;
            let secs = |t: Option<wasip2::clocks::wall_clock::Datetime>| {
                t.map_or("none".to_owned(), |d| {
                    format!("{}.{:09}", d.seconds, d.nanoseconds)
                })
            };
            return Ok(format!(
                "stat-at: {} {} {}; stat: {} {} {}",
                secs(at.data_access_timestamp),
                secs(at.data_modification_timestamp),
                secs(at.status_change_timestamp),
                secs(own.data_access_timestamp),
                secs(own.data_modification_timestamp),
                secs(own.status_change_timestamp),
            ));
        }
        let (oflags, flags) = if input.write {
            (OpenFlags::CREATE, DescriptorFlags::WRITE)
        } else {
            (OpenFlags::empty(), DescriptorFlags::READ)
        };
        let file = dir
            .open_at(PathFlags::SYMLINK_FOLLOW, &input.path, oflags, flags)
            .map_err(|e| ToolError::Failed(format!("open-at {}: {e:?}", input.path)))?;
        if input.write {
            file.write(b"escaped", 0)
                .map_err(|e| ToolError::Failed(format!("write: {e:?}")))?;
            return Ok("written".into());
        }
        let (bytes, _) = file
            .read(1 << 16, 0)
            .map_err(|e| ToolError::Failed(format!("read: {e:?}")))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

poimen_guest::export_tool!(FsEscape);
