//! The atomic `all` call: several rules and keys decided together, nothing consumed unless
//! every one allows. Every key's slot is locked, in one global order, for the decision.

use levee_core::{KeyState, RuleMode, Target, decide_all};
use parking_lot::MutexGuard;

use super::api_error::ApiError;
use super::decide::over_global_limit;
use super::idempotency::Cached;
use super::outcome::{AllOutcome, List, Outcome};
use super::override_table::OverrideTable;
use super::request::{AllEntry, Field};
use super::rule_set::{Resolved, RuleSet, global_remaining, outcome};
use super::state::Limiter;
use crate::store::Slot;

impl Limiter {
    /// Checks an atomic call as [`Limiter::check_all`] would (errors name `all[i]`; an empty
    /// call or the same rule and key twice is refused), without deciding anything.
    pub fn validate_all(&self, entries: &[AllEntry], cost: u64) -> Result<(), ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        resolve_all(&rules, &overrides, self.clock.now_ms(), entries, cost).map(|_| ())
    }

    /// Decides an atomic call over several rules: nothing is consumed unless all allow.
    pub fn check_all(
        &self,
        entries: &[AllEntry],
        cost: u64,
        dry_run: bool,
        idempotency_key: Option<&str>,
    ) -> Result<AllOutcome, ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        let (resolved, ids) = resolve_all(&rules, &overrides, now, entries, cost)?;
        if resolved.iter().any(|r| r.list.is_some()) {
            let lists: Vec<_> = resolved
                .iter()
                .map(|r| r.list.map(|l| (l, r.listed(l))))
                .collect();
            let rest: Vec<AllEntry> = entries
                .iter()
                .zip(&lists)
                .filter(|(_, l)| l.is_none())
                .map(|(e, _)| e.clone())
                .collect();
            let listed = lists
                .iter()
                .zip(&resolved)
                .map(|(l, r)| l.map(|(_, d)| outcome(r, d, None, now)))
                .collect();
            drop((overrides, rules));
            return self.check_all_listed(listed, &rest, cost, dry_run, idempotency_key);
        }
        let decide = || {
            let ctx = self.ctx(&rules, now);
            // A read (a dry run, cost 0) creates no key: a key not held is decided on a fresh
            // state that is then dropped.
            let read = dry_run || cost == 0;
            let slots: Vec<Option<_>> = ids
                .iter()
                .map(|id| {
                    if read {
                        self.store.get(id)
                    } else {
                        Some(self.store.slot(id))
                    }
                })
                .collect();
            // Lock every key's slot in one global order (sorted ids), never two shard locks.
            let mut order: Vec<usize> = (0..resolved.len()).collect();
            order.sort_by(|&a, &b| ids[a].cmp(&ids[b]));
            let mut guards: Vec<(usize, Held<'_>)> = order
                .iter()
                .map(|&i| {
                    let held = match &slots[i] {
                        Some(s) => Held::Locked(s.lock()),
                        None => Held::Fresh(Slot::default()),
                    };
                    (i, held)
                })
                .collect();
            guards.sort_by_key(|(i, _)| *i);
            // Strict mode: an overridden key its global usage refuses (decide.rs,
            // `over_global_limit`) refuses the call, which then consumes nothing.
            let capped =
                guards
                    .iter_mut()
                    .zip(&resolved)
                    .enumerate()
                    .find_map(|(i, ((_, g), r))| {
                        over_global_limit(&mut g.slot().state, r, cost, dry_run, &ctx)
                            .filter(|d| !d.allowed)
                            .map(|d| (i, d))
                    });
            let mut all = {
                let mut checks: Vec<(&mut KeyState, Target<'_>, RuleMode)> = guards
                    .iter_mut()
                    .zip(&resolved)
                    .map(|((_, g), r)| (&mut g.slot().state, r.target, r.entry.rule.mode))
                    .collect();
                decide_all(&mut checks, cost, dry_run || capped.is_some(), &ctx)
            };
            if let Some((i, d)) = capped {
                all.allowed = false;
                all.binding = i;
                all.results[i] = d;
            }
            // Every entry's `remaining` becomes its key's global estimate; the figures the
            // decision was made against (and chose the binding rule by) stay beside them.
            let mut locals = Vec::with_capacity(all.results.len());
            for (((_, g), r), d) in guards.iter_mut().zip(&resolved).zip(all.results.iter_mut()) {
                let (global, local) = global_remaining(&g.slot().state, &r.target, &ctx, *d);
                *d = global;
                locals.push(local);
            }
            if all.allowed {
                // The binding rule of an allowed call: the one with the least left globally.
                all.binding = (0..all.results.len())
                    .min_by_key(|&i| all.results[i].remaining)
                    .unwrap_or(0);
            }
            for ((_, g), entry) in guards.iter_mut().zip(&slots) {
                if let (Held::Locked(g), Some(entry)) = (g, entry) {
                    self.store.note(entry, g);
                }
            }
            for ((d, r), e) in all.results.iter().zip(&resolved).zip(entries) {
                self.record(&r.entry.metrics, d, dry_run);
                if !read {
                    let rule = &r.entry.rule.name;
                    self.notices
                        .observe(rule, r.target.algorithm, &e.key, d, now);
                }
            }
            (all, locals)
        };
        let (all, locals) = match idempotency_key {
            Some(k) if !dry_run => {
                let mut id: Vec<u8> = Vec::new();
                for one in &ids {
                    id.extend_from_slice(one);
                    id.push(0xfe);
                }
                let window = resolved
                    .iter()
                    .map(|r| r.target.algorithm.policy_window_secs(now) * 1000)
                    .max()
                    .unwrap_or(1000);
                let mut fresh = false;
                let (cached, _) = self.idempotency.get_with((id.into(), k.to_owned()), || {
                    fresh = true;
                    let (all, locals) = decide();
                    (Cached::All(all, locals), window)
                });
                if !fresh {
                    self.metrics.replays.increment(1);
                }
                match cached {
                    Cached::All(a, locals) => (a, locals),
                    Cached::One(..) => {
                        return Err(ApiError::invalid(
                            "idempotency_key: already used for a single check",
                        ));
                    }
                    Cached::Refund(..) => {
                        return Err(ApiError::invalid(
                            "idempotency_key: already used for a refund",
                        ));
                    }
                }
            }
            _ => decide(),
        };
        let results = all
            .results
            .iter()
            .zip(&resolved)
            .zip(&locals)
            .map(|((d, r), local)| outcome(r, *d, Some(*local), now))
            .collect();
        Ok(AllOutcome {
            allowed: all.allowed,
            binding: all.binding,
            results,
        })
    }
}

impl Limiter {
    /// An atomic call some of whose keys are on a list (`listed`, by entry): the others
    /// (`rest`, in order) are decided together, and consume nothing if a key is on the deny
    /// list (of an enforced rule: a shadow rule lets it through). The binding entry is the
    /// first denied one, else the rest's binding one.
    fn check_all_listed(
        &self,
        listed: Vec<Option<Outcome>>,
        rest: &[AllEntry],
        cost: u64,
        dry_run: bool,
        idempotency_key: Option<&str>,
    ) -> Result<AllOutcome, ApiError> {
        let deny = listed
            .iter()
            .position(|o| o.is_some_and(|o| o.list == Some(List::Deny) && !o.decision.allowed));
        let decided = match rest.is_empty() {
            true => None,
            false => {
                Some(self.check_all(rest, cost, dry_run || deny.is_some(), idempotency_key)?)
            }
        };
        let mut results = Vec::with_capacity(listed.len());
        let mut binding = deny;
        let mut from_rest = decided.as_ref().map(|d| d.results.iter());
        for (i, l) in listed.into_iter().enumerate() {
            match l {
                Some(o) => results.push(o),
                None => {
                    let j = results.len() - results.iter().filter(|o| o.list.is_some()).count();
                    if binding.is_none() && decided.as_ref().is_some_and(|d| d.binding == j) {
                        binding = Some(i);
                    }
                    if let Some(o) = from_rest.as_mut().and_then(|it| it.next()) {
                        results.push(*o);
                    }
                }
            }
        }
        Ok(AllOutcome {
            allowed: deny.is_none() && decided.as_ref().is_none_or(|d| d.allowed),
            binding: binding.unwrap_or(0),
            results,
        })
    }
}

/// Every entry of an atomic call resolved, with its key's identity; refuses an empty call and
/// the same rule and key twice.
fn resolve_all<'a>(
    rules: &'a RuleSet,
    overrides: &'a OverrideTable,
    now: levee_core::Millis,
    entries: &[AllEntry],
    cost: u64,
) -> Result<(Vec<Resolved<'a>>, Vec<Vec<u8>>), ApiError> {
    if entries.is_empty() {
        return Err(ApiError::invalid("all: must hold at least one entry"));
    }
    let mut resolved = Vec::with_capacity(entries.len());
    let mut ids: Vec<Vec<u8>> = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let r = rules.resolve(
            overrides,
            now,
            Field::All(i),
            &e.rule,
            &e.key,
            e.class.as_deref(),
            cost,
        )?;
        let id = r.id(&e.key);
        if let Some(j) = ids.iter().position(|p| *p == id) {
            return Err(ApiError::invalid(format!(
                "all[{i}]: the same rule and key as all[{j}]"
            )));
        }
        resolved.push(r);
        ids.push(id);
    }
    Ok((resolved, ids))
}

/// A key's slot for an atomic call: locked in the store, or a fresh one (a read of a key not
/// held) that is dropped afterwards.
enum Held<'a> {
    Locked(MutexGuard<'a, Slot>),
    Fresh(Slot),
}

impl Held<'_> {
    fn slot(&mut self) -> &mut Slot {
        match self {
            Held::Locked(g) => g,
            Held::Fresh(s) => s,
        }
    }
}
