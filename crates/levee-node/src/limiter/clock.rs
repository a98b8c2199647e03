//! The node's clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The node's clock: wall-clock milliseconds since the Unix epoch, plus an offset that only
/// tests set (to simulate a skewed node).
#[derive(Debug, Default)]
pub struct Clock {
    offset_ms: AtomicI64,
}

impl Clock {
    /// A clock with `offset_ms` added to the system time.
    pub fn with_offset(offset_ms: i64) -> Clock {
        Clock {
            offset_ms: AtomicI64::new(offset_ms),
        }
    }

    /// The offset added to the system time.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Milliseconds since the Unix epoch.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis() as i64;
        (now + self.offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }
}
