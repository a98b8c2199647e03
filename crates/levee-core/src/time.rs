//! Time representation and human-readable configuration durations.
//!
//! Levee never reads a clock inside its core: every function that needs the
//! current time takes it as a [`Millis`] argument. Durations that appear in
//! configuration are written as short strings such as `"20ms"`, `"1.5s"` or
//! `"1d"` and parsed into a [`HumanDuration`].

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};

/// A point in time (or a span of time) in whole milliseconds.
///
/// As a point in time it counts milliseconds since the Unix epoch,
/// 1970-01-01T00:00:00Z (UTC), ignoring leap seconds.
pub type Millis = u64;

const MS_PER_SECOND: u64 = 1_000;
const MS_PER_MINUTE: u64 = 60 * MS_PER_SECOND;
const MS_PER_HOUR: u64 = 60 * MS_PER_MINUTE;
const MS_PER_DAY: u64 = 24 * MS_PER_HOUR;

/// Units used by [`HumanDuration`]'s `Display`, largest first.
const DISPLAY_UNITS: [(u64, &str); 4] = [
    (MS_PER_DAY, "d"),
    (MS_PER_HOUR, "h"),
    (MS_PER_MINUTE, "m"),
    (MS_PER_SECOND, "s"),
];

const REASON_EXPECTED: &str =
    "expected a number followed by ms, s, m, h or d (e.g. \"20ms\", \"1s\")";
const REASON_MISSING_UNIT: &str =
    "missing unit; expected a number followed by ms, s, m, h or d (e.g. \"20ms\", \"1s\")";
const REASON_UNKNOWN_UNIT: &str = "unknown unit; expected one of ms, s, m, h or d";
const REASON_SUB_MS_UNIT: &str = "sub-millisecond units are not supported; the smallest unit is ms";
const REASON_SUB_MS_VALUE: &str =
    "sub-millisecond precision is not supported; the value must be a whole number of milliseconds";
const REASON_NEGATIVE: &str = "negative durations are not allowed";
const REASON_TOO_LARGE: &str = "value is too large (at most 18446744073709551615ms)";
const REASON_NO_FRACTION_DIGITS: &str = "expected at least one digit after the decimal point";
const REASON_MALFORMED_NUMBER: &str = "malformed number";
const REASON_SPACES: &str = "at most one space is allowed between the number and the unit";

/// A duration written in configuration as a human-readable string, stored as
/// whole milliseconds.
///
/// Accepted forms are a decimal number (with an optional fractional part),
/// optionally one space, and a unit: `ms`, `s`, `m`, `h` or `d`. Examples:
/// `"20ms"`, `"1s"`, `"1.5s"`, `"1 m"`, `"1h"`, `"1d"`. The result must be a
/// whole number of milliseconds, so `"1.5ms"` and `"0.0001s"` are rejected.
/// Zero (`"0ms"`, `"0s"`, ...) is accepted; callers that need a positive
/// duration must check for it.
///
/// `Display` (and serialization) uses the largest unit that represents the
/// value exactly, e.g. `60000` ms is shown as `"1m"` and `1500` ms as
/// `"1500ms"`, so that parsing the displayed string yields the same value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub u64);

impl HumanDuration {
    /// Creates a duration of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// Returns the duration in milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0
    }
}

/// Error returned when a string is not a valid [`HumanDuration`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationParseError {
    input: String,
    reason: &'static str,
}

impl DurationParseError {
    /// The string that failed to parse.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// A short description of what is wrong with the input.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl FromStr for HumanDuration {
    type Err = DurationParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_millis(s)
            .map(Self)
            .map_err(|reason| DurationParseError {
                input: s.to_owned(),
                reason,
            })
    }
}

/// Splits `s` into its leading run of ASCII digits and the remainder.
fn split_digits(s: &str) -> (&str, &str) {
    let end = s
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    s.split_at(end)
}

/// Multiplier (in ms) for a unit suffix.
fn unit_millis(unit: &str) -> Result<u64, &'static str> {
    match unit {
        "ms" => Ok(1),
        "s" => Ok(MS_PER_SECOND),
        "m" => Ok(MS_PER_MINUTE),
        "h" => Ok(MS_PER_HOUR),
        "d" => Ok(MS_PER_DAY),
        "" => Err(REASON_MISSING_UNIT),
        "us" | "µs" | "μs" | "ns" => Err(REASON_SUB_MS_UNIT),
        _ if unit.starts_with(char::is_whitespace) => Err(REASON_SPACES),
        _ if unit.starts_with(|c: char| c.is_ascii_digit() || c == '.') => {
            Err(REASON_MALFORMED_NUMBER)
        }
        _ => Err(REASON_UNKNOWN_UNIT),
    }
}

/// Parses a duration string into milliseconds, returning the failure reason.
fn parse_millis(s: &str) -> Result<u64, &'static str> {
    if s.starts_with('-') {
        return Err(REASON_NEGATIVE);
    }

    let (int_digits, rest) = split_digits(s);
    if int_digits.is_empty() {
        return Err(REASON_EXPECTED);
    }

    let (frac_digits, rest) = match rest.strip_prefix('.') {
        Some(after_dot) => {
            let (frac, rest) = split_digits(after_dot);
            if frac.is_empty() {
                return Err(REASON_NO_FRACTION_DIGITS);
            }
            (frac, rest)
        }
        None => ("", rest),
    };

    let unit = rest.strip_prefix(' ').unwrap_or(rest);
    let unit_ms = unit_millis(unit)?;

    let mut whole: u64 = 0;
    for b in int_digits.bytes() {
        whole = whole
            .checked_mul(10)
            .and_then(|w| w.checked_add(u64::from(b - b'0')))
            .ok_or(REASON_TOO_LARGE)?;
    }

    let frac_ms = fraction_millis(frac_digits, unit_ms)?;

    whole
        .checked_mul(unit_ms)
        .and_then(|w| w.checked_add(frac_ms))
        .ok_or(REASON_TOO_LARGE)
}

/// Converts the digits after the decimal point into whole milliseconds of a
/// unit worth `unit_ms`, rejecting values that are not whole milliseconds.
fn fraction_millis(frac_digits: &str, unit_ms: u64) -> Result<u64, &'static str> {
    let significant = frac_digits.trim_end_matches('0');
    if significant.is_empty() {
        return Ok(0);
    }
    // With trailing zeros removed, the fraction's numerator is not a multiple
    // of 10, so it is exact only if the unit supplies every factor of 2 (or
    // every factor of 5) of the denominator. No unit is divisible by 10^11,
    // so more than a handful of significant digits can never be exact; 18 is
    // a safe bound that keeps the arithmetic below within u128.
    if significant.len() > 18 {
        return Err(REASON_SUB_MS_VALUE);
    }
    let numerator = significant
        .bytes()
        .fold(0u128, |acc, b| acc * 10 + u128::from(b - b'0'));
    let denominator = 10u128.pow(significant.len() as u32);
    let scaled = numerator * u128::from(unit_ms);
    if scaled % denominator != 0 {
        return Err(REASON_SUB_MS_VALUE);
    }
    // numerator < denominator, so the quotient is below unit_ms and fits.
    u64::try_from(scaled / denominator).map_err(|_| REASON_TOO_LARGE)
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms != 0 {
            for (unit_ms, name) in DISPLAY_UNITS {
                if ms.is_multiple_of(unit_ms) {
                    return write!(f, "{}{}", ms / unit_ms, name);
                }
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Visitor that builds a [`HumanDuration`] from a string.
struct HumanDurationVisitor;

impl Visitor<'_> for HumanDurationVisitor {
    type Value = HumanDuration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a duration string such as \"20ms\", \"1s\", \"1.5s\", \"1m\", \"1h\" or \"1d\"",
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        v.parse().map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(HumanDurationVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<u64, DurationParseError> {
        s.parse::<HumanDuration>().map(HumanDuration::as_millis)
    }

    fn reason(s: &str) -> &'static str {
        match s.parse::<HumanDuration>() {
            Ok(d) => panic!("{s:?} unexpectedly parsed as {d:?}"),
            Err(e) => e.reason(),
        }
    }

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse("20ms").unwrap(), 20);
        assert_eq!(parse("1s").unwrap(), 1_000);
        assert_eq!(parse("1m").unwrap(), 60_000);
        assert_eq!(parse("1h").unwrap(), 3_600_000);
        assert_eq!(parse("1d").unwrap(), 86_400_000);
        assert_eq!(parse("7d").unwrap(), 7 * 86_400_000);
        assert_eq!(parse("90m").unwrap(), 90 * 60_000);
    }

    #[test]
    fn parses_zero_and_leading_zeros() {
        assert_eq!(parse("0ms").unwrap(), 0);
        assert_eq!(parse("0s").unwrap(), 0);
        assert_eq!(parse("0d").unwrap(), 0);
        assert_eq!(parse("0.0s").unwrap(), 0);
        assert_eq!(parse("007s").unwrap(), 7_000);
        assert_eq!(parse("0000000000000000000000000001ms").unwrap(), 1);
    }

    #[test]
    fn parses_fractions() {
        assert_eq!(parse("1.5s").unwrap(), 1_500);
        assert_eq!(parse("0.5s").unwrap(), 500);
        assert_eq!(parse("0.001s").unwrap(), 1);
        assert_eq!(parse("1.25m").unwrap(), 75_000);
        assert_eq!(parse("0.5h").unwrap(), 1_800_000);
        assert_eq!(parse("1.5d").unwrap(), 129_600_000);
        assert_eq!(parse("2.0ms").unwrap(), 2);
        assert_eq!(parse("1.500000000000000000000000s").unwrap(), 1_500);
        // Long fractions are fine as long as the result is whole: 1/1024 of
        // a day is exactly 84375 ms.
        assert_eq!(parse("0.0009765625d").unwrap(), 84_375);
    }

    #[test]
    fn parses_single_space() {
        assert_eq!(parse("20 ms").unwrap(), 20);
        assert_eq!(parse("1.5 s").unwrap(), 1_500);
        assert_eq!(parse("3 d").unwrap(), 3 * 86_400_000);
    }

    #[test]
    fn parses_extremes() {
        assert_eq!(parse("18446744073709551615ms").unwrap(), u64::MAX);
        assert_eq!(
            parse("18446744073709551s").unwrap(),
            18_446_744_073_709_551_000
        );
        assert_eq!(parse("18446744073709551.615s").unwrap(), u64::MAX);
    }

    #[test]
    fn rejects_empty_and_garbage() {
        assert_eq!(reason(""), REASON_EXPECTED);
        assert_eq!(reason("abc"), REASON_EXPECTED);
        assert_eq!(reason("s"), REASON_EXPECTED);
        assert_eq!(reason(".5s"), REASON_EXPECTED);
        assert_eq!(reason("+1s"), REASON_EXPECTED);
        assert_eq!(reason(" 1s"), REASON_EXPECTED);
    }

    #[test]
    fn rejects_missing_unit() {
        assert_eq!(reason("1"), REASON_MISSING_UNIT);
        assert_eq!(reason("1.5"), REASON_MISSING_UNIT);
        assert_eq!(reason("1 "), REASON_MISSING_UNIT);
    }

    #[test]
    fn rejects_unknown_unit() {
        assert_eq!(reason("1x"), REASON_UNKNOWN_UNIT);
        assert_eq!(reason("1sec"), REASON_UNKNOWN_UNIT);
        assert_eq!(reason("1S"), REASON_UNKNOWN_UNIT);
        assert_eq!(reason("1MS"), REASON_UNKNOWN_UNIT);
        assert_eq!(reason("1w"), REASON_UNKNOWN_UNIT);
        assert_eq!(reason("1s "), REASON_UNKNOWN_UNIT);
        assert_eq!(reason("1s2ms"), REASON_UNKNOWN_UNIT);
    }

    #[test]
    fn rejects_bad_spacing() {
        assert_eq!(reason("1  s"), REASON_SPACES);
        assert_eq!(reason("1\ts"), REASON_SPACES);
    }

    #[test]
    fn rejects_malformed_numbers() {
        assert_eq!(reason("1.s"), REASON_NO_FRACTION_DIGITS);
        assert_eq!(reason("1."), REASON_NO_FRACTION_DIGITS);
        assert_eq!(reason("1.2.3s"), REASON_MALFORMED_NUMBER);
        assert_eq!(reason("1 2s"), REASON_MALFORMED_NUMBER);
        assert_eq!(reason("1,5s"), REASON_UNKNOWN_UNIT);
    }

    #[test]
    fn rejects_negative() {
        assert_eq!(reason("-1s"), REASON_NEGATIVE);
        assert_eq!(reason("-0ms"), REASON_NEGATIVE);
    }

    #[test]
    fn rejects_sub_millisecond() {
        assert_eq!(reason("500us"), REASON_SUB_MS_UNIT);
        assert_eq!(reason("500µs"), REASON_SUB_MS_UNIT);
        assert_eq!(reason("1ns"), REASON_SUB_MS_UNIT);
        assert_eq!(reason("1.5ms"), REASON_SUB_MS_VALUE);
        assert_eq!(reason("0.5ms"), REASON_SUB_MS_VALUE);
        assert_eq!(reason("0.0001s"), REASON_SUB_MS_VALUE);
        assert_eq!(reason("0.1234s"), REASON_SUB_MS_VALUE);
        assert_eq!(reason("0.0000000000000000000001d"), REASON_SUB_MS_VALUE);
    }

    #[test]
    fn rejects_overflow() {
        assert_eq!(reason("18446744073709551616ms"), REASON_TOO_LARGE);
        assert_eq!(reason("99999999999999999999999999ms"), REASON_TOO_LARGE);
        assert_eq!(reason("18446744073709552s"), REASON_TOO_LARGE);
        assert_eq!(reason("18446744073709551.616s"), REASON_TOO_LARGE);
        assert_eq!(reason("213503982335d"), REASON_TOO_LARGE);
    }

    #[test]
    fn error_display() {
        let err = "abc".parse::<HumanDuration>().unwrap_err();
        assert_eq!(err.input(), "abc");
        assert_eq!(
            err.to_string(),
            r#"invalid duration "abc": expected a number followed by ms, s, m, h or d (e.g. "20ms", "1s")"#
        );
        let err = "-5s".parse::<HumanDuration>().unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid duration "-5s": negative durations are not allowed"#
        );
    }

    #[test]
    fn display_uses_largest_exact_unit() {
        let cases = [
            (0, "0ms"),
            (1, "1ms"),
            (999, "999ms"),
            (1_000, "1s"),
            (1_500, "1500ms"),
            (59_000, "59s"),
            (60_000, "1m"),
            (90_000, "90s"),
            (3_600_000, "1h"),
            (5_400_000, "90m"),
            (86_400_000, "1d"),
            (90_000_000, "25h"),
            (172_800_000, "2d"),
            (u64::MAX, "18446744073709551615ms"),
        ];
        for (ms, text) in cases {
            assert_eq!(HumanDuration::from_millis(ms).to_string(), text, "{ms} ms");
        }
    }

    #[test]
    fn display_round_trips() {
        let mut values: Vec<u64> = (0..=5_000).collect();
        let units = [1, MS_PER_SECOND, MS_PER_MINUTE, MS_PER_HOUR, MS_PER_DAY];
        for unit in units {
            for k in [1, 2, 7, 59, 60, 61, 1_000, 86_400, 1_000_003] {
                values.push(unit * k);
                values.push(unit * k + 1);
                values.push(unit * k - 1);
            }
        }
        values.extend([u64::MAX, u64::MAX - 1, u64::MAX / MS_PER_DAY * MS_PER_DAY]);
        for ms in values {
            let d = HumanDuration::from_millis(ms);
            let shown = d.to_string();
            assert_eq!(shown.parse::<HumanDuration>(), Ok(d), "{shown}");
        }
    }

    #[test]
    fn const_accessors() {
        const D: HumanDuration = HumanDuration::from_millis(42);
        assert_eq!(D.as_millis(), 42);
        assert_eq!(D, HumanDuration(42));
        assert!(HumanDuration(1) < HumanDuration(2));
    }

    #[test]
    fn deserializes_from_string() {
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer, U64Deserializer};

        let de: StrDeserializer<'_, Error> = "1.5s".into_deserializer();
        assert_eq!(HumanDuration::deserialize(de), Ok(HumanDuration(1_500)));

        let de: StrDeserializer<'_, Error> = "abc".into_deserializer();
        let err = HumanDuration::deserialize(de).unwrap_err();
        assert_eq!(
            err.to_string(),
            "abc".parse::<HumanDuration>().unwrap_err().to_string()
        );

        let de: U64Deserializer<Error> = 5u64.into_deserializer();
        let err = HumanDuration::deserialize(de).unwrap_err();
        assert!(err.to_string().contains("duration string"), "{err}");
    }

    #[test]
    fn serializes_as_display_string() {
        assert_eq!(
            HumanDuration(60_000).serialize(StringSerializer),
            Ok("1m".to_owned())
        );
        assert_eq!(
            HumanDuration(1_500).serialize(StringSerializer),
            Ok("1500ms".to_owned())
        );
    }

    /// Minimal serializer that only accepts strings, so serialization can be
    /// tested without a format crate.
    struct StringSerializer;

    #[derive(Debug, PartialEq)]
    struct NotAString;

    impl fmt::Display for NotAString {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("only strings are supported")
        }
    }

    impl std::error::Error for NotAString {}

    impl serde::ser::Error for NotAString {
        fn custom<T: fmt::Display>(_msg: T) -> Self {
            Self
        }
    }

    macro_rules! reject {
        ($($name:ident($($ty:ty),*);)*) => {
            $(fn $name(self, $(_: $ty),*) -> Result<String, NotAString> { Err(NotAString) })*
        };
    }

    macro_rules! reject_compound {
        ($($name:ident($($ty:ty),*) -> $ret:ident;)*) => {
            $(fn $name(self, $(_: $ty),*) -> Result<Self::$ret, NotAString> { Err(NotAString) })*
        };
    }

    impl Serializer for StringSerializer {
        type Ok = String;
        type Error = NotAString;
        type SerializeSeq = serde::ser::Impossible<String, NotAString>;
        type SerializeTuple = serde::ser::Impossible<String, NotAString>;
        type SerializeTupleStruct = serde::ser::Impossible<String, NotAString>;
        type SerializeTupleVariant = serde::ser::Impossible<String, NotAString>;
        type SerializeMap = serde::ser::Impossible<String, NotAString>;
        type SerializeStruct = serde::ser::Impossible<String, NotAString>;
        type SerializeStructVariant = serde::ser::Impossible<String, NotAString>;

        fn serialize_str(self, v: &str) -> Result<String, NotAString> {
            Ok(v.to_owned())
        }

        fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<String, NotAString> {
            Err(NotAString)
        }

        fn serialize_newtype_struct<T: ?Sized + Serialize>(
            self,
            _: &'static str,
            _: &T,
        ) -> Result<String, NotAString> {
            Err(NotAString)
        }

        fn serialize_newtype_variant<T: ?Sized + Serialize>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<String, NotAString> {
            Err(NotAString)
        }

        reject! {
            serialize_bool(bool);
            serialize_i8(i8);
            serialize_i16(i16);
            serialize_i32(i32);
            serialize_i64(i64);
            serialize_u8(u8);
            serialize_u16(u16);
            serialize_u32(u32);
            serialize_u64(u64);
            serialize_f32(f32);
            serialize_f64(f64);
            serialize_char(char);
            serialize_bytes(&[u8]);
            serialize_none();
            serialize_unit();
            serialize_unit_struct(&'static str);
            serialize_unit_variant(&'static str, u32, &'static str);
        }

        reject_compound! {
            serialize_seq(Option<usize>) -> SerializeSeq;
            serialize_tuple(usize) -> SerializeTuple;
            serialize_tuple_struct(&'static str, usize) -> SerializeTupleStruct;
            serialize_tuple_variant(&'static str, u32, &'static str, usize) -> SerializeTupleVariant;
            serialize_map(Option<usize>) -> SerializeMap;
            serialize_struct(&'static str, usize) -> SerializeStruct;
            serialize_struct_variant(&'static str, u32, &'static str, usize) -> SerializeStructVariant;
        }
    }
}
