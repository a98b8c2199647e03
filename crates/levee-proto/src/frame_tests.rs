//! Tests of the frame codec (`frame.rs`): every message round-trips, other versions and
//! oversized or truncated frames are refused, version 2 encodes and decodes as it did.
use super::*;
use crate::message::{DEFLATE_LEVEL, KEYS_DEFLATE, WireBatch, deflate};
use crate::*;
use levee_core::KeyCrdt;
use levee_core::NodeIdx;
use levee_core::crdt::Tally;
use serde::Serialize;

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
        prev_ms: 1_700_000_000_103,
        keys: vec![KeyEntry {
            id: b"api\0\xffacme".to_vec(),
            state,
        }]
        .into(),
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
        Message::Overrides(vec![
            OverrideEntry {
                rule: "r".into(),
                key: "k".into(),
                reg: levee_core::OverrideReg {
                    value: Some(levee_core::OverrideValue::Rate { rate: 5, burst: 9 }),
                    expires_at: Some(1_000),
                    written_at: 900,
                    writer: "eu-1".into(),
                },
            },
            OverrideEntry {
                rule: "r".into(),
                key: "gone".into(),
                reg: levee_core::OverrideReg {
                    value: None,
                    expires_at: None,
                    written_at: 901,
                    writer: "us-2".into(),
                },
            },
        ]),
        Message::OverrideDigest { hash: u64::MAX },
        Message::Heard {
            gateway: true,
            nodes: vec![
                HeardEntry {
                    node: 3,
                    age_ms: 20,
                },
                HeardEntry {
                    node: 255,
                    age_ms: u32::MAX,
                },
            ],
        },
        Message::Missed {
            since_ms: 1_700_000_000_080,
        },
        Message::ListsBefore {
            lists: vec![ListBefore {
                list: MemberList {
                    regions: vec![("eu".into(), 1), ("us".into(), 2)],
                    nodes: vec![
                        levee_core::ReplicaSpec {
                            id: "eu-1".into(),
                            region: "eu".into(),
                            weight: None,
                        },
                        levee_core::ReplicaSpec {
                            id: "us-1".into(),
                            region: "us".into(),
                            weight: Some(3),
                        },
                    ],
                },
                ago_ms: 86_400_000,
            }],
        },
    ] {
        let frame = encode_frame(&msg).unwrap();
        assert_eq!(decode_frame(&frame).unwrap(), msg);
    }
}

#[test]
fn a_frame_of_another_version_is_refused_not_misread() {
    for other in [VERSION + 1, OLDEST_VERSION - 1, u8::MAX] {
        let mut frame = encode_frame(&sample()).unwrap();
        frame[0] = other;
        assert_eq!(
            decode_frame(&frame),
            Err(DecodeError::UnsupportedVersion {
                got: other,
                expected: VERSION,
                oldest: OLDEST_VERSION,
            })
        );
    }
}

/// A whole frame: `version`, the payload's length, the payload.
fn framed(version: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![version];
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// Frames of the previous version, written byte by byte as a version-2 node encodes them
/// (bincode varints: every value below 251 is one byte), decode into this version's
/// messages, and this version's differ from them only where version 3 changed the layout.
#[test]
fn frames_of_the_previous_version_decode() {
    assert_eq!(OLDEST_VERSION, 2);
    // Hello { node: "eu-1", replica_digest: 42, incarnation: 7 }
    let hello = [&[0u8, 4][..], b"eu-1", &[42, 7]].concat();
    assert_eq!(
        decode_frame(&framed(2, &hello)).unwrap(),
        Message::Hello(Hello {
            node: "eu-1".into(),
            replica_digest: 42,
            incarnation: 7,
        })
    );
    // The keys of a batch: one key "r\0\xffk" whose state has, in epoch 7, node 2's tally
    // (5, 1, 9) and no transfers, a continuous transfer 0 -> 2 of 40, no registers and no
    // claims; 21 bytes, sent as they are (a block this short is not deflated).
    let keys = [
        &[1u8, 4][..],
        b"r\0\xffk",
        &[1, 7, 1, 2, 5, 1, 9, 0],
        &[1, 0, 2, 40],
        &[0, 0, 0],
    ]
    .concat();
    assert_eq!(keys.len(), 21);
    // Deltas (variant 1): sent_at 5, ack 3, then the block: codec 0 (plain), the keys'
    // length, the block's (the same, not deflated), the keys.
    let deltas = [&[1u8, 5, 3, 0, 21, 21][..], &keys].concat();
    let mut state = KeyCrdt::default();
    *state.slot_mut(7).tallies.entry(NodeIdx(2)) = Tally {
        consumed: 5,
        refunded: 1,
        requested: 9,
    };
    state.holdings.give(NodeIdx(0), NodeIdx(2), 40);
    let mut batch = DeltaBatch {
        sent_at_ms: 5,
        ack_ms: 3,
        prev_ms: 0,
        keys: vec![KeyEntry {
            id: b"r\0\xffk".to_vec(),
            state,
        }]
        .into(),
    };
    assert_eq!(
        decode_frame(&framed(2, &deltas)).unwrap(),
        Message::Deltas(batch.clone()),
        "a version-2 batch has no prev_ms: 0, unknown"
    );
    // The same keys as the last chunk of a pull (variant 5, then `done`).
    let chunk = [&[5u8][..], &deltas[1..], &[1]].concat();
    assert_eq!(
        decode_frame(&framed(2, &chunk)).unwrap(),
        Message::PullChunk {
            batch: batch.clone(),
            done: true
        }
    );
    // PullRequest, and a Digest of one bucket.
    assert_eq!(
        decode_frame(&framed(2, &[4])).unwrap(),
        Message::PullRequest
    );
    assert_eq!(
        decode_frame(&framed(2, &[2, 251, 0, 1, 1, 3, 9])).unwrap(),
        Message::Digest(Digest {
            buckets: 256,
            hashes: vec![(3, 9)],
        })
    );
    // Sent as version 2 (`cluster.wire_version = 2`), each is byte for byte what a
    // version-2 node encodes.
    for bytes in [&hello[..], &deltas, &chunk, &[4], &[2, 251, 0, 1, 1, 3, 9]] {
        let frame = framed(2, bytes);
        let msg = decode_frame(&frame).unwrap();
        assert_eq!(encode_frame_as(2, &msg).unwrap(), Some(frame), "{msg:?}");
    }
    // Version 3 puts prev_ms after ack_ms; everything else is version 2's.
    batch.prev_ms = 4;
    let v3 = [&[1u8, 5, 3, 4, 0, 21, 21][..], &keys].concat();
    assert_eq!(
        encode_frame(&Message::Deltas(batch)).unwrap(),
        framed(VERSION, &v3)
    );
    assert_eq!(
        encode_frame(&Message::PullRequest).unwrap(),
        framed(VERSION, &[4])
    );
    // The same version-2 Deltas read as version 3 is not misread: refused.
    assert!(matches!(
        decode_frame(&framed(VERSION, &deltas)),
        Err(DecodeError::Corrupted(_))
    ));
    // Version 3's last message, which version 2 does not have, is refused as version 2.
    assert!(matches!(
        decode_frame(&framed(2, &[13, 9])),
        Err(DecodeError::Corrupted(_))
    ));
    // Bytes left over after a version-2 message are refused too.
    assert!(matches!(
        decode_frame(&framed(2, &[4, 0])),
        Err(DecodeError::Corrupted(_))
    ));
}

/// Every message version 2 has goes out as version 2 and comes back as it was (`prev_ms`,
/// which version 2 lacks, comes back 0); `Missed`, added since, is not sent as version 2 at
/// all, and no other version is encoded.
#[test]
fn messages_sent_as_the_previous_version_come_back_as_they_were() {
    let forward = Message::Forward {
        id: 3,
        checks: vec![ForwardCheck {
            rule: "r".into(),
            key: "k".into(),
            cost: 2,
            class: Some("gold".into()),
            dry_run: false,
            idempotency_key: Some("retry-1".into()),
            refund: true,
        }],
    };
    let Message::Deltas(mut batch) = sample() else {
        unreachable!("sample() is a Deltas")
    };
    batch.prev_ms = 0;
    for msg in [
        Message::Deltas(batch.clone()),
        Message::PullChunk { batch, done: false },
        Message::Hello(Hello {
            node: "eu-1".into(),
            replica_digest: u64::MAX,
            incarnation: 7,
        }),
        Message::BucketRequest {
            buckets: 256,
            wanted: vec![0, 255],
        },
        Message::PullRequest,
        Message::PullDeferred,
        forward,
        Message::ForwardReply {
            id: 3,
            decisions: vec![None],
        },
        Message::OverrideDigest { hash: 1 },
        Message::Overrides(Vec::new()),
        Message::Heard {
            gateway: false,
            nodes: Vec::new(),
        },
    ] {
        let frame = encode_frame_as(2, &msg).unwrap().expect("version 2 has it");
        assert_eq!(frame[0], 2);
        assert_eq!(decode_frame(&frame).unwrap(), msg);
    }
    let missed = Message::Missed { since_ms: 1 };
    let before = Message::ListsBefore { lists: Vec::new() };
    for newer in [missed, before] {
        assert_eq!(encode_frame_as(2, &newer).unwrap(), None);
        assert!(encode_frame_as(VERSION, &newer).unwrap().is_some());
    }
    for other in [0, 1, VERSION + 1] {
        assert!(matches!(
            encode_frame_as(other, &Message::PullRequest),
            Err(EncodeError::Version(v)) if v == other
        ));
    }
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
        prev_ms: 1_763_700_000_000,
        keys,
    }
}

#[test]
fn copies_of_a_batch_for_several_peers_pack_their_keys_once() {
    // A node sends one interval's keys to every peer: each copy is stamped for its peer,
    // and the keys' block (bincode, then deflate) is made once, on the first encoding.
    let batch = bucket_batch(64);
    let mut to_b = batch.clone();
    to_b.ack_ms += 5;
    to_b.prev_ms += 3;
    let (a, b) = (
        Message::Deltas(batch.clone()),
        Message::Deltas(to_b.clone()),
    );
    assert!(!to_b.keys.is_packed());
    let fa = encode_frame(&a).unwrap();
    // Encoding the copy for one peer packed the block every copy shares.
    assert!(to_b.keys.is_packed());
    let fb = encode_frame(&b).unwrap();
    assert!(std::ptr::eq(batch.keys.packed(), to_b.keys.packed()));
    assert_eq!(decode_frame(&fa).unwrap(), a);
    assert_eq!(decode_frame(&fb).unwrap(), b);
    // Version 2's layout carries the same block.
    let v2 = encode_frame_as(OLDEST_VERSION, &a).unwrap().unwrap();
    let Message::Deltas(back) = decode_frame(&v2).unwrap() else {
        panic!("deltas come back as deltas");
    };
    assert_eq!(back.keys, batch.keys);
    // A decoded batch's keys are its own: moved out, not copied.
    let Message::Deltas(decoded) = decode_frame(&fa).unwrap() else {
        panic!("deltas come back as deltas");
    };
    let first = decoded.keys[0].id.as_ptr();
    assert_eq!(decoded.keys.into_vec()[0].id.as_ptr(), first);
}

#[test]
fn a_batch_of_many_keys_round_trips_deflated_and_smaller() {
    let batch = bucket_batch(256);
    let msg = Message::Deltas(batch.clone());
    let frame = encode_frame(&msg).unwrap();
    assert_eq!(decode_frame(&frame).unwrap(), msg);
    let plain = bincode::serde::encode_to_vec(&*batch.keys, config()).unwrap();
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
            prev_ms: 0,
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

proptest::proptest! {
    /// The thread's kept compressor deflates every block exactly as a fresh one does, whatever
    /// it deflated before: blocks of repeated runs (as batches are) and of random bytes, one
    /// after another on the same thread.
    #[test]
    fn the_kept_compressor_deflates_as_a_fresh_one(
        blocks in proptest::collection::vec(
            (proptest::collection::vec(proptest::num::u8::ANY, 0..64), 0usize..400),
            1..6,
        )
    ) {
        for (unit, repeats) in blocks {
            let raw: Vec<u8> = unit.iter().copied().cycle().take(unit.len() * repeats).collect();
            proptest::prop_assert_eq!(
                deflate(&raw),
                miniz_oxide::deflate::compress_to_vec(&raw, DEFLATE_LEVEL)
            );
        }
    }
}
