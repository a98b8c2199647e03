//! Timing agreement on the probe key after every heal.

use super::*;

impl<'p> Driver<'p> {
    /// Starts timing agreement on the probe key at every heal.
    pub(super) fn start_watches(&mut self) {
        let Some(probe) = self.plan.probe else {
            return;
        };
        for ep in &self.plan.episodes {
            if ep.heal != self.now {
                continue;
            }
            let mut watch = HealWatch::new(self.plan, ep);
            let states = self.probe_states(probe, &watch);
            watch.set_before(&states);
            self.watches.push(watch);
        }
    }

    pub(super) fn probe_states(&self, probe: u32, watch: &HealWatch) -> Vec<KeyCrdt> {
        let name = &self.plan.keys[probe as usize];
        self.nodes
            .iter()
            .filter(|n| n.up)
            .map(|n| watch.normal(n.states.state(RULE, name)))
            .collect()
    }

    pub(super) fn watch(&mut self) {
        let Some(probe) = self.plan.probe else {
            return;
        };
        for i in 0..self.watches.len() {
            if self.watches[i].done() {
                continue;
            }
            let states = self.probe_states(probe, &self.watches[i]);
            let now = self.now;
            self.watches[i].observe(now, &states);
        }
    }
}

/// Whether `a` holds every entry of `b` (joining `b` into it changes nothing).
pub fn dominates(a: &KeyCrdt, b: &KeyCrdt) -> bool {
    let mut c = a.clone();
    !c.join(b)
}
