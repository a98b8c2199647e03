//! Reading and writing whole frames on QUIC streams, with untrusted input bounded before it is
//! decoded.
//!
//! A frame is read in three steps: its [`HEADER_BYTES`]-byte header, checked with
//! [`FrameHeader::parse`] (a frame of a version it does not decode or over
//! [`levee_proto::MAX_FRAME_BYTES`] is refused before one byte of its payload is read); exactly
//! `len` payload bytes, buffered only as they arrive and within the connection's payload
//! budget; then [`decode_payload_of`] with the header's version.

use std::time::Duration;

use levee_proto::{DecodeError, FrameHeader, HEADER_BYTES, Message, decode_payload_of};
use quinn::{ReadExactError, RecvStream, SendStream, VarInt};
use tokio::sync::Semaphore;

/// Application error code on a stream whose frame was refused.
pub(crate) const STREAM_REFUSED: VarInt = VarInt::from_u32(1);
/// Application error code on a request stream the receiving application did not answer.
pub(crate) const STREAM_NO_REPLY: VarInt = VarInt::from_u32(2);

/// Payload bytes of frames being read at once on one connection. A frame waits for its share
/// before its payload is read, so a peer opening many streams cannot make this node buffer
/// more than this (plus QUIC's receive window).
pub(crate) const PAYLOAD_BUDGET_BYTES: usize = 64 << 20;
/// A payload must arrive within this long once its header has been read; a stalled stream
/// would otherwise hold its share of the budget forever.
pub(crate) const PAYLOAD_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no frame was read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The bytes were refused as a frame; the stream should be stopped, the connection kept.
    Refused(DecodeError),
    /// The payload did not arrive in time.
    Stalled,
    /// The stream or connection failed (reset by the peer, connection lost).
    Stream(String),
}

impl FrameError {
    /// The `kind` label of a refused or stalled frame.
    pub(crate) fn kind(&self) -> Option<&'static str> {
        match self {
            FrameError::Refused(e) => Some(e.kind()),
            FrameError::Stalled => Some("stalled"),
            FrameError::Stream(_) => None,
        }
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Refused(e) => write!(f, "{e}"),
            FrameError::Stalled => write!(
                f,
                "frame payload not received within {PAYLOAD_READ_TIMEOUT:?}"
            ),
            FrameError::Stream(e) => write!(f, "{e}"),
        }
    }
}

/// Reads the next frame of `recv`: `Ok(None)` if the stream ended cleanly before a header,
/// else the message and its size on the wire.
pub(crate) async fn read_frame(
    recv: &mut RecvStream,
    budget: &Semaphore,
) -> Result<Option<(Message, usize)>, FrameError> {
    let mut header = [0u8; HEADER_BYTES];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(ReadExactError::FinishedEarly(got)) => {
            return Err(FrameError::Refused(DecodeError::Truncated {
                got,
                expected: HEADER_BYTES,
            }));
        }
        Err(ReadExactError::ReadError(e)) => return Err(FrameError::Stream(e.to_string())),
    }
    let FrameHeader { len, version } = FrameHeader::parse(&header).map_err(FrameError::Refused)?;

    // `len` is at most MAX_FRAME_BYTES (4 MiB), which fits in u32 and in the budget.
    let _share = budget
        .acquire_many(len as u32)
        .await
        .map_err(|_| FrameError::Stream("connection closing".into()))?;
    let payload = tokio::time::timeout(PAYLOAD_READ_TIMEOUT, read_payload(recv, len))
        .await
        .map_err(|_| FrameError::Stalled)??;
    let msg = decode_payload_of(version, &payload).map_err(FrameError::Refused)?;
    Ok(Some((msg, HEADER_BYTES + len)))
}

/// Reads exactly `len` bytes, growing the buffer only as bytes arrive.
async fn read_payload(recv: &mut RecvStream, len: usize) -> Result<Vec<u8>, FrameError> {
    let mut payload = Vec::with_capacity(len.min(64 << 10));
    while payload.len() < len {
        match recv.read_chunk(len - payload.len(), true).await {
            Ok(Some(chunk)) => payload.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(FrameError::Refused(DecodeError::Truncated {
                    got: payload.len(),
                    expected: len,
                }));
            }
            Err(e) => return Err(FrameError::Stream(e.to_string())),
        }
    }
    Ok(payload)
}

/// Writes one whole frame and finishes the stream.
pub(crate) async fn write_frame(send: &mut SendStream, frame: &[u8]) -> Result<(), String> {
    send.write_all(frame).await.map_err(|e| e.to_string())?;
    send.finish().map_err(|e| e.to_string())
}
