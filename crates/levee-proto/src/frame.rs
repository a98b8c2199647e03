//! Framing: the header, encoding and bounded decoding of a [`Message`].

use crate::message::Message;

/// The protocol version this build speaks. 2: batches carry their keys as a (possibly
/// deflated) block, and a key's state the optimistic mode's claims (always empty since that
/// mode was removed; the field stays so that the encoding is version 2's). 3: a batch names
/// the one sent before it to the same peer (`prev_ms`), and a peer that finds one missing
/// says so (`Message::Missed`).
pub const VERSION: u8 = 3;
/// The oldest version this build decodes: one version back, so that nodes of two
/// consecutive versions understand each other's frames during a rolling upgrade (this build
/// always sends [`VERSION`]). See docs/replication.md, "Versions".
pub const OLDEST_VERSION: u8 = VERSION - 1;
/// The largest payload accepted, in bytes.
pub const MAX_FRAME_BYTES: usize = 4 << 20;
/// The size of a frame header.
pub const HEADER_BYTES: usize = 5;

/// Why a frame could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The encoded message is larger than [`MAX_FRAME_BYTES`]; split it.
    #[error("message of {len} bytes is over the frame limit of {max} bytes")]
    TooLarge {
        /// The encoded length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The encoder failed.
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// A version this build does not encode (it encodes [`OLDEST_VERSION`] to [`VERSION`]).
    #[error("cannot encode protocol version {0}: this build encodes {OLDEST_VERSION} to {VERSION}")]
    Version(u8),
}

/// Why a frame was refused. Nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame is from a protocol version this build does not decode (outside
    /// [`OLDEST_VERSION`]`..=`[`VERSION`]).
    #[error(
        "frame of protocol version {got}, this node speaks {expected} and decodes {oldest} to {expected}"
    )]
    UnsupportedVersion {
        /// The frame's version.
        got: u8,
        /// This build's version.
        expected: u8,
        /// The oldest version this build decodes.
        oldest: u8,
    },
    /// The frame announces more than [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes is over the limit of {max} bytes")]
    TooLarge {
        /// The announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Fewer bytes than the header announces.
    #[error("frame truncated: {got} of {expected} bytes")]
    Truncated {
        /// Bytes present.
        got: usize,
        /// Bytes announced.
        expected: usize,
    },
    /// The payload is not a valid message, or has bytes left over.
    #[error("corrupted frame: {0}")]
    Corrupted(String),
}

impl DecodeError {
    /// A short label for metrics (`version`, `size`, `truncated`, `corrupted`).
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::UnsupportedVersion { .. } => "version",
            DecodeError::TooLarge { .. } => "size",
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::Corrupted(_) => "corrupted",
        }
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The payload length.
    pub len: usize,
    /// The frame's protocol version: decode its payload with [`decode_payload_of`].
    pub version: u8,
}

impl FrameHeader {
    /// Checks a header: the version must be from [`OLDEST_VERSION`] to [`VERSION`] and the
    /// length at most [`MAX_FRAME_BYTES`].
    pub fn parse(header: &[u8; HEADER_BYTES]) -> Result<FrameHeader, DecodeError> {
        let version = header[0];
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(DecodeError::UnsupportedVersion {
                got: version,
                expected: VERSION,
                oldest: OLDEST_VERSION,
            });
        }
        let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(DecodeError::TooLarge {
                len,
                max: MAX_FRAME_BYTES,
            });
        }
        Ok(FrameHeader { len, version })
    }
}

pub(crate) fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Encodes a message as a whole frame (header and payload) of this build's [`VERSION`].
pub fn encode_frame(msg: &Message) -> Result<Vec<u8>, EncodeError> {
    let payload = bincode::serde::encode_to_vec(msg, config())
        .map_err(|e| EncodeError::Encode(e.to_string()))?;
    framed(VERSION, payload)
}

/// Encodes a message as a whole frame of protocol `version` ([`OLDEST_VERSION`] or
/// [`VERSION`]), for peers that decode nothing newer (`cluster.wire_version`). `Ok(None)`:
/// that version has no such message, and a peer of it would refuse it; it is not sent.
pub fn encode_frame_as(version: u8, msg: &Message) -> Result<Option<Vec<u8>>, EncodeError> {
    match version {
        VERSION => encode_frame(msg).map(Some),
        OLDEST_VERSION => match crate::v2::encode_payload_v2(msg)? {
            Some(payload) => framed(OLDEST_VERSION, payload).map(Some),
            None => Ok(None),
        },
        other => Err(EncodeError::Version(other)),
    }
}

/// The header and `payload`, of `version`.
fn framed(version: u8, payload: Vec<u8>) -> Result<Vec<u8>, EncodeError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(EncodeError::TooLarge {
            len: payload.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.push(version);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Decodes a payload of this build's [`VERSION`].
pub fn decode_payload(payload: &[u8]) -> Result<Message, DecodeError> {
    decode_payload_of(VERSION, payload)
}

/// Decodes a payload of protocol `version`, as its header said ([`FrameHeader::parse`]):
/// each accepted version with its own decoding.
pub fn decode_payload_of(version: u8, payload: &[u8]) -> Result<Message, DecodeError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(DecodeError::TooLarge {
            len: payload.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    match version {
        VERSION => {}
        OLDEST_VERSION => return crate::v2::decode_payload_v2(payload),
        got => {
            return Err(DecodeError::UnsupportedVersion {
                got,
                expected: VERSION,
                oldest: OLDEST_VERSION,
            });
        }
    }
    decode_whole(payload)
}

/// Decodes `payload` as one `T`, refusing bytes left over after it.
pub(crate) fn decode_whole<T: serde::de::DeserializeOwned>(
    payload: &[u8],
) -> Result<T, DecodeError> {
    let (msg, used): (T, usize) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|e| DecodeError::Corrupted(e.to_string()))?;
    if used != payload.len() {
        return Err(DecodeError::Corrupted(format!(
            "{} bytes left over after the message",
            payload.len() - used
        )));
    }
    Ok(msg)
}

/// Decodes one whole frame.
pub fn decode_frame(frame: &[u8]) -> Result<Message, DecodeError> {
    let Some(header) = frame.first_chunk::<HEADER_BYTES>() else {
        return Err(DecodeError::Truncated {
            got: frame.len(),
            expected: HEADER_BYTES,
        });
    };
    let h = FrameHeader::parse(header)?;
    let payload = &frame[HEADER_BYTES..];
    if payload.len() < h.len {
        return Err(DecodeError::Truncated {
            got: payload.len(),
            expected: h.len,
        });
    }
    if payload.len() > h.len {
        return Err(DecodeError::Corrupted(format!(
            "{} bytes after the frame",
            payload.len() - h.len
        )));
    }
    decode_payload_of(h.version, payload)
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
