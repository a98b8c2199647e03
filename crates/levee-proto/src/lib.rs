//! # levee-proto
//!
//! The messages Levee nodes exchange, and their framing on the wire.
//!
//! A frame is a 5-byte header — the protocol version (one byte) and the payload length (u32,
//! little endian) — followed by the payload, a [`Message`] encoded with bincode 2 (standard
//! configuration: variable-length integers). The header is checked before anything is
//! decoded: a frame of this [`VERSION`] or of the one before ([`OLDEST_VERSION`]) is decoded
//! with that version's layout; any other is refused as [`DecodeError::UnsupportedVersion`]
//! (never misread), and a length above [`MAX_FRAME_BYTES`] as [`DecodeError::TooLarge`] before
//! its payload is even read. The decoder itself is bounded by the same limit, so a hostile
//! length prefix inside the payload cannot make it allocate more.
//!
//! No I/O here: callers read the header, call [`FrameHeader::parse`], read `len` bytes, and
//! call [`decode_payload_of`] with the header's version; or hold a whole frame and call
//! [`decode_frame`].

mod frame;
mod id;
mod message;
mod v2;

pub use frame::*;
pub use id::*;
pub use message::*;
