//! The bucket a request draws from: a rule's [`Target`], resolved from the request's class
//! and bound to the replica set, so the decision path reads every figure it needs from it.

use crate::replica::{NodeIdx, ReplicaSet};
use crate::time::Millis;

use super::algorithm::Algorithm;
use super::bequest::Bequest;
use super::validate::Rule;

/// Why a request cannot be decided against a rule. Nothing was consumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The cost is more than the rule (or the class) could ever grant.
    #[error("{cost} is more than rule {rule:?} can ever grant (at most {max})")]
    CostTooHigh {
        /// The rule.
        rule: String,
        /// The requested cost.
        cost: u64,
        /// The most a single request may cost.
        max: u64,
    },
    /// The class is not defined by the rule.
    #[error("rule {rule:?} has no class {class:?}")]
    UnknownClass {
        /// The rule.
        rule: String,
        /// The class asked for.
        class: String,
    },
    /// The rule defines classes and the request named none.
    #[error("rule {rule:?} defines classes; the request must name one of them")]
    MissingClass {
        /// The rule.
        rule: String,
    },
}

impl CheckError {
    /// The request field the error is about (`cost` or `class`).
    pub fn field(&self) -> &'static str {
        match self {
            CheckError::CostTooHigh { .. } => "cost",
            CheckError::UnknownClass { .. } | CheckError::MissingClass { .. } => "class",
        }
    }
}

/// Which bucket of a rule a request draws from, resolved from its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'r> {
    /// The algorithm and figures of the bucket.
    pub algorithm: &'r Algorithm,
    /// Separate method: the class's index, which is part of the storage key.
    pub bucket: Option<u8>,
    /// Threshold method: the fill fraction (millionths) the bucket must hold.
    pub min_fill_ppm: u32,
    /// The capacity split among the nodes, when the rule was bound to the replica set.
    pub split: Option<&'r [u64]>,
    /// When the split applies from, if it grew after a change of the node list; 0 if not
    /// ([`Rule::grown_from`]).
    pub grown_from: Millis,
    /// Removed nodes' rights this bucket's heirs count ([`Rule::bequests`]); none for a
    /// class's own bucket or a key with its own figures.
    pub bequests: &'r [Bequest],
}

impl<'r> Target<'r> {
    /// `node`'s static share of the target's capacity (0 for a node the bound split does not
    /// name).
    #[inline]
    pub(crate) fn static_share(&self, node: NodeIdx, replicas: &ReplicaSet) -> u64 {
        match self.split {
            Some(split) => split.get(usize::from(node.0)).copied().unwrap_or(0),
            None => replicas.split(self.algorithm.capacity())[usize::from(node.0)],
        }
    }
}

impl Rule {
    /// The algorithm a check of `class` is decided by (a separate class's own bucket's, else
    /// the rule's; a key's override changes its figures, never its algorithm), or `None` for a
    /// class the rule does not have.
    pub fn algorithm_of(&self, class: Option<&str>) -> Option<Algorithm> {
        self.target(class, 0).ok().map(|t| *t.algorithm)
    }

    /// Resolves the bucket a request of `class` draws from and checks that `cost` can ever be
    /// granted by it. A cost above the capacity is the caller's error, not a silent deny.
    pub fn target(&self, class: Option<&str>, cost: u64) -> Result<Target<'_>, CheckError> {
        self.target_with(class, cost, None)
    }

    /// [`Rule::target`] for a key with its own figures (`over`, a per-key override's
    /// algorithm, [`Rule::override_effect`]): they replace the rule's own bucket's, split
    /// among the nodes as the rule's capacity is; a separate class's own bucket keeps its
    /// figures.
    pub fn target_with<'r>(
        &'r self,
        class: Option<&str>,
        cost: u64,
        over: Option<&'r Algorithm>,
    ) -> Result<Target<'r>, CheckError> {
        let own = over.unwrap_or(&self.algorithm);
        let split = if over.is_some() { None } else { self.bound() };
        let bequests: &[Bequest] = if over.is_some() { &[] } else { &self.bequests };
        let target = match (class, self.classes.is_empty()) {
            (None, true) => Target {
                algorithm: own,
                bucket: None,
                min_fill_ppm: 0,
                split,
                grown_from: self.grown_from,
                bequests,
            },
            (None, false) => {
                return Err(CheckError::MissingClass {
                    rule: self.name.clone(),
                });
            }
            (Some(name), _) => {
                let Some((i, c)) = self
                    .classes
                    .iter()
                    .enumerate()
                    .find(|(_, c)| c.name == name)
                else {
                    return Err(CheckError::UnknownClass {
                        rule: self.name.clone(),
                        class: name.to_owned(),
                    });
                };
                match &c.own {
                    Some(own) => Target {
                        algorithm: own,
                        bucket: Some(i as u8),
                        min_fill_ppm: 0,
                        split: (!c.split.is_empty()).then_some(c.split.as_slice()),
                        grown_from: self.grown_from,
                        bequests: &[],
                    },
                    None => Target {
                        algorithm: own,
                        bucket: None,
                        min_fill_ppm: c.min_fill_ppm,
                        split,
                        grown_from: self.grown_from,
                        bequests,
                    },
                }
            }
        };
        let max = target.algorithm.capacity();
        if cost > max {
            return Err(CheckError::CostTooHigh {
                rule: self.name.clone(),
                cost,
                max,
            });
        }
        Ok(target)
    }

    /// The target a stored key state of this rule belongs to, from the class bucket its key
    /// id carries (`levee_proto::encode_id` writes [`Target::bucket`] there): what a node
    /// merges a received delta, a restored snapshot or a rebalanced key against.
    ///
    /// * `Some(i)`: class `i`'s own bucket (separate method); `None` if the rule has no
    ///   class `i` or class `i` has no bucket of its own.
    /// * `None`: the rule's own bucket — of a rule without classes, or, when it has classes,
    ///   through its first threshold class (they all draw from it; the target carries that
    ///   class's `min_fill_ppm`, which deciding reads but merging, rebalancing and usage do
    ///   not). `None` if every class has its own bucket: no state is stored without one.
    ///
    /// Whenever it returns a target, the target's [`Target::bucket`] equals `bucket`, so
    /// an id re-encoded from the target names the same state. No cost is checked.
    pub fn target_of_bucket(&self, bucket: Option<u8>) -> Option<Target<'_>> {
        self.target_of_bucket_with(bucket, None)
    }

    /// [`Rule::target_of_bucket`] for a key with its own figures (`over`, as in
    /// [`Rule::target_with`]).
    pub fn target_of_bucket_with<'r>(
        &'r self,
        bucket: Option<u8>,
        over: Option<&'r Algorithm>,
    ) -> Option<Target<'r>> {
        let class = match bucket {
            Some(b) => Some(self.classes.get(usize::from(b))?.name.as_str()),
            None => self
                .classes
                .iter()
                .find(|c| c.own.is_none())
                .map(|c| c.name.as_str()),
        };
        let target = self.target_with(class, 0, over).ok()?;
        (target.bucket == bucket).then_some(target)
    }

    /// Precomputes the split of every capacity among the nodes of `replicas`, so the
    /// decision path does not recompute it. Call again whenever the replica set changes.
    /// Bound in full, a rule has no [`Bequest`]s: they serve only the windows before grown
    /// shares apply ([`Rule::bind_no_higher`]).
    pub fn bind(&mut self, replicas: &ReplicaSet) {
        self.bequests.clear();
        self.split = replicas.split(self.algorithm.capacity());
        for c in &mut self.classes {
            c.split = c
                .own
                .map(|own| replicas.split(own.capacity()))
                .unwrap_or_default();
        }
    }

    /// This rule (bound to a list in full, where shares grew) as it applies from `at`, the
    /// time [`Rule::bind_no_higher`] returned: windows that began earlier were spent under
    /// the smaller shares, so the escrow gives none of their rights by this split.
    pub fn growing_from(mut self, at: Millis) -> Rule {
        self.grown_from = at;
        self
    }

    /// Takes `old`'s shares (its split and its classes'), and its bequests, as the bound that
    /// [`Rule::bind_no_higher`] keeps to; `old` is this rule as it was in force, with as
    /// many classes.
    pub fn keep_shares_of(&mut self, old: &Rule) {
        self.split.clone_from(&old.split);
        for (c, was) in self.classes.iter_mut().zip(&old.classes) {
            c.split.clone_from(&was.split);
        }
        self.bequests.clone_from(&old.bequests);
    }

    /// [`Rule::bind`], with no node's part of any capacity above what this rule (bound
    /// before) gives it: a share that grows waits (see [`Algorithm::shares_may_grow_at`] and
    /// docs/membership.md). Returns when the rule bound to `replicas` as it is may apply, or
    /// `None` if no part was held down (or the rule was not bound before). Until then a
    /// removed node's rights of a long window are its heir's ([`Bequest`]; the rule's
    /// bequests before, in `self.bequests`, carry over while they run).
    pub fn bind_no_higher(&mut self, replicas: &ReplicaSet, now: Millis) -> Option<Millis> {
        self.grown_from = 0;
        let bequests = std::mem::take(&mut self.bequests);
        let before_main = std::mem::take(&mut self.split);
        let before_classes: Vec<Vec<u64>> = self
            .classes
            .iter_mut()
            .map(|c| std::mem::take(&mut c.split))
            .collect();
        self.bind(replicas);
        let mut grows_at: Option<Millis> = None;
        let mut cap = |split: &mut Vec<u64>, before: &[u64], algorithm: &Algorithm| {
            if before.is_empty() {
                return;
            }
            for (i, part) in split.iter_mut().enumerate() {
                let was = before.get(i).copied().unwrap_or(0);
                if *part > was {
                    *part = was;
                    let at = algorithm.shares_may_grow_at(now);
                    grows_at = Some(grows_at.map_or(at, |g| g.max(at)));
                }
            }
        };
        let algorithm = self.algorithm;
        cap(&mut self.split, &before_main, &algorithm);
        for (c, before) in self.classes.iter_mut().zip(&before_classes) {
            let own = c.own.unwrap_or(algorithm);
            cap(&mut c.split, before, &own);
        }
        self.bequests = bequests;
        self.bequeath(&before_main, replicas, now);
        grows_at
    }

    /// For a node that starts: this rule bound in full to `spending` (the list decisions
    /// spend by), held no higher than `in_force` (the rule as the node holds it now) and than
    /// its shares under each list of `before` (lists run before `spending`'s, each with when
    /// it stopped being run) whose change may still count at `now`: until
    /// [`Rule::shares_may_grow_at`] the time it stopped. A share that grew with a change made
    /// while the node was down waits as a running node's does (docs/membership.md, "A node
    /// that starts"). `waits_until`: when a share `in_force` holds down already grows, if one
    /// still waits; the held rule waits at least as long. Returns the held rule and when this
    /// one replaces it, or `None` if no such list holds a part of any capacity below this
    /// rule's.
    pub fn held_by_lists_before(
        &self,
        in_force: &Rule,
        waits_until: Option<Millis>,
        spending: &ReplicaSet,
        before: &[(ReplicaSet, Millis)],
        now: Millis,
    ) -> Option<(Rule, Millis)> {
        let counting: Vec<&(ReplicaSet, Millis)> = before
            .iter()
            .filter(|(_, until)| self.shares_may_grow_at(*until) > now)
            .collect();
        let at = counting
            .iter()
            .map(|(_, until)| self.shares_may_grow_at(*until))
            .max()?;
        let lists: Vec<ReplicaSet> = counting.iter().map(|(l, _)| l.clone()).collect();
        let mut held = self.clone();
        held.keep_shares_of(in_force);
        held.bind_no_higher(&spending.with_floors(&lists), now);
        let lower = |held: &[u64], full: &[u64]| held.iter().zip(full).any(|(h, f)| h < f);
        let held_down = lower(&held.split, &self.split)
            || held
                .classes
                .iter()
                .zip(&self.classes)
                .any(|(h, f)| lower(&h.split, &f.split));
        held_down.then_some((held, waits_until.map_or(at, |w| at.max(w))))
    }

    /// The latest time a share of this rule that changed at `at` may grow: the latest of
    /// [`Algorithm::shares_may_grow_at`] over its own bucket and its classes' own.
    pub fn shares_may_grow_at(&self, at: Millis) -> Millis {
        self.classes
            .iter()
            .filter_map(|c| c.own)
            .map(|own| own.shares_may_grow_at(at))
            .fold(self.algorithm.shares_may_grow_at(at), Millis::max)
    }

    fn bound(&self) -> Option<&[u64]> {
        (!self.split.is_empty()).then_some(self.split.as_slice())
    }
}
