//! What `levee cluster add | remove | restart` do to the running cluster, the way an operator
//! grows and shrinks a real one (docs/membership.md, "What an operator does"): write every
//! node's list, reload the running nodes (SIGHUP), start or stop the node, and wait until every
//! running node is ready and agrees on the list (`agreed` and not `bounded`, one `digest`).
//!
//! Every wait also watches the other nodes: one that exits without being asked to ends the
//! change with [`Abort::Died`], and the supervisor stops the cluster as it would without a
//! change running.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use levee_node::local_cluster::Listed;
use serde_json::Value;

use super::control::{Progress, Request};
use super::{Cluster, Failure, Member, STOP_TIMEOUT, TAIL_LINES};

/// How long the nodes may take to reload a list, or to agree on it and be ready.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one `POST /admin/leave` waits (`wait_ms`); it is asked again while it answers 202.
/// Below the nodes' `api.request_timeout` (5 s), which would answer 503 first.
const LEAVE_WAIT: Duration = Duration::from_secs(3);
/// How long a node may take to leave, over all its answers.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Between two looks at the nodes.
const POLL: Duration = Duration::from_millis(200);

/// Why a change ended early.
pub(super) enum Abort {
    /// Refused before anything was changed (a name that is not the cluster's, a node that
    /// cannot be removed).
    Refused(String),
    /// It failed part-way: what was done, and what was not.
    Failed(String),
    /// A node exited without being asked to: the cluster stops.
    Died(String),
}

/// Runs `request` on the cluster; what was done, to tell the client.
pub(super) async fn run(
    request: &Request,
    c: &mut Cluster,
    out: &mut Progress,
) -> Result<String, Abort> {
    match request {
        Request::Add(region) => add(region, c, out).await,
        Request::Remove(id) => remove(id, c, out).await,
        Request::Restart(id) => restart(id, c, out).await,
    }
}

/// `add <region>`.
async fn add(region: &str, c: &mut Cluster, out: &mut Progress) -> Result<String, Abort> {
    if !c.spec.regions.iter().any(|r| r == region) {
        return Err(Abort::Refused(format!(
            "region {region:?} is not one of this cluster's regions ({}); `levee cluster add` adds a node to one of them \
             (adding a region changes every node's cluster.regions, which it does not do)",
            c.spec.regions.join(", ")
        )));
    }
    let mut spec = c.spec.clone();
    spec.added.push(region.to_owned());
    let nodes = spec
        .nodes(&c.dir)
        .map_err(|e| Abort::Failed(format!("cannot lay out another node: {e}")))?;
    let node = nodes.last().cloned().ok_or_else(|| {
        Abort::Failed("cannot lay out another node: the layout is empty".to_owned())
    })?;
    if c.members.0.iter().any(|m| m.node.id == node.id) {
        return Err(Abort::Failed(format!(
            "the next node of {region} would be {}, which the cluster has already",
            node.id
        )));
    }
    super::check_free(std::slice::from_ref(&node)).map_err(|e| match e {
        Failure::Usage(m) | Failure::Run(m) => Abort::Failed(m),
    })?;
    out.line(&format!(
        "laid out {} (http {}, quic {})",
        node.id, node.http, node.gossip
    ))
    .await;

    let running = active(c);
    let before = digests(c, &running).await?;
    write_list(c, &spec)?;
    c.spec = spec;
    reload(c, &before, out).await?;

    let log = c.dir.join(format!("{}.log", node.id));
    let child = super::spawn(&c.exe, &node, &log, true).map_err(|e| {
        Abort::Failed(format!(
            "{e}; every node's list names {} already: start it by hand with `levee serve --config {}`",
            node.id,
            node.config.display()
        ))
    })?;
    out.line(&format!("started {} (pid {})", node.id, child.id()))
        .await;
    c.members.0.push(Member {
        node: node.clone(),
        log,
        child,
        exited: None,
        removed: false,
        stopping: false,
    });
    let n = wait_settled(c, out).await?;
    Ok(format!(
        "{} added to {region}: http://{} (log {}); {n} nodes run",
        node.id,
        node.http,
        c.dir.join(format!("{}.log", node.id)).display()
    ))
}

/// `remove <node>`.
async fn remove(id: &str, c: &mut Cluster, out: &mut Progress) -> Result<String, Abort> {
    let i = find(c, id)?;
    let region = c.members.0[i].node.region.clone();
    let running = active(c);
    if running.len() <= 1 {
        return Err(Abort::Refused(format!(
            "{id} is the cluster's last node; stop the cluster instead (Ctrl-C)"
        )));
    }
    if !running
        .iter()
        .any(|&j| j != i && c.members.0[j].node.region == region)
    {
        return Err(Abort::Refused(format!(
            "{id} is the last node of region {region}: the region's share of every limit would have no node to decide it \
             (its rights would go to other regions, but {region} stays in every node's cluster.regions); \
             add another node first (`levee cluster add --region {region}`), then remove {id}"
        )));
    }
    leave(c, i, out).await?;
    let status = stop(c, i).await?;
    out.line(&format!("stopped {id} ({status})")).await;

    c.members.0[i].removed = true;
    let rest = active(c);
    let before = digests(c, &rest).await?;
    let spec = c.spec.clone();
    write_list(c, &spec)?;
    reload(c, &before, out).await?;
    let n = wait_settled(c, out).await?;
    Ok(format!(
        "{id} removed: it stays in every node's list as removed (its position is never reused); its files stay in {}; {n} nodes run",
        c.dir.display()
    ))
}

/// `restart <node>`.
async fn restart(id: &str, c: &mut Cluster, out: &mut Progress) -> Result<String, Abort> {
    let i = find(c, id)?;
    let status = stop(c, i).await?;
    out.line(&format!("stopped {id} ({status})")).await;
    let m = &mut c.members.0[i];
    let child = super::spawn(&c.exe, &m.node, &m.log, false).map_err(|e| {
        Abort::Failed(format!(
            "{e}; {id} stays stopped (the others run on): `levee cluster restart {id}` again"
        ))
    })?;
    let pid = child.id();
    m.child = child;
    m.exited = None;
    m.stopping = false;
    out.line(&format!("started {id} (pid {pid})")).await;
    let n = wait_settled(c, out).await?;
    Ok(format!("{id} restarted (pid {pid}); {n} nodes run"))
}

/// The member named `id`, one that is in the list.
fn find(c: &Cluster, id: &str) -> Result<usize, Abort> {
    let Some(i) = c.members.0.iter().position(|m| m.node.id == id) else {
        let ids: Vec<&str> = c
            .members
            .0
            .iter()
            .filter(|m| !m.removed)
            .map(|m| m.node.id.as_str())
            .collect();
        return Err(Abort::Refused(format!(
            "no node {id:?} in this cluster (its nodes: {})",
            ids.join(", ")
        )));
    };
    if c.members.0[i].removed {
        return Err(Abort::Refused(format!(
            "{id} was removed already (a removed node's position is never reused: `levee cluster add` lays out a new one)"
        )));
    }
    Ok(i)
}

/// The members that should be running, by index.
fn active(c: &Cluster) -> Vec<usize> {
    (0..c.members.0.len())
        .filter(|&i| c.members.0[i].active())
        .collect()
}

/// Writes every node's configuration with `spec`'s layout as the list, the removed members
/// marked.
fn write_list(c: &Cluster, spec: &levee_node::local_cluster::LocalCluster) -> Result<(), Abort> {
    let list: Vec<Listed> = (0..spec.len())
        .map(|node| Listed {
            node,
            removed: c.members.0.get(node).is_some_and(|m| m.removed),
        })
        .collect();
    spec.write_list(&c.dir, |_, _| None, &list)
        .map(|_| ())
        .map_err(|e| Abort::Failed(format!("cannot write the configurations: {e}")))
}

/// SIGHUP to the nodes of `before` (index, digest before the list was written), and waits
/// until each runs another list.
async fn reload(
    c: &mut Cluster,
    before: &[(usize, Value)],
    out: &mut Progress,
) -> Result<(), Abort> {
    for &(i, _) in before {
        c.members.0[i].signal(rustix::process::Signal::HUP);
    }
    let agent = agent(Duration::from_millis(500));
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut waiting: Vec<usize> = before.iter().map(|(i, _)| *i).collect();
    while !waiting.is_empty() {
        c.members
            .check_alive("during the change")
            .map_err(Abort::Died)?;
        let mut still = Vec::new();
        for &(i, ref was) in before.iter().filter(|(i, _)| waiting.contains(i)) {
            let now = membership(&agent, &c.members.0[i]).await;
            if now.as_ref().is_none_or(|m| m["digest"] == *was) {
                still.push(i);
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            if Instant::now() >= deadline {
                return Err(Abort::Failed(format!(
                    "every node's file has the new list, but {} did not reload it within {SETTLE_TIMEOUT:?}; see {}",
                    ids(c, &waiting),
                    waiting
                        .iter()
                        .map(|&i| c.members.0[i].log.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }
    let all: Vec<usize> = before.iter().map(|(i, _)| *i).collect();
    out.line(&format!("reloaded {} nodes ({})", all.len(), ids(c, &all)))
        .await;
    Ok(())
}

/// Each of `nodes` with the digest of the list it runs now.
async fn digests(c: &Cluster, nodes: &[usize]) -> Result<Vec<(usize, Value)>, Abort> {
    let agent = agent(Duration::from_secs(2));
    let mut out = Vec::new();
    for &i in nodes {
        let m = &c.members.0[i];
        let Some(membership) = membership(&agent, m).await else {
            return Err(Abort::Failed(format!(
                "{} does not answer GET /v1/cluster; nothing was changed",
                m.node.id
            )));
        };
        out.push((i, membership["digest"].clone()));
    }
    Ok(out)
}

/// Waits until every member that should run is ready, sees its list agreed and is not
/// bounded by another, all on one digest; how many they are.
async fn wait_settled(c: &mut Cluster, out: &mut Progress) -> Result<usize, Abort> {
    let agent = agent(Duration::from_millis(500));
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        c.members
            .check_alive("during the change")
            .map_err(Abort::Died)?;
        let nodes = active(c);
        let mut states = Vec::with_capacity(nodes.len());
        for &i in &nodes {
            let m = &c.members.0[i];
            let ready = get(&agent, &format!("http://{}/readyz", m.node.http))
                .await
                .is_ok_and(|(status, _)| status == 200);
            let membership = if ready {
                membership(&agent, m).await
            } else {
                None
            };
            states.push((i, membership));
        }
        // The digest most nodes run: the others are on another list.
        let mut digests: Vec<&Value> = states
            .iter()
            .filter_map(|(_, m)| m.as_ref().map(|m| &m["digest"]))
            .collect();
        digests.sort_by_key(|d| d.to_string());
        let common = digests
            .iter()
            .max_by_key(|d| digests.iter().filter(|e| e == d).count())
            .map(|d| (*d).clone());
        let settled = |m: &Option<Value>| {
            m.as_ref().is_some_and(|m| {
                m["agreed"] == true
                    && m["bounded"] == false
                    && Some(&m["digest"]) == common.as_ref()
            })
        };
        if states.iter().all(|(_, m)| settled(m)) {
            let digest = common.as_ref().map(text).unwrap_or_default();
            out.line(&format!("agreed: digest {digest} on {} nodes", nodes.len()))
                .await;
            return Ok(nodes.len());
        }
        if Instant::now() >= deadline {
            let not: Vec<usize> = states
                .iter()
                .filter(|(_, m)| !settled(m))
                .map(|(i, _)| *i)
                .collect();
            let every: Vec<String> = states
                .iter()
                .map(|(i, m)| {
                    let id = &c.members.0[*i].node.id;
                    match m {
                        None => format!("{id}: not ready"),
                        Some(m) => format!(
                            "{id}: agreed {}, bounded {}, digest {}",
                            m["agreed"],
                            m["bounded"],
                            text(&m["digest"])
                        ),
                    }
                })
                .collect();
            return Err(Abort::Failed(format!(
                "not agreed within {SETTLE_TIMEOUT:?}: {} (every node: {}); the change is written and the nodes run it: \
                 watch GET /v1/cluster, and their logs in {}",
                ids(c, &not),
                every.join("; "),
                c.dir.display()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `POST /admin/leave` on member `i` until it answers 200 (it has handed every right over).
async fn leave(c: &mut Cluster, i: usize, out: &mut Progress) -> Result<(), Abort> {
    let (id, http) = (c.members.0[i].node.id.clone(), c.members.0[i].node.http);
    let agent = agent(LEAVE_WAIT + Duration::from_secs(10));
    let url = format!(
        "http://{http}/admin/leave?wait_ms={}",
        LEAVE_WAIT.as_millis()
    );
    out.line(&format!(
        "{id} is leaving (POST /admin/leave): it hands the rights it holds to the others"
    ))
    .await;
    let deadline = Instant::now() + LEAVE_TIMEOUT;
    let still_leaving = format!(
        "{id} is still leaving (it owns no keys until it restarts); it was neither stopped nor removed: \
         `levee cluster remove {id}` again, or `levee cluster restart {id}` to have it own keys again"
    );
    loop {
        c.members
            .check_alive("during the change")
            .map_err(Abort::Died)?;
        let (status, body) = post(&agent, &url).await.map_err(|e| {
            Abort::Failed(format!(
                "{id} did not answer POST /admin/leave ({e}); {still_leaving}"
            ))
        })?;
        match status {
            200 => {
                out.line(&format!(
                    "{id} left: handed over {} rights",
                    body["handed_over"]
                ))
                .await;
                return Ok(());
            }
            202 => {
                let waiting = body["not_acknowledged"]
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .map(|a| {
                        let ids: Vec<String> = a.iter().map(text).collect();
                        format!("; not acknowledged by {}", ids.join(", "))
                    })
                    .unwrap_or_default();
                out.line(&format!(
                    "{id} still leaving: holds {} rights of {} keys, handed over {} so far{waiting}",
                    body["holding"], body["keys_holding"], body["handed_over"]
                ))
                .await;
                if Instant::now() >= deadline {
                    return Err(Abort::Failed(format!(
                        "{id} did not finish leaving within {LEAVE_TIMEOUT:?}; {still_leaving}"
                    )));
                }
            }
            // The node's request timeout cut the wait short: it goes on leaving.
            503 => {
                out.line(&format!(
                    "{id} still leaving (no answer within its request timeout)"
                ))
                .await;
                if Instant::now() >= deadline {
                    return Err(Abort::Failed(format!(
                        "{id} did not finish leaving within {LEAVE_TIMEOUT:?}; {still_leaving}"
                    )));
                }
            }
            _ => {
                return Err(Abort::Failed(format!(
                    "{id} answered POST /admin/leave with {status}: {}; it was neither stopped nor removed \
                     (should it have started leaving, `levee cluster restart {id}` has it own keys again)",
                    body.get("message").map_or_else(|| body.to_string(), text)
                )));
            }
        }
    }
}

/// Stops member `i` on purpose: SIGTERM, SIGKILL after [`STOP_TIMEOUT`]; its exit status.
async fn stop(c: &mut Cluster, i: usize) -> Result<ExitStatus, Abort> {
    c.members.0[i].stopping = true;
    c.members.0[i].terminate();
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        if let Some(status) = c.members.0[i].poll_exit() {
            return Ok(status);
        }
        c.members
            .check_alive("during the change")
            .map_err(Abort::Died)?;
        if Instant::now() >= deadline {
            let m = &mut c.members.0[i];
            m.kill();
            return m.exited.ok_or_else(|| {
                Abort::Failed(format!(
                    "{} did not exit after SIGTERM nor SIGKILL; the last lines of its log:\n{}",
                    m.node.id,
                    super::tail(&m.log, TAIL_LINES)
                ))
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ids of members `nodes`, comma-separated.
fn ids(c: &Cluster, nodes: &[usize]) -> String {
    nodes
        .iter()
        .map(|&i| c.members.0[i].node.id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A JSON value as text (a string without its quotes).
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// `membership` of the member's `GET /v1/cluster`, if it answers.
async fn membership(agent: &ureq::Agent, m: &Member) -> Option<Value> {
    match get(agent, &format!("http://{}/v1/cluster", m.node.http)).await {
        Ok((200, v)) => Some(v["membership"].clone()).filter(|m| !m.is_null()),
        _ => None,
    }
}

async fn get(agent: &ureq::Agent, url: &str) -> Result<(u16, Value), String> {
    request(agent, false, url).await
}

async fn post(agent: &ureq::Agent, url: &str) -> Result<(u16, Value), String> {
    request(agent, true, url).await
}

/// A request on a blocking thread (the supervisor's runtime keeps reacting to signals and
/// clients meanwhile): the status and the body as JSON (`null` if it is not).
async fn request(agent: &ureq::Agent, post: bool, url: &str) -> Result<(u16, Value), String> {
    let (agent, url) = (agent.clone(), url.to_owned());
    tokio::task::spawn_blocking(move || {
        let answer = if post {
            agent.post(&url).send_empty()
        } else {
            agent.get(&url).call()
        };
        let mut r = answer.map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        let body = r.body_mut().read_to_string().unwrap_or_default();
        Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
    })
    .await
    .map_err(|e| e.to_string())?
}
