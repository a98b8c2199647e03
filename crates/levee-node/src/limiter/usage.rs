//! Reading a key's usage, and forgetting a key: neither decides anything.

use levee_core::KeyState;

use super::api_error::ApiError;
use super::outcome::UsageOutcome;
use super::request::{Field, check_key};
use super::state::Limiter;
use crate::store::encode_id;

impl Limiter {
    /// A key's usage as this node sees it.
    pub fn usage(
        &self,
        rule: &str,
        key: &str,
        class: Option<&str>,
    ) -> Result<UsageOutcome, ApiError> {
        let rules = self.rules.load();
        let overrides = self.overrides.load();
        let now = self.clock.now_ms();
        let r = rules.resolve(&overrides, now, Field::Top, rule, key, class, 0)?;
        let ctx = self.ctx(&rules, now);
        let usage = self
            .store
            .peek(&r.id(key), |s| s.usage(&r.target, &ctx))
            .unwrap_or_else(|| KeyState::new().usage(&r.target, &ctx));
        let region_names = rules
            .replicas
            .regions()
            .map(|i| rules.replicas.region_name(i).to_owned())
            .collect();
        Ok(UsageOutcome {
            rule: rule.to_owned(),
            key: key.to_owned(),
            usage,
            region_names,
        })
    }

    /// Forgets a key (every class bucket of it). Returns whether anything was held.
    pub fn reset(&self, rule: &str, key: &str) -> Result<bool, ApiError> {
        let rules = self.rules.load();
        let entry = rules.get("rule", rule)?;
        check_key(Field::Top, key)?;
        let mut buf = Vec::new();
        let mut any = false;
        let buckets: Vec<Option<u8>> = std::iter::once(None)
            .chain((0..entry.rule.classes.len()).map(|i| Some(i as u8)))
            .collect();
        for b in buckets {
            encode_id(&mut buf, rule, b, key);
            any |= self.store.remove(&buf);
        }
        Ok(any)
    }
}
