//! Schema fuzzing of a live node: `schemathesis` (PyPI, pinned by `.ci/run`, which installs it
//! into `target/schemathesis-venv`) reads the node's `/openapi.json` and sends every operation
//! positive and negative cases, checking every answer against the document (status, content
//! type, headers, schema), that no answer is a server error, that schema-valid data is
//! accepted and invalid data refused. Bounded: `--max-time 45`, `--max-examples 15`.
//!
//! Without schemathesis the fuzzing test prints `SKIPPED: schemathesis not found` and passes,
//! unless `LEVEE_REQUIRE_SCHEMATHESIS=1` (`.ci/run` sets it).
//!
//! What it found is kept here as plain black-box tests: a whole number written as a float
//! (`"cost": 3.0`, an integer to JSON Schema) was refused; a denial with a `deny_status` other
//! than 429 did not match the document.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use levee_blackbox::{Node, send_signal};
use serde_json::json;

const TOKEN: &str = "s3cret-admin";

const CONFIG: &str = r#"
[node]
id = "eu-1"
region = "eu"

[api]
admin_token = "s3cret-admin"

[[rule]]
name = "api"
algorithm = "fixed_window"
limit = 100
window = "1d"
"#;

/// Per operation, the answers schemathesis must take for schema-valid data: a decision's
/// `cost` above what its rule can ever grant, and a `class` its rule does not have, are
/// refused (400), which a schema cannot say (they depend on the configuration), and `/v1/authz` answers a denial with the `deny_status`
/// asked for (any 4xx). An override's figures must fit its rule's algorithm (a `rate` on a
/// window rule is 400) and its `ttl` be at most 366 days, and a full table is 409. Every
/// other operation keeps schemathesis's default.
const SCHEMATHESIS_TOML: &str = r#"
[[operations]]
include-path-regex = "^/v1/(check|refund|usage/)"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "404"]

[[operations]]
include-path-regex = "^/v1/overrides/"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "404", "409"]

[[operations]]
include-path-regex = "^/v1/authz/"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "4xx"]
"#;

/// Whole runs may take this long (the run's own budget is 45 s) before schemathesis is
/// killed, by its pid.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// `schemathesis`: in `PATH`, else in `target/schemathesis-venv`.
fn schemathesis() -> Option<PathBuf> {
    let in_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("schemathesis"))
            .find(|p| p.is_file())
    });
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/schemathesis-venv/bin/schemathesis");
    let found = in_path.or_else(|| venv.is_file().then_some(venv));
    if found.is_none() {
        assert!(
            std::env::var("LEVEE_REQUIRE_SCHEMATHESIS").as_deref() != Ok("1"),
            "LEVEE_REQUIRE_SCHEMATHESIS=1 but schemathesis is not installed (.ci/run installs it)"
        );
        // Straight to the process's stderr: the harness captures `eprintln!` of a passing test.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: schemathesis not found; set LEVEE_REQUIRE_SCHEMATHESIS=1 to make this a failure"
        );
    }
    found
}

#[test]
fn schemathesis_finds_nothing_wrong_with_the_live_node() {
    let Some(st) = schemathesis() else {
        return;
    };
    let node = Node::start(CONFIG);
    let config = node.dir().join("schemathesis.toml");
    std::fs::write(&config, SCHEMATHESIS_TOML).expect("write schemathesis.toml");
    let log = node.dir().join("schemathesis.log");
    let mut child = Command::new(&st)
        .arg("--config-file")
        .arg(&config)
        .args(["run", &format!("{}/openapi.json", node.url())])
        .args(["--checks", "all"])
        .args(["--mode", "all"])
        .args(["--max-examples", "15"])
        .args(["--max-time", "45"])
        .args(["--workers", "2"])
        .args(["--request-timeout", "5"])
        .args(["--seed", "17"])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .arg("--report-dir")
        .arg(node.dir().join("schemathesis-report"))
        .current_dir(node.dir())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("the log"))
        .stderr(Stdio::from(
            std::fs::File::options()
                .append(true)
                .open(&log)
                .expect("the log"),
        ))
        .spawn()
        .expect("schemathesis starts");
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        match child.try_wait().expect("wait for schemathesis") {
            Some(status) => break status,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            None => {
                send_signal(child.id(), "KILL");
                let _ = child.wait();
                panic!(
                    "schemathesis ran over {RUN_TIMEOUT:?}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        }
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "schemathesis found failures ({status}):\n{out}\nnode stderr:\n{}",
        node.stderr()
    );
    // Every operation schemathesis read from the document was selected and tested.
    let figure = |label: &str| -> Option<String> {
        let line = out.lines().find(|l| l.trim_start().starts_with(label))?;
        Some(line.trim_start()[label.len()..].trim().to_owned())
    };
    let selected = figure("Selected:").unwrap_or_else(|| panic!("no Selected line:\n{out}"));
    let tested = figure("Tested:").unwrap_or_else(|| panic!("no Tested line:\n{out}"));
    let (picked, total) = selected
        .split_once('/')
        .unwrap_or_else(|| panic!("Selected: {selected}"));
    assert!(
        picked == total && tested == total && total != "0",
        "not every operation was tested (selected {selected}, tested {tested}):\n{out}"
    );
    let health = node.get("/healthz");
    assert_eq!(health.status, 200, "the node is not well after the run");
    assert!(!node.stderr().contains("panicked"), "{}", node.stderr());
}

/// Found by schemathesis: `"cost": 3.0` is an integer to JSON Schema (and so to the document),
/// and some encoders write whole numbers so; it was refused (400). It is read as 3; any other
/// fraction is still refused, naming the field.
#[test]
fn a_whole_cost_written_as_a_float_is_an_integer() {
    let node = Node::start(CONFIG);
    let r = node.post_json(
        "/v1/check",
        &json!({"rule": "api", "key": "float", "cost": 3.0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json["remaining"], 97, "{}", r.body);
    let r = node.post_json(
        "/v1/check/batch",
        &json!({"checks": [{"rule": "api", "key": "float", "cost": 2.0}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json["results"][0]["remaining"], 95, "{}", r.body);
    let r = node.post_json_with_token(
        "/v1/refund",
        &json!({"rule": "api", "key": "float", "cost": 5.0}),
        TOKEN,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json["remaining"], 100, "{}", r.body);
    for (path, body) in [
        (
            "/v1/check",
            json!({"rule": "api", "key": "float", "cost": 1.5}),
        ),
        (
            "/v1/check/batch",
            json!({"checks": [{"rule": "api", "key": "float", "cost": 1.5}]}),
        ),
        (
            "/v1/check",
            json!({"rule": "api", "key": "float", "cost": -2.0}),
        ),
        (
            "/v1/check",
            json!({"rule": "api", "key": "float", "cost": 1e300}),
        ),
    ] {
        let r = node.post_json(path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        assert!(
            r.json["message"]
                .as_str()
                .is_some_and(|m| m.contains("cost")),
            "{path} {body}: {}",
            r.body
        );
    }
    // Nothing refused was charged: 100 − 3 − 2 + 5 (capped at the limit).
    assert_eq!(node.used("api", "float"), 0);
}

/// Found by schemathesis: a denial answered with a `deny_status` other than 429 (`420`, or
/// `400`, which is also an error's status) did not match the document, which now lists any
/// 4xx as a denial and 400/404 as an error or a denial.
#[test]
fn a_denial_with_any_deny_status_matches_the_document() {
    let node = Node::start(CONFIG);
    let doc = node.get("/openapi.json").json;
    let responses = &doc["paths"]["/v1/authz/{rule}"]["get"]["responses"];
    let schema = |status: &str| responses[status]["content"]["application/json"]["schema"].clone();
    assert_eq!(
        schema("4XX"),
        json!({"$ref": "#/components/schemas/AuthzDenial"}),
        "{responses}"
    );
    for status in ["400", "404"] {
        assert_eq!(
            schema(status),
            json!({"$ref": "#/components/schemas/AuthzRefusal"}),
            "{status}: {responses}"
        );
    }
    let refusal = &doc["components"]["schemas"]["AuthzRefusal"]["oneOf"];
    assert_eq!(
        refusal
            .as_array()
            .map(|v| v.iter().map(|s| s["$ref"].clone()).collect::<Vec<_>>()),
        Some(vec![
            json!("#/components/schemas/Error"),
            json!("#/components/schemas/AuthzDenial")
        ]),
        "{refusal}"
    );
    // And the node: a denial with deny_status=420 and =400 has the denial's body.
    let r = node.request("GET", "/v1/authz/api", &[("x-ratelimit-cost", "100")], None);
    assert_eq!(r.status, 200, "{}", r.body);
    for status in [420u16, 400] {
        let r = node.request(
            "GET",
            &format!("/v1/authz/api?deny_status={status}"),
            &[],
            None,
        );
        assert_eq!(r.status, status, "{}", r.body);
        assert_eq!(r.json["error"], "rate_limited", "{}", r.body);
        assert!(r.json["retry_after_ms"].is_u64(), "{}", r.body);
    }
}

/// Found by schemathesis: the document let an override's body hold `limit`, `rate`, `burst`
/// and `action` at once, which the node refuses (400, naming the field). The document now says
/// one of three shapes, each closed; a body of two shapes is still refused.
#[test]
fn an_override_body_is_one_of_three_closed_shapes() {
    let node = Node::start(CONFIG);
    let doc = node.get("/openapi.json").json;
    let schemas = &doc["components"]["schemas"];
    let one_of: Vec<String> = schemas["OverrideBody"]["oneOf"]
        .as_array()
        .expect("OverrideBody is a oneOf")
        .iter()
        .map(|s| s["$ref"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        one_of,
        [
            "#/components/schemas/OverrideLimit",
            "#/components/schemas/OverrideRate",
            "#/components/schemas/OverrideAction"
        ]
    );
    for (shape, required) in [
        ("OverrideLimit", "limit"),
        ("OverrideRate", "rate"),
        ("OverrideAction", "action"),
    ] {
        assert_eq!(schemas[shape]["additionalProperties"], false, "{shape}");
        assert_eq!(schemas[shape]["required"], json!([required]), "{shape}");
    }
    let r = node.request(
        "PUT",
        "/v1/overrides/api/k",
        &[
            ("content-type", "application/json"),
            ("authorization", &format!("Bearer {TOKEN}")),
        ],
        Some(br#"{"ttl":"1h","limit":1,"rate":1,"burst":1,"action":"allow"}"#),
    );
    r.assert_error(400, "invalid_request", "limit");
    assert_eq!(node.get("/v1/overrides/api/k").status, 404);
}

/// Found by schemathesis: a key on the deny list is refused by `/v1/authz` with `403` and
/// `{"error": "denied"}`, which the document's `4XX` denial (with `retry_after_ms`) did not
/// match; `403` is now documented as the listed refusal or a denial with `deny_status=403`.
#[test]
fn a_deny_listed_key_refused_by_authz_matches_the_document() {
    let node = Node::start(CONFIG);
    let doc = node.get("/openapi.json").json;
    let responses = &doc["paths"]["/v1/authz/{rule}"]["get"]["responses"];
    assert_eq!(
        responses["403"]["content"]["application/json"]["schema"],
        json!({"$ref": "#/components/schemas/AuthzForbidden"}),
        "{responses}"
    );
    let forbidden = &doc["components"]["schemas"]["AuthzForbidden"]["oneOf"];
    assert_eq!(
        forbidden
            .as_array()
            .map(|v| v.iter().map(|s| s["$ref"].clone()).collect::<Vec<_>>()),
        Some(vec![
            json!("#/components/schemas/AuthzListedDenial"),
            json!("#/components/schemas/AuthzDenial")
        ]),
        "{forbidden}"
    );
    let listed = &doc["components"]["schemas"]["AuthzListedDenial"];
    assert_eq!(listed["required"], json!(["error"]), "{listed}");
    // And the node: `key_from = "ip"`, so the deny-listed key is this client's address.
    let auth = format!("Bearer {TOKEN}");
    let r = node.request(
        "PUT",
        "/v1/overrides/api/127.0.0.1",
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ],
        Some(br#"{"action":"deny"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = node.request("GET", "/v1/authz/api", &[], None);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json, json!({"error": "denied"}), "{}", r.body);
}
