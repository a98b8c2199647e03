//! What a decision request says, as the JSON bodies of `/v1/check`, `/v1/check/batch` and
//! `/v1/refund` carry it, and the checks of its fields that come before the limiter's (a
//! missing rule or key, a negative cost, an `idempotency_key` over 256 bytes, `all` inside a
//! batch), with the messages both batch paths must give alike.

use serde::Deserialize;
use std::borrow::Cow;

use utoipa::openapi::schema::{
    AllOfBuilder, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::limiter::{AllEntry, ApiError, CheckRef, Field, check_idempotency_key};

/// The body of `POST /v1/check`: a single check, or an atomic `all` call. Also one check of
/// a batch, as the batch's reference decoding reads it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Check)]
pub(super) struct CheckBody {
    /// A rule of the node's configuration (required unless `all` is given).
    pub(super) rule: Option<String>,
    /// The subject being limited: 1–512 bytes (required unless `all` is given).
    #[schema(min_length = 1, max_length = 512)]
    pub(super) key: Option<String>,
    /// Tokens the request takes (default 1); 0 is a pure read.
    #[schema(minimum = 0)]
    #[serde(default, deserialize_with = "integer")]
    pub(super) cost: Option<i64>,
    /// The consumer class, for a rule with classes.
    pub(super) class: Option<String>,
    /// A retry with the same value gets the first answer back and is not charged again; at
    /// most 256 bytes.
    #[schema(max_length = 256)]
    pub(super) idempotency_key: Option<String>,
    /// Decide, consume nothing.
    #[serde(default)]
    pub(super) dry_run: bool,
    /// How long the caller can wait, in ms, when the check would be denied only because this
    /// node holds too little of the global limit while the cluster has room: the node asks
    /// for rights and answers when they arrive or the wait ends (`waited_ms` says how long it
    /// waited). 0 to 10,000; default 0, answered at once. Not with `all`.
    #[schema(minimum = 0, maximum = 10000)]
    #[serde(default, deserialize_with = "integer")]
    pub(super) max_wait_ms: Option<i64>,
    /// An atomic call over several rules and keys (`/v1/check` only, not with `rule`/`key`):
    /// at least one entry, at most `api.max_batch`.
    #[schema(min_items = 1)]
    pub(super) all: Option<Vec<AllEntry>>,
}

/// The schema of a body of `POST /v1/check`: a [`CheckBody`] that is either a single check
/// (`rule` and `key`, no `all`) or an atomic `all` call (`all`, and no `rule`, `key` or
/// `class`), which the handler tells apart (a derive can only say that each field is
/// optional).
pub(super) struct CheckRequest;

/// The schema of a check of a batch: a [`CheckBody`] with `rule` and `key`, without `all`.
pub(super) struct BatchCheck;

fn check_ref() -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(CheckBody::name()))
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn null() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::Null)
}

/// A [`CheckBody`] with `rule` and `key` and no `all`.
fn single_check() -> Schema {
    AllOfBuilder::new()
        .item(check_ref())
        .item(
            ObjectBuilder::new()
                .required("rule")
                .required("key")
                .property("rule", string())
                .property("key", string())
                .property("all", null()),
        )
        .into()
}

impl PartialSchema for CheckRequest {
    fn schema() -> RefOr<Schema> {
        let all = AllOfBuilder::new().item(check_ref()).item(
            ObjectBuilder::new()
                .required("all")
                .property(
                    "all",
                    ArrayBuilder::new()
                        .min_items(Some(1))
                        .items(RefOr::Ref(Ref::from_schema_name(AllEntry::name()))),
                )
                .property("rule", null())
                .property("key", null())
                .property("class", null()),
        );
        OneOfBuilder::new().item(single_check()).item(all).into()
    }
}

impl ToSchema for CheckRequest {
    fn name() -> Cow<'static, str> {
        "CheckRequest".into()
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((CheckBody::name().into(), CheckBody::schema()));
        CheckBody::schemas(schemas);
    }
}

impl PartialSchema for BatchCheck {
    fn schema() -> RefOr<Schema> {
        single_check().into()
    }
}

impl ToSchema for BatchCheck {
    fn name() -> Cow<'static, str> {
        "BatchCheck".into()
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((CheckBody::name().into(), CheckBody::schema()));
        CheckBody::schemas(schemas);
    }
}

impl CheckBody {
    /// Check `i` of a batch, validated and borrowing from `self`.
    pub(super) fn check_ref(&self, i: usize) -> Result<CheckRef<'_>, ApiError> {
        batch_check(
            i,
            self.rule.as_deref(),
            self.key.as_deref(),
            self.cost,
            self.class.as_deref(),
            self.idempotency_key.as_deref(),
            self.dry_run,
            self.all.is_some(),
        )
    }
}

/// The fuzzing entry point of a `POST /v1/check` body (`fuzz/`, target `http_bodies`): decoded
/// as the endpoint decodes it, then each of its checks validated as a batch's would be.
#[doc(hidden)]
pub fn fuzz_check_body(bytes: &[u8]) {
    if let Ok(body) = super::body::decode::<CheckBody>(bytes) {
        let _ = body.check_ref(0);
        let _ = cost_of(body.cost, Field::Top);
    }
}

/// An optional integer that may be written with a fraction of zero (`3.0`): JSON Schema, and
/// so the OpenAPI document, counts `3.0` as an integer, and JSON encoders of some languages
/// write whole floats so. Any other fraction is refused, as serde would refuse it.
pub(super) fn integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    struct Integer;
    impl serde::de::Visitor<'_> for Integer {
        type Value = i64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("i64")
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<i64, E> {
            // -2^63 and 2^63 bound what an i64 holds; a whole float in between converts exactly.
            if v.fract() == 0.0
                && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&v)
            {
                Ok(v as i64)
            } else {
                Err(E::invalid_type(serde::de::Unexpected::Float(v), &self))
            }
        }
    }
    struct Optional;
    impl<'de> serde::de::Visitor<'de> for Optional {
        type Value = Option<i64>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("i64")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Option<i64>, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<i64>, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<i64>, D::Error> {
            d.deserialize_any(Integer).map(Some)
        }
    }
    d.deserialize_option(Optional)
}

/// The cost of a request: 1 when absent, refused when negative.
pub(super) fn cost_of(cost: Option<i64>, field: Field) -> Result<u64, ApiError> {
    match cost {
        None => Ok(1),
        Some(c) if c < 0 => Err(ApiError::invalid(format!(
            "{field}cost: must not be negative"
        ))),
        Some(c) => Ok(c as u64),
    }
}

/// Validates the fields of check `i` of a batch (both paths): the same messages, in the same
/// order.
#[allow(clippy::too_many_arguments)]
pub(super) fn batch_check<'a>(
    i: usize,
    rule: Option<&'a str>,
    key: Option<&'a str>,
    cost: Option<i64>,
    class: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    dry_run: bool,
    all: bool,
) -> Result<CheckRef<'a>, ApiError> {
    if all {
        return Err(ApiError::invalid(format!(
            "checks[{i}].all: atomic calls go to /v1/check"
        )));
    }
    let cost = cost_of(cost, Field::Check(i))?;
    let rule = rule.ok_or_else(|| ApiError::invalid(format!("checks[{i}].rule: missing field")))?;
    let key = key.ok_or_else(|| ApiError::invalid(format!("checks[{i}].key: missing field")))?;
    check_idempotency_key(Field::Check(i), idempotency_key)?;
    Ok(CheckRef {
        rule,
        key,
        cost,
        class,
        idempotency_key,
        dry_run,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::decode;

    #[test]
    fn decode_names_the_wrong_field() {
        let e = decode::<CheckBody>(br#"{"rule": "a", "key": "k", "cost": "x"}"#).unwrap_err();
        assert!(e.message.starts_with("cost:"), "{}", e.message);
        let e = decode::<CheckBody>(br#"{"rule": "a", "bogus": 1}"#).unwrap_err();
        assert!(e.message.contains("bogus"), "{}", e.message);
        let e = decode::<CheckBody>(b"{not json").unwrap_err();
        assert!(e.message.starts_with("body:"), "{}", e.message);
    }
}
