//! The netlink transport and host facts: interface addresses (IPv6 detection); addresses, ip
//! rules and routes via rtnetlink with plain parameters ([`routes`], no `ip` subprocess, no
//! policy: which routes a capture needs is `apply`'s decision); nf_tables transactions over
//! nfnetlink ([`nft_batch`]), reading them back ([`nft_dump`]) and ipset names ([`ipset`]); the
//! nfnetlink numbers these write themselves, once ([`nf_kernel`]). This room owns the wire format — netlink and nfnetlink headers,
//! batch framing, sequence numbers, one socket per transaction, the kernel's answers — and frames
//! whatever neutral description it is given (message kind, flags, family, netlink-packet-core
//! attributes).
//! Also the real address probe of the host /proc netns scan ([`AddressProbe`], [`find_pod_netns`]).
//! May call: `netns` (sending from inside a pod's user namespace; the /proc scan).

use std::net::IpAddr;

/// The address Istio treats as the host (or pod) IP, and whether IPv6 rules are needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIp {
    pub addr: IpAddr,
    pub ipv6: bool,
}

fn usable(addr: IpAddr) -> Option<IpAddr> {
    let addr = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        v4 => v4,
    };
    let link_local = match addr {
        IpAddr::V4(a) => {
            a.is_link_local() || (a.octets()[0] == 224 && a.octets()[1] == 0 && a.octets()[2] == 0)
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xff0f) == 0xff02
        }
    };
    (!addr.is_loopback() && !link_local).then_some(addr)
}

/// Picks the host IP from addresses in kernel order, as Istio does: skip loopback and link-local;
/// without dual stack the first address decides; with dual stack IPv6 is on if any IPv6 address
/// comes (the host IP is still the first one).
pub fn pick_host_ip(addrs: impl IntoIterator<Item = IpAddr>, dual_stack: bool) -> Option<HostIp> {
    let mut first: Option<IpAddr> = None;
    for addr in addrs.into_iter().filter_map(usable) {
        let first_addr = *first.get_or_insert(addr);
        if !dual_stack {
            return Some(HostIp {
                addr: first_addr,
                ipv6: first_addr.is_ipv6(),
            });
        }
        if addr.is_ipv6() {
            return Some(HostIp {
                addr: first_addr,
                ipv6: true,
            });
        }
    }
    first.map(|addr| HostIp { addr, ipv6: false })
}

/// The interface addresses of the calling thread's network namespace, in kernel order.
pub fn interface_addresses() -> std::io::Result<Vec<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
    Ok(addrs
        .filter_map(|ifa| {
            let sa = ifa.address?;
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect())
}

/// The real effects of a host /proc netns scan ([`crate::netns::procfs::scan`]): open the netns,
/// read its interface addresses from a thread inside it, and compare them with the pod's IPs.
pub struct AddressProbe;

impl crate::netns::procfs::NetnsProbe for AddressProbe {
    type Handle = crate::netns::Netns;
    fn open(
        &self,
        path: &std::path::Path,
    ) -> Result<crate::netns::Netns, crate::netns::NetnsError> {
        crate::netns::Netns::open(path)
    }
    fn has_any_ip(&self, netns: &crate::netns::Netns, ips: &[IpAddr]) -> std::io::Result<bool> {
        let addrs = addresses_in(netns)?;
        Ok(addrs
            .iter()
            .any(|a| ips.iter().any(|b| crate::netns::procfs::same_ip(*a, *b))))
    }
}

/// The interface addresses inside `netns`, read from a thread in it (the one reading shared by
/// the /proc scan and the agent's check of a netns the plugin names).
pub fn addresses_in(netns: &crate::netns::Netns) -> std::io::Result<Vec<IpAddr>> {
    netns
        .run(interface_addresses)
        .map_err(std::io::Error::other)?
}

/// Finds the netns of each wanted pod (uid -> its IPs) under the host /proc `reserved` was
/// identified under, never a reserved one; pods not found, or without IPs yet, are absent from
/// the answer. `Err` (why) when the reserved namespaces are unknown: nothing is taken.
pub fn find_pod_netns(
    reserved: &crate::netns::reserved::Reserved,
    wanted: &std::collections::HashMap<String, Vec<IpAddr>>,
) -> Result<
    std::collections::HashMap<String, crate::netns::Netns>,
    crate::netns::reserved::Unidentified,
> {
    crate::netns::procfs::scan(reserved, wanted, &AddressProbe)
}

/// Detects the host IP of the calling thread's network namespace.
pub fn detect_host_ip(dual_stack: bool) -> std::io::Result<Option<HostIp>> {
    Ok(pick_host_ip(interface_addresses()?, dual_stack))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn first_usable_address_decides_without_dual_stack() {
        let got =
            pick_host_ip(ips(&["127.0.0.1", "fe80::1", "10.0.0.2", "fd00::2"]), false).unwrap();
        assert_eq!(
            got,
            HostIp {
                addr: "10.0.0.2".parse().unwrap(),
                ipv6: false
            }
        );
        let got = pick_host_ip(ips(&["::1", "fd00::2", "10.0.0.2"]), false).unwrap();
        assert!(got.ipv6);
    }

    #[test]
    fn dual_stack_turns_ipv6_on_when_any_ipv6_follows() {
        let got = pick_host_ip(ips(&["10.0.0.2", "fd00::2"]), true).unwrap();
        assert_eq!(
            got,
            HostIp {
                addr: "10.0.0.2".parse().unwrap(),
                ipv6: true
            }
        );
        assert!(!pick_host_ip(ips(&["10.0.0.2"]), true).unwrap().ipv6);
    }

    #[test]
    fn no_usable_address() {
        assert_eq!(
            pick_host_ip(ips(&["127.0.0.1", "169.254.1.1", "fe80::1"]), false),
            None
        );
    }
}

thread_local! {
    /// This thread's netlink receive buffer, kept between requests.
    static REPLY_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `read` with this thread's receive buffer: empty, with room for at least `capacity` bytes,
/// kept between requests. Nothing is zero-filled: `recv` writes into the spare room and only what
/// it wrote is read, so only the pages replies ever reached are resident. A fresh zeroed 32-64 KiB
/// buffer per request was a visible share of the agent's CPU (allocated, zeroed, faulted in,
/// returned). A nested use gets a buffer of its own.
fn with_reply_buffer<T>(capacity: usize, read: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let mut buf = REPLY_BUFFER.with(|b| std::mem::take(&mut *b.borrow_mut()));
    buf.clear();
    buf.reserve(capacity);
    let out = read(&mut buf);
    buf.clear();
    REPLY_BUFFER.with(|b| *b.borrow_mut() = buf);
    out
}

pub mod ipset;
pub mod nf_kernel;
pub mod nfnl;
pub mod nft_batch;
pub mod nft_dump;
pub mod routes;
