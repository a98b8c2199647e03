//! Answers with a JSON body: the error answer every endpoint gives (`{"error": code,
//! "message": …}`, API.md "Errors"), and successful answers whose body is JSON.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::limiter::ApiError;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}

/// The answer to an error: its status (400 if the status is not a valid one) and
/// `{"error": code, "message": …}`.
pub(super) fn error_response(e: &ApiError) -> Response {
    json_response(
        StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
        &ErrorJson {
            error: e.code,
            message: &e.message,
        },
    )
}

/// The body of every error answer (API.md "Errors").
#[derive(Serialize, ToSchema)]
#[schema(as = Error)]
pub(super) struct ErrorJson<'a> {
    /// A stable code: `invalid_request`, `unknown_rule`, `unauthorized`, `not_found` …
    pub(super) error: &'a str,
    /// What was wrong, naming the field.
    pub(super) message: &'a str,
}

/// An answer with `body` written as JSON.
pub(super) fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    bytes_response(
        status,
        serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// An answer with a JSON body already written.
pub(super) fn bytes_response(status: StatusCode, bytes: Vec<u8>) -> Response {
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
