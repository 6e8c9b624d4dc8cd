//! The rendezvous endpoint (`Endpoint`: HOST:PORT, parsed once, used by
//! run, the agent and doctor), and which network interface reaches its
//! host: the one gloo and NCCL must use for their sockets
//! (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME).
//! The kernel's route decides: connecting a UDP socket sends nothing and
//! picks the source address, and getifaddrs names its interface. Both work
//! inside a network namespace, where /sys/class/net may show another one.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};

/// A rendezvous endpoint: a host (a name or an address; an IPv6 address
/// without its brackets) and a port above 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// `HOST:PORT` (`[ADDR]:PORT` for IPv6), as every node gives it.
    pub(crate) fn parse(s: &str) -> Result<Endpoint, String> {
        let bad = || format!("{s:?}: expected HOST:PORT (e.g. node0:29400)");
        let (host, port) = s.trim().rsplit_once(':').ok_or_else(bad)?;
        let host = host.trim_matches(['[', ']']);
        match port.parse::<u16>() {
            Ok(port) if port > 0 && !host.is_empty() => Ok(Endpoint::new(host, port)),
            _ => Err(bad()),
        }
    }

    pub(crate) fn new(host: &str, port: u16) -> Endpoint {
        Endpoint {
            host: host.to_string(),
            port,
        }
    }

    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Is the host a name (not an address)?
    pub(crate) fn is_named(&self) -> bool {
        self.host.parse::<IpAddr>().is_err()
    }

    /// The addresses the host resolves to, with the port.
    pub(crate) fn addrs(&self) -> std::io::Result<Vec<SocketAddr>> {
        Ok((self.host.as_str(), self.port).to_socket_addrs()?.collect())
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// The variables that name the interface for collectives.
pub(crate) const IFNAME_VARS: [&str; 2] = ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"];

/// Every interface address of this network namespace: (name, address).
pub(crate) fn addresses() -> Vec<(String, IpAddr)> {
    let mut out = vec![];
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_name is a NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: the family says which sockaddr this is.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            let ip = match family {
                libc::AF_INET => {
                    // SAFETY: AF_INET: a sockaddr_in.
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()))
                }
                libc::AF_INET6 => {
                    // SAFETY: AF_INET6: a sockaddr_in6.
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::from(a.sin6_addr.s6_addr))
                }
                _ => None,
            };
            if let Some(ip) = ip {
                out.push((name, ip));
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The interface (and our address on it) through which `host` is reached.
pub(crate) fn route_to(host: &str) -> Option<(String, IpAddr)> {
    let target = (host, 9).to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(target).ok()?;
    let local = s.local_addr().ok()?.ip();
    addresses()
        .into_iter()
        .find(|(_, ip)| *ip == local)
        .map(|(name, _)| (name, local))
}

/// What to do about one IFNAME variable, given the interface that routes to
/// the rendezvous (`want`) and the user's value (`theirs`): Ok(Some(value))
/// to set it, Ok(None) to leave it, Err(warning) for a mismatch.
pub(crate) fn decide(
    var: &str,
    want: &str,
    theirs: Option<&str>,
) -> Result<Option<String>, String> {
    match theirs {
        None => Ok(Some(want.to_string())),
        // gloo and NCCL take a comma list; NCCL a ^/= prefixed one too.
        Some(v)
            if v.trim_start_matches(['^', '='])
                .split(',')
                .any(|x| x == want)
                && !v.starts_with('^') =>
        {
            Ok(None)
        }
        Some(v) => Err(format!(
            "{var}={v}, but the rendezvous host is reached through {want}; collectives may \
             hang or take a slow path (unset it, or set {var}={want})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_once_and_print_as_given() {
        for (text, host, port, back) in [
            ("node0:29400", "node0", 29400, "node0:29400"),
            ("[::1]:29400", "::1", 29400, "[::1]:29400"),
            ("10.0.0.1:1", "10.0.0.1", 1, "10.0.0.1:1"),
        ] {
            let e = Endpoint::parse(text).unwrap();
            assert_eq!(
                (e.host(), e.port(), e.to_string().as_str()),
                (host, port, back)
            );
        }
        assert!(Endpoint::parse("node0:29400").unwrap().is_named());
        assert!(!Endpoint::parse("[::1]:1").unwrap().is_named());
        for bad in [
            "node0",
            "node0:",
            ":29400",
            "node0:0",
            "node0:70000",
            "node0:x",
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(e.contains("expected HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn loopback_routes_through_lo() {
        let (name, ip) = route_to("127.0.0.1").unwrap();
        assert_eq!(name, "lo");
        assert!(ip.is_loopback());
        assert!(addresses().iter().any(|(n, _)| n == "lo"));
    }

    #[test]
    fn set_keep_or_warn() {
        assert_eq!(decide("G", "eth0", None), Ok(Some("eth0".into())));
        assert_eq!(decide("G", "eth0", Some("eth0")), Ok(None));
        assert_eq!(decide("G", "eth0", Some("ib0,eth0")), Ok(None));
        assert_eq!(decide("G", "eth0", Some("=eth0")), Ok(None));
        let w = decide("G", "eth0", Some("ib0")).unwrap_err();
        assert!(w.starts_with("G=ib0, but the rendezvous host is reached through eth0"));
        assert!(decide("G", "eth0", Some("^eth0")).is_err());
    }
}
