//! Decoding of protocol version 1, the version before [`VERSION`](crate::VERSION): a node
//! accepts frames of one version back, so that nodes of two consecutive versions can run side
//! by side during a rolling upgrade.
//!
//! Version 1 differs from version 2 in three places: a batch's keys are a plain sequence (no
//! block, no deflate); a key's state has no optimistic-mode `claims` (a version-1 node does
//! not send them: they decode as none); and `Message` ends with `RightsRequest`, which version
//! 2 no longer has (it is refused as a frame this node does not use).

use levee_core::crdt::{BucketReg, DemandReg, EpochSlot, NodeMap, TransferMatrix};
use levee_core::{KeyCrdt, Lattice};
use serde::Deserialize;

use crate::frame::{DecodeError, config};
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
