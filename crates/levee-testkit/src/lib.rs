//! # levee-testkit
//!
//! What Levee's tests and simulations share, so that each does not carry its own copy:
//!
//! * [`rng`]: [`SeededRng`], the only source of randomness of a test or a simulation. Draws
//!   come from named streams of one seed, so a run replays from its seed (print it on
//!   failure) and adding a stream never shifts another.
//! * [`net`]: [`Net`], an in-process network over messages of any type, with a virtual
//!   clock, per-link latency (fixed or drawn), loss, duplication and reordering, and a fault
//!   vocabulary (`cut`, `cut_both`, `isolate`, `drop`, `mend`, `rejoin`, `recover`) so a test
//!   reads like the fault it exercises. Delivery is in order of arrival time, then of sending.
//! * [`pool`]: [`MessagePool`], messages in flight delivered in whatever order the test
//!   picks (duplicated or lost at its choice): the adversarial scheduler of a property test.
//!
//! Stable hashes of keys come from `levee_core::hash`, as in production; this crate keeps
//! a private FNV-1a only to name its RNG streams (it depends on no Levee crate, so that
//! levee-core's own tests can use it).
//!
//! Everything is deterministic: no clock, no ambient randomness, no threads.
//!
//! ```
//! use levee_testkit::{Latency, Net, SeededRng};
//!
//! let mut net: Net<&str> = Net::new(3, SeededRng::stream(7, "net"));
//! net.set_latency(Latency::fixed(10));
//! net.isolate(2);
//! net.send(0, 1, "reaches 1");
//! net.send(0, 2, "lost in the partition");
//! net.advance(10);
//! assert_eq!(net.pop_due().map(|m| m.msg), Some("reaches 1"));
//! assert!(net.pop_due().is_none());
//! assert_eq!(net.stats().cut, 1);
//! ```

mod hash;
pub mod net;
pub mod pool;
pub mod rng;

pub use net::{Envelope, InFlightOnCut, Latency, Net, NetStats};
pub use pool::{MessagePool, Pending};
pub use rng::SeededRng;
