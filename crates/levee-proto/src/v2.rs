//! Protocol version 2, the version before [`VERSION`](crate::VERSION): its decoding (a node
//! accepts frames of one version back, so that nodes of two consecutive versions can run side
//! by side during a rolling upgrade) and its encoding (a node configured to send version 2,
//! `cluster.wire_version = 2`, while nodes of the previous build still run: they decode
//! nothing newer).
//!
//! Version 2 differs from version 3 in two places: a batch has no `prev_ms` (it decodes as 0,
//! "unknown", so a gap before it is never reported), and `Message` ends with `Heard` (version
//! 3 adds `Missed`, and later `ListsBefore`, neither sent as version 2).

use serde::{Deserialize, Serialize};

use crate::frame::{DecodeError, EncodeError, config, decode_whole};
use crate::message::{
    DeltaBatch, Digest, ForwardCheck, ForwardDecision, HeardEntry, Hello, MemberList, Message,
    OverrideEntry, unpack_keys,
};

/// A batch as version 2 sends it: version 3's without `prev_ms`.
#[derive(Serialize, Deserialize)]
struct WireBatchV2 {
    sent_at_ms: u64,
    ack_ms: u64,
    codec: u8,
    raw_len: u32,
    block: Vec<u8>,
}

/// A [`DeltaBatch`] that travels in version 2's layout.
#[derive(Clone, Serialize, Deserialize)]
#[serde(into = "WireBatchV2", try_from = "WireBatchV2")]
struct BatchV2(DeltaBatch);

impl From<BatchV2> for WireBatchV2 {
    fn from(b: BatchV2) -> WireBatchV2 {
        let (codec, raw_len, block) = b.0.keys.packed().clone();
        WireBatchV2 {
            sent_at_ms: b.0.sent_at_ms,
            ack_ms: b.0.ack_ms,
            codec,
            raw_len,
            block,
        }
    }
}

impl TryFrom<WireBatchV2> for BatchV2 {
    type Error = String;

    fn try_from(w: WireBatchV2) -> Result<BatchV2, String> {
        Ok(BatchV2(DeltaBatch {
            sent_at_ms: w.sent_at_ms,
            ack_ms: w.ack_ms,
            prev_ms: 0,
            keys: unpack_keys(w.codec, w.raw_len, &w.block)?.into(),
        }))
    }
}

/// Every message of version 2, in its order (bincode numbers variants by position).
#[derive(Serialize, Deserialize)]
enum MessageV2 {
    Hello(Hello),
    Deltas(BatchV2),
    Digest(Digest),
    BucketRequest {
        buckets: u32,
        wanted: Vec<u32>,
    },
    PullRequest,
    PullChunk {
        batch: BatchV2,
        done: bool,
    },
    PullDeferred,
    Forward {
        id: u64,
        checks: Vec<ForwardCheck>,
    },
    ForwardReply {
        id: u64,
        decisions: Vec<Option<ForwardDecision>>,
    },
    Overrides(Vec<OverrideEntry>),
    OverrideDigest {
        hash: u64,
    },
    Membership {
        list: MemberList,
        floors: Vec<MemberList>,
        leaving: Vec<u16>,
        reply: bool,
    },
    Heard {
        gateway: bool,
        nodes: Vec<HeardEntry>,
    },
}

impl From<MessageV2> for Message {
    fn from(m: MessageV2) -> Message {
        match m {
            MessageV2::Hello(h) => Message::Hello(h),
            MessageV2::Deltas(b) => Message::Deltas(b.0),
            MessageV2::Digest(d) => Message::Digest(d),
            MessageV2::BucketRequest { buckets, wanted } => {
                Message::BucketRequest { buckets, wanted }
            }
            MessageV2::PullRequest => Message::PullRequest,
            MessageV2::PullChunk { batch, done } => Message::PullChunk {
                batch: batch.0,
                done,
            },
            MessageV2::PullDeferred => Message::PullDeferred,
            MessageV2::Forward { id, checks } => Message::Forward { id, checks },
            MessageV2::ForwardReply { id, decisions } => Message::ForwardReply { id, decisions },
            MessageV2::Overrides(o) => Message::Overrides(o),
            MessageV2::OverrideDigest { hash } => Message::OverrideDigest { hash },
            MessageV2::Membership {
                list,
                floors,
                leaving,
                reply,
            } => Message::Membership {
                list,
                floors,
                leaving,
                reply,
            },
            MessageV2::Heard { gateway, nodes } => Message::Heard { gateway, nodes },
        }
    }
}

impl MessageV2 {
    /// `msg` in version 2's layout, or `None` for a message version 2 does not have
    /// (`Missed`, `ListsBefore`: a node of that version would refuse it).
    fn of(msg: &Message) -> Option<MessageV2> {
        Some(match msg.clone() {
            Message::Hello(h) => MessageV2::Hello(h),
            Message::Deltas(b) => MessageV2::Deltas(BatchV2(b)),
            Message::Digest(d) => MessageV2::Digest(d),
            Message::BucketRequest { buckets, wanted } => {
                MessageV2::BucketRequest { buckets, wanted }
            }
            Message::PullRequest => MessageV2::PullRequest,
            Message::PullChunk { batch, done } => MessageV2::PullChunk {
                batch: BatchV2(batch),
                done,
            },
            Message::PullDeferred => MessageV2::PullDeferred,
            Message::Forward { id, checks } => MessageV2::Forward { id, checks },
            Message::ForwardReply { id, decisions } => MessageV2::ForwardReply { id, decisions },
            Message::Overrides(o) => MessageV2::Overrides(o),
            Message::OverrideDigest { hash } => MessageV2::OverrideDigest { hash },
            Message::Membership {
                list,
                floors,
                leaving,
                reply,
            } => MessageV2::Membership {
                list,
                floors,
                leaving,
                reply,
            },
            Message::Heard { gateway, nodes } => MessageV2::Heard { gateway, nodes },
            Message::Missed { .. } | Message::ListsBefore { .. } => return None,
        })
    }
}

/// Decodes a version-2 payload (whose header was checked) into this version's [`Message`].
pub(crate) fn decode_payload_v2(payload: &[u8]) -> Result<Message, DecodeError> {
    decode_whole::<MessageV2>(payload).map(Message::from)
}

/// Encodes `msg` as a version-2 payload, or `None` for a message version 2 does not have.
pub(crate) fn encode_payload_v2(msg: &Message) -> Result<Option<Vec<u8>>, EncodeError> {
    let Some(out) = MessageV2::of(msg) else {
        return Ok(None);
    };
    bincode::serde::encode_to_vec(&out, config())
        .map(Some)
        .map_err(|e| EncodeError::Encode(e.to_string()))
}
