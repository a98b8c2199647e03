//! Snapshots of counters in `data_dir`, so a restart keeps day and month quotas.
//!
//! The file is `snapshot.bin`: the magic `LEVEESNP`, a format version (u32, little endian),
//! then the replicated state of every key, encoded with bincode. It is written to a temporary
//! file, synced, and renamed over the old one, so a crash mid-write leaves the previous
//! snapshot intact. On restore, keys of rules that no longer exist are skipped, and entries
//! are merged like a peer's full state (epochs past retention are dropped).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use levee_core::{DecideCtx, KeyCrdt, KeyState};
use serde::{Deserialize, Serialize};

use crate::limiter::Limiter;
use crate::store::decode_id;

const MAGIC: &[u8; 8] = b"LEVEESNP";
const VERSION: u32 = 1;
/// The largest snapshot accepted on restore.
const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

#[derive(Serialize, Deserialize)]
struct Snapshot {
    written_at_ms: u64,
    node: String,
    keys: Vec<(Vec<u8>, KeyCrdt)>,
}

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// File system error.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a snapshot of this format.
    #[error("{path}: not a Levee snapshot of format {VERSION}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The snapshot file inside `data_dir`.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshot.bin")
}

/// Writes every key's replicated state to `data_dir`. Returns the number of keys written.
pub fn save(limiter: &Limiter, node: &str, data_dir: &Path) -> Result<usize, SnapshotError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| SnapshotError::Io { path, source }
    };
    fs::create_dir_all(data_dir).map_err(io(data_dir))?;
    let mut keys = Vec::with_capacity(limiter.store().len());
    limiter.store().for_each(|id, state| {
        if !state.crdt().is_empty() {
            keys.push((id.to_vec(), state.crdt().clone()));
        }
    });
    let count = keys.len();
    let snap = Snapshot {
        written_at_ms: limiter.clock.now_ms(),
        node: node.to_owned(),
        keys,
    };
    let body = bincode::serde::encode_to_vec(&snap, bincode::config::standard()).map_err(|e| {
        SnapshotError::Format {
            path: data_dir.into(),
            reason: e.to_string(),
        }
    })?;
    let final_path = path_in(data_dir);
    let tmp = data_dir.join("snapshot.bin.tmp");
    {
        let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(MAGIC).map_err(io(&tmp))?;
        f.write_all(&VERSION.to_le_bytes()).map_err(io(&tmp))?;
        f.write_all(&body).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    fs::rename(&tmp, &final_path).map_err(io(&final_path))?;
    if let Ok(dir) = fs::File::open(data_dir) {
        let _ = dir.sync_all();
    }
    Ok(count)
}

/// Restores the snapshot in `data_dir`, if there is one. Returns the number of keys restored.
pub fn restore(limiter: &Limiter, data_dir: &Path) -> Result<usize, SnapshotError> {
    let path = path_in(data_dir);
    let bytes = match fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(SnapshotError::Io { path, source }),
        Ok(m) if m.len() > MAX_SNAPSHOT_BYTES => {
            return Err(SnapshotError::Format {
                path,
                reason: format!("{} bytes is larger than allowed", m.len()),
            });
        }
        Ok(_) => fs::read(&path).map_err(|source| SnapshotError::Io {
            path: path.clone(),
            source,
        })?,
    };
    let format = |reason: String| SnapshotError::Format {
        path: path.clone(),
        reason,
    };
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err(format("bad magic".into()));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("four bytes"));
    if version != VERSION {
        return Err(format(format!("format version {version}")));
    }
    let (snap, _): (Snapshot, usize) =
        bincode::serde::decode_from_slice(&bytes[12..], bincode::config::standard())
            .map_err(|e| format(e.to_string()))?;
    let rules = limiter.rules();
    let now = limiter.clock.now_ms();
    let ctx = DecideCtx {
        now,
        me: rules.me,
        replicas: &rules.replicas,
        view: levee_core::ClusterView::alone(),
    };
    let mut restored = 0;
    for (id, crdt) in snap.keys {
        let Some((rule, bucket, _)) = decode_id(&id) else {
            continue;
        };
        let Some(entry) = rules.by_name.get(rule) else {
            continue;
        };
        let Some(target) = entry.rule.target_of_bucket(bucket) else {
            continue;
        };
        let mut state = KeyState::new();
        if state.merge(&crdt, &target, &ctx).is_err() {
            continue;
        }
        if state.prune(target.algorithm, now) {
            continue;
        }
        limiter.store().insert(id.into(), state);
        restored += 1;
    }
    Ok(restored)
}
