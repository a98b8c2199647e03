//! The error every refused request is answered with.

/// An error answered to the caller: HTTP status, error code and a message naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Machine-readable code (`invalid_request`, `unknown_rule` …).
    pub code: &'static str,
    /// What was wrong, naming the field.
    pub message: String,
}

impl ApiError {
    /// `400 invalid_request`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            code: "invalid_request",
            message: message.into(),
        }
    }

    /// `404 unknown_rule`: no rule named `rule` (given in `field`) is configured.
    pub(super) fn unknown_rule(field: &str, rule: &str) -> ApiError {
        ApiError {
            status: 404,
            code: "unknown_rule",
            message: format!("{field}: no rule named {rule:?} is configured"),
        }
    }
}
