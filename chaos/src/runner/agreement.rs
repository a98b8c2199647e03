//! Waiting for the nodes to notice a fault, and measuring when their views agree.

use super::*;

/// Waits until every member on each side sees every region of the other side unreachable;
/// when, or `None` after [`DETECTION_BOUND`].
pub(super) fn wait_detection(
    c: &ChaosCluster,
    control: &LoadControl,
    side_a: &[usize],
    side_b: &[usize],
) -> Option<u64> {
    let deadline = Instant::now() + DETECTION_BOUND;
    let members: Vec<usize> = (0..NODES)
        .filter(|&i| control.role(i) == Role::Up && c.is_running(i))
        .collect();
    let mut pending: Vec<usize> = members;
    while Instant::now() < deadline {
        pending.retain(|&i| {
            let mine = ChaosCluster::region_index(c.region_of(i));
            let others = if side_a.contains(&mine) {
                side_b
            } else {
                side_a
            };
            !c.status(i).is_ok_and(|s| {
                others
                    .iter()
                    .all(|&r| reachable_of(&s["regions"], REGIONS[r]) == Some(false))
            })
        });
        if pending.is_empty() {
            return Some(now_ms());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Polls every member's view of the probe key until they are equal and count every probe
/// admission the clients saw (or have been equal for 2 s, or the bound passes). The probes
/// are paused by the caller. With `write_to`, the measurement starts with one probe check on
/// that node.
pub(super) fn measure_agreement(
    c: &ChaosCluster,
    control: &LoadControl,
    data: &RunData,
    label: &str,
    rtt_ms: u64,
    write_to: Option<usize>,
) -> Agreement {
    let at_ms = now_ms();
    let started = Instant::now();
    let nodes: Vec<usize> = (0..NODES)
        .filter(|&i| control.role(i) == Role::Up && c.is_running(i))
        .collect();
    if let Some(w) = write_to {
        let body = serde_json::json!({ "rule": PROBE_RULE, "key": data.probe_key }).to_string();
        let agent = agent(Duration::from_secs(3));
        if http(&agent, "POST", &c.url(w, "/v1/check"), Some(&body))
            .is_ok_and(|r| r.status == 200 && r.json["allowed"] == true)
        {
            control.count_probe_admission();
        }
    }
    let expected = control.probe_admitted();
    let mut equal_ms = None;
    let mut complete_ms = None;
    let mut views: Vec<Option<View>>;
    loop {
        views = nodes
            .iter()
            .map(|&i| c.view(i, PROBE_RULE, &data.probe_key))
            .collect();
        let elapsed = started.elapsed().as_millis() as u64;
        let equal = views.iter().all(Option::is_some) && views.windows(2).all(|w| w[0] == w[1]);
        if equal && equal_ms.is_none() {
            equal_ms = Some(elapsed);
        }
        if equal && complete_ms.is_none() && views[0].as_ref().is_some_and(|v| v.used == expected) {
            complete_ms = Some(elapsed);
        }
        if complete_ms.is_some()
            || equal_ms.is_some_and(|e| equal && elapsed > e + 2_000)
            || elapsed > AGREEMENT_BOUND_MS
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Agreement {
        label: label.to_owned(),
        at_ms,
        equal_ms,
        complete_ms,
        target_ms: 2 * GOSSIP_INTERVAL_MS + rtt_ms,
        rtt_ms,
        bound_ms: AGREEMENT_BOUND_MS,
        views: nodes
            .iter()
            .map(|&i| c.id(i).to_owned())
            .zip(views)
            .collect(),
        expected_used: expected,
        after_write: write_to.is_some(),
    }
}

/// The view of `key` (probe rule) every node of `nodes` agrees on, waiting up to `timeout`.
pub(super) fn agreed_view(
    c: &ChaosCluster,
    nodes: &[usize],
    key: &str,
    timeout: Duration,
) -> Option<View> {
    let deadline = Instant::now() + timeout;
    loop {
        let views: Vec<Option<View>> = nodes.iter().map(|&i| c.view(i, PROBE_RULE, key)).collect();
        if views.iter().all(Option::is_some) && views.windows(2).all(|w| w[0] == w[1]) {
            return views.into_iter().next().flatten();
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
