//! What the limiter answers: a decision with the window its headers announce, an atomic
//! call's decisions, a key's usage.

use levee_core::{Decision, Usage};

/// A decision with what the answer needs to say about it (the rule and key are the
/// request's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The decision.
    pub decision: Decision,
    /// The window the `RateLimit-Policy` header announces, in seconds.
    pub window_secs: u64,
}

/// The answer to an atomic call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllOutcome {
    /// Whether every rule allowed.
    pub allowed: bool,
    /// Index of the binding rule.
    pub binding: usize,
    /// One outcome per entry.
    pub results: Vec<Outcome>,
}

/// A key's usage with its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageOutcome {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The figures.
    pub usage: Usage,
    /// Region names, in the order of `usage.regions`.
    pub region_names: Vec<String>,
}
