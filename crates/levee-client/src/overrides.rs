//! Per-key overrides, allow and deny lists (`/v1/overrides/…`, docs/api.md): a key's own
//! figures instead of its rule's, or a list entry. Written on any node, they reach every node
//! of every region; writing needs the admin token when the nodes have one
//! ([`crate::ClientBuilder::admin_token`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::transport::encode_segment;
use crate::{Client, Error};

/// What `PUT /v1/overrides/{rule}/{key}` sets: one of a limit, a rate and burst, or an
/// action; and an optional `ttl`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Override {
    /// Windows, quotas, sliding logs: the key's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Token and leaky buckets: the key's rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Token and leaky buckets: the key's burst (the node defaults it to `rate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// `allow` or `deny`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// How long it lasts (`"1h"`); forever when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

impl Override {
    /// A window's or a quota's own limit.
    pub fn limit(limit: u64) -> Override {
        Override {
            limit: Some(limit),
            ..Override::default()
        }
    }

    /// A bucket's own rate and burst.
    pub fn rate(rate: u64, burst: Option<u64>) -> Override {
        Override {
            rate: Some(rate),
            burst,
            ..Override::default()
        }
    }

    /// On the allow list: always admitted, not counted.
    pub fn allow() -> Override {
        Override {
            action: Some("allow".into()),
            ..Override::default()
        }
    }

    /// On the deny list: always refused.
    pub fn deny() -> Override {
        Override {
            action: Some("deny".into()),
            ..Override::default()
        }
    }

    /// The same override, disappearing after `ttl` (`"30s"`, `"1h"` …).
    pub fn ttl(mut self, ttl: impl Into<String>) -> Override {
        self.ttl = Some(ttl.into());
        self
    }
}

/// An override as a node answers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OverrideInfo {
    /// The rule.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The key's limit.
    #[serde(default)]
    pub limit: Option<u64>,
    /// The key's rate.
    #[serde(default)]
    pub rate: Option<u64>,
    /// The key's burst.
    #[serde(default)]
    pub burst: Option<u64>,
    /// `allow` or `deny`.
    #[serde(default)]
    pub action: Option<String>,
    /// ms until it disappears.
    #[serde(default)]
    pub expires_in_ms: Option<u64>,
}

#[derive(Deserialize)]
struct OverrideList {
    overrides: Vec<OverrideInfo>,
}

fn path(rule: &str, key: &str) -> String {
    format!(
        "/v1/overrides/{}/{}",
        encode_segment(rule),
        encode_segment(key)
    )
}

impl Client {
    /// Gives `key` of `rule` its own figures, or puts it on a list, from the next decision
    /// on (`PUT /v1/overrides/{rule}/{key}`). Answers the override as stored.
    pub async fn put_override(
        &self,
        rule: &str,
        key: &str,
        value: &Override,
    ) -> Result<OverrideInfo, Error> {
        let body = serde_json::to_vec(value).map_err(|e| Error::Decode(e.to_string()))?;
        let token = self.inner.cfg.admin_token.clone();
        self.attempts(
            http::Method::PUT,
            &path(rule, key),
            None,
            Some(body),
            token,
            Duration::ZERO,
        )
        .await?
        .json()
    }

    /// The override of `key`, `None` if it has none.
    pub async fn get_override(&self, rule: &str, key: &str) -> Result<Option<OverrideInfo>, Error> {
        match self
            .attempts(
                http::Method::GET,
                &path(rule, key),
                None,
                None,
                None,
                Duration::ZERO,
            )
            .await
        {
            Ok(reply) => reply.json().map(Some),
            Err(Error::Api {
                status: 404, code, ..
            }) if code == "not_found" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every override of `rule` in force, by key.
    pub async fn list_overrides(&self, rule: &str) -> Result<Vec<OverrideInfo>, Error> {
        let path = format!("/v1/overrides/{}", encode_segment(rule));
        let list: OverrideList = self
            .attempts(http::Method::GET, &path, None, None, None, Duration::ZERO)
            .await?
            .json()?;
        Ok(list.overrides)
    }

    /// Removes `key`'s override: the rule's own figures apply again.
    pub async fn delete_override(&self, rule: &str, key: &str) -> Result<(), Error> {
        let token = self.inner.cfg.admin_token.clone();
        self.attempts(
            http::Method::DELETE,
            &path(rule, key),
            None,
            None,
            token,
            Duration::ZERO,
        )
        .await
        .map(|_| ())
    }
}
