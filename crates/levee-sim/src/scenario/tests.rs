use super::*;

#[test]
fn a_seed_always_draws_the_same_plan() {
    for s in Scenario::ALL {
        let a = s.plan(42);
        let b = s.plan(42);
        assert_eq!(a.requests, b.requests, "{}", s.name());
        assert_eq!(a.faults, b.faults, "{}", s.name());
        assert_eq!(a.offsets, b.offsets, "{}", s.name());
    }
}

#[test]
fn clocks_stay_within_the_configured_skew() {
    for seed in 0..200 {
        let p = Scenario::Crashes.plan(seed);
        assert!(2 * p.max_offset() as u64 <= p.protocol.max_clock_skew);
    }
}

#[test]
fn names_round_trip() {
    for s in Scenario::every() {
        assert_eq!(Scenario::from_name(s.name()), Some(s));
    }
}
