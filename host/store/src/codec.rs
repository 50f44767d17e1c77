//! Reading stored values back into records, shared by the SQL backends:
//! every stored hash, id, status, effect class or JSON text is parsed
//! strictly, and one that does not parse is [`StoreError::Corrupt`] naming
//! the store — never papered over. Nothing here knows SQL.

use std::path::Path;
use std::str::FromStr;

use poimen_workflow::EffectClass;
use serde_json::Value;

use crate::error::StoreError;
use crate::ids::RunId;
use crate::records::Lease;

type Result<T> = std::result::Result<T, StoreError>;

/// A stored value that does not parse as what the schema says it is.
pub(crate) fn bad_value(path: &Path, what: &str, value: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        path: path.to_owned(),
        detail: format!("{what} `{value}` is not well-formed"),
    }
}

pub(crate) fn parse<T: FromStr>(p: &Path, what: &str, s: &str) -> Result<T> {
    s.parse().map_err(|_| bad_value(p, what, s))
}

pub(crate) fn to_u32(p: &Path, what: &str, n: i64) -> Result<u32> {
    u32::try_from(n).map_err(|_| bad_value(p, what, n))
}

pub(crate) fn json_value(p: &Path, what: &str, s: &str) -> Result<Value> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
        path: p.to_owned(),
        detail: format!("{what} is not valid JSON: {e}"),
    })
}

/// The name an effect class is stored under.
pub(crate) fn effect_name(e: EffectClass) -> &'static str {
    match e {
        EffectClass::Pure => "pure",
        EffectClass::Idempotent => "idempotent",
        EffectClass::NonIdempotent => "non-idempotent",
    }
}

pub(crate) fn parse_effect(p: &Path, s: &str) -> Result<EffectClass> {
    match s {
        "pure" => Ok(EffectClass::Pure),
        "idempotent" => Ok(EffectClass::Idempotent),
        "non-idempotent" => Ok(EffectClass::NonIdempotent),
        other => Err(bad_value(p, "effect class", other)),
    }
}

/// The lease of run `id` from its stored columns: none without an owner.
pub(crate) fn to_lease(
    p: &Path,
    id: &RunId,
    owner: Option<String>,
    epoch: i64,
    expires_at: Option<i64>,
) -> Result<Option<Lease>> {
    let Some(owner) = owner else {
        return Ok(None);
    };
    let epoch = u64::try_from(epoch)
        .ok()
        .filter(|e| *e > 0)
        .ok_or_else(|| bad_value(p, &format!("lease epoch of run {id}"), epoch))?;
    let expires_at = expires_at.ok_or_else(|| StoreError::Corrupt {
        path: p.to_owned(),
        detail: format!("run {id} is held by `{owner}` but its lease has no expiry"),
    })?;
    Ok(Some(Lease {
        run: id.clone(),
        owner,
        epoch,
        expires_at,
    }))
}
