//! What a transport delivers to a node: [`Inbound`].

use levee_proto::Message;
use tokio::sync::oneshot;

/// A message from a peer.
#[derive(Debug)]
pub struct Inbound {
    /// The sender's node id, as proven by its certificate (or by the name this node dialled).
    pub peer: String,
    /// The message.
    pub msg: Message,
    /// For a request: send the answer here (it goes back as one frame). Dropping it resets
    /// the request stream, so the requester fails at once.
    pub reply: Option<oneshot::Sender<Message>>,
}

