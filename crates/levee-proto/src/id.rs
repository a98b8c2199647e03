//! A key's identity on the wire and in stores: rule, class bucket, key.

/// The longest key a node accepts, in bytes (the HTTP API's limit is this constant).
pub const MAX_KEY_BYTES: usize = 512;
/// The longest rule or class name, in bytes (the rules' own limit).
pub const MAX_RULE_BYTES: usize = levee_core::rule::MAX_NAME_LEN;
/// The longest key identity a node ever stores or sends: a rule name, its zero byte, the
/// class bucket and a key. Longer identities from a peer are refused.
pub const MAX_ID_BYTES: usize = MAX_RULE_BYTES + 2 + MAX_KEY_BYTES;

/// The "no class bucket" marker in a key identity.
pub const NO_BUCKET: u8 = 0xff;

/// Encodes a key's stored identity into `buf` (cleared first): the rule's name, a zero byte,
/// the class bucket (0xff: none), then the key's bytes. Rule names never hold a zero byte.
pub fn encode_id(buf: &mut Vec<u8>, rule: &str, bucket: Option<u8>, key: &str) {
    buf.clear();
    buf.reserve(rule.len() + key.len() + 2);
    buf.extend_from_slice(rule.as_bytes());
    buf.push(0);
    buf.push(bucket.unwrap_or(NO_BUCKET));
    buf.extend_from_slice(key.as_bytes());
}

/// Splits a key identity into rule name, class bucket and key.
pub fn decode_id(id: &[u8]) -> Option<(&str, Option<u8>, &str)> {
    let zero = id.iter().position(|&b| b == 0)?;
    let rule = std::str::from_utf8(&id[..zero]).ok()?;
    let bucket = *id.get(zero + 1)?;
    let key = std::str::from_utf8(&id[zero + 2..]).ok()?;
    Some((rule, (bucket != NO_BUCKET).then_some(bucket), key))
}
