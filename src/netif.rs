//! Which network interface reaches the rendezvous host: the one gloo and
//! NCCL must use for their sockets (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME).
//! The kernel's route decides: connecting a UDP socket sends nothing and
//! picks the source address, and getifaddrs names its interface. Both work
//! inside a network namespace, where /sys/class/net may show another one.

use std::net::{IpAddr, ToSocketAddrs, UdpSocket};

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
