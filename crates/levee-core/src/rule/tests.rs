//! Validation and target resolution, field by field.

use super::*;
use crate::time::HumanDuration;

fn tb() -> RuleSpec {
    RuleSpec {
        name: "api".into(),
        algorithm: AlgorithmName::TokenBucket,
        rate: Some(100),
        per: Some(HumanDuration::from_millis(1000)),
        burst: Some(200),
        delay: None,
        limit: None,
        window: None,
        period: None,
        mode: RuleMode::Enforce,
        key_from: None,
        class_method: None,
        classes: vec![],
        overrides: vec![],
    }
}

fn window(limit: Option<u64>) -> RuleSpec {
    RuleSpec {
        algorithm: AlgorithmName::FixedWindow,
        rate: None,
        per: None,
        burst: None,
        limit,
        window: Some(HumanDuration::from_millis(60_000)),
        ..tb()
    }
}

fn field_of(spec: &RuleSpec) -> String {
    spec.validate().unwrap_err().field
}

#[test]
fn a_valid_token_bucket_keeps_its_figures() {
    let rule = tb().validate().unwrap();
    assert_eq!(
        rule.algorithm,
        Algorithm::TokenBucket {
            rate: 100,
            per_ms: 1000,
            burst: 200,
            shaping: None,
        }
    );
    assert_eq!(rule.algorithm.capacity(), 200);
    assert_eq!(rule.algorithm.policy_window_secs(0), 2);
}

#[test]
fn burst_defaults_to_rate() {
    let rule = RuleSpec {
        burst: None,
        ..tb()
    }
    .validate()
    .unwrap();
    assert_eq!(rule.algorithm.capacity(), 100);
}

#[test]
fn each_wrong_field_is_named() {
    assert_eq!(field_of(&RuleSpec { rate: None, ..tb() }), "rate");
    assert_eq!(
        field_of(&RuleSpec {
            rate: Some(0),
            ..tb()
        }),
        "rate"
    );
    assert_eq!(field_of(&RuleSpec { per: None, ..tb() }), "per");
    assert_eq!(
        field_of(&RuleSpec {
            per: Some(HumanDuration::from_millis(0)),
            ..tb()
        }),
        "per"
    );
    assert_eq!(
        field_of(&RuleSpec {
            burst: Some(MAX_BURST + 1),
            ..tb()
        }),
        "burst"
    );
    assert_eq!(
        field_of(&RuleSpec {
            limit: Some(5),
            ..tb()
        }),
        "limit"
    );
    assert_eq!(field_of(&window(None)), "limit");
    assert_eq!(
        field_of(&RuleSpec {
            window: None,
            ..window(Some(5))
        }),
        "window"
    );
    assert_eq!(
        field_of(&RuleSpec {
            name: String::new(),
            ..tb()
        }),
        "name"
    );
    assert_eq!(
        field_of(&RuleSpec {
            name: "a b".into(),
            ..tb()
        }),
        "name"
    );
    assert_eq!(
        field_of(&RuleSpec {
            key_from: Some("cookie:x".into()),
            ..tb()
        }),
        "key_from"
    );
    let quota = RuleSpec {
        algorithm: AlgorithmName::Quota,
        window: None,
        ..window(Some(5))
    };
    assert_eq!(field_of(&quota), "period");
}

#[test]
fn key_from_header_is_lower_cased() {
    let rule = RuleSpec {
        key_from: Some("header:X-Api-Key".into()),
        ..tb()
    }
    .validate()
    .unwrap();
    assert_eq!(rule.key_from, Some(KeyFrom::Header("x-api-key".into())));
}

fn class(name: &str, min_fill: Option<f64>, limit: Option<u64>, rate: Option<u64>) -> ClassSpec {
    ClassSpec {
        name: name.into(),
        min_fill,
        limit,
        rate,
    }
}

#[test]
fn threshold_classes_validate_their_fill() {
    let ok = RuleSpec {
        classes: vec![
            class("paid", None, None, None),
            class("free", Some(0.6), None, None),
        ],
        ..tb()
    };
    let rule = ok.validate().unwrap();
    assert_eq!(rule.classes[1].min_fill_ppm, 600_000);
    let bad = RuleSpec {
        classes: vec![class("free", Some(1.0), None, None)],
        ..tb()
    };
    assert_eq!(field_of(&bad), "class[0].min_fill");
    let dup = RuleSpec {
        classes: vec![class("a", None, None, None), class("a", None, None, None)],
        ..tb()
    };
    assert_eq!(field_of(&dup), "class[1].name");
}

#[test]
fn separate_classes_must_fit_under_the_common_limit() {
    let fits = RuleSpec {
        class_method: Some(ClassMethod::Separate),
        classes: vec![
            class("a", None, Some(30), None),
            class("b", None, Some(70), None),
        ],
        ..window(Some(100))
    };
    let rule = fits.validate().unwrap();
    assert_eq!(rule.classes[1].own.unwrap().capacity(), 70);
    let exceeds = RuleSpec {
        classes: vec![
            class("a", None, Some(31), None),
            class("b", None, Some(70), None),
        ],
        ..fits.clone()
    };
    assert_eq!(field_of(&exceeds), "class");
    let tb_rates = RuleSpec {
        class_method: Some(ClassMethod::Separate),
        classes: vec![
            class("a", None, Some(100), Some(60)),
            class("b", None, Some(100), Some(60)),
        ],
        ..tb()
    };
    let e = tb_rates.validate().unwrap_err();
    assert!(e.problem.contains("rates sum to 120"), "{e}");
}

#[test]
fn cost_above_capacity_is_the_callers_error() {
    let rule = tb().validate().unwrap();
    assert!(rule.target(None, 200).is_ok());
    assert_eq!(
        rule.target(None, 201),
        Err(CheckError::CostTooHigh {
            rule: "api".into(),
            cost: 201,
            max: 200
        })
    );
    let classes = RuleSpec {
        class_method: Some(ClassMethod::Separate),
        classes: vec![class("a", None, Some(50), Some(10))],
        ..tb()
    }
    .validate()
    .unwrap();
    assert!(matches!(
        classes.target(Some("a"), 51),
        Err(CheckError::CostTooHigh { max: 50, .. })
    ));
    assert!(matches!(
        classes.target(Some("z"), 1),
        Err(CheckError::UnknownClass { .. })
    ));
    assert!(matches!(
        classes.target(None, 1),
        Err(CheckError::MissingClass { .. })
    ));
}

#[test]
fn the_target_of_a_stored_bucket_follows_the_rules_classes() {
    // No classes: only the rule's own bucket is stored.
    let plain = tb().validate().unwrap();
    let t = plain.target_of_bucket(None).unwrap();
    assert_eq!(
        (t.bucket, t.algorithm.capacity(), t.min_fill_ppm),
        (None, 200, 0)
    );
    assert_eq!(plain.target_of_bucket(Some(0)), None);

    // Threshold classes share the rule's bucket: no bucket index, reached through the first
    // threshold class.
    let shared = RuleSpec {
        classes: vec![
            class("paid", None, None, None),
            class("free", Some(0.6), None, None),
        ],
        ..tb()
    }
    .validate()
    .unwrap();
    let t = shared.target_of_bucket(None).unwrap();
    assert_eq!(t, shared.target(Some("paid"), 0).unwrap());
    assert_eq!(t.bucket, None);
    assert_eq!(shared.target_of_bucket(Some(0)), None);
    assert_eq!(shared.target_of_bucket(Some(1)), None);

    // Separate classes: each index picks that class's own bucket; no index picks nothing.
    let separate = RuleSpec {
        class_method: Some(ClassMethod::Separate),
        classes: vec![
            class("a", None, Some(30), None),
            class("b", None, Some(70), None),
        ],
        ..window(Some(100))
    }
    .validate()
    .unwrap();
    let t = separate.target_of_bucket(Some(1)).unwrap();
    assert_eq!(t, separate.target(Some("b"), 0).unwrap());
    assert_eq!((t.bucket, t.algorithm.capacity()), (Some(1), 70));
    assert_eq!(separate.target_of_bucket(Some(0)).unwrap().bucket, Some(0));
    assert_eq!(separate.target_of_bucket(Some(2)), None);
    assert_eq!(separate.target_of_bucket(None), None);
}

#[test]
fn the_target_of_a_stored_bucket_is_bound_like_a_requests() {
    let mut separate = RuleSpec {
        class_method: Some(ClassMethod::Separate),
        classes: vec![class("a", None, Some(50), Some(10))],
        ..tb()
    }
    .validate()
    .unwrap();
    let replicas = crate::ReplicaSet::single("n1", "eu");
    separate.bind(&replicas);
    let t = separate.target_of_bucket(Some(0)).unwrap();
    assert_eq!(t.split, Some(&[50u64][..]));
    assert_eq!(t, separate.target(Some("a"), 0).unwrap());
}

#[test]
fn key_from_takes_a_list_of_parts_and_names_the_wrong_one() {
    let rule = RuleSpec {
        key_from: Some(vec!["header:X-Api-Key", "method", "path", "query:page", "ip"].into()),
        ..tb()
    }
    .validate()
    .unwrap();
    assert_eq!(
        rule.key_from,
        Some(KeyFrom::Parts(vec![
            KeyPart::Header("x-api-key".into()),
            KeyPart::Method,
            KeyPart::Path,
            KeyPart::Query("page".into()),
            KeyPart::Ip,
        ]))
    );
    let single = RuleSpec {
        key_from: Some("path".into()),
        ..tb()
    }
    .validate()
    .unwrap();
    assert_eq!(single.key_from, Some(KeyFrom::Parts(vec![KeyPart::Path])));
    let e = RuleSpec {
        key_from: Some(vec!["method", "cookie:x"].into()),
        ..tb()
    }
    .validate()
    .unwrap_err();
    assert_eq!((e.rule.as_str(), e.field.as_str()), ("api", "key_from[1]"));
    assert!(e.problem.contains("cookie:x"), "{e}");
    for bad in [
        vec![],
        vec!["method", "method"],
        vec!["query:"],
        vec!["header:"],
    ] {
        let e = RuleSpec {
            key_from: Some(bad.clone().into()),
            ..tb()
        }
        .validate()
        .unwrap_err();
        assert!(e.field.starts_with("key_from"), "{bad:?}: {e}");
    }
}

#[test]
fn a_leaky_bucket_is_a_token_bucket_of_burst_plus_one_and_checks_its_delay() {
    let rule = RuleSpec::leaky_bucket("shape", 10, 1_000, 5, 2)
        .validate()
        .unwrap();
    assert_eq!(
        rule.algorithm,
        Algorithm::TokenBucket {
            rate: 10,
            per_ms: 1_000,
            burst: 6,
            shaping: Some(Shaping { queue: 5, delay: 2 }),
        }
    );
    assert_eq!(rule.algorithm_name(), AlgorithmName::LeakyBucket);
    let no_burst = RuleSpec {
        burst: None,
        delay: None,
        ..RuleSpec::leaky_bucket("shape", 10, 1_000, 0, 0)
    };
    assert_eq!(no_burst.validate().unwrap().algorithm.capacity(), 1);
    let e = RuleSpec::leaky_bucket("shape", 10, 1_000, 5, 6)
        .validate()
        .unwrap_err();
    assert_eq!((e.rule.as_str(), e.field.as_str()), ("shape", "delay"));
    let e = RuleSpec {
        delay: Some(1),
        ..tb()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.field, "delay");
    let e = RuleSpec {
        limit: Some(1),
        ..RuleSpec::leaky_bucket("shape", 10, 1_000, 5, 0)
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.field, "limit");
}
