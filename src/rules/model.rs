//! The renderer-neutral rule model: per IP family, an ordered list of rules, each naming its table,
//! chain, position, typed matches and one typed target. Renderers turn it into iptables-restore text
//! or nftables; appliers never look inside a rule.

use std::fmt;

/// IP family of a rule list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Both families, IPv4 first (the order every transcript uses).
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];
}

/// Values every backend prints the same way, named once.
pub mod well_known {
    /// The DNS port whose traffic the DNS capture redirects.
    pub const DNS_PORT: &str = "53";
    /// Conntrack zone of DNS between the proxy and upstream servers (keeps it apart from the
    /// application's own DNS flows with the same 5-tuple).
    pub const CT_ZONE_UPSTREAM_DNS: u16 = 1;
    /// Conntrack zone of DNS between the application and the proxy.
    pub const CT_ZONE_APP_DNS: u16 = 2;
    /// The loopback interface.
    pub const LOOPBACK_IFACE: &str = "lo";
}

/// Short constructors for the matches and targets the builders write most (the iptables-model
/// twin of `nft_model::expr`), so every builder spells a rule the same way.
pub mod parts {
    use super::{Match, Proto, Target};

    pub const TCP: Match = Match::Proto(Proto::Tcp);
    pub const UDP: Match = Match::Proto(Proto::Udp);

    pub fn in_iface(name: &str) -> Match {
        Match::InIface {
            name: name.into(),
            negate: false,
        }
    }
    pub fn out_iface(name: &str) -> Match {
        Match::OutIface {
            name: name.into(),
            negate: false,
        }
    }
    pub fn dst(addr: &str, negate: bool) -> Match {
        Match::Dst {
            addr: addr.into(),
            negate,
        }
    }
    pub fn src(addr: &str) -> Match {
        Match::Src {
            addr: addr.into(),
            negate: false,
        }
    }
    pub fn dport(port: &str, negate: bool) -> Match {
        Match::DstPort {
            port: port.into(),
            negate,
            module: None,
        }
    }
    pub fn sport(port: &str) -> Match {
        Match::SrcPort {
            port: port.into(),
            negate: false,
            module: None,
        }
    }
    pub fn mark(value: &str, negate: bool) -> Match {
        Match::Mark {
            value: value.into(),
            negate,
        }
    }
    pub fn jump(chain: &str) -> Target {
        Target::Jump(chain.into())
    }
    pub fn redirect(port: &str, plural: bool) -> Target {
        Target::Redirect {
            port: port.into(),
            plural,
        }
    }
}

/// Netfilter table. The declaration order is the rendering order (lexicographic by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Filter,
    Mangle,
    Nat,
    Raw,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Mangle => "mangle",
            Table::Nat => "nat",
            Table::Raw => "raw",
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Chains the kernel provides; they are never declared.
pub fn is_builtin_chain(chain: &str) -> bool {
    matches!(
        chain,
        "INPUT"
            | "OUTPUT"
            | "FORWARD"
            | "PREROUTING"
            | "POSTROUTING"
            | "ACCEPT"
            | "RETURN"
            | "DROP"
    )
}

/// A rule (or statement) a model cannot say, read back from the kernel or a listing; names the
/// first part that did not decode. It equals no planned rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("foreign rule: {0}")]
pub struct ForeignRule(pub String);

/// Which socket owner id a match looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OwnerKind {
    Uid,
    Gid,
}

/// Transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// Conntrack states used by the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtState {
    Invalid,
    Related,
    Established,
}

/// Direction of a set match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetDir {
    Src,
    Dst,
}

/// One match of a rule. Values (ports, ids, addresses, marks) are kept as the operator wrote them:
/// Istio prints them verbatim, so the model does too. `negate` means "does not match".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// Incoming interface.
    InIface { name: String, negate: bool },
    /// Outgoing interface.
    OutIface { name: String, negate: bool },
    /// Transport protocol.
    Proto(Proto),
    /// Source address/prefix.
    Src { addr: String, negate: bool },
    /// Destination address/prefix.
    Dst { addr: String, negate: bool },
    /// Destination port. `explicit_module` renders the protocol match module (`-m tcp`/`-m udp`).
    DstPort {
        port: String,
        negate: bool,
        module: Option<Proto>,
    },
    /// Source port.
    SrcPort {
        port: String,
        negate: bool,
        module: Option<Proto>,
    },
    /// Several destination ports at once (multiport).
    DstPorts { ports: Vec<String>, negate: bool },
    /// Socket owner UID.
    UidOwner { id: String, negate: bool },
    /// Socket owner GID (or group name).
    GidOwner { id: String, negate: bool },
    /// The packet belongs to a local socket.
    SocketExists,
    /// Packet mark (`value` may carry a `/mask`).
    Mark { value: String, negate: bool },
    /// Connection mark (`value` may carry a `/mask`).
    ConnMark { value: String },
    /// Conntrack state.
    CtState(Vec<CtState>),
    /// The address is in a named set.
    InSet { name: String, dir: SetDir },
    /// Protocol match module without ports (`-m tcp`).
    ProtoModule(Proto),
}

/// A port match of either end, as both renderers read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMatch<'a> {
    /// `true` for [`Match::SrcPort`], `false` for [`Match::DstPort`].
    pub source: bool,
    pub port: &'a str,
    pub negate: bool,
    pub module: Option<Proto>,
}

impl Match {
    /// The port match this is, if it is one.
    pub fn as_port(&self) -> Option<PortMatch<'_>> {
        let (source, port, negate, module) = match self {
            Match::SrcPort {
                port,
                negate,
                module,
            } => (true, port, negate, module),
            Match::DstPort {
                port,
                negate,
                module,
            } => (false, port, negate, module),
            _ => return None,
        };
        Some(PortMatch {
            source,
            port,
            negate: *negate,
            module: *module,
        })
    }
}

/// What a matching packet gets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Jump to a user chain.
    Jump(String),
    Return,
    Accept,
    Drop,
    /// Redirect to a local port. `plural` picks `--to-ports` (true) or `--to-port`; Istio uses both.
    Redirect {
        port: String,
        plural: bool,
    },
    /// TPROXY to a local port, setting `mark` (which carries its mask).
    Tproxy {
        mark: String,
        port: String,
    },
    /// Set the packet mark.
    SetMark(String),
    /// CONNMARK --set-xmark.
    ConnmarkSetXmark(String),
    /// Copy the packet mark to the connection.
    ConnmarkSave,
    /// Copy the connection mark to the packet; `masks` adds `--nfmask/--ctmask 0xffffffff`.
    ConnmarkRestore {
        masks: bool,
    },
    /// Conntrack zone.
    CtZone(u16),
    /// Source NAT to an address.
    Snat(String),
}

impl Target {
    /// The user chain this target jumps to, if any.
    pub fn jump_chain(&self) -> Option<&str> {
        match self {
            Target::Jump(chain) => Some(chain),
            _ => None,
        }
    }
}

/// Where a rule goes in its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    Append,
    /// Insert at a 1-based position.
    Insert(u32),
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub table: Table,
    pub chain: String,
    pub position: Position,
    pub matches: Vec<Match>,
    pub target: Target,
}

/// A chain's rules in the order the kernel holds them once each is placed in turn: `Some(i)`
/// lands at index `i` (0-based) of what is there by then, `None` (or an index past the end) at
/// the end. Inserts at the front and appends cost O(1), an insert at a small index O(index), so
/// a chain of n rules with the builders' positions is placed in O(n), never O(n²).
pub fn place_in_order<T>(items: impl IntoIterator<Item = (Option<usize>, T)>) -> Vec<T> {
    let mut chain = std::collections::VecDeque::new();
    for (index, item) in items {
        match index {
            Some(0) => chain.push_front(item),
            Some(i) if i < chain.len() => chain.insert(i, item),
            _ => chain.push_back(item),
        }
    }
    chain.into()
}

/// Ordered rules for both families. The IPv6 list stays empty unless IPv6 is enabled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    pub v4: Vec<Rule>,
    pub v6: Vec<Rule>,
}

impl RuleSet {
    pub fn family(&self, family: Family) -> &[Rule] {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
}

/// Builds a [`RuleSet`] in program order, honouring "IPv6 only when enabled".
#[derive(Debug)]
pub struct RuleSetBuilder {
    ipv6: bool,
    set: RuleSet,
}

impl RuleSetBuilder {
    pub fn new(ipv6: bool) -> Self {
        RuleSetBuilder {
            ipv6,
            set: RuleSet::default(),
        }
    }

    /// Adds a rule to one family (a no-op for IPv6 when IPv6 is disabled).
    pub fn push(&mut self, family: Family, rule: Rule) {
        match family {
            Family::V4 => self.set.v4.push(rule),
            Family::V6 if self.ipv6 => self.set.v6.push(rule),
            Family::V6 => {}
        }
    }

    /// Appends to one family.
    pub fn append_to(
        &mut self,
        family: Family,
        table: Table,
        chain: &str,
        matches: Vec<Match>,
        target: Target,
    ) {
        self.push(
            family,
            rule(table, chain, Position::Append, matches, target),
        );
    }

    /// Appends the same rule to both families.
    pub fn append(&mut self, table: Table, chain: &str, matches: Vec<Match>, target: Target) {
        for family in Family::ALL {
            self.append_to(family, table, chain, matches.clone(), target.clone());
        }
    }

    /// Appends to both families, building each family's rule with its own value.
    pub fn append_versioned(
        &mut self,
        table: Table,
        chain: &str,
        v4: &str,
        v6: &str,
        build: impl Fn(&str) -> (Vec<Match>, Target),
    ) {
        let (m, t) = build(v4);
        self.append_to(Family::V4, table, chain, m, t);
        if self.ipv6 {
            let (m, t) = build(v6);
            self.append_to(Family::V6, table, chain, m, t);
        }
    }

    /// Inserts at a 1-based position in one family.
    pub fn insert_to(
        &mut self,
        family: Family,
        table: Table,
        chain: &str,
        pos: u32,
        matches: Vec<Match>,
        target: Target,
    ) {
        self.push(
            family,
            rule(table, chain, Position::Insert(pos), matches, target),
        );
    }

    /// Inserts the same rule in both families.
    pub fn insert(
        &mut self,
        table: Table,
        chain: &str,
        pos: u32,
        matches: Vec<Match>,
        target: Target,
    ) {
        for family in Family::ALL {
            self.insert_to(family, table, chain, pos, matches.clone(), target.clone());
        }
    }

    pub fn build(self) -> RuleSet {
        self.set
    }
}

fn rule(
    table: Table,
    chain: &str,
    position: Position,
    matches: Vec<Match>,
    target: Target,
) -> Rule {
    Rule {
        table,
        chain: chain.to_string(),
        position,
        matches,
        target,
    }
}

#[cfg(test)]
mod placement_tests {
    use super::place_in_order;

    #[test]
    fn placed_as_the_kernel_places_them() {
        let placed = place_in_order([(None, 'a'), (Some(0), 'b'), (Some(1), 'c'), (Some(9), 'd')]);
        assert_eq!(placed, ['b', 'c', 'a', 'd']);
    }

    /// Inserting at the front of a Vec moves everything after it: n²/2 moves (5·10⁹ here).
    #[test]
    fn front_inserts_are_placed_in_linear_time() {
        let started = std::time::Instant::now();
        let placed = place_in_order((0..100_000u32).map(|i| (Some(0), [i; 16])));
        assert_eq!(placed[0], [99_999; 16]);
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }
}
