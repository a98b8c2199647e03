//! Protocol version 1, the version before [`VERSION`](crate::VERSION): its decoding (a node
//! accepts frames of one version back, so that nodes of two consecutive versions can run side
//! by side during a rolling upgrade) and its encoding (a node configured to send version 1,
//! `cluster.wire_version = 1`, while nodes of the previous build still run: they decode
//! nothing newer).
//!
//! Version 1 differs from version 2 in three places: a batch's keys are a plain sequence (no
//! block, no deflate); a key's state has no optimistic-mode `claims` (a version-1 node does
//! not send them: they decode as none); and `Message` ends with `RightsRequest`, which version
//! 2 no longer has (it is refused as a frame this node does not use).

use levee_core::crdt::{BucketReg, DemandReg, EpochSlot, NodeMap, TransferMatrix};
use levee_core::{KeyCrdt, Lattice};
use serde::{Deserialize, Serialize};

use crate::frame::{DecodeError, EncodeError, config};
use crate::message::{DeltaBatch, Digest, ForwardCheck, ForwardDecision, Hello, KeyEntry, Message};

/// A key's replicated state in version 1: [`KeyCrdt`] without `claims`.
#[derive(Deserialize)]
struct KeyCrdtV1 {
    slots: Vec<EpochSlot>,
    holdings: TransferMatrix,
    buckets: NodeMap<BucketReg>,
    demand: NodeMap<DemandReg>,
}

impl From<KeyCrdtV1> for KeyCrdt {
    fn from(v: KeyCrdtV1) -> KeyCrdt {
        let mut k = KeyCrdt::default();
        for s in &v.slots {
            k.slot_mut(s.epoch).join(s);
        }
        k.holdings = v.holdings;
        k.buckets = v.buckets;
        k.demand = v.demand;
        k
    }
}

#[derive(Deserialize)]
struct KeyEntryV1 {
    id: Vec<u8>,
    state: KeyCrdtV1,
}

/// A batch in version 1: its keys as a plain sequence.
#[derive(Deserialize)]
struct DeltaBatchV1 {
    sent_at_ms: u64,
    ack_ms: u64,
    keys: Vec<KeyEntryV1>,
}

impl From<DeltaBatchV1> for DeltaBatch {
    fn from(b: DeltaBatchV1) -> DeltaBatch {
        DeltaBatch {
            sent_at_ms: b.sent_at_ms,
            ack_ms: b.ack_ms,
            keys: b
                .keys
                .into_iter()
                .map(|k| KeyEntry {
                    id: k.id,
                    state: k.state.into(),
                })
                .collect(),
        }
    }
}

/// Every message of version 1, in its order (bincode numbers variants by position).
#[derive(Deserialize)]
enum MessageV1 {
    Hello(Hello),
    Deltas(DeltaBatchV1),
    Digest(Digest),
    BucketRequest {
        buckets: u32,
        wanted: Vec<u32>,
    },
    PullRequest,
    PullChunk {
        batch: DeltaBatchV1,
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
    RightsRequest {
        #[expect(
            dead_code,
            reason = "decoded to be refused: version 2 has no such message"
        )]
        ids: Vec<Vec<u8>>,
    },
}

/// Decodes a version-1 payload (whose header was checked) into this version's [`Message`].
pub(crate) fn decode_payload_v1(payload: &[u8]) -> Result<Message, DecodeError> {
    let (msg, used): (MessageV1, usize) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|e| DecodeError::Corrupted(e.to_string()))?;
    if used != payload.len() {
        return Err(DecodeError::Corrupted(format!(
            "{} bytes left over after the message",
            payload.len() - used
        )));
    }
    Ok(match msg {
        MessageV1::Hello(h) => Message::Hello(h),
        MessageV1::Deltas(b) => Message::Deltas(b.into()),
        MessageV1::Digest(d) => Message::Digest(d),
        MessageV1::BucketRequest { buckets, wanted } => Message::BucketRequest { buckets, wanted },
        MessageV1::PullRequest => Message::PullRequest,
        MessageV1::PullChunk { batch, done } => Message::PullChunk {
            batch: batch.into(),
            done,
        },
        MessageV1::PullDeferred => Message::PullDeferred,
        MessageV1::Forward { id, checks } => Message::Forward { id, checks },
        MessageV1::ForwardReply { id, decisions } => Message::ForwardReply { id, decisions },
        MessageV1::RightsRequest { .. } => {
            return Err(DecodeError::Corrupted(
                "a version-1 RightsRequest, which this version does not use".into(),
            ));
        }
    })
}

/// [`KeyCrdtV1`] as it is encoded, borrowed from a [`KeyCrdt`] (whose claims, always empty
/// since the optimistic mode was removed, version 1 does not have).
#[derive(Serialize)]
struct KeyCrdtV1Out<'a> {
    slots: &'a [EpochSlot],
    holdings: &'a TransferMatrix,
    buckets: &'a NodeMap<BucketReg>,
    demand: &'a NodeMap<DemandReg>,
}

#[derive(Serialize)]
struct KeyEntryV1Out<'a> {
    id: &'a [u8],
    state: KeyCrdtV1Out<'a>,
}

#[derive(Serialize)]
struct DeltaBatchV1Out<'a> {
    sent_at_ms: u64,
    ack_ms: u64,
    keys: Vec<KeyEntryV1Out<'a>>,
}

impl<'a> From<&'a DeltaBatch> for DeltaBatchV1Out<'a> {
    fn from(b: &'a DeltaBatch) -> DeltaBatchV1Out<'a> {
        DeltaBatchV1Out {
            sent_at_ms: b.sent_at_ms,
            ack_ms: b.ack_ms,
            keys: b
                .keys
                .iter()
                .map(|k| KeyEntryV1Out {
                    id: &k.id,
                    state: KeyCrdtV1Out {
                        slots: &k.state.slots,
                        holdings: &k.state.holdings,
                        buckets: &k.state.buckets,
                        demand: &k.state.demand,
                    },
                })
                .collect(),
        }
    }
}

/// [`MessageV1`] as it is encoded: the same variants in the same order (the last one,
/// `RightsRequest`, is never sent, so it is left out: leaving out a last variant keeps every
/// other's number).
#[derive(Serialize)]
enum MessageV1Out<'a> {
    Hello(&'a Hello),
    Deltas(DeltaBatchV1Out<'a>),
    Digest(&'a Digest),
    BucketRequest {
        buckets: u32,
        wanted: &'a [u32],
    },
    PullRequest,
    PullChunk {
        batch: DeltaBatchV1Out<'a>,
        done: bool,
    },
    PullDeferred,
    Forward {
        id: u64,
        checks: &'a [ForwardCheck],
    },
    ForwardReply {
        id: u64,
        decisions: &'a [Option<ForwardDecision>],
    },
}

/// Encodes `msg` as a version-1 payload, or `None` for a message version 1 does not have
/// (`Overrides`, `OverrideDigest`, `Membership`, `Heard`: a node of that version would
/// refuse it).
pub(crate) fn encode_payload_v1(msg: &Message) -> Result<Option<Vec<u8>>, EncodeError> {
    let out = match msg {
        Message::Hello(h) => MessageV1Out::Hello(h),
        Message::Deltas(b) => MessageV1Out::Deltas(b.into()),
        Message::Digest(d) => MessageV1Out::Digest(d),
        Message::BucketRequest { buckets, wanted } => MessageV1Out::BucketRequest {
            buckets: *buckets,
            wanted,
        },
        Message::PullRequest => MessageV1Out::PullRequest,
        Message::PullChunk { batch, done } => MessageV1Out::PullChunk {
            batch: batch.into(),
            done: *done,
        },
        Message::PullDeferred => MessageV1Out::PullDeferred,
        Message::Forward { id, checks } => MessageV1Out::Forward { id: *id, checks },
        Message::ForwardReply { id, decisions } => {
            MessageV1Out::ForwardReply { id: *id, decisions }
        }
        Message::Overrides(_)
        | Message::OverrideDigest { .. }
        | Message::Membership { .. }
        | Message::Heard { .. } => {
            return Ok(None);
        }
    };
    bincode::serde::encode_to_vec(&out, config())
        .map(Some)
        .map_err(|e| EncodeError::Encode(e.to_string()))
}
