//! The policy-rule model: what `ip rule` lists and what this crate adds, as plain values
//! ([`MarkRule`], [`PolicyRule`]), and their translation to and from rtnetlink rule messages. The
//! requests that carry them are the parent's [`RouteSession`](super::RouteSession).

use std::net::IpAddr;

use netlink_packet_route::AddressFamily;
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};

use super::family;

/// A policy rule `fwmark MARK/MASK lookup TABLE pref PRIORITY` of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkRule {
    pub ipv6: bool,
    pub mark: u32,
    pub mask: u32,
    pub table: u32,
    pub priority: u32,
}

impl MarkRule {
    pub(super) fn message(&self) -> RuleMessage {
        let mut msg = fwmark_rule(self.ipv6, self.mark, self.table);
        msg.attributes.push(RuleAttribute::FwMask(self.mask));
        msg.attributes.push(RuleAttribute::Priority(self.priority));
        msg
    }
}

impl std::fmt::Display for MarkRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}fwmark {:#x}/{:#x} lookup {} pref {}",
            if self.ipv6 { "-6 " } else { "" },
            self.mark,
            self.mask,
            self.table,
            self.priority
        )
    }
}

/// A policy rule `[to IP] [iif NAME] lookup TABLE pref PRIORITY` of one family (the family is
/// the destination's; without one, `ipv6` says). What `ip rule` lists, as plain values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicyRule {
    pub ipv6: bool,
    /// A host destination (`/32` or `/128`); other destinations list as `None` with `other_dst`.
    pub to: Option<IpAddr>,
    /// The rule matches some other selector this model does not carry (a prefix destination, a
    /// source, a mark...): never one of ours, never an `iif`-only rule.
    pub other_match: bool,
    pub iif: Option<String>,
    pub table: u32,
    pub priority: u32,
}

/// The kernel's local routing table (`lookup local`).
pub const TABLE_LOCAL: u32 = 255;
/// The kernel's main routing table.
pub const TABLE_MAIN: u32 = 254;

impl PolicyRule {
    pub(super) fn from_message(msg: &RuleMessage) -> PolicyRule {
        let mut rule = PolicyRule {
            ipv6: msg.header.family == AddressFamily::Inet6,
            to: None,
            other_match: msg.header.src_len != 0,
            iif: None,
            table: u32::from(msg.header.table),
            priority: 0,
        };
        let full = if rule.ipv6 { 128 } else { 32 };
        for attr in &msg.attributes {
            match attr {
                RuleAttribute::Destination(ip) if msg.header.dst_len == full => rule.to = Some(*ip),
                RuleAttribute::Destination(_) => rule.other_match = true,
                RuleAttribute::Iifname(name) => rule.iif = Some(name.clone()),
                RuleAttribute::Table(t) => rule.table = *t,
                RuleAttribute::Priority(p) => rule.priority = *p,
                RuleAttribute::FwMark(_) | RuleAttribute::Oifname(_) | RuleAttribute::Source(_) => {
                    rule.other_match = true
                }
                _ => {}
            }
        }
        rule
    }

    pub(super) fn message(&self) -> RuleMessage {
        let mut msg = RuleMessage::default();
        msg.header.family = family(self.ipv6);
        msg.header.action = RuleAction::ToTable;
        msg.header.table = if self.table < 256 {
            self.table as u8
        } else {
            0
        };
        if let Some(ip) = self.to {
            msg.header.dst_len = if ip.is_ipv6() { 128 } else { 32 };
            msg.attributes.push(RuleAttribute::Destination(ip));
        }
        if let Some(iif) = &self.iif {
            msg.attributes.push(RuleAttribute::Iifname(iif.clone()));
        }
        msg.attributes.push(RuleAttribute::Table(self.table));
        msg.attributes.push(RuleAttribute::Priority(self.priority));
        msg
    }
}

impl std::fmt::Display for PolicyRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.ipv6 {
            f.write_str("-6 ")?;
        }
        if let Some(ip) = self.to {
            write!(f, "to {ip} ")?;
        }
        if let Some(iif) = &self.iif {
            write!(f, "iif {iif} ")?;
        }
        match self.table {
            TABLE_LOCAL => f.write_str("lookup local")?,
            TABLE_MAIN => f.write_str("lookup main")?,
            t => write!(f, "lookup {t}")?,
        }
        write!(f, " pref {}", self.priority)
    }
}

/// `ip rule fwmark MARK lookup TABLE`.
pub(super) fn fwmark_rule(ipv6: bool, mark: u32, table: u32) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = family(ipv6);
    msg.header.action = RuleAction::ToTable;
    msg.header.table = if table < 256 { table as u8 } else { 0 };
    msg.attributes = vec![RuleAttribute::FwMark(mark), RuleAttribute::Table(table)];
    msg
}
