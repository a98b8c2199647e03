//! Configuration errors: the line and the field of what is wrong, rule names and duplicated
//! keys included.

use std::fmt;

/// A configuration error: where, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or `<embedded>`).
    pub source_name: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The field, as a path (`rule[2].rate`, `api.max_body`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(
                f,
                "{}:{}: {}: {}",
                self.source_name, line, self.field, self.message
            ),
            None => write!(f, "{}: {}: {}", self.source_name, self.field, self.message),
        }
    }
}

/// Turns a TOML or serde error into a `ConfigError` with the line of its span. A duplicate
/// key is named (the TOML parser only says "duplicate key").
pub(super) fn toml_error(
    text: &str,
    source_name: &str,
    e: &toml::de::Error,
    path: &str,
) -> ConfigError {
    let field = if path.is_empty() || path == "." {
        "config".to_owned()
    } else {
        normalize_path(path)
    };
    let mut message = e.message().trim().to_owned();
    if message.starts_with("duplicate key")
        && let Some(key) = e
            .span()
            .and_then(|s| text.get(s))
            .map(str::trim)
            .filter(|k| !k.is_empty() && !message.contains(k))
    {
        message = format!("duplicate key `{key}`");
    }
    ConfigError {
        source_name: source_name.to_owned(),
        line: e.span().map(|s| line_at(text, s.start)),
        field,
        message,
    }
}

/// The marker `toml::Spanned` leaves in serde paths.
const SPANNED_MARKER: &str = "$__serde_spanned_private_value";

/// `rule[1].rate` rather than serde_path_to_error's `rule[1].rate` / `rule.rate` forms, with
/// `toml::Spanned`'s private field left out.
pub(super) fn normalize_path(path: &str) -> String {
    path.replace(&format!(".{SPANNED_MARKER}"), "")
        .replace(SPANNED_MARKER, "")
        .replace("?.", "")
        .replace('?', "")
}

/// The `name` of every `[[rule]]` table, in order, as far as the text can be read as TOML.
pub(super) fn rule_names(text: &str) -> Vec<Option<String>> {
    let Ok(table) = toml::from_str::<toml::Table>(text) else {
        return Vec::new();
    };
    let Some(rules) = table.get("rule").and_then(toml::Value::as_array) else {
        return Vec::new();
    };
    rules
        .iter()
        .map(|r| r.get("name")?.as_str().map(str::to_owned))
        .collect()
}

/// `rule "login": limit` for `rule[2].limit` when the third rule is named `login`.
pub(super) fn name_rule(field: &str, names: &[Option<String>]) -> String {
    let Some(rest) = field.strip_prefix("rule[") else {
        return field.to_owned();
    };
    let Some((index, tail)) = rest.split_once(']') else {
        return field.to_owned();
    };
    let Some(Some(name)) = index.parse::<usize>().ok().and_then(|i| names.get(i)) else {
        return field.to_owned();
    };
    match tail.strip_prefix('.') {
        Some(tail) => format!("rule {name:?}: {tail}"),
        None if tail.is_empty() => format!("rule {name:?}"),
        None => format!("rule {name:?}: {tail}"),
    }
}

/// From the start of a table to the next table header (or the end): where its keys are.
pub(super) fn table_extent(text: &str, start: usize) -> std::ops::Range<usize> {
    let start = start.min(text.len());
    let first_line_end = text[start..]
        .find('\n')
        .map_or(text.len(), |i| start + i + 1);
    let mut offset = first_line_end;
    for line in text[first_line_end..].split_inclusive('\n') {
        if line.trim_start().starts_with('[') {
            return start..offset;
        }
        offset += line.len();
    }
    start..text.len()
}

pub(super) fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

/// The line inside `range` where `key = …` is written, if any.
pub(super) fn find_key_line(text: &str, range: std::ops::Range<usize>, key: &str) -> Option<usize> {
    if key.is_empty() {
        return None;
    }
    let start = range.start.min(text.len());
    let end = range.end.min(text.len());
    let mut offset = start;
    for line in text[start..end].split_inclusive('\n') {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return Some(line_at(text, offset));
        }
        offset += line.len();
    }
    None
}
