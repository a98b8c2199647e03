//! Rules: what is limited, by which algorithm, with which figures.
//!
//! A [`RuleSpec`] is what a configuration file says; [`RuleSpec::validate`] turns it into a
//! [`Rule`] or a [`RuleError`] naming the rule and the field. A `Rule` carries every figure
//! the decision path needs, already in milliseconds; it changes only when [`Rule::bind`]
//! splits its capacities over a new replica set.
//!
//! * `spec`: [`RuleSpec`], what a configuration writes.
//! * `validate`: [`RuleSpec::validate`], the limits it checks, and the [`Rule`] it builds.
//! * `algorithm`: an [`Algorithm`]'s figures and its epoch arithmetic.
//! * `target`: the [`Target`] a request draws from, bound to the replica set.
//! * `bequest`: a removed node's rights of a long window, counted by a region-mate
//!   ([`Bequest`]).
//!
//! Their dependencies run one way: `algorithm` ← `spec` ← `validate` ← `bequest` ← `target`.

mod algorithm;
mod bequest;
mod spec;
mod target;
mod validate;

pub use algorithm::{Algorithm, AlgorithmName, Shaping};
pub use bequest::Bequest;
pub use spec::{ClassMethod, ClassSpec, KeyFromSpec, RuleMode, RuleSpec};
pub use target::{CheckError, Target};
pub use validate::{
    Class, KeyFrom, KeyPart, MAX_AMOUNT, MAX_BURST, MAX_CLASSES, MAX_KEY_PARTS, MAX_LOG_LIMIT,
    MAX_NAME_LEN, MAX_PERIOD_MS, Rule, RuleError,
};

#[cfg(test)]
mod tests;
