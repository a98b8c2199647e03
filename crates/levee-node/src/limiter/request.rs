//! What the limiter is asked: one check (owned or borrowing its strings), an entry of an
//! atomic `all` call, where a check sits in the request (for error messages), and the bounds
//! of a key.

use super::api_error::ApiError;

/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;

/// The longest `idempotency_key`, in bytes: remembered keys are held in memory for a rule's
/// window, so their size is bounded.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = levee_proto::MAX_IDEMPOTENCY_KEY_BYTES;

/// One check as the API receives it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// Tokens the request takes (default 1).
    #[serde(default = "one")]
    pub cost: u64,
    /// Consumer class.
    #[serde(default)]
    pub class: Option<String>,
    /// Retry identity.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Decide without consuming.
    #[serde(default)]
    pub dry_run: bool,
}

fn one() -> u64 {
    1
}

impl CheckRequest {
    /// The same check, borrowing its strings.
    pub fn borrowed(&self) -> CheckRef<'_> {
        CheckRef {
            rule: &self.rule,
            key: &self.key,
            cost: self.cost,
            class: self.class.as_deref(),
            idempotency_key: self.idempotency_key.as_deref(),
            dry_run: self.dry_run,
        }
    }
}

/// One check, borrowing its strings (from the request body or headers): what the decision
/// path takes, so that deciding allocates nothing per check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckRef<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The key.
    pub key: &'a str,
    /// Tokens the request takes.
    pub cost: u64,
    /// Consumer class.
    pub class: Option<&'a str>,
    /// Retry identity.
    pub idempotency_key: Option<&'a str>,
    /// Decide without consuming.
    pub dry_run: bool,
}

impl<'a> CheckRef<'a> {
    /// A check of `cost` tokens of `rule` for `key`: no class, no idempotency key, consuming.
    pub fn of(rule: &'a str, key: &'a str, cost: u64) -> CheckRef<'a> {
        CheckRef {
            rule,
            key,
            cost,
            class: None,
            idempotency_key: None,
            dry_run: false,
        }
    }
}

/// Where a check sits in the request, for error messages (`checks[3].key: …`). Formatted only
/// when there is an error to explain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// A single check: fields are named as they are.
    Top,
    /// The check at this index of a batch's `checks`.
    Check(usize),
    /// The entry at this index of an atomic call's `all`.
    All(usize),
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Top => Ok(()),
            Field::Check(i) => write!(f, "checks[{i}]."),
            Field::All(i) => write!(f, "all[{i}]."),
        }
    }
}

/// One entry of an atomic `all` call.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AllEntry {
    /// The rule's name.
    pub rule: String,
    /// The key: 1–512 bytes.
    #[schema(min_length = 1, max_length = 512)]
    pub key: String,
    /// Consumer class.
    #[serde(default)]
    pub class: Option<String>,
}

/// Refuses an empty key, or one over [`MAX_KEY_BYTES`].
pub(super) fn check_key(field: Field, key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::invalid(format!("{field}key: must not be empty")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(format!(
            "{field}key: {} bytes, at most {MAX_KEY_BYTES} allowed",
            key.len()
        )));
    }
    Ok(())
}

/// Refuses an `idempotency_key` over [`MAX_IDEMPOTENCY_KEY_BYTES`].
pub fn check_idempotency_key(field: Field, k: Option<&str>) -> Result<(), ApiError> {
    match k {
        Some(k) if k.len() > MAX_IDEMPOTENCY_KEY_BYTES => Err(ApiError::invalid(format!(
            "{field}idempotency_key: {} bytes, at most {MAX_IDEMPOTENCY_KEY_BYTES} allowed",
            k.len()
        ))),
        _ => Ok(()),
    }
}
