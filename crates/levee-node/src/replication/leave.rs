//! `POST /admin/leave`: a node hands every right it holds over before it is removed from the
//! list (docs/membership.md, "Leaving").
//!
//! The order matters. The node first stops owning keys and tells its peers
//! ([`Cluster::leave`]); only once every live peer has said it knows (so none routes a key to
//! it or gives it rights as a key's owner any more) can it hold nothing for good. Meanwhile its
//! rebalancing, every gossip interval, gives what it holds of every key it knows to the key's
//! owner (a region-mate, or a node of another region if it was the last of its own), as any
//! region-mate of an owner does. It is done when its peers know and it holds nothing of any key
//! beyond what it used; its last gifts are then sent at once and their acknowledgements awaited,
//! as when it stops.

use std::time::Duration;

use levee_cluster::Cluster;

use super::{ClusterHost, Replication, drain};
use crate::states::target_of;

/// How often a leaving node looks at what it still holds.
const LEAVE_POLL: Duration = Duration::from_millis(20);

/// How a leave went, for the answer of `POST /admin/leave`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveProgress {
    /// Every live peer knows this node is leaving, and it holds nothing beyond what it used.
    pub done: bool,
    /// Rights (tokens) given to other nodes since the node started leaving.
    pub handed_over: u64,
    /// Keys this node still holds rights of.
    pub keys_holding: usize,
    /// Rights it still holds beyond what it used.
    pub holding: u64,
    /// The peers it hears that have not yet said they know it is leaving.
    pub not_acknowledged: Vec<String>,
    /// The peers it does not hear (not heard within `suspect_after`): not waited for.
    pub unreachable: Vec<String>,
}

impl Replication {
    /// Whether this node is leaving (`POST /admin/leave` since it started): `/readyz` then
    /// answers 503, so that load balancers stop sending it checks.
    pub fn is_leaving(&self) -> bool {
        self.cluster.lock().lists().is_leaving(self.me)
    }

    /// Starts leaving (nothing more if it already is) and waits up to `within` until it is
    /// done: every live peer knows and the node holds nothing. Calling it again goes on.
    pub async fn leave<H: ClusterHost>(
        self: &std::sync::Arc<Self>,
        host: &H,
        within: Duration,
    ) -> LeaveProgress {
        let limiter = host.limiter();
        let now = limiter.clock.now_ms();
        let out = {
            let mut c = self.cluster.lock();
            if !c.lists().is_leaving(self.me) {
                self.leave_given_from
                    .store(c.rights_given(), std::sync::atomic::Ordering::SeqCst);
                tracing::info!(
                    "leaving: this node owns no key from now on and hands its rights over"
                );
            }
            c.leave(now);
            let (out, _) = drain(&mut c);
            out
        };
        self.send_all(out);
        // The last of its region gives its keys to other regions' owners, and forwards their
        // checks there.
        self.start_forwarders_to_all(&limiter.rules().replicas);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let progress = self.leave_progress(host);
            if progress.done || tokio::time::Instant::now() >= deadline {
                if progress.done {
                    // Its last gifts, acknowledged first.
                    self.flush_and_await(host).await;
                    tracing::info!(
                        handed_over = progress.handed_over,
                        "left: this node holds nothing; it can be stopped and removed from the list"
                    );
                }
                return progress;
            }
            tokio::time::sleep(LEAVE_POLL).await;
        }
    }

    /// Where the leave stands now.
    fn leave_progress<H: ClusterHost>(&self, host: &H) -> LeaveProgress {
        let limiter = host.limiter();
        let now = limiter.clock.now_ms();
        let (acknowledged, (not_acknowledged, unreachable), given) = {
            let c = self.cluster.lock();
            (
                c.leave_acknowledged(),
                self.not_acknowledging(&c),
                c.rights_given(),
            )
        };
        let (rules, overrides) = (limiter.rules(), limiter.overrides());
        let (mut keys_holding, mut holding) = (0usize, 0u64);
        limiter.store().for_each_slot(|id, slot| {
            let Some(target) = target_of(&rules, &overrides, id, now) else {
                return;
            };
            let unspent = slot.state.unspent(&target, &rules.replicas, rules.me, now);
            if unspent > 0 {
                keys_holding += 1;
                holding = holding.saturating_add(unspent);
            }
        });
        LeaveProgress {
            done: acknowledged && holding == 0,
            handed_over: given.saturating_sub(
                self.leave_given_from
                    .load(std::sync::atomic::Ordering::SeqCst),
            ),
            keys_holding,
            holding,
            not_acknowledged,
            unreachable,
        }
    }

    /// The ids of the peers it hears that have not said they know this node is leaving, and
    /// of the peers it does not hear (not waited for, see `Lists::leave_acknowledged`).
    fn not_acknowledging(&self, c: &Cluster) -> (Vec<String>, Vec<String>) {
        let lists = c.lists();
        let (heard, unheard): (Vec<_>, Vec<_>) = lists
            .current()
            .nodes()
            .filter(|&n| n != self.me)
            .partition(|&n| c.hears(n));
        let not_acknowledged = heard
            .into_iter()
            .filter(|&n| {
                !lists
                    .report(n)
                    .is_some_and(|r| r.leaving.contains(&self.me.0))
            })
            .map(|n| self.id_of(n))
            .collect();
        (
            not_acknowledged,
            unheard.into_iter().map(|n| self.id_of(n)).collect(),
        )
    }
}
