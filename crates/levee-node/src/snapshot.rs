//! Snapshots of counters in `data_dir`, so a restart keeps day and month quotas.
//!
//! The file is `snapshot.bin`: the magic `LEVEESNP`, a format version (u32, little endian),
//! the CRC-32 of the body (u32, little endian; format 2 and later), then the body: the
//! replicated state of every key, encoded with bincode. It is written to a temporary file,
//! synced, and renamed over the old one, so a crash mid-write leaves the previous snapshot
//! intact. On restore, keys of rules that no longer exist are skipped, and entries are merged
//! like a peer's full state (epochs past retention are dropped).
//!
//! A snapshot that is not one this release can read — bad magic, a checksum that does not
//! match (an edited or damaged file), a body that does not decode, an unknown format — is
//! moved aside as `snapshot.bin.corrupt-<unix seconds>` and the node starts without it
//! ([`Restored::MovedAside`]). Format 1 (the previous release's, without a checksum) is still
//! read, once: the next snapshot is written in format 3.
//!
//! Format 3 adds the runtime per-key overrides (`/v1/overrides`): every register, tombstones
//! included, restored before the keys (a key's own figures are its target's). Formats 1 and 2
//! (without overrides) are still read.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use levee_core::{DecideCtx, KeyCrdt, KeyState, OverrideReg};
use serde::{Deserialize, Serialize};

use crate::limiter::Limiter;

const MAGIC: &[u8; 8] = b"LEVEESNP";
/// The format written: 3 carries the overrides besides the keys, and a CRC-32 of the body.
const VERSION: u32 = 3;
/// The previous release's format: a CRC-32 of the body, no overrides; read, never written.
const VERSION_2: u32 = 2;
/// The release before's format: no checksum; read, never written.
const VERSION_1: u32 = 1;
/// The largest snapshot accepted on restore.
const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

#[derive(Serialize, Deserialize)]
struct Snapshot {
    written_at_ms: u64,
    node: String,
    keys: Vec<(Vec<u8>, KeyCrdt)>,
    /// (rule, key, register) of every runtime override (format 3 on).
    overrides: Vec<(String, String, OverrideReg)>,
}

/// The body of formats 1 and 2.
#[derive(Serialize, Deserialize)]
struct SnapshotV2 {
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
    /// The file is not a snapshot this release can read.
    #[error("{path}: not a readable Levee snapshot: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `data_dir` cannot hold snapshots.
    #[error(
        "{path}: snapshots cannot be written there ({source}); make it a writable \
         directory, or remove node.data_dir to run without persistence"
    )]
    Unwritable {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What [`restore`] found.
#[derive(Debug)]
pub enum Restored {
    /// No snapshot: the node starts empty.
    None,
    /// The snapshot was loaded.
    Loaded {
        /// Keys restored.
        keys: usize,
        /// Its format version (1: the previous release's, rewritten in format 2 next time).
        format: u32,
    },
    /// The snapshot could not be read and was moved aside; the node starts without it.
    MovedAside {
        /// Where the file is now.
        to: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
}

/// The snapshot file inside `data_dir`.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshot.bin")
}

/// Checks that snapshots can be written to `data_dir`, creating it if missing: a file is
/// created there and removed.
pub fn check_writable(data_dir: &Path) -> Result<(), SnapshotError> {
    let unwritable = |source| SnapshotError::Unwritable {
        path: data_dir.to_owned(),
        source,
    };
    fs::create_dir_all(data_dir).map_err(unwritable)?;
    let probe = data_dir.join(format!(".levee-write-check-{}", std::process::id()));
    fs::File::create(&probe)
        .and_then(|mut f| f.write_all(b"levee"))
        .map_err(unwritable)?;
    fs::remove_file(&probe).map_err(unwritable)
}

/// Checks, without changing anything, that `data_dir` could hold snapshots: it is a writable
/// directory, or it does not exist yet and its nearest existing ancestor is one (for
/// `levee config check`).
pub fn check_data_dir(data_dir: &Path) -> Result<(), SnapshotError> {
    let unwritable = |source| SnapshotError::Unwritable {
        path: data_dir.to_owned(),
        source,
    };
    let mut at = data_dir;
    let existing = loop {
        match fs::metadata(at) {
            Ok(m) => break (at, m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match at.parent() {
                Some(p) if !p.as_os_str().is_empty() => at = p,
                _ => break (Path::new("."), fs::metadata(".").map_err(unwritable)?),
            },
            Err(e) => return Err(unwritable(e)),
        }
    };
    let (dir, meta) = existing;
    if !meta.is_dir() {
        return Err(unwritable(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", dir.display()),
        )));
    }
    let probe = dir.join(format!(".levee-write-check-{}", std::process::id()));
    fs::File::create(&probe).map_err(unwritable)?;
    fs::remove_file(&probe).map_err(unwritable)
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
    let overrides = limiter
        .overrides()
        .registers()
        .map(|(r, k, reg)| (r.to_owned(), k.to_owned(), reg.clone()))
        .collect();
    let snap = Snapshot {
        written_at_ms: limiter.clock.now_ms(),
        node: node.to_owned(),
        keys,
        overrides,
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
        f.write_all(&encode_header(VERSION, &body))
            .map_err(io(&tmp))?;
        f.write_all(&body).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    fs::rename(&tmp, &final_path).map_err(io(&final_path))?;
    if let Ok(dir) = fs::File::open(data_dir) {
        let _ = dir.sync_all();
    }
    Ok(count)
}

/// The header of a snapshot of `version` (1: without the checksum) over `body`.
fn encode_header(version: u32, body: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(16);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    if version >= 2 {
        h.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    }
    h
}

/// Decodes a snapshot file's bytes: the snapshot and its format version, or what is wrong.
fn decode(bytes: &[u8]) -> Result<(Snapshot, u32), String> {
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err("it does not start with the snapshot magic".into());
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("four bytes"));
    let body = match version {
        VERSION_1 => &bytes[12..],
        VERSION_2 | VERSION => {
            let Some(sum) = bytes.get(12..16) else {
                return Err("it is cut short".into());
            };
            let sum = u32::from_le_bytes(sum.try_into().expect("four bytes"));
            let body = &bytes[16..];
            if crc32fast::hash(body) != sum {
                return Err("its checksum does not match (the file was edited or damaged)".into());
            }
            body
        }
        v => {
            return Err(format!(
                "format {v} is unknown to this release (it reads formats 1 to 3)"
            ));
        }
    };
    let snap = if version == VERSION {
        decode_body::<Snapshot>(body)?
    } else {
        let old = decode_body::<SnapshotV2>(body)?;
        Snapshot {
            written_at_ms: old.written_at_ms,
            node: old.node,
            keys: old.keys,
            overrides: Vec::new(),
        }
    };
    Ok((snap, version))
}

/// Decodes a whole body with bincode: nothing may follow the content.
fn decode_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let (snap, used): (T, usize) =
        bincode::serde::decode_from_slice(body, bincode::config::standard())
            .map_err(|e| format!("its content does not decode: {e}"))?;
    if used != body.len() {
        return Err(format!("{} bytes follow its content", body.len() - used));
    }
    Ok(snap)
}

/// Restores the snapshot in `data_dir`, if there is one. A snapshot that cannot be read is
/// moved aside (`snapshot.bin.corrupt-<unix seconds>`) and nothing is restored; an error is
/// returned only when the file system fails (the file cannot be read or moved).
pub fn restore(limiter: &Limiter, data_dir: &Path) -> Result<Restored, SnapshotError> {
    let path = path_in(data_dir);
    let bytes = match fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Restored::None),
        Err(source) => return Err(SnapshotError::Io { path, source }),
        Ok(m) if m.len() > MAX_SNAPSHOT_BYTES => {
            return move_aside(&path, format!("{} bytes is larger than allowed", m.len()));
        }
        Ok(_) => fs::read(&path).map_err(|source| SnapshotError::Io {
            path: path.clone(),
            source,
        })?,
    };
    let (snap, format) = match decode(&bytes) {
        Ok(s) => s,
        Err(reason) => return move_aside(&path, reason),
    };
    limiter.merge_overrides(snap.overrides);
    let rules = limiter.rules();
    let overrides = limiter.overrides();
    let now = limiter.clock.now_ms();
    let ctx = DecideCtx {
        now,
        me: rules.me,
        replicas: &rules.replicas,
        view: levee_core::ClusterView::alone(),
    };
    let mut restored = 0;
    for (id, crdt) in snap.keys {
        let Some(target) = crate::states::target_of(&rules, &overrides, &id, now) else {
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
    Ok(Restored::Loaded {
        keys: restored,
        format,
    })
}

/// Renames an unreadable snapshot to `<name>.corrupt-<unix seconds>`.
fn move_aside(path: &Path, reason: String) -> Result<Restored, SnapshotError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".corrupt-{secs}"));
    let to = PathBuf::from(name);
    fs::rename(path, &to).map_err(|source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(Restored::MovedAside { to, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::limiter::Clock;

    fn limiter() -> Limiter {
        let config = Config::parse(
            "[node]\nid = \"n1\"\n\n[[rule]]\nname = \"q\"\nalgorithm = \"quota\"\nlimit = 100\nperiod = \"month\"\n",
            "test.toml",
        )
        .expect("a valid configuration");
        Limiter::new(&config, Clock::default())
    }

    use crate::limiter::test_support::charge;

    fn used(l: &Limiter, key: &str) -> u64 {
        l.usage("q", key, None).expect("usage").usage.used
    }

    #[test]
    fn a_snapshot_round_trips_and_every_changed_byte_is_caught() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let l = limiter();
        charge(&l, "acme", 42);
        assert_eq!(save(&l, "n1", dir.path()).expect("saved"), 1);
        let good = fs::read(path_in(dir.path())).expect("the snapshot");
        assert_eq!(&good[..8], MAGIC);
        assert_eq!(good[8..12], VERSION.to_le_bytes());
        let (snap, v) = decode(&good).expect("it decodes");
        assert_eq!((snap.keys.len(), v), (1, VERSION));
        // Any single changed byte — header, checksum or counters — is refused.
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "byte {i} changed went unnoticed");
        }
        let fresh = limiter();
        match restore(&fresh, dir.path()).expect("restored") {
            Restored::Loaded {
                keys: 1,
                format: VERSION,
            } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(used(&fresh, "acme"), 42);
    }

    #[test]
    fn a_corrupt_snapshot_is_moved_aside_and_nothing_is_restored() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let l = limiter();
        charge(&l, "acme", 42);
        save(&l, "n1", dir.path()).expect("saved");
        let path = path_in(dir.path());
        let mut bytes = fs::read(&path).expect("the snapshot");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        fs::write(&path, &bytes).expect("written");
        let fresh = limiter();
        let Restored::MovedAside { to, reason } =
            restore(&fresh, dir.path()).expect("no I/O error")
        else {
            panic!("the corrupt snapshot was loaded");
        };
        assert!(reason.contains("checksum"), "{reason}");
        assert!(!path.exists());
        assert_eq!(fs::read(&to).expect("moved aside"), bytes);
        assert!(
            to.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("snapshot.bin.corrupt-")),
            "{}",
            to.display()
        );
        assert_eq!(used(&fresh, "acme"), 0);
        assert!(fresh.store().is_empty());
    }

    /// A snapshot file in a previous format (`version` 1 or 2, the key layout of format 2)
    /// holding `acme` charged `used`, and the length of its body.
    fn previous_format_file(version: u32, used: u64) -> (Vec<u8>, usize) {
        let l = limiter();
        charge(&l, "acme", used);
        let mut keys = Vec::new();
        l.store()
            .for_each(|id, s| keys.push((id.to_vec(), s.crdt().clone())));
        let snap = SnapshotV2 {
            written_at_ms: l.clock.now_ms(),
            node: "n1".into(),
            keys,
        };
        let body =
            bincode::serde::encode_to_vec(&snap, bincode::config::standard()).expect("encoded");
        let mut file = encode_header(version, &body);
        file.extend_from_slice(&body);
        (file, body.len())
    }

    /// An old release's format 1 (no checksum) is read once; the next save writes 3.
    #[test]
    fn a_format_1_snapshot_is_loaded_and_rewritten_in_format_3() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (file, body_len) = previous_format_file(VERSION_1, 17);
        assert_eq!(file.len(), 12 + body_len, "format 1: magic, version, body");
        fs::write(path_in(dir.path()), &file).expect("written");
        let fresh = limiter();
        match restore(&fresh, dir.path()).expect("restored") {
            Restored::Loaded { keys: 1, format: 1 } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(used(&fresh, "acme"), 17);
        save(&fresh, "n1", dir.path()).expect("saved");
        let again = fs::read(path_in(dir.path())).expect("the snapshot");
        assert_eq!(again[8..12], VERSION.to_le_bytes());
    }

    #[test]
    fn a_data_dir_under_a_regular_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("a-file");
        fs::write(&file, b"not a directory").expect("written");
        let data_dir = file.join("data");
        let e = check_data_dir(&data_dir).expect_err("refused");
        assert!(e.to_string().contains(&*data_dir.to_string_lossy()), "{e}");
        let e = check_writable(&data_dir).expect_err("refused");
        assert!(e.to_string().contains(&*data_dir.to_string_lossy()), "{e}");
        // A directory that does not exist yet under a writable one is fine, and created only
        // by `check_writable`.
        let new = dir.path().join("new/data");
        check_data_dir(&new).expect("accepted");
        assert!(!new.exists());
        check_writable(&new).expect("accepted");
        assert!(new.is_dir());
        assert_eq!(fs::read_dir(&new).expect("listed").count(), 0);
    }

    /// The previous release's format 2 (a checksum, no overrides) is read.
    #[test]
    fn a_format_2_snapshot_is_loaded() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (file, _) = previous_format_file(VERSION_2, 9);
        fs::write(path_in(dir.path()), &file).expect("written");
        let fresh = limiter();
        match restore(&fresh, dir.path()).expect("restored") {
            Restored::Loaded { keys: 1, format: 2 } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(used(&fresh, "acme"), 9);
    }

    /// Runtime overrides, deletions included, survive a save and a restore; a key's usage is
    /// restored against its own figures.
    #[test]
    fn overrides_survive_a_restart() {
        use levee_core::OverrideValue;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let l = limiter();
        l.put_override("q", "big", OverrideValue::Limit(5_000), None)
            .expect("put");
        l.put_override("q", "gone", OverrideValue::Deny, None)
            .expect("put");
        assert!(l.delete_override("q", "gone").expect("deleted"));
        charge(&l, "big", 2_000);
        save(&l, "n1", dir.path()).expect("saved");
        let fresh = limiter();
        restore(&fresh, dir.path()).expect("restored");
        assert_eq!(
            fresh.get_override("q", "big").expect("kept").value,
            Some(OverrideValue::Limit(5_000))
        );
        assert_eq!(
            fresh.get_override("q", "gone").expect_err("deleted").status,
            404
        );
        let u = fresh.usage("q", "big", None).expect("usage").usage;
        assert_eq!((u.limit, u.used), (5_000, 2_000));
        // The deletion is kept as a tombstone: an older write of the key does not return.
        let old = l
            .overrides()
            .entry("q", "gone")
            .expect("tombstone")
            .reg
            .clone();
        let mut older = old.clone();
        older.written_at -= 1;
        older.value = Some(OverrideValue::Allow);
        assert_eq!(
            fresh.merge_overrides(vec![("q".into(), "gone".into(), older)]),
            0
        );
    }
}
