//! The tasks that drive a node's replication machine: its timer ([`run_timer`]) and the
//! messages from its peers ([`run_inbound`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use levee_core::{Millis, NodeIdx};
use levee_transport::Inbound;
use tokio::sync::{mpsc, watch};

use super::{ClusterHost, Replication, drain};
use crate::states::NodeStates;

/// Drives the machine's timers: wakes when [`Cluster::poll_timeout`] says, until `stop`.
pub(super) async fn run_timer<H: ClusterHost>(
    host: Arc<H>,
    repl: Arc<Replication>,
    mut stop: watch::Receiver<bool>,
) {
    let suspect_after = repl.suspect_after;
    let mut redialled: Vec<Millis> = Vec::new();
    let mut next_status: Millis = 0;
    loop {
        let at = repl.cluster.lock().poll_timeout();
        repl.timer_at.store(at, Ordering::Release);
        let wait = at.saturating_sub(host.limiter().clock.now_ms());
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(wait)) => {}
            () = repl.wake_timer.notified() => continue,
            _ = stop.changed() => return,
        }
        let now = host.limiter().clock.now_ms();
        let (out, events, peers) = {
            let mut c = repl.cluster.lock();
            let mut digest = repl.digest.lock();
            let mut states = NodeStates::new(host.limiter(), &mut digest);
            c.handle_timeout(now, &mut states);
            let (out, events) = drain(&mut c);
            let peers = (now >= next_status).then(|| {
                let lists = c.lists();
                metrics::gauge!("levee_membership_agreed").set(f64::from(u8::from(lists.agreed())));
                metrics::gauge!("levee_membership_version").set(lists.current().len() as f64);
                (
                    c.peers_status(now),
                    c.refused(),
                    c.rights_given(),
                    (c.given_back_late(), c.withheld_late()),
                )
            });
            (out, events, peers)
        };
        repl.send_all(out);
        repl.dispatch(&host, events);
        let Some((peers, refused, given, (given_back_late, withheld_late))) = peers else {
            continue;
        };
        next_status = now + 100;
        // What peers sent that was refused after decoding (states, ids, forwards, digests):
        // the machine counts, this exports its running total.
        metrics::counter!("levee_replication_refused_total").absolute(refused);
        metrics::counter!("levee_rights_moved_total").absolute(given);
        metrics::counter!("levee_forward_late_given_back_total").absolute(given_back_late);
        metrics::counter!("levee_forward_late_withheld_total").absolute(withheld_late);
        crate::activity::set_rights_moved(given);
        for p in peers {
            let peer = repl.id_of(p.node).to_owned();
            // We hear the peer but it has not acknowledged us for twice suspect_after (it has
            // long marked us unreachable): our connection to it may be dead at its end while
            // ours still hears its keep-alives. Redial, at most twice per suspect_after.
            let deaf = p.reachable && p.ack_lag_ms.is_some_and(|lag| lag > 2 * suspect_after);
            let i = usize::from(p.node.0);
            if redialled.len() <= i {
                redialled.resize(i + 1, 0);
            }
            if deaf && now.saturating_sub(redialled[i]) > suspect_after / 2 {
                redialled[i] = now;
                repl.transport.reconnect(&peer);
            }
            if let Some(lag) = p.ack_lag_ms {
                metrics::gauge!("levee_gossip_ack_lag_ms", "peer" => peer.clone()).set(lag as f64);
            }
            if let Some(offset) = p.clock_offset_ms {
                metrics::gauge!("levee_peer_clock_offset_ms", "peer" => peer.clone())
                    .set(offset as f64);
            }
            metrics::counter!("levee_gossip_batches_missed_total", "peer" => peer.clone())
                .absolute(p.batches_missed);
            metrics::counter!("levee_gossip_repaired_keys_total", "peer" => peer.clone())
                .absolute(p.repaired_keys);
            metrics::gauge!("levee_gossip_backlog_keys", "peer" => peer).set(p.backlog_keys as f64);
        }
    }
}

/// Handles every message from peers until the transport closes.
pub(super) async fn run_inbound<H: ClusterHost>(
    host: Arc<H>,
    repl: Arc<Replication>,
    mut rx: mpsc::Receiver<Inbound>,
) {
    while let Some(inb) = rx.recv().await {
        let Some(from) = repl
            .ids
            .read()
            .iter()
            .position(|id| *id == inb.peer)
            .map(|i| NodeIdx(i as u16))
        else {
            continue;
        };
        let now = host.limiter().clock.now_ms();
        let merges = matches!(
            inb.msg,
            levee_proto::Message::Deltas(_) | levee_proto::Message::PullChunk { .. }
        );
        let (out, events) = {
            let mut c = repl.cluster.lock();
            let mut digest = repl.digest.lock();
            let mut states = NodeStates::new(host.limiter(), &mut digest);
            c.handle_message(from, inb.msg, now, &mut states);
            drain(&mut c)
        };
        repl.send_all(out);
        repl.dispatch(&host, events);
        if merges && repl.merged.receiver_count() > 0 {
            repl.merged.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}
