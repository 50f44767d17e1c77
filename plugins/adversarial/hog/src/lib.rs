//! Test-only component `adv-hog`: with nothing but the default `scratch`
//! grant, tries to make the host hold as much as it can. Each attack is
//! one `attack` of its arguments, sized by `n`:
//!
//! - `journal`: `n` `stat` calls (default 60 000) — one host-call record
//!   each, unless the host bounds its journal;
//! - `long-path`: `open-at` with a path of `n` bytes (default 64 MiB);
//! - `fds`: opens the scratch directory `n` times (default 20 000) and
//!   keeps every descriptor;
//! - `deep`: creates `n` nested directories (default 25 000);
//! - `disk`: writes `n` MiB to a scratch file (default 4096);
//! - `handles`: `n` pollables held at once (default 200 000);
//! - `listings`: creates `n` files (default 20 000) and then holds as many
//!   listings of them open as it can;
//! - `tiny-objects`: returns an array of `n` empty objects (default
//!   1 200 000, about 3.6 MB).
//!
//! A well-behaved host stops each of them at a limit with its own error
//! and stays healthy. Whatever gets through is reported in the result.
//! Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};
use wasip2::filesystem::preopens::get_directories;
use wasip2::filesystem::types::{Descriptor, DescriptorFlags, OpenFlags, PathFlags};

/// The arguments.
#[derive(Debug, Deserialize)]
pub struct Input {
    attack: String,
    #[serde(default)]
    n: Option<u64>,
}

/// The component.
#[derive(Debug)]
pub struct Hog;

fn scratch() -> Result<Descriptor, ToolError> {
    get_directories()
        .into_iter()
        .find(|(_, name)| name == "/scratch")
        .map(|(d, _)| d)
        .ok_or_else(|| ToolError::Failed("no /scratch preopen".into()))
}

fn failed(what: &str, e: impl std::fmt::Debug) -> ToolError {
    ToolError::Failed(format!("{what}: {e:?}"))
}

fn attack(input: &Input) -> Result<Value, ToolError> {
    let n = |default: u64| input.n.unwrap_or(default);
    match input.attack.as_str() {
        "journal" => {
            let dir = scratch()?;
            for _ in 0..n(60_000) {
                dir.stat().map_err(|e| failed("stat", e))?;
            }
            Ok(json!({"stat": n(60_000)}))
        }
        "long-path" => {
            let dir = scratch()?;
            let path = "a".repeat(usize::try_from(n(64 << 20)).unwrap_or(usize::MAX));
            dir.open_at(
                PathFlags::empty(),
                &path,
                OpenFlags::empty(),
                DescriptorFlags::READ,
            )
            .map(drop)
            .map_err(|e| failed("open-at", e))?;
            Ok(json!("opened"))
        }
        "fds" => {
            let dir = scratch()?;
            let mut held = Vec::new();
            for _ in 0..n(20_000) {
                held.push(
                    dir.open_at(
                        PathFlags::empty(),
                        ".",
                        OpenFlags::DIRECTORY,
                        DescriptorFlags::READ,
                    )
                    .map_err(|e| failed("open-at", e))?,
                );
            }
            Ok(json!({"held": held.len()}))
        }
        "deep" => {
            let mut dir = scratch()?;
            for depth in 0..n(25_000) {
                dir.create_directory_at("d")
                    .map_err(|e| failed(&format!("mkdir at depth {depth}"), e))?;
                dir = dir
                    .open_at(
                        PathFlags::empty(),
                        "d",
                        OpenFlags::DIRECTORY,
                        DescriptorFlags::READ | DescriptorFlags::MUTATE_DIRECTORY,
                    )
                    .map_err(|e| failed(&format!("open at depth {depth}"), e))?;
            }
            Ok(json!({"depth": n(25_000)}))
        }
        "disk" => {
            use std::io::Write;
            let mut file =
                std::fs::File::create("/scratch/fill").map_err(|e| failed("create", e))?;
            let chunk = vec![7u8; 1 << 20];
            for _ in 0..n(4096) {
                file.write_all(&chunk).map_err(|e| failed("write", e))?;
            }
            Ok(json!({"mib": n(4096)}))
        }
        "handles" => {
            let held: Vec<_> = (0..n(200_000))
                .map(|_| wasip2::clocks::monotonic_clock::subscribe_duration(1 << 40))
                .collect();
            Ok(json!({"held": held.len()}))
        }
        "listings" => {
            let dir = scratch()?;
            for i in 0..n(20_000) {
                dir.open_at(
                    PathFlags::empty(),
                    &format!("file-with-a-long-name-to-list-{i:08}"),
                    OpenFlags::CREATE,
                    DescriptorFlags::WRITE,
                )
                .map(drop)
                .map_err(|e| failed("create", e))?;
            }
            let mut held = Vec::new();
            loop {
                held.push(
                    dir.read_directory()
                        .map_err(|e| failed("read-directory", e))?,
                );
            }
        }
        "tiny-objects" => Ok(Value::Array(vec![
            json!({});
            usize::try_from(n(1_200_000)).unwrap_or(0)
        ])),
        other => Err(ToolError::InvalidInput(format!("no attack `{other}`"))),
    }
}

impl Tool for Hog {
    const NAME: &'static str = "adv-hog";
    const DESCRIPTION: &'static str =
        "Test only: tries to make the host hold what it should not, with scratch alone.";
    const CAPABILITIES: &'static [&'static str] = &["scratch"];
    type Input = Input;
    type Output = Value;

    fn invoke(input: Input, _call: &Call) -> Result<Value, ToolError> {
        attack(&input)
    }
}

poimen_guest::export_tool!(Hog);
