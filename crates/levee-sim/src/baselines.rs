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

use levee_core::{ClusterView, DecideCtx, KeyState, NodeIdx, ReplicaSet, Rule, RuleMode, Target};
use levee_proto::encode_id;

use crate::heal::HealFigure;
use crate::ledger::Ledger;
use crate::levee::refund_measured;
use crate::mixed;
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

/// The plan's rules decided exactly, by the core on a single node, at each of a few places
/// that never exchange state: the central counter's one, or every region's own part of the
/// limit for the static split. Clocks read simulated time.
struct Exact {
    /// By place: the rules bound to a single node.
    rules: Vec<Vec<Rule>>,
    single: ReplicaSet,
    /// By place and key id (`levee_proto::encode_id`).
    keys: HashMap<(usize, Vec<u8>), KeyState>,
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

/// Records what request `r` asked for in `window`, in each of its ledger keys, and returns
/// them.
fn asked(plan: &RunPlan, ledger: &mut Ledger, r: &Request, window: u64) -> Vec<u32> {
    let keys = mixed::ledger_keys(plan, r.key, r.class);
    for &k in &keys {
        ledger.demand(k, window, r.region as usize, u64::from(r.cost));
    }
    keys
}

impl Exact {
    fn new(places: impl IntoIterator<Item = Vec<Rule>>) -> Exact {
        let single = ReplicaSet::single("anchor", "r0");
        let rules = places
            .into_iter()
            .map(|rules| {
                rules
                    .into_iter()
                    .map(|mut r| {
                        r.bind(&single);
                        r
                    })
                    .collect()
            })
            .collect();
        Exact {
            rules,
            single,
            keys: HashMap::new(),
        }
    }

    /// Decides request `r` at `place`: which of its [`mixed::ledger_keys`] consumed its cost (none
    /// if denied).
    fn decide(&mut self, plan: &RunPlan, place: usize, r: &Request, now: u64) -> Vec<bool> {
        let name = plan.keys[r.key as usize].as_str();
        let cost = u64::from(r.cost);
        let rules = &self.rules[place];
        let entries: Vec<(&Rule, Option<&str>)> = if plan.mixed {
            mixed::entries(r.class)
                .iter()
                .filter_map(|&(rule, class, _)| {
                    Some((rules.iter().find(|x| x.name == rule)?, class))
                })
                .collect()
        } else {
            vec![(&rules[0], None)]
        };
        let mut targets = Vec::new();
        for &(rule, class) in &entries {
            let over = match rule.overrides.get(name) {
                Some(levee_core::Effect::Figures(a)) => Some(a),
                _ => None,
            };
            // A cost above a region's whole part is never granted.
            let Ok(target) = rule.target_with(class, cost, over) else {
                return vec![false; entries.len()];
            };
            let mut id = Vec::new();
            encode_id(&mut id, &rule.name, target.bucket, name);
            targets.push((id, target, rule.mode));
        }
        let mut states: Vec<KeyState> = targets
            .iter()
            .map(|(id, _, _)| self.keys.remove(&(place, id.clone())).unwrap_or_default())
            .collect();
        let ctx = ctx(&self.single, now);
        let mut checks: Vec<(&mut KeyState, Target<'_>, RuleMode)> = states
            .iter_mut()
            .zip(&targets)
            .map(|(s, (_, t, m))| (s, *t, *m))
            .collect();
        let d = levee_core::decide_all(&mut checks, cost, false, &ctx);
        drop(checks);
        let consumed = d
            .results
            .iter()
            .map(|x| d.allowed && x.would_allow)
            .collect();
        for ((id, _, _), state) in targets.into_iter().zip(states) {
            self.keys.insert((place, id), state);
        }
        consumed
    }

    /// Gives back the refunds due at `now` and records what was really given back.
    fn refund_due(&mut self, plan: &RunPlan, due: &mut Due, now: u64, ledger: &mut Ledger) {
        let Some(list) = due.remove(&now) else {
            return;
        };
        for (place, key, region, cost, endpoint) in list {
            let rule = &self.rules[place][0];
            let Ok(target) = rule.target(None, cost) else {
                continue;
            };
            let mut id = Vec::new();
            encode_id(&mut id, &rule.name, target.bucket, &plan.keys[key as usize]);
            let ctx = ctx(&self.single, now);
            let Some(state) = self.keys.get_mut(&(place, id)) else {
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

/// Which entries consumed, as bits.
fn mask(consumed: &[bool]) -> u8 {
    consumed
        .iter()
        .enumerate()
        .filter(|(_, c)| **c)
        .fold(0, |m, (i, _)| m | 1 << i)
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
    let mut ledger = Ledger::new(regions, !plan.algo.per_window() || plan.mixed);
    let mut exact = Exact::new(limits.iter().map(|&l| plan.rules_with(l)));
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
            let keys = asked(plan, &mut ledger, &r, w);
            if !world.region_up(region) {
                continue;
            }
            let consumed = exact.decide(plan, region, &r, now);
            for (&k, _) in keys.iter().zip(&consumed).filter(|(_, c)| **c) {
                ledger.admit(k, (w, now), region, region, cost);
            }
            if consumed.first() == Some(&true) {
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
        /// Which of the request's ledger keys consumed its cost (bit `i`: the `i`th).
        consumed: u8,
    },
}

/// One exact counter per key at its home region.
pub fn run_central(plan: &RunPlan) -> Ledger {
    let regions = plan.topology.regions();
    let mut world: World<'_, CentralMsg> = World::new(plan, "central");
    let mut ledger = Ledger::new(regions, !plan.algo.per_window() || plan.mixed);
    let mut exact = Exact::new([plan.rules()]);
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
                    let consumed = mask(&exact.decide(plan, 0, &request, now));
                    world.net.send(
                        now,
                        home,
                        request.region as usize,
                        0,
                        CentralMsg::Answer {
                            request,
                            decided: (w, now),
                            consumed,
                        },
                    );
                }
                CentralMsg::Answer {
                    request,
                    decided,
                    consumed,
                } => {
                    if consumed != 0 && world.region_up(m.to) {
                        // Counted when the home admitted it; refunded (at the home) from
                        // when the caller knows.
                        let home = m.from;
                        let keys = mixed::ledger_keys(plan, request.key, request.class);
                        for (i, &k) in keys.iter().enumerate() {
                            if consumed & (1 << i) != 0 {
                                ledger.admit(k, decided, m.to, home, u64::from(request.cost));
                            }
                        }
                        if consumed & 1 != 0 {
                            schedule(&mut due, &request, now, (0, home));
                        }
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
            let keys = asked(plan, &mut ledger, &r, w);
            if !world.region_up(region) {
                continue;
            }
            let home = plan.home_region(r.key);
            if home == region {
                let consumed = exact.decide(plan, 0, &r, now);
                for (&k, _) in keys.iter().zip(&consumed).filter(|(_, c)| **c) {
                    ledger.admit(k, (w, now), region, region, cost);
                }
                if consumed.first() == Some(&true) {
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
