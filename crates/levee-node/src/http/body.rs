//! Reading a request's JSON body: at most `api.max_body` bytes (413 beyond, judged by
//! `Content-Length` before a byte is read), JSON only (415 otherwise), and decoded into an
//! object with the path of any wrong field in the error (400); anything but whitespace after
//! the object is malformed JSON (400).

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::header;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::app::App;
use crate::limiter::ApiError;

/// Reads and decodes a JSON body: 415 unless JSON, 413 beyond the limit, 400 naming the field.
pub(super) async fn json_body<T: DeserializeOwned>(app: &App, req: Request) -> Result<T, ApiError> {
    decode(&json_bytes(app, req).await?)
}

/// Reads a JSON body: 415 unless JSON, 413 beyond the limit.
pub(super) async fn json_bytes(app: &App, req: Request) -> Result<Bytes, ApiError> {
    let (parts, body) = req.into_parts();
    let limit = app.max_body();
    if let Some(len) = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large(limit));
    }
    let is_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|v| {
            v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
        });
    if !is_json {
        return Err(ApiError {
            status: 415,
            code: "unsupported_media_type",
            message: "Content-Type must be application/json".into(),
        });
    }
    let bytes: Bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            || e.to_string().contains("length limit")
        {
            too_large(limit)
        } else {
            ApiError::invalid(format!("body: could not be read: {e}"))
        }
    })?;
    Ok(bytes)
}

fn too_large(limit: usize) -> ApiError {
    ApiError {
        status: 413,
        code: "payload_too_large",
        message: format!("the body is over the limit of {limit} bytes"),
    }
}

/// Decodes a JSON object, naming the path of a wrong field. Anything but an object (serde
/// would also read a struct from a positional array) is refused.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
            return Err(ApiError::invalid("body: must be a JSON object"));
        }
        None => return Err(ApiError::invalid("body: empty; a JSON object is required")),
        Some(_) => return Err(ApiError::invalid("body: malformed JSON")),
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = strip_position(&inner.to_string());
        if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("body: malformed JSON: {msg}"))
        } else if path == "." || path == "?" || path.is_empty() {
            ApiError::invalid(format!("body: {msg}"))
        } else {
            ApiError::invalid(format!("{path}: {msg}"))
        }
    })?;
    // Anything but whitespace after the object is refused too (`{…} }}not json`).
    de.end().map_err(|e| {
        ApiError::invalid(format!(
            "body: malformed JSON: {} after the object",
            strip_position(&e.to_string())
        ))
    })?;
    Ok(value)
}

/// A `serde_json` message without its ` at line L column C` suffix.
pub(super) fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// A value that must be a JSON object (serde would also read a struct from an array).
pub(super) struct ObjectOnly<T>(pub(super) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Object(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}
