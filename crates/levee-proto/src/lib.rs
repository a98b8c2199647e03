//! # levee-proto
//!
//! The messages Levee nodes exchange, and their framing on the wire.
//!
//! A frame is a 5-byte header — the protocol version (one byte) and the payload length (u32,
//! little endian) — followed by the payload, a [`Message`] encoded with bincode 2 (standard
//! configuration: variable-length integers). The header is checked before anything is
//! decoded: a frame from another version is refused as [`DecodeError::UnsupportedVersion`]
//! (never misread), and a length above [`MAX_FRAME_BYTES`] as [`DecodeError::TooLarge`] before
//! its payload is even read. The decoder itself is bounded by the same limit, so a hostile
//! length prefix inside the payload cannot make it allocate more.
//!
//! No I/O here: callers read the header, call [`FrameHeader::parse`], read `len` bytes, and
//! call [`decode_payload`]; or hold a whole frame and call [`decode_frame`].

use levee_core::KeyCrdt;
use serde::{Deserialize, Serialize};

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

/// The protocol version this build speaks. 2: batches carry `ack_ms` and their keys as a
/// (possibly deflated) block.
pub const VERSION: u8 = 2;
/// The largest payload accepted, in bytes.
pub const MAX_FRAME_BYTES: usize = 4 << 20;
/// The size of a frame header.
pub const HEADER_BYTES: usize = 5;

/// What a node says first on every connection: who it is and which replica list and rules it
/// runs. Peers with a different replica list must not exchange counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The sender's node id.
    pub node: String,
    /// Digest of the agreed replica list (`ReplicaSet::digest`).
    pub replica_digest: u64,
    /// Changes every time the process starts, so peers notice restarts.
    pub incarnation: u64,
}

/// One key in a batch: its stored identity and its replicated state (a delta, or a full
/// state — the receiver cannot tell and need not care: merge is the same join). Named apart
/// from `levee_core::KeyState`, a node's whole state of a key, of which this carries only the
/// replicated part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEntry {
    /// `rule \0 bucket key` as the store encodes it.
    pub id: Vec<u8>,
    /// Entries, as absolute values.
    pub state: KeyCrdt,
}

/// Deltas (or full states) of many keys, from one node.
///
/// On the wire the keys are one block: their bincode encoding, deflated when that is
/// smaller (it is for any batch of more than a few keys: ids share rule names and key
/// prefixes, clock values share their high bytes). Decoding inflates at most
/// [`MAX_FRAME_BYTES`] and refuses a block whose announced and actual lengths differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "WireBatch", try_from = "WireBatch")]
pub struct DeltaBatch {
    /// The sender's wall clock when it sent the batch (ms since the Unix epoch).
    pub sent_at_ms: u64,
    /// The highest `sent_at_ms` of the destination's batches the sender has received (in the
    /// destination's clock; 0: none yet). A destination that sees this jump knows the sender
    /// missed what it sent in between and pushes it again.
    pub ack_ms: u64,
    /// The keys.
    pub keys: Vec<KeyEntry>,
}

/// How a batch's keys are encoded: bincode, as is.
const KEYS_PLAIN: u8 = 0;
/// How a batch's keys are encoded: bincode, then raw deflate.
const KEYS_DEFLATE: u8 = 1;
/// Blocks shorter than this are sent as they are.
const DEFLATE_FROM_BYTES: usize = 64;
/// Deflate level: the fastest; a batch's redundancy is in long repeats it finds anyway.
const DEFLATE_LEVEL: u8 = 1;

/// A [`DeltaBatch`] as it travels.
#[derive(Serialize, Deserialize)]
struct WireBatch {
    sent_at_ms: u64,
    ack_ms: u64,
    /// [`KEYS_PLAIN`] or [`KEYS_DEFLATE`].
    codec: u8,
    /// The length of the bincode encoding of the keys.
    raw_len: u32,
    /// The keys' block.
    block: Vec<u8>,
}

impl From<DeltaBatch> for WireBatch {
    fn from(b: DeltaBatch) -> WireBatch {
        // Encoding a Vec of plain structs into memory cannot fail; an empty block would be
        // refused by the receiver rather than misread.
        let raw = bincode::serde::encode_to_vec(&b.keys, config()).unwrap_or_default();
        let raw_len = raw.len() as u32;
        let (codec, block) = if raw.len() >= DEFLATE_FROM_BYTES {
            let packed = miniz_oxide::deflate::compress_to_vec(&raw, DEFLATE_LEVEL);
            if packed.len() < raw.len() {
                (KEYS_DEFLATE, packed)
            } else {
                (KEYS_PLAIN, raw)
            }
        } else {
            (KEYS_PLAIN, raw)
        };
        WireBatch {
            sent_at_ms: b.sent_at_ms,
            ack_ms: b.ack_ms,
            codec,
            raw_len,
            block,
        }
    }
}

impl TryFrom<WireBatch> for DeltaBatch {
    type Error = String;

    fn try_from(w: WireBatch) -> Result<DeltaBatch, String> {
        let raw_len = w.raw_len as usize;
        if raw_len > MAX_FRAME_BYTES {
            return Err(format!(
                "a batch of {raw_len} bytes is over the frame limit"
            ));
        }
        let inflated;
        let raw = match w.codec {
            KEYS_PLAIN => w.block.as_slice(),
            KEYS_DEFLATE => {
                inflated = miniz_oxide::inflate::decompress_to_vec_with_limit(&w.block, raw_len)
                    .map_err(|e| format!("the batch's keys do not inflate: {e}"))?;
                inflated.as_slice()
            }
            other => return Err(format!("unknown encoding {other} of a batch's keys")),
        };
        if raw.len() != raw_len {
            return Err(format!(
                "the batch's keys are {} bytes, {raw_len} announced",
                raw.len()
            ));
        }
        let (keys, used): (Vec<KeyEntry>, usize) =
            bincode::serde::decode_from_slice(raw, config()).map_err(|e| e.to_string())?;
        if used != raw.len() {
            return Err(format!(
                "{} bytes left over after the keys",
                raw.len() - used
            ));
        }
        Ok(DeltaBatch {
            sent_at_ms: w.sent_at_ms,
            ack_ms: w.ack_ms,
            keys,
        })
    }
}

/// Anti-entropy: hashes of the sender's keys, bucketed by key hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    /// How many buckets the key space is cut into.
    pub buckets: u32,
    /// `(bucket, hash of every key's state in it)`, for non-empty buckets.
    pub hashes: Vec<(u32, u64)>,
}

/// One check forwarded to the key's owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardCheck {
    /// Rule name.
    pub rule: String,
    /// Key.
    pub key: String,
    /// Cost.
    pub cost: u64,
    /// Class.
    pub class: Option<String>,
    /// Decide without consuming.
    pub dry_run: bool,
    /// A retry identity: the owner answers a repeat from its idempotency cache.
    pub idempotency_key: Option<String>,
    /// Give `cost` tokens back instead of taking them.
    pub refund: bool,
}

/// The owner's answer to one forwarded check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardDecision {
    /// Allowed.
    pub allowed: bool,
    /// What the algorithm decided.
    pub would_allow: bool,
    /// Limit.
    pub limit: u64,
    /// Remaining.
    pub remaining: u64,
    /// Reset after, ms.
    pub reset_after_ms: u64,
    /// Retry after, ms.
    pub retry_after_ms: u64,
    /// Decided under a conservative cap.
    pub degraded: bool,
}

/// Every message between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// First message on a connection.
    Hello(Hello),
    /// Changed keys since the last batch.
    Deltas(DeltaBatch),
    /// Anti-entropy digest; the receiver answers with the keys of buckets that differ.
    Digest(Digest),
    /// Asks for every key in these digest buckets.
    BucketRequest {
        /// How many buckets the key space is cut into.
        buckets: u32,
        /// The buckets wanted.
        wanted: Vec<u32>,
    },
    /// Asks for the full state of every key (join or restart).
    PullRequest,
    /// A part of a full state; `done` on the last one.
    PullChunk {
        /// The keys.
        batch: DeltaBatch,
        /// Whether this is the last chunk.
        done: bool,
    },
    /// The answer to a pull from a node that is itself recovering: it cannot vouch for a
    /// complete state (the keys it has come as `Deltas` beside this).
    PullDeferred,
    /// Checks forwarded to this node as the owner of their keys.
    Forward {
        /// Correlates the reply.
        id: u64,
        /// The checks, decided in order.
        checks: Vec<ForwardCheck>,
    },
    /// The owner's decisions, in order; `None` where the owner could not decide (unknown
    /// rule, bad cost): the forwarder then decides alone.
    ForwardReply {
        /// The request's id.
        id: u64,
        /// One answer per check.
        decisions: Vec<Option<ForwardDecision>>,
    },
}

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
}

/// Why a frame was refused. Nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame is from a protocol version this build does not speak.
    #[error("frame of protocol version {got}, this node speaks {expected}")]
    UnsupportedVersion {
        /// The frame's version.
        got: u8,
        /// This build's version.
        expected: u8,
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
}

impl FrameHeader {
    /// Checks a header: the version must be [`VERSION`] and the length at most
    /// [`MAX_FRAME_BYTES`].
    pub fn parse(header: &[u8; HEADER_BYTES]) -> Result<FrameHeader, DecodeError> {
        if header[0] != VERSION {
            return Err(DecodeError::UnsupportedVersion {
                got: header[0],
                expected: VERSION,
            });
        }
        let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(DecodeError::TooLarge {
                len,
                max: MAX_FRAME_BYTES,
            });
        }
        Ok(FrameHeader { len })
    }
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Encodes a message as a whole frame (header and payload).
pub fn encode_frame(msg: &Message) -> Result<Vec<u8>, EncodeError> {
    let mut out = vec![0u8; HEADER_BYTES];
    let payload = bincode::serde::encode_to_vec(msg, config())
        .map_err(|e| EncodeError::Encode(e.to_string()))?;
    if payload.len() > MAX_FRAME_BYTES {
        return Err(EncodeError::TooLarge {
            len: payload.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    out[0] = VERSION;
    out[1..5].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Decodes a payload whose header was checked with [`FrameHeader::parse`].
pub fn decode_payload(payload: &[u8]) -> Result<Message, DecodeError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(DecodeError::TooLarge {
            len: payload.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let (msg, used): (Message, usize) = bincode::serde::decode_from_slice(payload, config())
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
    decode_payload(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use levee_core::NodeIdx;
    use levee_core::crdt::Tally;

    fn sample() -> Message {
        let mut state = KeyCrdt::default();
        *state.slot_mut(1_700_000_000).tallies.entry(NodeIdx(2)) = Tally {
            consumed: 5,
            refunded: 1,
            requested: 9,
        };
        state.holdings.give(NodeIdx(0), NodeIdx(2), 40);
        Message::Deltas(DeltaBatch {
            sent_at_ms: 1_700_000_000_123,
            ack_ms: 1_700_000_000_101,
            keys: vec![KeyEntry {
                id: b"api\0\xffacme".to_vec(),
                state,
            }],
        })
    }

    /// The state's compact containers (one entry inline, thin vectors) are plain sequences on
    /// the wire, byte for byte what `Vec`s were: peers of either layout understand each other.
    #[test]
    fn compact_containers_encode_as_vectors() {
        use levee_core::crdt::{BucketReg, Transfer};
        let mut state = KeyCrdt::default();
        let reg = |seq| BucketReg {
            seq,
            at: 7,
            level_nt: -3,
        };
        *state.buckets.entry(NodeIdx(0)) = reg(1);
        *state.buckets.entry(NodeIdx(4)) = reg(2);
        state.holdings.give(NodeIdx(1), NodeIdx(0), 40);
        fn enc<T: Serialize>(v: &T) -> Vec<u8> {
            bincode::serde::encode_to_vec(v, config()).unwrap()
        }
        let as_vec: Vec<(NodeIdx, BucketReg)> = vec![(NodeIdx(0), reg(1)), (NodeIdx(4), reg(2))];
        assert_eq!(enc(&state.buckets), enc(&as_vec));
        let cells = vec![Transfer {
            from: NodeIdx(1),
            to: NodeIdx(0),
            units: 40,
        }];
        assert_eq!(enc(&state.holdings), enc(&cells));
        let back: KeyCrdt = bincode::serde::decode_from_slice(&enc(&state), config())
            .unwrap()
            .0;
        assert_eq!(back, state);
    }

    #[test]
    fn ids_round_trip() {
        let mut b = Vec::new();
        encode_id(&mut b, "rule-1", Some(3), "acme/ü");
        assert_eq!(decode_id(&b), Some(("rule-1", Some(3), "acme/ü")));
        encode_id(&mut b, "r", None, "");
        assert_eq!(decode_id(&b), Some(("r", None, "")));
        assert_eq!(decode_id(b"no-zero"), None);
    }

    #[test]
    fn frames_round_trip() {
        for msg in [
            sample(),
            Message::Hello(Hello {
                node: "eu-1".into(),
                replica_digest: 42,
                incarnation: 7,
            }),
            Message::PullRequest,
            Message::Forward {
                id: 3,
                checks: vec![ForwardCheck {
                    rule: "r".into(),
                    key: "k".into(),
                    cost: 2,
                    class: None,
                    dry_run: false,
                    idempotency_key: Some("retry-1".into()),
                    refund: false,
                }],
            },
        ] {
            let frame = encode_frame(&msg).unwrap();
            assert_eq!(decode_frame(&frame).unwrap(), msg);
        }
    }

    #[test]
    fn a_frame_of_another_version_is_refused_not_misread() {
        let mut frame = encode_frame(&sample()).unwrap();
        frame[0] = VERSION + 1;
        assert_eq!(
            decode_frame(&frame),
            Err(DecodeError::UnsupportedVersion {
                got: VERSION + 1,
                expected: VERSION
            })
        );
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header() {
        let mut header = [VERSION, 0, 0, 0, 0];
        header[1..5].copy_from_slice(&((MAX_FRAME_BYTES as u32) + 1).to_le_bytes());
        assert!(matches!(
            FrameHeader::parse(&header),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn truncated_and_padded_frames_are_refused() {
        let frame = encode_frame(&sample()).unwrap();
        assert!(matches!(
            decode_frame(&frame[..frame.len() - 1]),
            Err(DecodeError::Truncated { .. })
        ));
        assert!(matches!(
            decode_frame(&frame[..3]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut padded = frame.clone();
        padded.push(0);
        assert!(matches!(
            decode_frame(&padded),
            Err(DecodeError::Corrupted(_))
        ));
    }

    #[test]
    fn a_hostile_length_inside_the_payload_does_not_allocate_it() {
        // A Deltas message claiming 2^60 keys: the bounded decoder refuses it.
        let mut payload = vec![1u8]; // variant index of Deltas
        payload.push(0); // sent_at_ms = 0
        payload.extend_from_slice(&[0xfd]); // varint marker for a u64
        payload.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(
            decode_payload(&payload),
            Err(DecodeError::Corrupted(_))
        ));
    }

    /// A batch like a gossip interval's: token-bucket registers of `n` keys of one rule.
    fn bucket_batch(n: u64) -> DeltaBatch {
        let keys = (0..n)
            .map(|i| {
                let mut state = KeyCrdt::default();
                *state.buckets.entry(NodeIdx(0)) = levee_core::crdt::BucketReg {
                    seq: 1_000 + i * 7,
                    at: 1_763_700_000_000 + i % 20,
                    level_nt: (i as i64 * 7_919_000_003) % 100_000_000_000,
                };
                let mut id = Vec::new();
                encode_id(&mut id, "allow", None, &format!("g{i}"));
                KeyEntry { id, state }
            })
            .collect();
        DeltaBatch {
            sent_at_ms: 1_763_700_000_020,
            ack_ms: 1_763_700_000_001,
            keys,
        }
    }

    #[test]
    fn a_batch_of_many_keys_round_trips_deflated_and_smaller() {
        let batch = bucket_batch(256);
        let msg = Message::Deltas(batch.clone());
        let frame = encode_frame(&msg).unwrap();
        assert_eq!(decode_frame(&frame).unwrap(), msg);
        let plain = bincode::serde::encode_to_vec(&batch.keys, config()).unwrap();
        assert!(
            frame.len() < plain.len() * 2 / 3,
            "frame {} bytes, keys alone {} bytes",
            frame.len(),
            plain.len()
        );
    }

    #[test]
    fn a_block_that_inflates_past_its_announced_length_is_refused() {
        // 1 MiB of zeros deflates to about a kilobyte; announce less, or more than a frame.
        let block = miniz_oxide::deflate::compress_to_vec(&vec![0u8; 1 << 20], 1);
        for raw_len in [100u32, (MAX_FRAME_BYTES + 1) as u32] {
            let wire = WireBatch {
                sent_at_ms: 1,
                ack_ms: 0,
                codec: KEYS_DEFLATE,
                raw_len,
                block: block.clone(),
            };
            let mut payload = vec![1u8]; // variant index of Deltas
            payload.extend(bincode::serde::encode_to_vec(&wire, config()).unwrap());
            assert!(matches!(
                decode_payload(&payload),
                Err(DecodeError::Corrupted(_))
            ));
        }
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode_frame(&bytes);
            let mut framed = vec![VERSION];
            framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            framed.extend_from_slice(&bytes);
            let _ = decode_frame(&framed);
        }
    }
}
