//! The impostor step: a process with another CA's certificate on a stopped member's
//! addresses, and what the members make of it.

use super::*;

/// The impostor step: a process with a certificate of another CA and otherwise `id`'s
/// configuration, on `id`'s addresses (the real `id` is stopped).
pub(super) fn impostor(
    c: &mut ChaosCluster,
    control: &LoadControl,
    data: &mut RunData,
    id: &str,
    for_ms: u64,
) -> ImpostorWatch {
    let mut watch = ImpostorWatch {
        node: id.to_owned(),
        ..ImpostorWatch::default()
    };
    if let Err(e) = impostor_watch(c, control, data, id, for_ms, &mut watch) {
        watch.error = Some(e);
    }
    watch
}

fn impostor_watch(
    c: &mut ChaosCluster,
    control: &LoadControl,
    data: &mut RunData,
    id: &str,
    for_ms: u64,
    watch: &mut ImpostorWatch,
) -> Result<(), String> {
    let i = node_index(id)?;
    if c.is_running(i) {
        return Err(format!(
            "{id} must be stopped before an impostor takes its place"
        ));
    }
    let rogue_path = c.write_impostor(i)?;

    // The probe key goes quiet, so that any move of the members' views while the impostor
    // runs can only come from it.
    control.set_probe(false);
    std::thread::sleep(Duration::from_millis(PROBE_QUIET_MS));
    let members: Vec<usize> = (0..NODES)
        .filter(|&j| j != i && control.role(j) == Role::Up && c.is_running(j))
        .collect();
    let before = agreed_view(c, &members, &data.probe_key, Duration::from_secs(5))
        .ok_or("the members' views of the probe key did not agree before the impostor")?;
    watch.members_probe_before = Some(before.clone());
    let refused = |c: &ChaosCluster| -> f64 {
        members
            .iter()
            .filter_map(|&j| c.metrics(j).ok())
            .filter_map(|m| metric(&m, "levee_transport_handshakes_refused_total", &[]))
            .sum()
    };
    let refused_before = refused(c);

    c.spawn(i, &rogue_path)?;
    // Alone, it becomes ready once it has waited `suspect_after` for peers that never answer.
    c.wait_ready(i, Instant::now() + Duration::from_secs(15))?;
    control.set_role(i, Role::Impostor);
    watch.start_ms = now_ms();
    data.intervals.push(Interval {
        label: format!("impostor as {id}"),
        kind: IntervalKind::Impostor,
        start_ms: watch.start_ms,
        end_ms: None,
    });
    let until = Instant::now() + Duration::from_millis(for_ms);
    let agent = agent(Duration::from_secs(3));
    let body = serde_json::json!({ "rule": PROBE_RULE, "key": data.probe_key }).to_string();
    let url = c.url(i, "/v1/check");
    while Instant::now() < until {
        for _ in 0..10 {
            if http(&agent, "POST", &url, Some(&body))
                .is_ok_and(|r| r.status == 200 && r.json["allowed"] == true)
            {
                watch.impostor_probe_admitted += 1;
            }
        }
        watch.polls += 1;
        for &j in &members {
            let jid = c.id(j).to_owned();
            if let Ok(s) = c.status(j)
                && reachable_of(&s["peers"], id) == Some(true)
                && !watch.seen_reachable_by.contains(&jid)
            {
                watch.seen_reachable_by.push(jid.clone());
            }
            if c.view(j, PROBE_RULE, &data.probe_key).as_ref() != Some(&before)
                && !watch.members_probe_moved.contains(&jid)
            {
                watch.members_probe_moved.push(jid);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    watch.impostor_probe_used = c.view(i, PROBE_RULE, &data.probe_key).map(|v| v.used);
    if let Ok(s) = c.status(i) {
        watch.impostor_reached = s["peers"]
            .as_array()
            .map(|peers| {
                peers
                    .iter()
                    .filter(|p| p["reachable"] == true)
                    .filter_map(|p| p["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
    }
    watch.handshakes_refused = refused(c) - refused_before;

    control.set_role(i, Role::Down);
    match c.stop(i) {
        Some(status) if status.success() => {}
        Some(status) => data
            .crashes
            .push(format!("the impostor exited with {status} on SIGTERM")),
        None => data.crashes.push("the impostor died by itself".into()),
    }
    watch.end_ms = now_ms();
    if let Some(iv) = data
        .intervals
        .iter_mut()
        .rev()
        .find(|iv| iv.kind == IntervalKind::Impostor && iv.end_ms.is_none())
    {
        iv.end_ms = Some(watch.end_ms);
    }
    control.set_probe(true);
    Ok(())
}
