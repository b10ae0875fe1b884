//! rtnetlink requests in the calling thread's network namespace: addresses, `ip rule fwmark`
//! policy rules and local default routes, with plain parameters (which mark, table, family and
//! address is the caller's decision). A [`RouteSession`] holds one socket for a group of requests,
//! opened on the first request only, and checks that every answer carries its request's sequence
//! number. The rule values it adds and lists live in `rule`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::RuleMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

mod rule;
use rule::fwmark_rule;
pub use rule::{MarkRule, PolicyRule, TABLE_LOCAL, TABLE_MAIN};

/// A netlink request failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("{what}: {source}")]
    Request {
        what: String,
        source: std::io::Error,
    },
    #[error("interface {0} not found")]
    NoInterface(String),
}

impl NetlinkError {
    /// A delete that found nothing to delete (or a family the kernel does not have).
    fn is_absent(&self) -> bool {
        matches!(self, NetlinkError::Request { source, .. } if matches!(
            source.raw_os_error(),
            Some(libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT)
        ))
    }

    fn is_exists(&self) -> bool {
        matches!(self, NetlinkError::Request { source, .. }
            if source.raw_os_error() == Some(libc::EEXIST))
    }
}

/// One rtnetlink socket for a group of requests. Nothing is opened until the first request, so a
/// group with nothing to do costs no system call.
#[derive(Default)]
pub struct RouteSession {
    socket: Option<Socket>,
    seq: u32,
}

/// More than any answer to one request (an ACK or an error echoing the request header).
const REPLY_BUFFER: usize = 8192;
/// Bounds the deletes of duplicate rules: each successful delete removes one copy.
const MAX_DUPLICATES: usize = 64;

impl RouteSession {
    pub fn new() -> RouteSession {
        RouteSession::default()
    }

    fn socket(&mut self) -> Result<&mut Socket, NetlinkError> {
        if self.socket.is_none() {
            let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
            socket.bind_auto().map_err(NetlinkError::Socket)?;
            socket
                .connect(&SocketAddr::new(0, 0))
                .map_err(NetlinkError::Socket)?;
            self.socket = Some(socket);
        }
        Ok(self.socket.as_mut().expect("opened above"))
    }

    /// Sends one request asking for an ACK and waits for the answer carrying its sequence number.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &str,
    ) -> Result<(), NetlinkError> {
        self.exchange(msg, NLM_F_ACK | flags, what).map(|_| ())
    }

    /// Sends one dump request and collects every answer up to `NLMSG_DONE` (multi-part replies
    /// span several reads).
    fn dump(
        &mut self,
        msg: RouteNetlinkMessage,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.exchange(msg, NLM_F_DUMP, what)
    }

    /// Sends one request and reads the answers carrying its sequence number until its ACK, its
    /// error or `NLMSG_DONE`; the messages before that (a dump's) are returned. Answers to an
    /// earlier request of this session are not ours to judge and are skipped.
    fn exchange(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let failed = |source: std::io::Error| NetlinkError::Request {
            what: what.to_string(),
            source,
        };
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        let socket = self.socket()?;
        socket.send(&buf, 0).map_err(failed)?;
        // One read may pack several messages (a dump's chunks are up to 32 KiB).
        super::with_reply_buffer(4 * REPLY_BUFFER, |reply| {
            read_answers(socket, reply, seq, failed)
        })
    }
}

impl RouteSession {
    /// `ip rule show` of one family, as plain values.
    pub fn list_rules(&mut self, ipv6: bool) -> Result<Vec<PolicyRule>, NetlinkError> {
        let mut msg = RuleMessage::default();
        msg.header.family = family(ipv6);
        let answers = self.dump(RouteNetlinkMessage::GetRule(msg), "ip rule show")?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRule(rule) => Some(PolicyRule::from_message(&rule)),
                _ => None,
            })
            .collect())
    }

    /// The interfaces (by index) of the host routes to `ip` (`/32` or `/128`) in `table`.
    pub fn host_route_links(&mut self, table: u32, ip: IpAddr) -> Result<Vec<u32>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family(ip.is_ipv6());
        let answers = self.dump(
            RouteNetlinkMessage::GetRoute(msg),
            &format!("ip route show table {table}"),
        )?;
        let full = if ip.is_ipv6() { 128 } else { 32 };
        let mut links = Vec::new();
        for m in answers {
            let RouteNetlinkMessage::NewRoute(route) = m else {
                continue;
            };
            if route.header.destination_prefix_length != full {
                continue;
            }
            let mut route_table = u32::from(route.header.table);
            let (mut dst, mut oif) = (None, None);
            for attr in &route.attributes {
                match attr {
                    RouteAttribute::Table(t) => route_table = *t,
                    RouteAttribute::Destination(RouteAddress::Inet(a)) => {
                        dst = Some(IpAddr::V4(*a))
                    }
                    RouteAttribute::Destination(RouteAddress::Inet6(a)) => {
                        dst = Some(IpAddr::V6(*a))
                    }
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    _ => {}
                }
            }
            if route_table == table
                && dst == Some(ip)
                && let Some(oif) = oif
            {
                links.push(oif);
            }
        }
        Ok(links)
    }

    /// `ip rule add` of a destination or input-interface rule; one already there is fine.
    pub fn add_policy_rule(&mut self, rule: &PolicyRule) -> Result<(), NetlinkError> {
        match self.request(
            RouteNetlinkMessage::NewRule(rule.message()),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("ip rule add {rule}"),
        ) {
            Err(e) if e.is_exists() => Ok(()),
            other => other,
        }
    }

    /// `ip rule del` of the rule; none there is fine.
    pub fn delete_policy_rule(&mut self, rule: &PolicyRule) -> Result<(), NetlinkError> {
        ignore_absent(self.request(
            RouteNetlinkMessage::DelRule(rule.message()),
            0,
            &format!("ip rule del {rule}"),
        ))
    }

    /// Adds an address to an interface; an existing one is fine.
    pub fn add_address(&mut self, iface: &str, addr: IpNet) -> Result<(), NetlinkError> {
        self.change_address(true, iface, addr)
    }

    /// Deletes an address from an interface; an absent one is fine.
    pub fn delete_address(&mut self, iface: &str, addr: IpNet) -> Result<(), NetlinkError> {
        self.change_address(false, iface, addr)
    }

    /// Adds (`add`) or deletes an address; being there already, or gone already, is the goal.
    fn change_address(&mut self, add: bool, iface: &str, addr: IpNet) -> Result<(), NetlinkError> {
        let msg = address_message(iface, addr.addr(), addr.prefix_len())?;
        let (message, flags, what) = if add {
            let what = format!("add address {addr} to {iface}");
            (
                RouteNetlinkMessage::NewAddress(msg),
                NLM_F_CREATE | NLM_F_EXCL,
                what,
            )
        } else {
            let what = format!("delete address {addr} from {iface}");
            (RouteNetlinkMessage::DelAddress(msg), 0, what)
        };
        match self.request(message, flags, &what) {
            Err(e) if (add && e.is_exists()) || (!add && e.is_absent()) => Ok(()),
            other => other,
        }
    }

    /// Makes sure exactly one `ip rule fwmark MARK lookup TABLE` exists for one family. Without a
    /// priority the kernel would add a duplicate on every run, so earlier copies are deleted
    /// first.
    pub fn ensure_fwmark_rule(
        &mut self,
        ipv6: bool,
        mark: u32,
        table: u32,
    ) -> Result<(), NetlinkError> {
        self.delete_fwmark_rules(ipv6, mark, table)?;
        self.request(
            RouteNetlinkMessage::NewRule(fwmark_rule(ipv6, mark, table)),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("ip rule add fwmark {mark} lookup {table}"),
        )
    }

    /// Deletes every `ip rule fwmark MARK lookup TABLE` of one family. None there is fine; any
    /// other refusal is reported.
    pub fn delete_fwmark_rules(
        &mut self,
        ipv6: bool,
        mark: u32,
        table: u32,
    ) -> Result<(), NetlinkError> {
        let what = format!("ip rule del fwmark {mark} lookup {table}");
        delete_repeatedly(|| {
            self.request(
                RouteNetlinkMessage::DelRule(fwmark_rule(ipv6, mark, table)),
                0,
                &what,
            )
        })
    }

    /// `ip rule add fwmark MARK/MASK lookup TABLE pref PRIORITY`; one that already exists is fine
    /// (with a priority the kernel recognises the duplicate, so nothing is removed first and the
    /// rule is never briefly missing).
    pub fn add_mark_rule(&mut self, rule: &MarkRule) -> Result<(), NetlinkError> {
        let result = self.request(
            RouteNetlinkMessage::NewRule(rule.message()),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("ip rule add {rule}"),
        );
        match result {
            Err(e) if e.is_exists() => Ok(()),
            other => other,
        }
    }

    /// Deletes every copy of the rule; none there is fine.
    pub fn delete_mark_rule(&mut self, rule: &MarkRule) -> Result<(), NetlinkError> {
        let what = format!("ip rule del {rule}");
        delete_repeatedly(|| self.request(RouteNetlinkMessage::DelRule(rule.message()), 0, &what))
    }

    /// `ip route replace local 0.0.0.0/0 (or ::/0) dev IFACE table TABLE`.
    pub fn replace_local_default_route(
        &mut self,
        ipv6: bool,
        iface: &str,
        table: u32,
    ) -> Result<(), NetlinkError> {
        self.request(
            RouteNetlinkMessage::NewRoute(local_default_route(ipv6, iface, table)?),
            NLM_F_CREATE | NLM_F_REPLACE,
            &format!("replace local default route table {table}"),
        )
    }

    /// `ip route del local 0.0.0.0/0 (or ::/0) dev IFACE table TABLE`; an absent one is fine.
    pub fn delete_local_default_route(
        &mut self,
        ipv6: bool,
        iface: &str,
        table: u32,
    ) -> Result<(), NetlinkError> {
        ignore_absent(self.request(
            RouteNetlinkMessage::DelRoute(local_default_route(ipv6, iface, table)?),
            0,
            &format!("delete local default route table {table}"),
        ))
    }
}

/// Runs `delete` until it reports nothing left (Ok), or a real failure (Err); at most
/// [`MAX_DUPLICATES`] times.
fn delete_repeatedly(
    mut delete: impl FnMut() -> Result<(), NetlinkError>,
) -> Result<(), NetlinkError> {
    for _ in 0..MAX_DUPLICATES {
        match delete() {
            Ok(()) => continue,
            Err(e) if e.is_absent() => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn ignore_absent(result: Result<(), NetlinkError>) -> Result<(), NetlinkError> {
    match result {
        Err(e) if e.is_absent() => Ok(()),
        other => other,
    }
}

fn interface_index(name: &str) -> Result<u32, NetlinkError> {
    nix::net::if_::if_nametoindex(name).map_err(|_| NetlinkError::NoInterface(name.to_string()))
}

fn family(ipv6: bool) -> AddressFamily {
    if ipv6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    }
}

fn address_message(
    iface: &str,
    addr: IpAddr,
    prefix_len: u8,
) -> Result<AddressMessage, NetlinkError> {
    let mut msg = AddressMessage::default();
    msg.header.family = family(addr.is_ipv6());
    msg.header.prefix_len = prefix_len;
    msg.header.scope = AddressScope::Universe;
    msg.header.index = interface_index(iface)?;
    msg.attributes = vec![
        AddressAttribute::Local(addr),
        AddressAttribute::Address(addr),
    ];
    Ok(msg)
}

/// The name of the interface with index `index`, if it exists.
pub fn interface_name(index: u32) -> Option<String> {
    let all = nix::net::if_::if_nameindex().ok()?;
    all.iter()
        .find(|i| i.index() == index)
        .map(|i| i.name().to_string_lossy().into_owned())
}

/// The `local 0.0.0.0/0 (or ::/0) dev IFACE table TABLE` route.
fn local_default_route(ipv6: bool, iface: &str, table: u32) -> Result<RouteMessage, NetlinkError> {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(ipv6);
    msg.header.destination_prefix_length = 0;
    msg.header.table = if table < 256 { table as u8 } else { 0 };
    msg.header.protocol = RouteProtocol::Boot;
    msg.header.scope = RouteScope::Host;
    msg.header.kind = RouteType::Local;
    let dst = if ipv6 {
        RouteAddress::Inet6(Ipv6Addr::UNSPECIFIED)
    } else {
        RouteAddress::Inet(Ipv4Addr::UNSPECIFIED)
    };
    msg.attributes = vec![
        RouteAttribute::Destination(dst),
        RouteAttribute::Oif(interface_index(iface)?),
        RouteAttribute::Table(table),
    ];
    Ok(msg)
}

/// Reads the answers to request `seq` until its end (ACK, error or `NLMSG_DONE`).
fn read_answers(
    socket: &Socket,
    reply: &mut Vec<u8>,
    seq: u32,
    failed: impl Fn(std::io::Error) -> NetlinkError,
) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    let mut answers = Vec::new();
    loop {
        reply.clear();
        // Into the spare room: `n` is what was written (no MSG_TRUNC asked).
        socket.recv(reply, 0).map_err(&failed)?;
        let n = reply.len();
        if n == 0 {
            return Err(failed(std::io::Error::from(
                std::io::ErrorKind::UnexpectedEof,
            )));
        }
        let mut at = 0;
        while at < n {
            let msg = <NetlinkMessage<RouteNetlinkMessage>>::deserialize(&reply[at..n])
                .map_err(|e| failed(std::io::Error::other(e.to_string())))?;
            let len = msg.header.length as usize;
            if len == 0 {
                return Err(failed(std::io::Error::other("zero-length netlink message")));
            }
            // Messages are 4-byte aligned within a read.
            at += (len + 3) & !3;
            if msg.header.sequence_number != seq {
                continue;
            }
            match msg.payload {
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(failed(e.to_io())),
                NetlinkPayload::Error(_) | NetlinkPayload::Done(_) => return Ok(answers),
                NetlinkPayload::InnerMessage(inner) => answers.push(inner),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(errno: i32) -> NetlinkError {
        NetlinkError::Request {
            what: "ip rule del".into(),
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    #[test]
    fn deleting_duplicates_stops_quietly_when_none_is_left() {
        let mut left = 3;
        let result = delete_repeatedly(|| {
            if left == 0 {
                return Err(refused(libc::ENOENT));
            }
            left -= 1;
            Ok(())
        });
        assert!(result.is_ok());
        assert_eq!(left, 0);
    }

    #[test]
    fn deleting_reports_a_refusal_other_than_not_found() {
        let mut calls = 0;
        let err = delete_repeatedly(|| {
            calls += 1;
            if calls == 1 {
                Ok(())
            } else {
                Err(refused(libc::EPERM))
            }
        })
        .expect_err("EPERM is not 'nothing to delete'");
        assert!(err.to_string().contains("ip rule del"), "{err}");
        assert_eq!(calls, 2);
    }
}
