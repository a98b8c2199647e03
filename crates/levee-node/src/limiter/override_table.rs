//! The table of runtime per-key overrides (`/v1/overrides/…`): a last-writer-wins register per (rule, key)
//! ([`OverrideReg`]), with each register's [`Effect`] under the rules in force precomputed,
//! so a decision borrows the key's figures from here as it borrows the rule's from the rule
//! set. The table is swapped whole on every write (writes are rare; decisions never lock).
//!
//! Bounds: at most `node.max_overrides` overrides in force; deleted and expired registers
//! (kept so an older write arriving late cannot bring an override back) are dropped
//! [`TOMBSTONE_KEEP_MS`] after they stopped being in force, and never outnumber the bound.

use std::collections::HashMap;

use levee_core::{Effect, Millis, OverrideReg};

/// How long a deleted or expired override's register is kept (ms): a write older than it
/// that reaches this node later is still recognised as older.
pub const TOMBSTONE_KEEP_MS: Millis = 7 * 86_400_000;

/// How far in this node's future a peer's write may be stamped (clock skew between nodes).
pub(super) const MAX_FUTURE_MS: Millis = 10 * 60_000;

/// One register and what it does under the rules in force.
#[derive(Debug, Clone)]
pub struct OverrideEntry {
    /// The register.
    pub reg: OverrideReg,
    /// Its effect under the rule in force; `None` for a tombstone, or a value that no longer
    /// fits the rule after a reload (it is then ignored until it fits again).
    pub effect: Option<Effect>,
}

/// Why a write was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The table holds `node.max_overrides` overrides in force.
    Full,
    /// An equal or newer write is already held.
    Stale,
}

/// Every runtime override this node knows, by rule then key.
#[derive(Debug, Clone, Default)]
pub struct OverrideTable {
    by_rule: HashMap<String, HashMap<String, OverrideEntry>>,
    /// The most overrides in force.
    max: usize,
}

impl OverrideTable {
    /// An empty table holding at most `max` overrides in force.
    pub fn new(max: usize) -> OverrideTable {
        OverrideTable {
            by_rule: HashMap::new(),
            max,
        }
    }

    /// The same registers under a new bound.
    pub fn with_max(mut self, max: usize) -> OverrideTable {
        self.max = max;
        self
    }

    /// The entry of (`rule`, `key`), in force or not.
    pub fn entry(&self, rule: &str, key: &str) -> Option<&OverrideEntry> {
        self.by_rule.get(rule)?.get(key)
    }

    /// The effect in force at `now` for (`rule`, `key`).
    #[inline]
    pub fn effect(&self, rule: &str, key: &str, now: Millis) -> Option<&Effect> {
        if self.by_rule.is_empty() {
            return None;
        }
        let e = self.entry(rule, key)?;
        e.reg.live(now)?;
        e.effect.as_ref()
    }

    /// The overrides of `rule` in force at `now`, by key.
    pub fn list(&self, rule: &str, now: Millis) -> Vec<(&str, &OverrideReg)> {
        let mut out: Vec<(&str, &OverrideReg)> = self
            .by_rule
            .get(rule)
            .into_iter()
            .flatten()
            .filter(|(_, e)| e.reg.live(now).is_some())
            .map(|(k, e)| (k.as_str(), &e.reg))
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
        out
    }

    /// Every register, tombstones included (what a snapshot keeps and a peer is sent).
    pub fn registers(&self) -> impl Iterator<Item = (&str, &str, &OverrideReg)> {
        self.by_rule.iter().flat_map(|(rule, keys)| {
            keys.iter()
                .map(move |(key, e)| (rule.as_str(), key.as_str(), &e.reg))
        })
    }

    /// How many overrides are in force at `now`.
    pub fn live(&self, now: Millis) -> usize {
        self.by_rule
            .values()
            .flat_map(|k| k.values())
            .filter(|e| e.reg.live(now).is_some())
            .count()
    }

    /// Takes `reg` for (`rule`, `key`) if it wins over the register held (last writer
    /// wins) and, when it puts an override in force where none was, the table has room.
    /// `effect_of` says what a register does under the rules in force.
    pub fn merge(
        &mut self,
        effect_of: impl Fn(&str, &OverrideReg) -> Option<Effect>,
        rule: &str,
        key: &str,
        reg: OverrideReg,
        now: Millis,
    ) -> Result<(), Refusal> {
        let held = self.entry(rule, key);
        if held.is_some_and(|h| !reg.wins_over(&h.reg)) {
            return Err(Refusal::Stale);
        }
        // Out of force for longer than tombstones are kept: nothing to keep (a peer that has
        // not pruned it yet sends it back). Written far in this node's future: a clock that
        // is wrong would make it win over every later write.
        if ended(&reg, now).is_some_and(|t| now.saturating_sub(t) >= TOMBSTONE_KEEP_MS)
            || reg.written_at > now.saturating_add(MAX_FUTURE_MS)
        {
            return Err(Refusal::Stale);
        }
        let was_live = held.is_some_and(|h| h.reg.live(now).is_some());
        if reg.live(now).is_some() && !was_live {
            self.prune(now);
            if self.live(now) >= self.max {
                return Err(Refusal::Full);
            }
        }
        let effect = effect_of(rule, &reg);
        self.by_rule
            .entry(rule.to_owned())
            .or_default()
            .insert(key.to_owned(), OverrideEntry { reg, effect });
        // Tombstones (a peer's included) never outnumber the bound for long.
        if self.by_rule.values().map(HashMap::len).sum::<usize>() > self.max.saturating_mul(2) {
            self.prune(now);
        }
        Ok(())
    }

    /// Recomputes every effect under new rules (after a reload).
    pub fn rebind(&mut self, effect_of: impl Fn(&str, &OverrideReg) -> Option<Effect>) {
        for (rule, keys) in &mut self.by_rule {
            for e in keys.values_mut() {
                e.effect = effect_of(rule, &e.reg);
            }
        }
    }

    /// Drops registers out of force for longer than [`TOMBSTONE_KEEP_MS`], and the oldest of
    /// the rest beyond `max` registers out of force.
    pub fn prune(&mut self, now: Millis) {
        let ended = |r: &OverrideReg| ended(r, now);
        for keys in self.by_rule.values_mut() {
            keys.retain(|_, e| {
                ended(&e.reg).is_none_or(|t| now.saturating_sub(t) < TOMBSTONE_KEEP_MS)
            });
        }
        let mut dead: Vec<(Millis, String, String)> = self
            .by_rule
            .iter()
            .flat_map(|(rule, keys)| {
                keys.iter()
                    .filter_map(|(k, e)| ended(&e.reg).map(|t| (t, rule.clone(), k.clone())))
            })
            .collect();
        if dead.len() > self.max {
            dead.sort_unstable();
            let excess = dead.len() - self.max;
            for (_, rule, key) in dead.into_iter().take(excess) {
                if let Some(keys) = self.by_rule.get_mut(&rule) {
                    keys.remove(&key);
                }
            }
        }
        self.by_rule.retain(|_, keys| !keys.is_empty());
    }
}

/// When `reg` went out of force (deleted or expired), if it has by `now`.
fn ended(r: &OverrideReg, now: Millis) -> Option<Millis> {
    match (r.value, r.expires_at) {
        (None, _) => Some(r.written_at),
        (Some(_), Some(at)) if now >= at => Some(at),
        _ => None,
    }
}
