//! An async client for a Levee cluster (the HTTP API of `docs/api.md`).
//!
//! - [`Client::check`], [`Client::check_all`], [`Client::batch`], [`Client::refund`],
//!   [`Client::usage`].
//! - Per-key overrides, allow and deny lists: [`Client::put_override`],
//!   [`Client::get_override`], [`Client::list_overrides`], [`Client::delete_override`]
//!   (writing needs [`ClientBuilder::admin_token`] when the nodes have one).
//! - **Owner routing**: the client reads the ring of its region from `GET /v1/cluster`
//!   (`ring`: the region's nodes, their HTTP addresses, which are members) and places each key
//!   with the node's own code ([`levee_cluster::ring::Rings`], the key's own bytes), so each
//!   check goes straight to its key's owner and no node forwards it. The ring is read again
//!   every [`ClientBuilder::ring_refresh`] and after a node fails to answer.
//! - **Retries with idempotency keys**: every logical call gets one generated
//!   `idempotency_key`, sent again on every retry, so a retry whose first attempt was counted
//!   is not charged twice. Connect errors, timeouts and `503` are retried, up to
//!   [`ClientBuilder::retries`] times, with exponential backoff, each time on the next node
//!   (the key's owner first, then the other nodes of the region, then the nodes given; a node
//!   that could not be reached is not tried again in the same call).
//! - **Fallback** when no node answers in time ([`Fallback`]): an error, allow, deny, or a
//!   local token bucket per key from the rule's figures (read from `GET /v1/rules`).
//! - [`layer::RateLimitLayer`]: a `tower::Layer` that rate-limits a service by a key taken
//!   from each request, answering `429` with the rate-limit headers.
//!
//! Plain HTTP only (HTTP/1.1, pooled connections): put Levee's listener on a private network
//! or behind a TLS terminator.

mod fallback;
pub mod layer;
mod overrides;
mod ring;
mod transport;
mod types;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use fallback::LocalCap;
pub use overrides::{Override, OverrideInfo};
pub use ring::RegionRing;
use ring::RingState;
use transport::{Reply, Transport};
pub use types::{Check, Decision, Source, Usage};

/// What a call answers when no node answered in time (after every retry).
#[derive(Debug, Clone, PartialEq)]
pub enum Fallback {
    /// Return [`Error::Unavailable`] (the default): the caller decides.
    Error,
    /// Allow: availability over the limit.
    FailOpen,
    /// Deny: the limit over availability.
    FailClosed,
    /// Decide on this process's own, with a token bucket per key holding `fraction` of the
    /// rule's figures (capacity and refill), at most `max_keys` keys (the least recently used
    /// forgotten first). The figures come from `GET /v1/rules`, read with the ring; a rule
    /// never read is denied.
    LocalCap {
        /// Share of the rule's global figures this process may grant alone, in (0, 1].
        fraction: f64,
        /// Keys remembered.
        max_keys: usize,
    },
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node refused the request (4xx): `error` and `message` as it answered.
    #[error("{status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The API's error code, e.g. `invalid_request`, `unknown_rule`.
        code: String,
        /// What was wrong.
        message: String,
    },
    /// No node answered in time, and the fallback is [`Fallback::Error`].
    #[error("no Levee node answered: {0}")]
    Unavailable(String),
    /// The answer could not be read.
    #[error("unreadable answer: {0}")]
    Decode(String),
    /// The client was built wrong (no node, a bad address).
    #[error("client configuration: {0}")]
    Config(String),
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    seeds: Vec<String>,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
    fallback: Fallback,
    routing: bool,
    ring_refresh: Duration,
    refund_token: Option<String>,
    admin_token: Option<String>,
}

impl ClientBuilder {
    /// One node's address (`http://127.0.0.1:8750` or `127.0.0.1:8750`); more with
    /// [`ClientBuilder::node`]. With routing on, the others of its region are learned.
    pub fn node(mut self, url: impl Into<String>) -> ClientBuilder {
        self.seeds.push(url.into());
        self
    }

    /// How long one attempt may take (default 1 s: above a node's own 500 ms wait for a key's
    /// owner, after which it decides alone, so a node that lost its owner still answers).
    pub fn timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// Retries after the first attempt (default 2) on connect errors, timeouts and `503`.
    pub fn retries(mut self, retries: u32) -> ClientBuilder {
        self.retries = retries;
        self
    }

    /// The first backoff, doubled on each retry (default 20 ms).
    pub fn backoff(mut self, backoff: Duration) -> ClientBuilder {
        self.backoff = backoff;
        self
    }

    /// What to answer when no node answers (default [`Fallback::Error`]).
    pub fn fallback(mut self, fallback: Fallback) -> ClientBuilder {
        self.fallback = fallback;
        self
    }

    /// Owner routing on (the default) or off (every call goes to the first node given; the
    /// node forwards each check to its owner).
    pub fn owner_routing(mut self, on: bool) -> ClientBuilder {
        self.routing = on;
        self
    }

    /// How often the ring is read again (default 5 s); also after a node fails to answer.
    pub fn ring_refresh(mut self, every: Duration) -> ClientBuilder {
        self.ring_refresh = every;
        self
    }

    /// The bearer token of the admin endpoints this client calls (writing and deleting
    /// overrides: `api.admin_token`).
    pub fn admin_token(mut self, token: impl Into<String>) -> ClientBuilder {
        self.admin_token = Some(token.into());
        self
    }

    /// `Authorization: Bearer` token sent with refunds (`api.refund_token`).
    pub fn refund_token(mut self, token: impl Into<String>) -> ClientBuilder {
        self.refund_token = Some(token.into());
        self
    }

    /// The client. Nothing is contacted before the first call.
    pub fn build(self) -> Result<Client, Error> {
        if self.seeds.is_empty() {
            return Err(Error::Config("no node given".into()));
        }
        let seeds = self
            .seeds
            .iter()
            .map(|s| transport::base_url(s))
            .collect::<Result<Vec<_>, _>>()?;
        if let Fallback::LocalCap { fraction, max_keys } = self.fallback
            && (!(fraction > 0.0 && fraction <= 1.0) || max_keys == 0)
        {
            return Err(Error::Config(
                "LocalCap: fraction must be in (0, 1] and max_keys above 0".into(),
            ));
        }
        let cap = match self.fallback {
            Fallback::LocalCap { fraction, max_keys } => Some(LocalCap::new(fraction, max_keys)),
            _ => None,
        };
        Ok(Client {
            inner: Arc::new(Inner {
                transport: Transport::new(self.timeout),
                ring: RingState::new(seeds),
                cap,
                cfg: self,
            }),
        })
    }
}

/// A Levee client; cheap to clone (one connection pool and ring, shared).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    ring: RingState,
    cap: Option<LocalCap>,
    cfg: ClientBuilder,
}

#[derive(Serialize)]
struct AllBody<'a> {
    all: Vec<AllEntry<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<u64>,
    idempotency_key: &'a str,
}

#[derive(Serialize)]
struct AllEntry<'a> {
    rule: &'a str,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    class: Option<&'a str>,
}

#[derive(Serialize)]
struct BatchBody<'a> {
    checks: &'a [Check],
}

#[derive(Deserialize)]
struct BatchAnswer {
    results: Vec<Decision>,
}

impl Client {
    /// A builder with the defaults.
    pub fn builder() -> ClientBuilder {
        ClientBuilder {
            seeds: Vec::new(),
            timeout: Duration::from_secs(1),
            retries: 2,
            backoff: Duration::from_millis(20),
            fallback: Fallback::Error,
            routing: true,
            ring_refresh: Duration::from_secs(5),
            refund_token: None,
            admin_token: None,
        }
    }

    /// One decision, sent to the key's owner.
    pub async fn check(&self, check: &Check) -> Result<Decision, Error> {
        let mut check = check.clone();
        check
            .idempotency_key
            .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
        let body = serde_json::to_vec(&check).map_err(|e| Error::Decode(e.to_string()))?;
        let wait = Duration::from_millis(check.max_wait_ms.unwrap_or(0));
        match self
            .send("/v1/check", Some(&check.key), body, None, wait)
            .await
        {
            Ok(reply) => reply.decision(),
            Err(Error::Unavailable(why)) => self.fall_back(&check, why),
            Err(e) => Err(e),
        }
    }

    /// Several limits that must all hold (`all`): nothing is consumed unless every entry
    /// allows. Sent to the owner of the first entry's key (an `all` call is decided where it
    /// arrives). The fallback decides each entry and allows only if all allow.
    pub async fn check_all(&self, entries: &[Check], cost: Option<u64>) -> Result<Decision, Error> {
        let key = uuid::Uuid::new_v4().to_string();
        let body = AllBody {
            all: entries
                .iter()
                .map(|c| AllEntry {
                    rule: &c.rule,
                    key: &c.key,
                    class: c.class.as_deref(),
                })
                .collect(),
            cost,
            idempotency_key: &key,
        };
        let body = serde_json::to_vec(&body).map_err(|e| Error::Decode(e.to_string()))?;
        let route = entries.first().map(|c| c.key.as_str());
        match self
            .send("/v1/check", route, body, None, Duration::ZERO)
            .await
        {
            Ok(reply) => reply.decision(),
            Err(Error::Unavailable(why)) => {
                // Atomic like the node's: every entry decided without consuming, then
                // consumed only if all allow.
                let entries: Vec<Check> = entries
                    .iter()
                    .map(|c| Check {
                        cost: cost.or(c.cost),
                        ..c.clone()
                    })
                    .collect();
                let mut results = Vec::with_capacity(entries.len());
                for c in &entries {
                    let probe = Check {
                        dry_run: true,
                        ..c.clone()
                    };
                    results.push(self.fall_back(&probe, why.clone())?);
                }
                if results.iter().all(|d| d.allowed) {
                    results.clear();
                    for c in &entries {
                        results.push(self.fall_back(c, why.clone())?);
                    }
                }
                let allowed = results.iter().all(|d| d.allowed);
                let binding = results
                    .iter()
                    .find(|d| !d.allowed)
                    .or(results.first())
                    .cloned();
                let mut top = binding.unwrap_or_else(|| Decision::fallback("", "", allowed, 0, 0));
                top.allowed = allowed;
                top.results = Some(results);
                Ok(top)
            }
            Err(e) => Err(e),
        }
    }

    /// Many independent decisions in one request per owner: the checks are grouped by their
    /// key's owner, each group sent to its owner, and the answers put back in the given order.
    pub async fn batch(&self, checks: &[Check]) -> Result<Vec<Decision>, Error> {
        let mut checks = checks.to_vec();
        for c in &mut checks {
            c.idempotency_key
                .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
        }
        let groups = self.inner.ring.group(&checks, self).await;
        let mut out: Vec<Option<Decision>> = vec![None; checks.len()];
        for (first, idx) in groups {
            let group: Vec<Check> = idx.iter().map(|&i| checks[i].clone()).collect();
            let wait = Duration::from_millis(
                group
                    .iter()
                    .filter_map(|c| c.max_wait_ms)
                    .max()
                    .unwrap_or(0),
            );
            let body = serde_json::to_vec(&BatchBody { checks: &group })
                .map_err(|e| Error::Decode(e.to_string()))?;
            match self
                .send(
                    "/v1/check/batch",
                    Some(&checks[first].key),
                    body,
                    None,
                    wait,
                )
                .await
            {
                Ok(reply) => {
                    let answer: BatchAnswer = reply.json()?;
                    if answer.results.len() != idx.len() {
                        return Err(Error::Decode(format!(
                            "{} results for {} checks",
                            answer.results.len(),
                            idx.len()
                        )));
                    }
                    for (i, d) in idx.into_iter().zip(answer.results) {
                        out[i] = Some(d);
                    }
                }
                Err(Error::Unavailable(why)) => {
                    for i in idx {
                        out[i] = Some(self.fall_back(&checks[i], why.clone())?);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Gives `cost` tokens back (the request failed on the server's side). Retried with one
    /// idempotency key, so it is never refunded twice. No fallback: an unanswered refund is
    /// [`Error::Unavailable`].
    pub async fn refund(&self, check: &Check) -> Result<Decision, Error> {
        let mut check = check.clone();
        check.dry_run = false;
        check
            .idempotency_key
            .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
        let body = serde_json::to_vec(&check).map_err(|e| Error::Decode(e.to_string()))?;
        let token = self.inner.cfg.refund_token.clone();
        self.send("/v1/refund", Some(&check.key), body, token, Duration::ZERO)
            .await?
            .decision()
    }

    /// The converged view of a key (`GET /v1/usage/{rule}/{key}`), from the key's owner.
    pub async fn usage(&self, rule: &str, key: &str) -> Result<Usage, Error> {
        let path = format!(
            "/v1/usage/{}/{}",
            transport::encode_segment(rule),
            transport::encode_segment(key)
        );
        self.get(&path, Some(key)).await?.json()
    }

    /// The node an owner-routed call for `key` goes to now (its base URL), reading the ring
    /// first if it is stale.
    pub async fn node_for(&self, key: &str) -> String {
        self.inner.ring.targets(Some(key), self).await.remove(0)
    }

    fn fall_back(&self, check: &Check, why: String) -> Result<Decision, Error> {
        match &self.inner.cfg.fallback {
            Fallback::Error => Err(Error::Unavailable(why)),
            Fallback::FailOpen => Ok(Decision::fallback(&check.rule, &check.key, true, 0, 0)),
            Fallback::FailClosed => Ok(Decision::fallback(&check.rule, &check.key, false, 0, 0)),
            Fallback::LocalCap { .. } => {
                let cap = self.inner.cap.as_ref().expect("built with LocalCap");
                let (allowed, remaining, limit) = cap.take(
                    &check.rule,
                    &check.key,
                    check.cost.unwrap_or(1),
                    check.dry_run,
                );
                Ok(Decision::fallback(
                    &check.rule,
                    &check.key,
                    allowed,
                    remaining,
                    limit,
                ))
            }
        }
    }

    async fn get(&self, path: &str, route: Option<&str>) -> Result<Reply, Error> {
        self.attempts(http::Method::GET, path, route, None, None, Duration::ZERO)
            .await
    }

    async fn send(
        &self,
        path: &str,
        route: Option<&str>,
        body: Vec<u8>,
        token: Option<String>,
        wait: Duration,
    ) -> Result<Reply, Error> {
        self.attempts(http::Method::POST, path, route, Some(body), token, wait)
            .await
    }

    /// The first attempt on the route's node, the retries on the next ones, with backoff.
    async fn attempts(
        &self,
        method: http::Method,
        path: &str,
        route: Option<&str>,
        body: Option<Vec<u8>>,
        token: Option<String>,
        wait: Duration,
    ) -> Result<Reply, Error> {
        let mut targets = self.inner.ring.targets(route, self).await;
        let mut next = 0;
        let mut backoff = self.inner.cfg.backoff;
        let mut failures: Vec<String> = Vec::new();
        for attempt in 0..=self.inner.cfg.retries {
            if attempt > 0 {
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2);
            }
            next %= targets.len();
            let base = targets[next].clone();
            let started = Instant::now();
            match self
                .inner
                .transport
                .request(
                    method.clone(),
                    &base,
                    path,
                    body.clone(),
                    token.as_deref(),
                    wait,
                )
                .await
            {
                Ok(reply) if reply.status == 503 => {
                    failures.push(format!("{base}: 503 unavailable"));
                    next += 1;
                }
                Ok(reply) if reply.status >= 400 => return Err(reply.error()),
                Ok(reply) => return Ok(reply),
                Err(e) => {
                    failures.push(format!("{base}: {e} after {:?}", started.elapsed()));
                    self.inner.ring.mark_stale();
                    // Not tried again in this call while another node is left.
                    if targets.len() > 1 {
                        targets.remove(next);
                    } else {
                        next += 1;
                    }
                }
            }
        }
        Err(Error::Unavailable(failures.join("; ")))
    }

    fn routing(&self) -> bool {
        self.inner.cfg.routing
    }

    fn ring_refresh(&self) -> Duration {
        self.inner.cfg.ring_refresh
    }

    fn wants_rules(&self) -> bool {
        self.inner.cap.is_some()
    }

    fn cap(&self) -> Option<&LocalCap> {
        self.inner.cap.as_ref()
    }

    fn transport(&self) -> &Transport {
        &self.inner.transport
    }
}
