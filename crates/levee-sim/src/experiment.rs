//! Experiments: deliberate departures from production behaviour, used only to test a
//! diagnosis (see `docs/accuracy.md`), never by the checks or the default runs.

/// Where optimistic decisions get `ClusterView::sync_gen` from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncGen {
    /// Production: `Cluster::view()`, which advances at every gossip tick.
    #[default]
    Production,
    /// An experiment, not production behaviour: the generation advances only once a delta
    /// sent after the previous advance has arrived from every region the node believes
    /// reachable — what the documentation of `ClusterView::sync_gen` describes ("advances at
    /// every completed gossip exchange"). Used to test a diagnosis, never by the checks.
    PerExchange,
    /// An experiment, not production behaviour: as `PerExchange`, but a region counts only
    /// once one of its deltas shows it had heard this node's deltas sent after the previous
    /// advance — a full round trip, so that every region's takes under the previous allowance
    /// are known when a new one starts.
    PerRoundTrip,
}
