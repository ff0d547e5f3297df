//! Where a sink may deliver: never, by default, to an address inside outboxd's own network —
//! loopback, private ranges, link-local (cloud metadata services among them), unique local,
//! site-local, carrier-grade NAT, benchmarking, reserved, unspecified, multicast, and IPv6
//! addresses that embed one of those (IPv4-mapped and -compatible, NAT64, 6to4; Teredo
//! always) — unless the operator allows it
//! (`--sink-allow-private`). A sink's creator chooses its URL, so without this check a sink is
//! a way to make outboxd reach internal services and to scan their ports (ADR 0053).
//!
//! The check is made on the addresses a name resolves to, at connect time: the webhook client
//! resolves through [`GuardedResolver`], so a name that resolves to a public address when the
//! sink is created and to an internal one later (DNS rebinding) is refused at the connection
//! it would make. RabbitMQ and NATS clients resolve names themselves: their URL's addresses
//! are checked just before each connection (a rebinding in the milliseconds between the two
//! look-ups is not closed for those two kinds), and a NATS client never follows the servers its
//! server advertises.
use std::net::{IpAddr, SocketAddr};

/// The destinations sinks may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destinations {
    /// Allow loopback, private and link-local addresses (tests, a broker beside outboxd).
    pub allow_private: bool,
    /// Internal networks that sinks may reach all the same (`--sink-allow 10.1.0.0/16`): a
    /// broker inside the operator's network, without opening every internal address.
    pub allowed: std::sync::Arc<[ipnet::IpNet]>,
}

impl Destinations {
    /// Every internal address allowed (tests, a broker on this host).
    pub fn anywhere() -> Self {
        Self { allow_private: true, allowed: std::sync::Arc::new([]) }
    }

    /// Why `ip` may not be reached, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        if self.allow_private || self.allowed.iter().any(|net| net.contains(&ip)) {
            return None;
        }
        internal(ip)
    }

    /// Checks every address `url`'s host resolves to (a literal address as it is).
    pub async fn check_url(&self, url: &str) -> Result<(), String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("the sink's URL does not parse: {e}"))?;
        let port = parsed.port_or_known_default().unwrap_or(0);
        let addrs: Vec<IpAddr> = match parsed.host() {
            Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
            Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
            Some(url::Host::Domain(d)) => tokio::net::lookup_host((d, port))
                .await
                .map_err(|e| format!("resolving the sink's host: {e}"))?
                .map(|a| a.ip())
                .collect(),
            None => return Err("the sink's URL has no host".into()),
        };
        for ip in addrs {
            if let Some(why) = self.refusal(ip) {
                return Err(refused(why));
            }
        }
        Ok(())
    }
}

pub(crate) fn refused(why: &str) -> String {
    format!(
        "the sink's destination is {why}, which sinks may not reach (outboxd --sink-allow NETWORK allows a \
         network, --sink-allow-private every internal address)"
    )
}

/// What kind of internal address `ip` is, if it is one.
fn internal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if v4.is_loopback() {
                Some("a loopback address")
            } else if v4.is_private() {
                Some("a private address")
            } else if v4.is_link_local() {
                Some("a link-local address (cloud metadata services live there)")
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                Some("a carrier-grade NAT address")
            } else if v4.is_unspecified() || o[0] == 0 {
                Some("an unspecified address")
            } else if v4.is_multicast() || v4.is_broadcast() {
                Some("a multicast or broadcast address")
            } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
                // 198.18.0.0/15, RFC 2544: networks often number internal test beds from it.
                Some("a benchmarking address (198.18.0.0/15)")
            } else if o[0] >= 240 {
                Some("a reserved address (240.0.0.0/4)")
            } else if (o[0], o[1], o[2]) == (192, 0, 0) {
                Some("an IETF protocol assignment (192.0.0.0/24)")
            } else if matches!((o[0], o[1], o[2]), (192, 0, 2) | (198, 51, 100) | (203, 0, 113)) {
                Some("a documentation address (TEST-NET)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal(IpAddr::V4(v4));
            }
            let seg = v6.segments();
            let first = seg[0];
            let embedded = |hi: u16, lo: u16| std::net::Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
            // Addresses that carry an IPv4 address inside them reach that address through a
            // translator or a tunnel: they are judged by it, so that `64:ff9b::10.0.0.1` or
            // `2002:0a00:0001::` is no way around the IPv4 rules above.
            if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                // NAT64's well-known prefix, 64:ff9b::/96 (RFC 6052).
                return internal(IpAddr::V4(embedded(seg[6], seg[7])));
            }
            if first == 0x2002 {
                // 6to4, 2002::/16 (RFC 3056): the IPv4 address is bits 16 to 47.
                return internal(IpAddr::V4(embedded(seg[1], seg[2])));
            }
            if seg[..6] == [0, 0, 0, 0, 0, 0] && !v6.is_loopback() && !v6.is_unspecified() {
                // ::a.b.c.d, IPv4-compatible (deprecated by RFC 4291): no route should carry
                // it, and a stack that still maps it reaches the IPv4 address.
                return Some("an IPv4-compatible address (::a.b.c.d, deprecated)");
            }
            if seg[..6] == [0, 0, 0, 0, 0xffff, 0] {
                // ::ffff:0:a.b.c.d, IPv4-translated (SIIT, RFC 2765).
                return internal(IpAddr::V4(embedded(seg[6], seg[7])));
            }
            if (seg[4] & 0xfdff, seg[5]) == (0, 0x5efe) {
                // ISATAP (RFC 5214): the interface id carries the IPv4 address of the tunnel's end.
                if let Some(why) = internal(IpAddr::V4(embedded(seg[6], seg[7]))) {
                    return Some(why);
                }
            }
            if (first, seg[1]) == (0x2001, 0xdb8) {
                return Some("a documentation address (2001:db8::/32)");
            }
            if (first, seg[1], seg[2]) == (0x2001, 2, 0) {
                return Some("a benchmarking address (2001:2::/48)");
            }
            if (first, seg[1]) == (0x64, 0xff9b) && seg[2] == 1 {
                // 64:ff9b:1::/48, NAT64 for local use (RFC 8215): the translator is inside.
                return Some("a local-use NAT64 address (64:ff9b:1::/48)");
            }
            if (first, seg[1]) == (0x2001, 0) {
                // Teredo, 2001::/32 (RFC 4380): its IPv4 server and client are obfuscated in it.
                return Some("a Teredo tunnel address (2001::/32)");
            }
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("an unspecified address")
            } else if (first & 0xfe00) == 0xfc00 {
                Some("a unique local address")
            } else if (first & 0xffc0) == 0xfe80 {
                Some("a link-local address")
            } else if (first & 0xffc0) == 0xfec0 {
                Some("a site-local address (fec0::/10, deprecated)")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else {
                None
            }
        }
    }
}

/// The webhook client's resolver: the system's answer, without the addresses that
/// [`Destinations`] refuses; a name left with none fails to resolve, naming why.
#[derive(Debug, Clone)]
pub struct GuardedResolver(pub Destinations);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let destinations = self.0.clone();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let mut why = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match destinations.refusal(a.ip()) {
                    Some(w) => {
                        why = Some(w);
                        false
                    }
                    None => true,
                })
                .collect();
            if allowed.is_empty() {
                let message = refused(why.unwrap_or("not resolvable"));
                return Err(Box::<dyn std::error::Error + Send + Sync>::from(message));
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn internal_addresses_are_refused_in_every_spelling_unless_allowed() {
        let d = Destinations::default();
        for url in [
            "http://127.0.0.1:9/x",
            "http://127.0.0.2/x",
            "http://2130706433/x",
            "http://0x7f.1/x",
            "http://[::1]/x",
            "http://[::ffff:127.0.0.1]/x",
            "https://169.254.169.254/latest/meta-data",
            "amqp://10.0.0.5:5672/%2f",
            "nats://192.168.1.1:4222",
            "nats://172.16.0.1:4222",
            "http://[fd00::1]/x",
            "http://100.64.0.1/x",
            "http://0.0.0.0/x",
            "http://localhost:8080/x",
            // Addresses that embed an internal IPv4 address, and the ranges no classification
            // covered before.
            "http://[::127.0.0.1]/x",
            "http://[::a00:1]/x",
            "http://[64:ff9b::10.0.0.1]/x",
            "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
            "http://[64:ff9b:1::1]/x",
            "http://[2002:a00:1::]/x",
            "http://[2002:7f00:1::1]/x",
            "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/x",
            "http://[fec0::1]/x",
            "http://198.18.0.1/x",
            "http://198.19.255.254/x",
            "http://240.0.0.1/x",
            "http://192.0.0.8/x",
            "http://[::ffff:0:10.0.0.1]/x",
            "http://[2a00:1450::5efe:a00:1]/x",
            "http://[2001:db8::1]/x",
            "http://[2001:2::1]/x",
            "http://192.0.2.1/x",
            "http://203.0.113.9/x",
        ] {
            let e = d.check_url(url).await.unwrap_err();
            assert!(e.contains("--sink-allow-private"), "{url}: {e}");
        }
        assert!(d.check_url("https://93.184.215.14/hook").await.is_ok());
        // The same public address through NAT64 or 6to4 stays reachable.
        assert!(d.check_url("https://[64:ff9b::5db8:d70e]/hook").await.is_ok());
        assert!(d.check_url("https://[2002:5db8:d70e::1]/hook").await.is_ok());
        assert!(d.check_url("https://198.20.0.1/hook").await.is_ok(), "just past 198.18.0.0/15");
        assert!(d.check_url("https://[2a00:1450::5efe:5db8:d70e]/hook").await.is_ok(), "ISATAP to a public address");
        assert!(Destinations::anywhere().check_url("http://127.0.0.1:9/x").await.is_ok());
        let one_net = Destinations { allow_private: false, allowed: vec!["10.1.0.0/16".parse().unwrap()].into() };
        assert!(one_net.check_url("amqp://10.1.2.3:5672/%2f").await.is_ok(), "inside the allowed network");
        assert!(one_net.check_url("amqp://10.2.0.1:5672/%2f").await.is_err(), "another private network");
        assert!(one_net.check_url("http://169.254.169.254/").await.is_err());
    }
}
