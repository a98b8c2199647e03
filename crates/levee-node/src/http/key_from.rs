//! Where `/v1/authz/{rule}` takes a check's key from (the rule's `key_from`): a header, the
//! client's address (believing forwarding headers from trusted proxies only), or a composite
//! of parts of the request the gateway passes on.

use std::borrow::Cow;
use std::net::SocketAddr;

use axum::http::HeaderMap;
use levee_core::rule::KeyPart;

use super::authz::AuthzRequest;
use crate::limiter::ApiError;

/// The key of a composite `key_from`: its parts' values joined with `|`, in order. The
/// original request is the one the gateway passes on: its method from `X-Forwarded-Method`
/// (or `X-Original-Method`, else this request's own), its URI from `X-Forwarded-Uri` (Traefik,
/// Caddy) or `X-Original-URI` (nginx), a query parameter from that URI's query string or else
/// this request's own. A part with no value (or an empty one) is `400 missing_key` naming it.
pub(super) fn composite_key(
    parts: &[KeyPart],
    (method, uri, headers): AuthzRequest<'_>,
    peer: SocketAddr,
    trusted: &[ipnet::IpNet],
) -> Result<String, ApiError> {
    let missing = |part: String, why: &str| ApiError {
        status: 400,
        code: "missing_key",
        message: format!("key_from part {part:?}: {why}"),
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let original_uri = || header("x-forwarded-uri").or_else(|| header("x-original-uri"));
    let mut key = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            key.push('|');
        }
        match part {
            KeyPart::Header(name) => key.push_str(header(name).ok_or_else(|| {
                missing(format!("header:{name}"), "the header is missing or empty")
            })?),
            KeyPart::Ip => key.push_str(&client_ip(headers, peer, trusted)?),
            KeyPart::Method => key.push_str(
                header("x-forwarded-method")
                    .or_else(|| header("x-original-method"))
                    .unwrap_or(method.as_str()),
            ),
            KeyPart::Path => {
                let path = original_uri()
                    .map(|u| u.split(['?', '#']).next().unwrap_or(""))
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| {
                        missing(
                            "path".into(),
                            "no X-Forwarded-Uri or X-Original-URI header gives the request's path",
                        )
                    })?;
                key.push_str(path);
            }
            KeyPart::Query(name) => {
                let from_original = original_uri()
                    .and_then(|u| u.split('#').next()?.split_once('?'))
                    .map(|(_, q)| q);
                let value = [from_original, uri.query()]
                    .into_iter()
                    .flatten()
                    .find_map(|q| {
                        form_urlencoded::parse(q.as_bytes())
                            .find(|(n, _)| n == name.as_str())
                            .map(|(_, v)| v)
                    })
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| {
                        missing(
                            format!("query:{name}"),
                            "the query parameter is missing or empty",
                        )
                    })?;
                key.push_str(&value);
            }
        }
    }
    Ok(key)
}

/// The client's address for `key_from = "ip"`. From a peer in `trusted` (`api.trusted_proxies`)
/// the forwarding headers are believed: `X-Forwarded-For` read right to left past the trusted
/// hops (the first address not trusted is the client's; the leftmost if all are), else
/// `X-Real-IP`, else the peer; an entry that is not an IP address is `400`. From any other peer
/// the headers are ignored and the peer's address is the key, so that a client cannot choose
/// its own bucket.
pub(super) fn client_ip<'a>(
    headers: &'a HeaderMap,
    peer: SocketAddr,
    trusted: &[ipnet::IpNet],
) -> Result<Cow<'a, str>, ApiError> {
    let peer_ip = peer.ip().to_canonical();
    let is_trusted = |ip: &std::net::IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer_ip) {
        return Ok(Cow::Owned(peer_ip.to_string()));
    }
    let parse = |name: &str, entry: &str| {
        entry
            .parse::<std::net::IpAddr>()
            .or_else(|_| entry.parse::<SocketAddr>().map(|a| a.ip()))
            .map(|ip| ip.to_canonical())
            .map_err(|_| {
                ApiError::invalid(format!(
                    "header {name}: {entry:?} is not an IP address (sent by trusted proxy {peer_ip})"
                ))
            })
    };
    let mut forwarded = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let value = value
            .to_str()
            .map_err(|_| ApiError::invalid("header X-Forwarded-For: not a list of IP addresses"))?;
        forwarded.extend(value.split(',').map(str::trim).filter(|e| !e.is_empty()));
    }
    if !forwarded.is_empty() {
        let mut client = peer_ip;
        for entry in forwarded.iter().rev() {
            client = parse("X-Forwarded-For", entry)?;
            if !is_trusted(&client) {
                break;
            }
        }
        return Ok(Cow::Owned(client.to_string()));
    }
    let real = headers
        .get("x-real-ip")
        .map(|v| v.to_str().unwrap_or("\u{fffd}").trim())
        .filter(|v| !v.is_empty());
    match real {
        Some(ip) => Ok(Cow::Owned(parse("X-Real-IP", ip)?.to_string())),
        None => Ok(Cow::Owned(peer_ip.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn forwarding_headers_are_believed_from_trusted_proxies_only() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let proxy: SocketAddr = "10.0.0.9:4000".parse().unwrap();
        let stranger: SocketAddr = "198.51.100.50:4000".parse().unwrap();
        let ip = |h: &HeaderMap, peer| client_ip(h, peer, &trusted).map(|c| c.into_owned());
        let mut h = HeaderMap::new();
        assert_eq!(ip(&h, proxy).unwrap(), "10.0.0.9");
        h.insert("x-real-ip", HeaderValue::from_static("198.51.100.2"));
        assert_eq!(ip(&h, proxy).unwrap(), "198.51.100.2");
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("1.1.1.1, 203.0.113.7, 10.0.0.1"),
        );
        // Right to left past the trusted hops: 10.0.0.1 is a proxy, 203.0.113.7 the client.
        assert_eq!(ip(&h, proxy).unwrap(), "203.0.113.7");
        // From a peer that is not trusted, the headers are ignored.
        assert_eq!(ip(&h, stranger).unwrap(), "198.51.100.50");
        assert_eq!(
            client_ip(&h, proxy, &[]).unwrap(),
            "10.0.0.9",
            "no trusted proxies: the peer"
        );
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("203.0.113.7, not-an-ip"),
        );
        let e = ip(&h, proxy).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("X-Forwarded-For"), "{}", e.message);
        assert_eq!(ip(&h, stranger).unwrap(), "198.51.100.50");
        // An IPv4 peer seen through an IPv6 socket is the same address.
        let mapped: SocketAddr = "[::ffff:10.0.0.9]:4000".parse().unwrap();
        assert_eq!(ip(&HeaderMap::new(), mapped).unwrap(), "10.0.0.9");
    }
}
