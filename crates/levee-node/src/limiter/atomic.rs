//! The atomic `all` call: several rules and keys decided together, nothing consumed unless
//! every one allows. Every key's slot is locked, in one global order, for the decision.

use levee_core::{KeyState, RuleMode, Target, decide_all};
use parking_lot::MutexGuard;

use super::api_error::ApiError;
use super::idempotency::Cached;
use super::outcome::AllOutcome;
use super::request::{AllEntry, Field};
use super::rule_set::outcome;
use super::state::Limiter;
use crate::store::Slot;

impl Limiter {
    /// Decides an atomic call over several rules: nothing is consumed unless all allow.
    pub fn check_all(
        &self,
        entries: &[AllEntry],
        cost: u64,
        dry_run: bool,
        idempotency_key: Option<&str>,
    ) -> Result<AllOutcome, ApiError> {
        if entries.is_empty() {
            return Err(ApiError::invalid("all: must hold at least one entry"));
        }
        let rules = self.rules.load();
        let mut resolved = Vec::with_capacity(entries.len());
        let mut ids: Vec<Vec<u8>> = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let r = rules.resolve(Field::All(i), &e.rule, &e.key, e.class.as_deref(), cost)?;
            let id = r.id(&e.key);
            if let Some(j) = ids.iter().position(|p| *p == id) {
                return Err(ApiError::invalid(format!(
                    "all[{i}]: the same rule and key as all[{j}]"
                )));
            }
            resolved.push(r);
            ids.push(id);
        }
        let now = self.clock.now_ms();
        let decide = || {
            let ctx = self.ctx(&rules, now);
            // Lock every key's slot in one global order (sorted ids), never two shard locks.
            let slots: Vec<_> = ids.iter().map(|id| self.store.slot(id)).collect();
            let mut order: Vec<usize> = (0..resolved.len()).collect();
            order.sort_by(|&a, &b| ids[a].cmp(&ids[b]));
            let mut guards: Vec<(usize, MutexGuard<'_, Slot>)> =
                order.iter().map(|&i| (i, slots[i].lock())).collect();
            guards.sort_by_key(|(i, _)| *i);
            let all = {
                let mut checks: Vec<(&mut KeyState, Target<'_>, RuleMode)> = guards
                    .iter_mut()
                    .zip(&resolved)
                    .map(|((_, g), r)| {
                        g.hits = g.hits.saturating_add(1);
                        (&mut g.state, r.target, r.entry.rule.mode)
                    })
                    .collect();
                decide_all(&mut checks, cost, dry_run, &ctx)
            };
            for ((_, g), id) in guards.iter_mut().zip(&ids) {
                self.store.note(id, g);
            }
            for (d, r) in all.results.iter().zip(&resolved) {
                self.record(&r.entry.metrics, d, dry_run);
            }
            all
        };
        let all = match idempotency_key {
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
                    (Cached::All(decide()), window)
                });
                if !fresh {
                    self.metrics.replays.increment(1);
                }
                match cached {
                    Cached::All(a) => a,
                    Cached::One(_) => {
                        return Err(ApiError::invalid(
                            "idempotency_key: already used for a single check",
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
            .map(|(d, r)| outcome(r, *d, now))
            .collect();
        Ok(AllOutcome {
            allowed: all.allowed,
            binding: all.binding,
            results,
        })
    }
}
