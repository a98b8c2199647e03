//! The messages nodes exchange.

use std::sync::{Arc, OnceLock};

use levee_core::KeyCrdt;
use serde::{Deserialize, Serialize};

use crate::frame::{MAX_FRAME_BYTES, config};
use crate::id::{MAX_KEY_BYTES, MAX_RULE_BYTES};

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
    /// The `sent_at_ms` of the batch the sender sent the destination before this one (0:
    /// none, or unknown: a batch of version 2). A destination whose last batch from the
    /// sender is older missed the ones in between and says so ([`Message::Missed`]).
    pub prev_ms: u64,
    /// The keys.
    pub keys: BatchKeys,
}

/// The keys of a [`DeltaBatch`], shared by every copy of the batch: a node sends the same
/// keys to each of its peers, and they are cloned (a reference count) and encoded (bincode,
/// then deflate) once for all of them, not once a peer.
#[derive(Clone, Default)]
pub struct BatchKeys(Arc<SharedKeys>);

#[derive(Default)]
struct SharedKeys {
    keys: Vec<KeyEntry>,
    /// [`pack_keys`] of `keys`, made on the first encoding.
    packed: OnceLock<(u8, u32, Vec<u8>)>,
}

impl BatchKeys {
    /// The keys, moved out when this is their only copy (a batch just decoded), else cloned.
    pub fn into_vec(self) -> Vec<KeyEntry> {
        match Arc::try_unwrap(self.0) {
            Ok(shared) => shared.keys,
            Err(shared) => shared.keys.clone(),
        }
    }

    /// The keys' block as it travels, `(codec, raw length, block)`: packed on first use.
    pub(crate) fn packed(&self) -> &(u8, u32, Vec<u8>) {
        self.0.packed.get_or_init(|| pack_keys(&self.0.keys))
    }

    /// Whether the block was made already.
    #[cfg(test)]
    pub(crate) fn is_packed(&self) -> bool {
        self.0.packed.get().is_some()
    }
}

impl From<Vec<KeyEntry>> for BatchKeys {
    fn from(keys: Vec<KeyEntry>) -> BatchKeys {
        BatchKeys(Arc::new(SharedKeys {
            keys,
            packed: OnceLock::new(),
        }))
    }
}

impl FromIterator<KeyEntry> for BatchKeys {
    fn from_iter<I: IntoIterator<Item = KeyEntry>>(keys: I) -> BatchKeys {
        keys.into_iter().collect::<Vec<_>>().into()
    }
}

impl std::ops::Deref for BatchKeys {
    type Target = [KeyEntry];

    fn deref(&self) -> &[KeyEntry] {
        &self.0.keys
    }
}

impl IntoIterator for BatchKeys {
    type Item = KeyEntry;
    type IntoIter = std::vec::IntoIter<KeyEntry>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl PartialEq for BatchKeys {
    fn eq(&self, other: &BatchKeys) -> bool {
        self.0.keys == other.0.keys
    }
}

impl Eq for BatchKeys {}

impl std::fmt::Debug for BatchKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.keys.fmt(f)
    }
}

/// How a batch's keys are encoded: bincode, as is.
const KEYS_PLAIN: u8 = 0;
/// How a batch's keys are encoded: bincode, then raw deflate.
pub(crate) const KEYS_DEFLATE: u8 = 1;
/// Blocks shorter than this are sent as they are.
const DEFLATE_FROM_BYTES: usize = 64;
/// Deflate level: the fastest; a batch's redundancy is in long repeats it finds anyway.
pub(crate) const DEFLATE_LEVEL: u8 = 1;

/// A [`DeltaBatch`] as it travels.
#[derive(Serialize, Deserialize)]
pub(crate) struct WireBatch {
    pub(crate) sent_at_ms: u64,
    pub(crate) ack_ms: u64,
    pub(crate) prev_ms: u64,
    /// [`KEYS_PLAIN`] or [`KEYS_DEFLATE`].
    pub(crate) codec: u8,
    /// The length of the bincode encoding of the keys.
    pub(crate) raw_len: u32,
    /// The keys' block.
    pub(crate) block: Vec<u8>,
}

impl From<DeltaBatch> for WireBatch {
    fn from(b: DeltaBatch) -> WireBatch {
        let (codec, raw_len, block) = b.keys.packed().clone();
        WireBatch {
            sent_at_ms: b.sent_at_ms,
            ack_ms: b.ack_ms,
            prev_ms: b.prev_ms,
            codec,
            raw_len,
            block,
        }
    }
}

impl TryFrom<WireBatch> for DeltaBatch {
    type Error = String;

    fn try_from(w: WireBatch) -> Result<DeltaBatch, String> {
        Ok(DeltaBatch {
            sent_at_ms: w.sent_at_ms,
            ack_ms: w.ack_ms,
            prev_ms: w.prev_ms,
            keys: unpack_keys(w.codec, w.raw_len, &w.block)?.into(),
        })
    }
}

/// A batch's keys as one block: `(codec, raw length, block)`, deflated when that is smaller.
pub(crate) fn pack_keys(keys: &[KeyEntry]) -> (u8, u32, Vec<u8>) {
    // Encoding a Vec of plain structs into memory cannot fail; an empty block would be
    // refused by the receiver rather than misread.
    let raw = bincode::serde::encode_to_vec(keys, config()).unwrap_or_default();
    let raw_len = raw.len() as u32;
    if raw.len() >= DEFLATE_FROM_BYTES {
        let packed = deflate(&raw);
        if packed.len() < raw.len() {
            return (KEYS_DEFLATE, raw_len, packed);
        }
    }
    (KEYS_PLAIN, raw_len, raw)
}

/// `raw` deflated (raw deflate, no zlib header), as `miniz_oxide::deflate::compress_to_vec` at
/// [`DEFLATE_LEVEL`] makes it, byte for byte, but with the thread's compressor kept between
/// batches. A new compressor is ~300 KB (its dictionary and hash chains), allocated zeroed for
/// every batch: the allocation came fresh from the kernel each time, page by page, and cost
/// more than deflating a 20 ms batch of a few hundred keys (docs/benchmarks.md, 2026-12-03).
pub(crate) fn deflate(raw: &[u8]) -> Vec<u8> {
    use miniz_oxide::deflate::core::{
        CompressorOxide, TDEFLFlush, TDEFLStatus, compress, create_comp_flags_from_zip_params,
    };
    thread_local! {
        static COMPRESSOR: std::cell::RefCell<Option<CompressorOxide>> =
            const { std::cell::RefCell::new(None) };
    }
    COMPRESSOR.with_borrow_mut(|slot| {
        let c = slot.get_or_insert_with(|| {
            CompressorOxide::new(create_comp_flags_from_zip_params(
                DEFLATE_LEVEL.into(),
                0,
                0,
            ))
        });
        c.reset();
        let mut out = vec![0; (raw.len() / 2).max(2)];
        let (mut input, mut at) = (raw, 0);
        loop {
            let (status, read, wrote) = compress(c, input, &mut out[at..], TDEFLFlush::Finish);
            at += wrote;
            match status {
                TDEFLStatus::Done => {
                    out.truncate(at);
                    return out;
                }
                TDEFLStatus::Okay if read <= input.len() => {
                    input = &input[read..];
                    if out.len() - at < 30 {
                        out.resize(out.len() * 2, 0);
                    }
                }
                // A compressor fed from memory into memory fails only by a bug of its own:
                // start again with a fresh one (what `compress_to_vec` would have used).
                _ => {
                    *slot = None;
                    return miniz_oxide::deflate::compress_to_vec(raw, DEFLATE_LEVEL);
                }
            }
        }
    })
}

/// The keys of a block [`pack_keys`] made, inflating at most its announced length.
pub(crate) fn unpack_keys(codec: u8, raw_len: u32, block: &[u8]) -> Result<Vec<KeyEntry>, String> {
    let raw_len = raw_len as usize;
    if raw_len > MAX_FRAME_BYTES {
        return Err(format!(
            "a batch of {raw_len} bytes is over the frame limit"
        ));
    }
    let inflated;
    let raw = match codec {
        KEYS_PLAIN => block,
        KEYS_DEFLATE => {
            inflated = miniz_oxide::inflate::decompress_to_vec_with_limit(block, raw_len)
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
    Ok(keys)
}

/// Anti-entropy: hashes of the sender's keys, bucketed by key hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    /// How many buckets the key space is cut into.
    pub buckets: u32,
    /// `(bucket, hash of every key's state in it)`, for non-empty buckets.
    pub hashes: Vec<(u32, u64)>,
}

/// The most checks in one [`Message::Forward`]: a node forwards at most this many per batch
/// (its forwarder batches up to it), and refuses a `Forward` with more.
pub const MAX_FORWARD_CHECKS: usize = 256;

/// The longest `idempotency_key` of a [`ForwardCheck`]: the HTTP API's cap, so a peer cannot
/// fill its owner's idempotency cache with keys no client could have sent.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;

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

impl ForwardCheck {
    /// Whether its names are within what a node ever sends ([`MAX_RULE_BYTES`] for the rule
    /// and the class, [`MAX_KEY_BYTES`] for the key, [`MAX_IDEMPOTENCY_KEY_BYTES`] for the
    /// idempotency key).
    pub fn within_bounds(&self) -> bool {
        self.rule.len() <= MAX_RULE_BYTES
            && self
                .idempotency_key
                .as_ref()
                .is_none_or(|k| k.len() <= MAX_IDEMPOTENCY_KEY_BYTES)
            && self.key.len() <= MAX_KEY_BYTES
            && self
                .class
                .as_ref()
                .is_none_or(|c| c.len() <= MAX_RULE_BYTES)
    }
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
    /// Retry after, ms, when `would_allow` is false. When it is true (no retry-after then), a
    /// leaky bucket's `delay_ms`: the field carries it so that the encoding stays version 2's.
    pub retry_after_ms: u64,
    /// Decided under a conservative cap.
    pub degraded: bool,
}

/// The most override registers in one [`Message::Overrides`]: a node sends more in several
/// messages, and refuses a message with more.
pub const MAX_OVERRIDES_PER_MESSAGE: usize = 512;

/// One per-key override as replicated: its rule, its key and its last-writer-wins register.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideEntry {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The register (a tombstone when deleted).
    pub reg: levee_core::OverrideReg,
}

impl OverrideEntry {
    /// Whether its names are within what a node ever sends ([`MAX_RULE_BYTES`] for the rule,
    /// [`MAX_KEY_BYTES`] for the key, [`levee_core::overrides::MAX_WRITER_LEN`] for the
    /// writer's id).
    pub fn within_bounds(&self) -> bool {
        self.rule.len() <= MAX_RULE_BYTES
            && !self.key.is_empty()
            && self.key.len() <= MAX_KEY_BYTES
            && self.reg.writer.len() <= levee_core::overrides::MAX_WRITER_LEN
    }
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
    /// Per-key override registers (changed ones at every gossip interval; all of them to a
    /// peer heard again after a silence, or whose digest differs); at most
    /// [`MAX_OVERRIDES_PER_MESSAGE`]. Added at the end: versions before it decode every other
    /// message as before, and refuse this one as unknown.
    Overrides(Vec<OverrideEntry>),
    /// Anti-entropy of overrides: the XOR of the hashes of the sender's registers. A receiver
    /// whose own differs sends all of its registers back.
    OverrideDigest {
        /// The XOR of every register's hash (`levee_cluster` computes it).
        hash: u64,
    },
    /// The replica list the sender runs (its acknowledgement of that list), and the lists
    /// that still bound its shares (live membership, docs/membership.md). Added at the end:
    /// versions before it decode every other message as before, and refuse this one as
    /// unknown (they count it and go on).
    Membership {
        /// The list the sender runs.
        list: MemberList,
        /// Until its list is agreed, the other lists that bound its shares (at most
        /// [`MAX_FLOOR_LISTS`]; none once agreed): a node that starts while a change settles
        /// bounds its shares by them too, so that it does not spend a share the running
        /// nodes have not yet given up.
        floors: Vec<MemberList>,
        /// The positions (in `list`) of the nodes the sender knows are leaving
        /// (`POST /admin/leave`), its own first when it leaves; at most
        /// `levee_core::MAX_NODES`. A node is leaving when it says so of itself; what it
        /// says of others acknowledges what they said.
        leaving: Vec<u16>,
        /// The sender has not heard the receiver's list yet (it just started): the
        /// receiver answers with its own.
        reply: bool,
    },
    /// With regional gossip (`levee_cluster::Topology::Regions`), to the peers the sender
    /// gossips with: the nodes it hears directly, each with how long ago it last heard it,
    /// so that every node knows every node's liveness without talking to it. At most
    /// `levee_core::MAX_NODES` entries. Added at the end: versions before it decode every
    /// other message as before, and refuse this one as unknown.
    Heard {
        /// The sender chose the receiver as its gateway to the receiver's region.
        gateway: bool,
        /// The nodes the sender hears directly.
        nodes: Vec<HeardEntry>,
    },
    /// The receiver's batches sent after `since_ms` (the receiver's clock: the last of its
    /// batches the sender got before a gap) did not all arrive: the receiver sends again the
    /// keys it sent since then. Version 3.
    Missed {
        /// The `sent_at_ms` of the last batch received before the gap.
        since_ms: u64,
    },
    /// Sent right after the whole answer to a [`Message::PullRequest`] (and with the answer
    /// to a `Membership` that asks for a reply): the lists the sender ran before the one it
    /// runs (at most [`MAX_FLOOR_LISTS`], the latest), each with how long ago it stopped
    /// running it. A node that starts binds its shares by those still recent enough to count
    /// (a share that grew with a change made while the node was down waits as a running
    /// node's does: docs/membership.md). Added at the end: versions before it decode every
    /// other message as before, and refuse this one as unknown (which stops the stream it
    /// came on: hence after the pull's answer, not before); a starting node that pulls from
    /// such a peer waits `suspect_after` for it before it decides.
    ListsBefore {
        /// The lists, each with how long before the message was sent the sender stopped
        /// running it, oldest first.
        lists: Vec<ListBefore>,
    },
}

/// One list of a [`Message::ListsBefore`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListBefore {
    /// The list.
    pub list: MemberList,
    /// How long before the message was sent the sender stopped running it (it reloaded a
    /// later list), in ms.
    pub ago_ms: u64,
}

/// One node heard directly by the sender of a [`Message::Heard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeardEntry {
    /// The node's position in the replica list.
    pub node: u16,
    /// How long before the message was sent the sender last heard it, in ms.
    pub age_ms: u32,
}

/// The most lists a [`Message::Membership`] carries as floors: a node refuses a change of
/// its list while this many of its own are still not agreed, and passes on at most this many
/// (its own first).
pub const MAX_FLOOR_LISTS: usize = 8;

/// Longest node id or region name in a [`MemberList`].
pub const MAX_MEMBER_NAME_BYTES: usize = 128;

/// A replica list as it travels: region weights and the nodes in order (a removed node with
/// weight `Some(0)`), what `levee_core::ReplicaSet::specs` gives and `ReplicaSet::new` takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberList {
    /// `(region, weight)`, sorted by name.
    pub regions: Vec<(String, u32)>,
    /// The nodes, in list order.
    pub nodes: Vec<levee_core::ReplicaSpec>,
}

impl MemberList {
    /// Whether it is within what a node ever sends: at most `levee_core::MAX_NODES` nodes and
    /// `MAX_REGIONS` regions, names of at most [`MAX_MEMBER_NAME_BYTES`]. (Whether it is a
    /// valid list is `ReplicaSet::new`'s to say.)
    pub fn within_bounds(&self) -> bool {
        let name = |s: &String| s.len() <= MAX_MEMBER_NAME_BYTES;
        self.nodes.len() <= levee_core::MAX_NODES
            && self.regions.len() <= levee_core::MAX_REGIONS
            && self.regions.iter().all(|(r, _)| name(r))
            && self.nodes.iter().all(|n| name(&n.id) && name(&n.region))
    }
}
