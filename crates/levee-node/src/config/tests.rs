use std::net::SocketAddr;

use super::*;

/// The error `text` is refused with (named `t.toml`).
fn refused(text: &str) -> ConfigError {
    Config::parse(text, "t.toml").unwrap_err()
}

/// A `[[rule]]` table of a fixed window named `name`, with `limit` and `window` as written
/// in TOML (a field on each of lines 4 and 5 of the table).
fn fixed_window(name: &str, limit: &str, window: &str) -> String {
    format!(
        "[[rule]]\nname = \"{name}\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = {window}\n"
    )
}

#[test]
fn the_embedded_configuration_is_valid() {
    let c = Config::embedded();
    assert_eq!(c.node.http, SocketAddr::from(([127, 0, 0, 1], 8750)));
    assert!(c.rules.len() >= 3);
}

#[test]
fn an_invalid_rule_names_its_line_and_field() {
    let text = "[node]\nid = \"a\"\n\n[[rule]]\nname = \"x\"\nalgorithm = \"token_bucket\"\nrate = 0\nper = \"1s\"\n";
    let e = refused(text);
    assert_eq!(e.line, Some(7));
    assert_eq!(e.field, "rule \"x\": rate");
    assert!(
        e.to_string().starts_with("t.toml:7: rule \"x\": rate:"),
        "{e}"
    );
}

#[test]
fn an_unknown_field_names_its_line() {
    let text = "[api]\nmax_body = \"1MiB\"\nbogus = 1\n";
    let e = refused(text);
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("bogus"), "{e}");
}

#[test]
fn a_mistyped_field_names_its_path() {
    let e = refused(&fixed_window("x", "\"ten\"", "\"1s\""));
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.field.contains("limit"), "{e}");
}

#[test]
fn a_mistyped_rule_field_names_the_rule_and_the_field() {
    let text = format!(
        "{}\n{}",
        fixed_window("a", "5", "\"1s\""),
        fixed_window("login-per-ip", "\"ten\"", "\"1s\"")
    );
    let e = refused(&text);
    assert_eq!(e.field, "rule \"login-per-ip\": limit", "{e}");
    assert_eq!(e.line, Some(10), "{e}");
    assert!(!e.to_string().contains("serde_spanned"), "{e}");
}

#[test]
fn a_duplicate_key_is_named() {
    let text = "[api]\nmax_batch = 10\nmax_batch = 20\n";
    let e = refused(text);
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("`max_batch`"), "{e}");
}

#[test]
fn an_open_admin_api_on_a_public_address_is_refused() {
    let public = "[node]\nhttp = \"0.0.0.0:8750\"\n";
    let e = refused(public);
    assert_eq!(e.field, "api.admin_token", "{e}");
    assert!(e.message.contains("admin_open"), "{e}");
    assert!(Config::parse(&format!("{public}[api]\nadmin_open = true\n"), "t.toml").is_ok());
    assert!(Config::parse(&format!("{public}[api]\nadmin_token = \"t\"\n"), "t.toml").is_ok());
    assert!(Config::parse("[node]\nhttp = \"[::1]:8750\"\n", "t.toml").is_ok());
}

#[test]
fn a_bad_trusted_proxy_names_the_field() {
    let text = "[api]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.0/99\"]\n";
    let e = refused(text);
    assert_eq!(e.field, "api.trusted_proxies[1]", "{e}");
    assert_eq!(e.line, Some(2), "{e}");
    let ok = Config::parse(
        "[api]\ntrusted_proxies = [\"10.0.0.0/8\", \"::1/128\"]\n",
        "t.toml",
    );
    assert_eq!(ok.map(|c| c.api.trusted_proxies.len()), Ok(2));
}

#[test]
fn a_bad_duration_is_reported() {
    let e = refused(&fixed_window("x", "5", "\"soon\""));
    assert_eq!(e.line, Some(5), "{e}");
    assert!(e.message.contains("invalid duration"), "{e}");
}

#[test]
fn a_bad_override_names_the_rule_the_entry_and_the_field() {
    let rule = "[[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = 5\nper = \"1s\"\n";
    for (table, field) in [
        ("key = \"a\"\nlimit = 5\n", "override[0].limit"),
        ("key = \"a\"\nrate = 0\n", "override[0].rate"),
        ("key = \"a\"\naction = \"block\"\n", "override[0].action"),
        ("key = \"a*b*\"\naction = \"deny\"\n", "override[0].key"),
        ("key = \"a\"\n", "override[0].limit"),
    ] {
        let text = format!("{rule}[[rule.override]]\n{table}");
        let e = refused(&text);
        assert_eq!(e.field, format!("rule \"api\": {field}"), "{table}: {e}");
    }
    let e = refused(&format!(
        "{rule}[[rule.override]]\nkey = \"a\"\nrate = 1\nlimits = 3\n"
    ));
    assert!(e.to_string().contains("limits"), "{e}");
    let ok = format!("{rule}[[rule.override]]\nkey = \"int-*\"\naction = \"allow\"\n");
    Config::parse(&ok, "t.toml").expect("a valid override");
}

#[test]
fn duplicate_rule_names_are_refused() {
    let rule = fixed_window("x", "5", "\"1s\"");
    let e = refused(&format!("{rule}{rule}"));
    assert_eq!(e.field, "rule[1].name");
    assert_eq!(e.line, Some(7));
}

#[test]
fn byte_sizes_parse() {
    assert_eq!("1MiB".parse::<ByteSize>(), Ok(ByteSize(1 << 20)));
    assert_eq!("64KB".parse::<ByteSize>(), Ok(ByteSize(64_000)));
    assert_eq!("123".parse::<ByteSize>(), Ok(ByteSize(123)));
    assert!("1 parsec".parse::<ByteSize>().is_err());
}

#[test]
fn notify_tables_are_validated_naming_the_field() {
    let rule = fixed_window("api", "5", "\"1s\"");
    let ok = Config::parse(
        &format!("{rule}[[notify]]\nurl = \"http://127.0.0.1:9/h\"\n"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(ok.notify[0].thresholds, vec![0.8, 0.9, 1.0]);
    assert_eq!(ok.notify[0].rules, None);
    for (table, field, line) in [
        ("url = \"ftp://x/\"\n", "notify[0].url", 7),
        (
            "url = \"http://x/\"\nthresholds = [0.5, 1.5]\n",
            "notify[0].thresholds[1]",
            8,
        ),
        (
            "url = \"http://x/\"\nthresholds = [0.0]\n",
            "notify[0].thresholds[0]",
            8,
        ),
        (
            "url = \"http://x/\"\nrules = [\"api\", \"nope\"]\n",
            "notify[0].rules[1]",
            8,
        ),
        ("url = \"http://x/\"\nrules = []\n", "notify[0].rules", 8),
    ] {
        let e = refused(&format!("{rule}[[notify]]\n{table}"));
        assert_eq!(e.field, field, "{e}");
        assert_eq!(e.line, Some(line), "{e}");
    }
}

#[test]
fn a_cluster_nodes_http_must_be_host_port() {
    let base = "[node]\nid = \"eu-1\"\nregion = \"eu\"\n[cluster]\nregions = { eu = 1 }\n[[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9000\"\n";
    for good in ["10.0.0.2:8750", "levee-eu-1.levee-eu:8750", "[::1]:8750"] {
        let text = format!("{base}http = \"{good}\"\n");
        let c = Config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{good}: {e}"));
        let http = c.cluster.as_ref().map(|c| c.nodes[0].http.clone());
        assert_eq!(http, Some(Some(good.to_owned())));
    }
    for bad in [
        "",
        "http://10.0.0.2:8750",
        "10.0.0.2",
        "host:0",
        "a b:80",
        "h:99999",
    ] {
        let text = format!("{base}http = \"{bad}\"\n");
        let e = refused(&text);
        assert_eq!(e.field, "cluster.node.http", "{bad}");
        assert_eq!(e.line, Some(10), "{bad}");
    }
}

#[test]
fn a_cluster_nodes_addr_is_an_ip_or_a_dns_name() {
    let base = "[node]\nid = \"eu-1\"\nregion = \"eu\"\n[cluster]\nregions = { eu = 1 }\n[[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\n";
    for good in [
        "10.0.0.2:8751",
        "levee-eu-0.levee-eu.levee.svc:8751",
        "[::1]:8751",
    ] {
        let text = format!("{base}addr = \"{good}\"\n");
        let c = Config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{good}: {e}"));
        let addr = c.cluster.as_ref().map(|c| c.nodes[0].addr.to_string());
        assert_eq!(addr.as_deref(), Some(good));
    }
    for bad in ["", "levee-eu-0", "a b:8751", "h:0", "http://h:1"] {
        let text = format!("{base}addr = \"{bad}\"\n");
        let e = refused(&text);
        assert!(e.field.ends_with("addr"), "{bad}: {e}");
        assert_eq!(e.line, Some(9), "{bad}: {e}");
    }
}

#[test]
fn a_cluster_must_list_this_node() {
    let text = "[node]\nid = \"eu-9\"\nregion = \"eu\"\n[cluster]\nregions = { eu = 1 }\n[[cluster.node]]\nid = \"eu-1\"\nregion = \"eu\"\naddr = \"127.0.0.1:9000\"\n";
    let e = refused(text);
    assert_eq!(e.field, "node.id");
}
