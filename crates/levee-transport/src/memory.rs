//! An in-process network for tests and simulations: [`MemoryNetwork`] hands out a
//! [`MemoryTransport`] per node id, and cuts and heals links between them.
//!
//! Every message goes through the same codec as on the wire — `levee_proto::encode_frame`,
//! then `levee_proto::decode_frame` on the way in — so a message that could not cross a QUIC
//! link cannot cross a memory one either, and what arrives is what the decoder made of the
//! bytes, not the sender's value.
//!
//! Faults, in the words of the test that uses them:
//! - [`cut_one_way(a, b)`](MemoryNetwork::cut_one_way): messages from `a` to `b` are
//!   dropped; `b` still reaches `a`.
//! - [`cut(a, b)`](MemoryNetwork::cut): both directions.
//! - [`isolate(n)`](MemoryNetwork::isolate): every link to and from `n`, including those to
//!   nodes that join later.
//! - [`heal(a, b)`](MemoryNetwork::heal), [`heal_all()`](MemoryNetwork::heal_all).
//! - A restart: [`join`](MemoryNetwork::join) an id again (the old transport goes dead), or
//!   [`shutdown`](PeerTransport::shutdown) and join later.
//!
//! What it models of the QUIC transport, and what not:
//! - Sessions: the first message from `a` to `b` after a join of either, a
//!   [`reconnect`](PeerTransport::reconnect) or a cut of that link opens a session, as a dial
//!   opens a connection: `b` receives `a`'s `Hello`, `a` receives `b`'s (unless that
//!   direction is cut), then the message.
//! - Links are directed and have no handshake: a one-way cut drops exactly one direction for
//!   as long as it lasts. (Over QUIC a connection needs both directions, so a one-way cut
//!   soon stops both; and a cut shorter than the idle timeout delays frames rather than
//!   dropping them.)
//! - No latency, no reordering, no duplication: a message is in the receiver's channel when
//!   [`send`](PeerTransport::send) returns, or dropped and counted in
//!   [`dropped`](MemoryNetwork::dropped). A full receiver channel drops too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use levee_proto::{Hello, Message, decode_frame, encode_frame};
use tokio::sync::mpsc;
use tracing::{debug, error};

use crate::peer_transport::{Inbound, PeerTransport, ShutdownFuture};

/// Messages waiting in a node's receiver before further ones are dropped, by default: about
/// what a QUIC node holds from a few peers (a 1024-frame queue per link, plus 256 received).
pub const DEFAULT_INBOX_CAPACITY: usize = 4096;

/// An in-process network of [`MemoryTransport`]s. Cheap to clone; every clone is the same
/// network.
#[derive(Clone)]
pub struct MemoryNetwork {
    state: Arc<Mutex<Network>>,
}

/// One node's endpoint on a [`MemoryNetwork`]. Cheap to clone; dropping the last clone
/// shuts it down.
#[derive(Clone)]
pub struct MemoryTransport {
    handle: Arc<Handle>,
}

struct Handle {
    id: String,
    /// Which join of `id` this transport belongs to.
    membership: u64,
    state: Arc<Mutex<Network>>,
}

struct Network {
    inbox_capacity: usize,
    members: HashMap<String, Member>,
    /// Directed links `(from, to)` that drop everything.
    cut: HashSet<(String, String)>,
    /// Nodes cut off from every other.
    isolated: HashSet<String>,
    /// Directed links `(from, to)` whose session is open (its `Hello`s delivered).
    sessions: HashSet<(String, String)>,
    /// Messages dropped per directed link `(from, to)`.
    dropped: HashMap<(String, String), u64>,
    /// The last membership number handed out.
    joins: u64,
}

struct Member {
    hello: Hello,
    membership: u64,
    inbox: mpsc::Sender<Inbound>,
}

impl Default for MemoryNetwork {
    fn default() -> MemoryNetwork {
        MemoryNetwork::with_inbox_capacity(DEFAULT_INBOX_CAPACITY)
    }
}

impl MemoryNetwork {
    /// An empty network, every link up.
    pub fn new() -> MemoryNetwork {
        MemoryNetwork::default()
    }

    /// An empty network whose nodes hold at most `capacity` messages not yet received
    /// (at least 1).
    pub fn with_inbox_capacity(capacity: usize) -> MemoryNetwork {
        MemoryNetwork {
            state: Arc::new(Mutex::new(Network {
                inbox_capacity: capacity.max(1),
                members: HashMap::new(),
                cut: HashSet::new(),
                isolated: HashSet::new(),
                sessions: HashSet::new(),
                dropped: HashMap::new(),
                joins: 0,
            })),
        }
    }

    /// Adds node `hello.node`, which says `hello` first in every session, and returns its
    /// transport and the channel of the messages it receives. If the id is already on the
    /// network, this is that node's restart: the previous transport sends and receives
    /// nothing more, and every session with the node starts anew. Cuts and isolation
    /// naming the id stay.
    pub fn join(&self, hello: Hello) -> (MemoryTransport, mpsc::Receiver<Inbound>) {
        let mut net = self.lock();
        let (inbox, rx) = mpsc::channel(net.inbox_capacity);
        net.joins += 1;
        let membership = net.joins;
        let id = hello.node.clone();
        net.end_sessions(|from, to| from == id || to == id);
        net.members.insert(
            id.clone(),
            Member {
                hello,
                membership,
                inbox,
            },
        );
        let handle = Handle {
            id,
            membership,
            state: self.state.clone(),
        };
        (
            MemoryTransport {
                handle: Arc::new(handle),
            },
            rx,
        )
    }

    /// Drops every message from `from` to `to` until healed; `to` still reaches `from`.
    pub fn cut_one_way(&self, from: &str, to: &str) {
        let mut net = self.lock();
        net.cut.insert((from.to_owned(), to.to_owned()));
        net.end_sessions(|f, t| f == from && t == to);
    }

    /// Drops every message between `a` and `b`, both ways, until healed.
    pub fn cut(&self, a: &str, b: &str) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Drops every message to and from `node` until [`heal_all`](MemoryNetwork::heal_all),
    /// whoever joins meanwhile.
    pub fn isolate(&self, node: &str) {
        let mut net = self.lock();
        net.isolated.insert(node.to_owned());
        net.end_sessions(|f, t| f == node || t == node);
    }

    /// Restores both directions between `a` and `b` (an isolation of either stays).
    pub fn heal(&self, a: &str, b: &str) {
        let mut net = self.lock();
        net.cut.remove(&(a.to_owned(), b.to_owned()));
        net.cut.remove(&(b.to_owned(), a.to_owned()));
    }

    /// Restores every link and ends every isolation.
    pub fn heal_all(&self) {
        let mut net = self.lock();
        net.cut.clear();
        net.isolated.clear();
    }

    /// Messages from `from` to `to` dropped so far, for any reason (cut, receiver down or
    /// full, sender shut down, codec failure), `Hello`s included.
    pub fn dropped(&self, from: &str, to: &str) -> u64 {
        let net = self.lock();
        net.dropped
            .get(&(from.to_owned(), to.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    fn lock(&self) -> MutexGuard<'_, Network> {
        lock(&self.state)
    }
}

/// The network's state, even if a panic elsewhere poisoned its lock (it holds no invariant
/// a half-finished call could break).
fn lock(state: &Mutex<Network>) -> MutexGuard<'_, Network> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Network {
    fn end_sessions(&mut self, matches: impl Fn(&str, &str) -> bool) {
        self.sessions.retain(|(from, to)| !matches(from, to));
    }

    fn is_cut(&self, from: &str, to: &str) -> bool {
        self.isolated.contains(from)
            || self.isolated.contains(to)
            || self.cut.contains(&(from.to_owned(), to.to_owned()))
    }

    fn count_drop(&mut self, from: &str, to: &str) {
        *self
            .dropped
            .entry((from.to_owned(), to.to_owned()))
            .or_default() += 1;
    }

    /// Whether `id` is on the network as the join `membership`.
    fn is_member(&self, id: &str, membership: u64) -> bool {
        self.members
            .get(id)
            .is_some_and(|m| m.membership == membership)
    }

    /// Sends `msg` from `from` (a current member) to `to`, opening the session first if
    /// needed.
    fn send(&mut self, from: &str, to: &str, msg: &Message) {
        if self.is_cut(from, to) || !self.members.contains_key(to) {
            self.count_drop(from, to);
            debug!(
                from,
                to, "memory network dropped a message: link cut or peer down"
            );
            return;
        }
        let session = (from.to_owned(), to.to_owned());
        if !self.sessions.contains(&session) {
            let theirs = Message::Hello(self.members[to].hello.clone());
            let ours = Message::Hello(self.members[from].hello.clone());
            self.deliver(from, to, &ours);
            if !self.is_cut(to, from) {
                self.deliver(to, from, &theirs);
            } else {
                self.count_drop(to, from);
            }
            self.sessions.insert(session);
        }
        self.deliver(from, to, msg);
    }

    /// Puts `msg`, as the codec decodes it, into `to`'s channel (a member's), or drops it.
    fn deliver(&mut self, from: &str, to: &str, msg: &Message) {
        let decoded = match encode_frame(msg) {
            Ok(frame) => decode_frame(&frame),
            Err(e) => {
                debug!(from, to, error = %e, "memory network dropped a message it cannot encode");
                self.count_drop(from, to);
                return;
            }
        };
        let msg = match decoded {
            Ok(msg) => msg,
            Err(e) => {
                error!(from, to, error = %e, "a frame the codec made does not decode");
                self.count_drop(from, to);
                return;
            }
        };
        let inbound = Inbound {
            peer: from.to_owned(),
            msg,
            reply: None,
        };
        if self.members[to].inbox.try_send(inbound).is_err() {
            debug!(
                from,
                to, "memory network dropped a message: receiver full or gone"
            );
            self.count_drop(from, to);
        }
    }
}

impl MemoryTransport {
    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.handle.id
    }
}

impl PeerTransport for MemoryTransport {
    fn send(&self, peer: &str, msg: &Message) {
        let h = &self.handle;
        let mut net = lock(&h.state);
        if net.is_member(&h.id, h.membership) {
            net.send(&h.id, peer, msg);
        } else {
            net.count_drop(&h.id, peer);
        }
    }

    fn reconnect(&self, peer: &str) {
        let h = &self.handle;
        let mut net = lock(&h.state);
        if net.is_member(&h.id, h.membership) {
            net.end_sessions(|from, to| from == h.id && to == peer);
        }
    }

    fn shutdown(&self) -> ShutdownFuture<'_> {
        self.handle.leave();
        Box::pin(std::future::ready(()))
    }
}

impl Handle {
    /// Takes this node off the network, unless it has been restarted since.
    fn leave(&self) {
        let mut net = lock(&self.state);
        if net.is_member(&self.id, self.membership) {
            net.members.remove(&self.id);
            net.end_sessions(|from, to| from == self.id || to == self.id);
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.leave();
    }
}

impl std::fmt::Debug for MemoryNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let net = self.lock();
        let mut members: Vec<_> = net.members.keys().collect();
        members.sort();
        f.debug_struct("MemoryNetwork")
            .field("members", &members)
            .field("cut", &net.cut)
            .field("isolated", &net.isolated)
            .finish()
    }
}

impl std::fmt::Debug for MemoryTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTransport")
            .field("node", &self.handle.id)
            .field("membership", &self.handle.membership)
            .finish()
    }
}
