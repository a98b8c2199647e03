//! Threshold notices (`[[notify]]`): when a key's use of its limit crosses a configured
//! fraction, a JSON notice is POSTed to a webhook, once per (rule, key, threshold, window) per
//! region, with an `Idempotency-Key` every node and region computes alike.
//!
//! Two halves that share only a bounded channel:
//!
//! * the watch ([`Notices`], `watch.rs`), called by the limiter after each decision it makes
//!   (`Notices::observe`): arithmetic, a bounded set of crossings already noticed, and a
//!   `try_send`. It never waits, never does I/O, and drops (and counts) what does not fit;
//! * the sender (`sender.rs`), a task started and stopped with the server: it POSTs each
//!   notice, retrying with backoff on a failure or a timeout for up to [`RETRY_FOR`], and
//!   counts the outcome in `levee_notices_total{result="sent|failed|dropped"}`.
//!
//! What a notice says and its window are in `notice.rs`.

mod notice;
mod sender;
mod watch;

use std::time::Duration;

use axum::http;

pub use notice::{Notice, idempotency_key, window_start_ms};
pub use sender::{MAX_IN_FLIGHT, run};
pub use watch::{Notices, Queued, SEEN_CAPACITY};

/// How long a notice is retried before it counts as `failed`.
pub const RETRY_FOR: Duration = Duration::from_secs(60);

/// Checks a `[[notify]] url`: an absolute `http://` URL with a host. `https://` is refused
/// (the node carries no TLS client for webhooks; send through a local TLS proxy).
pub fn check_url(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{url:?}: https is not supported; use an http:// URL (a local TLS proxy)"
            ));
        }
        _ => return Err(format!("{url:?} must start with http://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn only_absolute_http_urls_are_accepted() {
        assert!(check_url("http://127.0.0.1:9000/hooks/levee").is_ok());
        assert!(check_url("http://hooks.example/levee?x=1").is_ok());
        for bad in [
            "",
            "hooks/levee",
            "ftp://x/",
            "https://x/",
            "http://",
            "not a url",
        ] {
            assert!(check_url(bad).is_err(), "{bad:?} accepted");
        }
    }
}
