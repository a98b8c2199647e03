//! Runtime per-key overrides (`/v1/overrides/…`) as the limiter offers them: writing,
//! reading, listing and deleting them, taking a peer's or a snapshot's registers, and the
//! registers queued for gossip. The table itself is `override_table.rs`.

use std::sync::Arc;

use levee_core::{Effect, Millis, OverrideReg, OverrideValue};

use super::api_error::ApiError;
use super::override_table::{OverrideTable, Refusal};
use super::request::{Field, check_key};
use super::rule_set::RuleSet;
use super::state::Limiter;

/// What the limiter keeps about its own writes: the last write time it gave (so two writes of
/// this node never tie), and the registers taken since a peer last asked (the gossip's).
#[derive(Debug, Default)]
pub struct OverrideWrites {
    last_written: Millis,
    changed: Vec<(String, String, OverrideReg)>,
}

/// The most registers queued for gossip; beyond it the oldest are dropped (anti-entropy sends
/// the whole table to peers periodically, so nothing is lost for good).
const MAX_CHANGED: usize = 10_000;

impl Limiter {
    /// The runtime overrides in force.
    pub fn overrides(&self) -> arc_swap::Guard<Arc<OverrideTable>> {
        self.overrides.load()
    }

    /// `PUT /v1/overrides/{rule}/{key}`: writes an override (`ttl_ms`: it disappears after
    /// that long). Refused naming the field when the value does not fit the rule; `409
    /// too_many_overrides` when `node.max_overrides` are in force.
    pub fn put_override(
        &self,
        rule: &str,
        key: &str,
        value: OverrideValue,
        ttl_ms: Option<Millis>,
    ) -> Result<OverrideReg, ApiError> {
        let rules = self.rules.load();
        let entry = rules.get("rule", rule)?;
        check_key(Field::Top, key)?;
        entry
            .rule
            .override_effect(&value)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        self.write_override(&rules, rule, key, Some(value), ttl_ms)
    }

    /// `DELETE /v1/overrides/{rule}/{key}`: the rule's own figures (or the configuration's
    /// override) apply again. Returns whether an override was in force.
    pub fn delete_override(&self, rule: &str, key: &str) -> Result<bool, ApiError> {
        let rules = self.rules.load();
        rules.get("rule", rule)?;
        check_key(Field::Top, key)?;
        let now = self.clock.now_ms();
        let was = self
            .overrides
            .load()
            .entry(rule, key)
            .is_some_and(|e| e.reg.live(now).is_some());
        if was {
            self.write_override(&rules, rule, key, None, None)?;
        }
        Ok(was)
    }

    /// `GET /v1/overrides/{rule}/{key}`: the override in force, `404 not_found` if none.
    pub fn get_override(&self, rule: &str, key: &str) -> Result<OverrideReg, ApiError> {
        self.rules.load().get("rule", rule)?;
        check_key(Field::Top, key)?;
        let now = self.clock.now_ms();
        self.overrides
            .load()
            .entry(rule, key)
            .filter(|e| e.reg.live(now).is_some())
            .map(|e| e.reg.clone())
            .ok_or_else(|| ApiError {
                status: 404,
                code: "not_found",
                message: format!("key {key:?} of rule {rule:?} has no override"),
            })
    }

    /// `GET /v1/overrides/{rule}`: the rule's overrides in force, by key.
    pub fn list_overrides(&self, rule: &str) -> Result<Vec<(String, OverrideReg)>, ApiError> {
        self.rules.load().get("rule", rule)?;
        let now = self.clock.now_ms();
        Ok(self
            .overrides
            .load()
            .list(rule, now)
            .into_iter()
            .map(|(k, r)| (k.to_owned(), r.clone()))
            .collect())
    }

    fn write_override(
        &self,
        rules: &RuleSet,
        rule: &str,
        key: &str,
        value: Option<OverrideValue>,
        ttl_ms: Option<Millis>,
    ) -> Result<OverrideReg, ApiError> {
        let mut w = self.override_writes.lock();
        let now = self.clock.now_ms();
        let written_at = now.max(w.last_written.saturating_add(1));
        let reg = OverrideReg {
            value,
            expires_at: ttl_ms.map(|t| written_at.saturating_add(t)),
            written_at,
            writer: self.node_id.clone(),
        };
        let mut table = OverrideTable::clone(&self.overrides.load());
        match table.merge(|r, g| effect_of(rules, r, g), rule, key, reg.clone(), now) {
            Ok(()) => {}
            Err(Refusal::Full) => {
                return Err(ApiError {
                    status: 409,
                    code: "too_many_overrides",
                    message: format!(
                        "key: {} overrides are in force, the most node.max_overrides allows",
                        table.live(now)
                    ),
                });
            }
            Err(Refusal::Stale) => {
                return Err(ApiError {
                    status: 409,
                    code: "conflict",
                    message: "key: a newer write of this override is already held".into(),
                });
            }
        }
        w.last_written = written_at;
        queue_changed(&mut w.changed, rule, key, &reg);
        self.overrides.store(Arc::new(table));
        Ok(reg)
    }

    /// Takes registers from a peer or a snapshot, each if it wins over the one held (last
    /// writer wins). Returns how many were taken; what was taken is queued for gossip too.
    pub fn merge_overrides(&self, regs: Vec<(String, String, OverrideReg)>) -> usize {
        if regs.is_empty() {
            return 0;
        }
        let rules = self.rules.load();
        let mut w = self.override_writes.lock();
        let now = self.clock.now_ms();
        let mut table = OverrideTable::clone(&self.overrides.load());
        let mut taken = 0;
        for (rule, key, reg) in regs {
            if check_key(Field::Top, &key).is_err()
                || reg.writer.len() > levee_core::overrides::MAX_WRITER_LEN
            {
                continue;
            }
            w.last_written = w.last_written.max(reg.written_at.min(now));
            if table
                .merge(
                    |r, g| effect_of(&rules, r, g),
                    &rule,
                    &key,
                    reg.clone(),
                    now,
                )
                .is_ok()
            {
                queue_changed(&mut w.changed, &rule, &key, &reg);
                taken += 1;
            }
        }
        if taken > 0 {
            self.overrides.store(Arc::new(table));
        }
        taken
    }

    /// The registers taken since the last call (what the next gossip sends).
    pub fn take_changed_overrides(&self) -> Vec<(String, String, OverrideReg)> {
        std::mem::take(&mut self.override_writes.lock().changed)
    }

    /// Recomputes the overrides' effects under the rules in force (after a reload).
    pub(super) fn rebind_overrides(&self, max: usize) {
        let _w = self.override_writes.lock();
        let rules = self.rules.load();
        let mut table = OverrideTable::clone(&self.overrides.load()).with_max(max);
        table.rebind(|r, g| effect_of(&rules, r, g));
        self.overrides.store(Arc::new(table));
    }
}

/// What `reg` does to keys of `rule` under `rules` (`None`: a tombstone, or a value that does
/// not fit the rule, or no such rule).
fn effect_of(rules: &RuleSet, rule: &str, reg: &OverrideReg) -> Option<Effect> {
    let value: OverrideValue = reg.value?;
    rules.by_name.get(rule)?.rule.override_effect(&value).ok()
}

fn queue_changed(
    q: &mut Vec<(String, String, OverrideReg)>,
    rule: &str,
    key: &str,
    reg: &OverrideReg,
) {
    if q.len() >= MAX_CHANGED {
        q.remove(0);
    }
    q.push((rule.to_owned(), key.to_owned(), reg.clone()));
}

#[cfg(test)]
mod tests {
    use levee_core::{OverrideReg, OverrideValue};

    use crate::config::Config;
    use crate::limiter::{CheckRef, Clock, Limiter, List};

    fn limiter(extra: &str) -> Limiter {
        let text = format!(
            "[node]\nid = \"n1\"\nmax_overrides = 2\n\n\
             [[rule]]\nname = \"w\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1h\"\n{extra}\n\
             [[rule]]\nname = \"b\"\nalgorithm = \"token_bucket\"\nrate = 1\nper = \"1h\"\nburst = 2\n"
        );
        Limiter::new(
            &Config::parse(&text, "t.toml").expect("valid"),
            Clock::default(),
        )
    }

    fn check<'a>(rule: &'a str, key: &'a str) -> CheckRef<'a> {
        CheckRef::of(rule, key, 1)
    }

    fn admitted(l: &Limiter, rule: &str, key: &str, n: usize) -> usize {
        (0..n)
            .filter(|_| l.check(check(rule, key)).expect("decided").decision.allowed)
            .count()
    }

    #[test]
    fn an_override_gives_its_figures_from_the_next_decision_on() {
        let l = limiter("");
        assert_eq!(admitted(&l, "w", "k", 5), 2);
        l.put_override("w", "k", OverrideValue::Limit(5), None)
            .expect("put");
        let o = l.check(check("w", "k")).expect("decided");
        assert!(o.decision.allowed);
        assert_eq!((o.decision.limit, o.decision.remaining), (5, 2));
        assert_eq!(admitted(&l, "w", "k", 5), 2);
        l.put_override("b", "k", OverrideValue::Rate { rate: 1, burst: 4 }, None)
            .expect("put");
        assert_eq!(admitted(&l, "b", "k", 10), 4);
        // Deleted: the rule's own limit (2) applies again, and 5 were used.
        assert!(l.delete_override("w", "k").expect("deleted"));
        let o = l.check(check("w", "k")).expect("decided");
        assert!(!o.decision.allowed);
        assert_eq!(o.decision.limit, 2);
    }

    #[test]
    fn allow_and_deny_lists_decide_without_counting() {
        let l = limiter("");
        l.put_override("w", "vip", OverrideValue::Allow, None)
            .expect("put");
        assert_eq!(admitted(&l, "w", "vip", 10), 10);
        let o = l.check(check("w", "vip")).expect("decided");
        assert_eq!(o.list, Some(List::Allow));
        assert_eq!(l.usage("w", "vip", None).expect("usage").usage.used, 0);
        l.put_override("w", "bad", OverrideValue::Deny, None)
            .expect("put");
        let o = l.check(check("w", "bad")).expect("decided");
        assert!(!o.decision.allowed);
        assert_eq!((o.list, o.decision.retry_after_ms), (Some(List::Deny), 0));
        assert_eq!(l.usage("w", "bad", None).expect("usage").usage.used, 0);
        // An atomic call with a denied key consumes nothing.
        let entry = |key: &str| crate::limiter::AllEntry {
            rule: "w".into(),
            key: key.into(),
            class: None,
        };
        let all = l
            .check_all(&[entry("other"), entry("bad")], 1, false, None)
            .expect("decided");
        assert!(!all.allowed);
        assert_eq!(all.binding, 1);
        assert_eq!(l.usage("w", "other", None).expect("usage").usage.used, 0);
        let all = l
            .check_all(&[entry("vip"), entry("other")], 1, false, None)
            .expect("decided");
        assert!(all.allowed);
        assert_eq!(all.binding, 1);
        assert_eq!(l.usage("w", "other", None).expect("usage").usage.used, 1);
    }

    #[test]
    fn bad_values_name_the_field_and_the_table_is_bounded() {
        let l = limiter("");
        let e = l
            .put_override("b", "k", OverrideValue::Limit(3), None)
            .expect_err("refused");
        assert_eq!(e.status, 400);
        assert!(e.message.starts_with("limit:"), "{}", e.message);
        let e = l
            .put_override("nope", "k", OverrideValue::Limit(3), None)
            .expect_err("refused");
        assert_eq!((e.status, e.code), (404, "unknown_rule"));
        l.put_override("w", "1", OverrideValue::Limit(3), None)
            .expect("put");
        l.put_override("w", "2", OverrideValue::Limit(3), None)
            .expect("put");
        let e = l
            .put_override("w", "3", OverrideValue::Limit(3), None)
            .expect_err("full");
        assert_eq!((e.status, e.code), (409, "too_many_overrides"));
        // Rewriting one in force is not a new one; deleting one makes room.
        l.put_override("w", "2", OverrideValue::Limit(4), None)
            .expect("rewritten");
        l.delete_override("w", "1").expect("deleted");
        l.put_override("w", "3", OverrideValue::Limit(3), None)
            .expect("room again");
        assert_eq!(l.list_overrides("w").expect("listed").len(), 2);
    }

    #[test]
    fn the_configuration_gives_exact_keys_and_prefixes_and_runtime_wins() {
        let l = limiter(
            "[[rule.override]]\nkey = \"int-*\"\naction = \"allow\"\n\
             [[rule.override]]\nkey = \"int-x\"\nlimit = 3\n",
        );
        assert_eq!(admitted(&l, "w", "int-a", 10), 10);
        assert_eq!(admitted(&l, "w", "int-x", 10), 3);
        l.put_override("w", "int-a", OverrideValue::Limit(1), None)
            .expect("put");
        assert_eq!(admitted(&l, "w", "int-a", 10), 1);
    }

    #[test]
    fn a_reload_keeps_an_override_that_no_longer_fits_without_applying_it() {
        let l = limiter("");
        l.put_override("w", "k", OverrideValue::Limit(5), None)
            .expect("put");
        let bucket = "[node]\nid = \"n1\"\n\n[[rule]]\nname = \"w\"\nalgorithm = \"token_bucket\"\nrate = 1\nper = \"1h\"\nburst = 2\n";
        let config = Config::parse(bucket, "t.toml").expect("valid");
        l.replace_rules(&config, config.replicas.clone());
        assert_eq!(l.list_overrides("w").expect("listed").len(), 1);
        let o = l.check(check("w", "k")).expect("decided");
        assert_eq!(o.decision.limit, 2, "the rule's own figures");
        // Back to a window: it applies again.
        let window = "[node]\nid = \"n1\"\n\n[[rule]]\nname = \"w\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1h\"\n";
        let config = Config::parse(window, "t.toml").expect("valid");
        l.replace_rules(&config, config.replicas.clone());
        assert_eq!(l.check(check("w", "k")).expect("decided").decision.limit, 5);
    }

    #[test]
    fn a_peers_tombstones_stay_bounded() {
        let l = limiter("");
        let now = l.clock.now_ms();
        let regs = (0..50)
            .map(|i| {
                let reg = OverrideReg {
                    value: None,
                    expires_at: None,
                    written_at: now - 100 + i,
                    writer: "n2".into(),
                };
                ("w".to_owned(), format!("k{i}"), reg)
            })
            .collect();
        l.merge_overrides(regs);
        // `max_overrides = 2`: at most 2 × 2 registers held after any merge.
        assert!(l.overrides().registers().count() <= 4);
        // The newest deletions are the ones kept.
        assert!(l.overrides().entry("w", "k49").is_some());
    }

    #[test]
    fn an_expired_override_no_longer_applies() {
        let l = limiter("");
        let now = l.clock.now_ms();
        let reg = OverrideReg {
            value: Some(OverrideValue::Deny),
            expires_at: Some(now - 1),
            written_at: now - 10,
            writer: "n2".into(),
        };
        assert_eq!(l.merge_overrides(vec![("w".into(), "k".into(), reg)]), 1);
        assert!(l.check(check("w", "k")).expect("decided").decision.allowed);
        assert_eq!(l.get_override("w", "k").expect_err("expired").status, 404);
        assert!(l.list_overrides("w").expect("listed").is_empty());
    }
}
