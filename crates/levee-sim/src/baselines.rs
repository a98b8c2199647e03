//! The three anchors of the accuracy figure, run over the same plans as Levee.
//!
//! They model regions, not nodes (a region answers while any of its nodes is up), use the
//! same network (latency, jitter, loss, cuts; no duplication: they would run over TCP) and
//! count windows by simulated time.
//!
//! * **Static split**: each region enforces its part of the limit (the same integer split
//!   Levee's escrow starts from) and never talks to the others.
//! * **Central counter**: one exact counter per key in the key's home region. A request from
//!   another region travels there and back; it fails if either leg is lost or cut (the
//!   counter may have counted it: the answer was lost). Counted in the home's window at
//!   arrival.
//! * **Shared counter without shares** (Gubernator's `GLOBAL` behaviour): a region answers
//!   from its cached view of the key (the owner's last broadcast, plus its own hits since)
//!   and queues every hit; every sync interval (the same 20 ms as Levee's gossip) queued hits
//!   go to the key's owner region, which adds them to its counter (saturating at the limit)
//!   and broadcasts the new count to every region, whose cache it replaces. Hits or
//!   broadcasts lost on the way are not resent. A new window starts every cache afresh.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use levee_testkit::rng::SeededRng;

use levee_core::{ClusterView, DecideCtx, KeyState, NodeIdx, ReplicaSet, Rule, RuleMode};

use crate::heal::HealFigure;
use crate::ledger::Ledger;
use crate::levee::refund_measured;
use crate::net::SimNet;
use crate::plan::{Algo, FaultKind, NetParams, Request, RunPlan, T0};

/// Region liveness and links, replayed from the plan's faults.
struct World<'p, P> {
    plan: &'p RunPlan,
    up: Vec<bool>,
    region_of: Vec<usize>,
    net: SimNet<P>,
    next_fault: usize,
}

impl<'p, P: Clone> World<'p, P> {
    fn new(plan: &'p RunPlan, stream: &str) -> Self {
        let regions = plan.topology.regions();
        // The baselines talk over a reliable transport (TCP, gRPC): a duplicated packet
        // never reaches them twice.
        let params = NetParams {
            duplicate: 0.0,
            ..plan.net.clone()
        };
        World {
            plan,
            // Nodes added to the list later are down until they start.
            up: (0..plan.positions())
                .map(|n| n < plan.lists[0].len())
                .collect(),
            region_of: plan.node_regions(),
            net: SimNet::new(
                &plan.topology,
                params,
                (0..regions).collect(),
                SeededRng::stream(plan.seed, stream),
            ),
            next_fault: 0,
        }
    }

    fn advance(&mut self, now: u64) {
        while self.next_fault < self.plan.faults.len()
            && self.plan.faults[self.next_fault].at <= now
        {
            match self.plan.faults[self.next_fault].kind {
                FaultKind::Cut { from, to } => self.net.set_cut(from, to, true),
                FaultKind::Mend { from, to } => self.net.set_cut(from, to, false),
                FaultKind::Crash { node } => self.up[node] = false,
                FaultKind::Restart { node, .. }
                | FaultKind::Start { node, .. }
                | FaultKind::Thaw { node } => self.up[node] = true,
                FaultKind::Freeze { node } => self.up[node] = false,
                // A region's part of the limit does not depend on its nodes.
                FaultKind::Reload { .. } => {}
                // Nothing is held per node.
                FaultKind::Leave { node } => self.up[node] = false,
            }
            self.next_fault += 1;
        }
    }

    fn region_up(&self, r: usize) -> bool {
        self.region_of
            .iter()
            .zip(&self.up)
            .any(|(&reg, &up)| reg == r && up)
    }
}

fn window(plan: &RunPlan, now: u64) -> u64 {
    plan.window_of(T0 + now)
}

/// The plan's rule decided exactly, by the core on a single node, at each of a few places
/// that never exchange state: the central counter's one, or every region's own part of the
/// limit for the static split. Clocks read simulated time.
struct Exact {
    /// By place: the rule bound to a single node.
    rules: Vec<Rule>,
    single: ReplicaSet,
    keys: HashMap<(u32, usize), KeyState>,
}

/// A decision's context at a single node whose clock reads simulated time.
fn ctx(single: &ReplicaSet, now: u64) -> DecideCtx<'_> {
    DecideCtx {
        now: T0 + now,
        me: NodeIdx(0),
        replicas: single,
        view: ClusterView::alone(),
    }
}

/// A refund due at a place: (place, key, region asked, cost, the ledger's endpoint for the
/// place).
type Due = BTreeMap<u64, Vec<(usize, u32, usize, u64, usize)>>;

impl Exact {
    fn new(limits: impl IntoIterator<Item = Rule>) -> Exact {
        let single = ReplicaSet::single("anchor", "r0");
        let rules = limits
            .into_iter()
            .map(|mut r| {
                r.bind(&single);
                r
            })
            .collect();
        Exact {
            rules,
            single,
            keys: HashMap::new(),
        }
    }

    /// Decides a check of `cost` for `key` at `place`.
    fn decide(&mut self, place: usize, key: u32, cost: u64, now: u64) -> bool {
        // A cost above a region's whole part is never granted.
        let Ok(target) = self.rules[place].target(None, cost) else {
            return false;
        };
        let ctx = ctx(&self.single, now);
        let state = self.keys.entry((key, place)).or_default();
        state
            .decide(&target, RuleMode::Enforce, cost, false, &ctx)
            .allowed
    }

    /// Gives back the refunds due at `now` and records what was really given back.
    fn refund_due(&mut self, plan: &RunPlan, due: &mut Due, now: u64, ledger: &mut Ledger) {
        let Some(list) = due.remove(&now) else {
            return;
        };
        for (place, key, region, cost, endpoint) in list {
            let Ok(target) = self.rules[place].target(None, cost) else {
                continue;
            };
            let ctx = ctx(&self.single, now);
            let Some(state) = self.keys.get_mut(&(key, place)) else {
                continue;
            };
            for (epoch, tokens) in refund_measured(state, &target, cost, &ctx) {
                let (w, sim) = if plan.algo == Algo::SlidingLog {
                    (plan.window_of(epoch), epoch - T0)
                } else {
                    (epoch, now)
                };
                ledger.refund(key, (w, sim), region, endpoint, tokens);
            }
        }
    }
}

/// Schedules the refund of an admitted request, if its caller gives it back.
fn schedule(due: &mut Due, r: &Request, now: u64, (place, endpoint): (usize, usize)) {
    if r.refund_ms > 0 {
        due.entry(now + u64::from(r.refund_ms)).or_default().push((
            place,
            r.key,
            r.region as usize,
            u64::from(r.cost),
            endpoint,
        ));
    }
}

/// Each region enforces its static part of the limit alone.
pub fn run_static_split(plan: &RunPlan) -> Ledger {
    let regions = plan.topology.regions();
    let limits = plan.region_limits();
    let mut world: World<'_, ()> = World::new(plan, "static");
    let mut ledger = Ledger::new(regions, !plan.algo.per_window());
    let mut exact = Exact::new(limits.iter().map(|&l| plan.rule_with(l)));
    let mut due = Due::new();
    let mut next = 0;
    for now in 0..plan.duration_ms {
        exact.refund_due(plan, &mut due, now, &mut ledger);
        while next < plan.requests.len() && plan.requests[next].at <= now {
            let r = plan.requests[next];
            next += 1;
            world.advance(r.at);
            let region = r.region as usize;
            let w = window(plan, r.at);
            let cost = u64::from(r.cost);
            ledger.demand(r.key, w, region, cost);
            if world.region_up(region) && exact.decide(region, r.key, cost, now) {
                ledger.admit(r.key, (w, now), region, region, cost);
                schedule(&mut due, &r, now, (region, region));
            }
        }
    }
    ledger
}

#[derive(Debug, Clone, Copy)]
enum CentralMsg {
    Ask {
        request: Request,
    },
    Answer {
        request: Request,
        /// The home's window and simulated time when it decided.
        decided: (u64, u64),
        allowed: bool,
    },
}

/// One exact counter per key at its home region.
pub fn run_central(plan: &RunPlan) -> Ledger {
    let regions = plan.topology.regions();
    let mut world: World<'_, CentralMsg> = World::new(plan, "central");
    let mut ledger = Ledger::new(regions, !plan.algo.per_window());
    let mut exact = Exact::new([plan.rule()]);
    let mut due = Due::new();
    let mut next = 0;
    for now in 0..plan.duration_ms {
        world.advance(now);
        exact.refund_due(plan, &mut due, now, &mut ledger);
        while let Some(m) = world.net.pop_due(now) {
            match m.payload {
                CentralMsg::Ask { request } => {
                    let home = m.to;
                    if !world.region_up(home) {
                        continue;
                    }
                    let w = window(plan, now);
                    let allowed = exact.decide(0, request.key, u64::from(request.cost), now);
                    world.net.send(
                        now,
                        home,
                        request.region as usize,
                        0,
                        CentralMsg::Answer {
                            request,
                            decided: (w, now),
                            allowed,
                        },
                    );
                }
                CentralMsg::Answer {
                    request,
                    decided,
                    allowed,
                } => {
                    if allowed && world.region_up(m.to) {
                        // Counted when the home admitted it; refunded (at the home) from
                        // when the caller knows.
                        // The counter's tallies are the home's.
                        let home = m.from;
                        ledger.admit(request.key, decided, m.to, home, u64::from(request.cost));
                        schedule(&mut due, &request, now, (0, home));
                    }
                }
            }
        }
        while next < plan.requests.len() && plan.requests[next].at <= now {
            let r = plan.requests[next];
            next += 1;
            let region = r.region as usize;
            let w = window(plan, now);
            let cost = u64::from(r.cost);
            ledger.demand(r.key, w, region, cost);
            if !world.region_up(region) {
                continue;
            }
            let home = plan.home_region(r.key);
            if home == region {
                if exact.decide(0, r.key, cost, now) {
                    ledger.admit(r.key, (w, now), region, region, cost);
                    schedule(&mut due, &r, now, (0, home));
                }
            } else {
                world
                    .net
                    .send(now, region, home, 0, CentralMsg::Ask { request: r });
            }
        }
    }
    ledger
}

#[derive(Debug, Clone, Copy)]
enum SharedMsg {
    Hits { key: u32, window: u64, hits: u64 },
    Status { key: u32, window: u64, used: u64 },
}

/// Gubernator's `GLOBAL` behaviour: answer from a local cache, send hits asynchronously.
pub fn run_shared_counter(plan: &RunPlan) -> (Ledger, Vec<HealFigure>) {
    let regions = plan.topology.regions();
    let mut world: World<'_, SharedMsg> = World::new(plan, "shared");
    let mut ledger = Ledger::new(regions, false);
    // The owner's counters, and the keys changed since its last broadcast.
    let mut count: HashMap<(u32, u64), u64> = HashMap::new();
    let mut dirty: BTreeSet<u32> = BTreeSet::new();
    // Each region's cached view of a key: (window, used).
    let mut cache: HashMap<(usize, u32), (u64, u64)> = HashMap::new();
    // Hits queued at each region: (region, key, window) -> hits.
    let mut pending: BTreeMap<(usize, u32, u64), u64> = BTreeMap::new();
    let sync = plan.protocol.gossip_interval;
    let mut watches: Vec<HealFigure> = Vec::new();
    let mut next = 0;
    for now in 0..plan.duration_ms {
        world.advance(now);
        if plan.probe.is_some() {
            for ep in plan.episodes.iter().filter(|e| e.heal == now) {
                watches.push(HealFigure::new(plan, ep));
            }
        }
        let w_now = window(plan, now);
        while let Some(m) = world.net.pop_due(now) {
            if !world.region_up(m.to) {
                continue;
            }
            match m.payload {
                SharedMsg::Hits { key, window, hits } => {
                    let c = count.entry((key, window)).or_default();
                    *c = (*c + hits).min(plan.limit);
                    dirty.insert(key);
                }
                SharedMsg::Status { key, window, used } => {
                    let c = cache.entry((m.to, key)).or_insert((window, 0));
                    if window >= c.0 {
                        *c = (window, used);
                    }
                }
            }
        }
        if now % sync == 0 {
            for ((region, key, window), hits) in std::mem::take(&mut pending) {
                let home = plan.home_region(key);
                world
                    .net
                    .send(now, region, home, 0, SharedMsg::Hits { key, window, hits });
            }
            for key in std::mem::take(&mut dirty) {
                let home = plan.home_region(key);
                let used = count.get(&(key, w_now)).copied().unwrap_or(0);
                for r in (0..regions).filter(|&r| r != home) {
                    world.net.send(
                        now,
                        home,
                        r,
                        0,
                        SharedMsg::Status {
                            key,
                            window: w_now,
                            used,
                        },
                    );
                }
            }
        }
        while next < plan.requests.len() && plan.requests[next].at <= now {
            let r = plan.requests[next];
            next += 1;
            let region = r.region as usize;
            ledger.demand(r.key, w_now, region, 1);
            if !world.region_up(region) {
                continue;
            }
            let home = plan.home_region(r.key);
            if home == region {
                let c = count.entry((r.key, w_now)).or_default();
                if *c < plan.limit {
                    *c += 1;
                    dirty.insert(r.key);
                    ledger.admit(r.key, (w_now, now), region, region, 1);
                }
            } else {
                let c = cache.entry((region, r.key)).or_insert((w_now, 0));
                if c.0 != w_now {
                    *c = (w_now, 0);
                }
                if c.1 < plan.limit {
                    c.1 += 1;
                    ledger.admit(r.key, (w_now, now), region, region, 1);
                }
                *pending.entry((region, r.key, w_now)).or_default() += 1;
            }
        }
        if let Some(probe) = plan.probe {
            for h in watches.iter_mut().filter(|h| h.usage_ms.is_none()) {
                let home = plan.home_region(probe);
                let view = |r: usize| {
                    if r == home {
                        count.get(&(probe, w_now)).copied().unwrap_or(0)
                    } else {
                        cache
                            .get(&(r, probe))
                            .filter(|c| c.0 == w_now)
                            .map_or(0, |c| c.1)
                    }
                };
                let first = view(0);
                if (1..regions).all(|r| view(r) == first) {
                    // A baseline's state is what its counters show: consumption and state
                    // agree at the same moment.
                    h.usage_ms = Some(now - h.heal_at);
                    h.equal_ms = h.usage_ms;
                    h.dominate_ms = h.usage_ms;
                }
            }
        }
    }
    (ledger, watches)
}
