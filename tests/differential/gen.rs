//! Generated `istio-iptables` inputs: every flag (in each pflag spelling) and environment variable
//! of the rule tool, with valid, odd and invalid values, and the host the case runs on. Seeded:
//! the same seed gives the same cases.

use super::sandbox::{HOSTS, RESOLV};

// One generator for the three differential tests; each uses part of it.
#[allow(dead_code)]
#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

/// One command-line occurrence (a flag with its value, one or two words) or one variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    Arg(Vec<String>),
    Env(String, String),
}

/// One generated input: what both tools get, and the host they run on.
#[derive(Clone, Debug)]
pub struct Case {
    pub tokens: Vec<Token>,
    /// Index into [`HOSTS`].
    pub host: usize,
    /// Index into [`RESOLV`].
    pub resolv: usize,
    /// Ours gets the host facts as flags (`--ipv6`, `--dns-servers`) instead of reading them.
    pub pinned: bool,
}

impl Case {
    pub fn args(&self) -> Vec<String> {
        self.tokens
            .iter()
            .filter_map(|t| match t {
                Token::Arg(words) => Some(words.clone()),
                Token::Env(..) => None,
            })
            .flatten()
            .collect()
    }

    pub fn env(&self) -> Vec<(String, String)> {
        self.tokens
            .iter()
            .filter_map(|t| match t {
                Token::Env(k, v) => Some((k.clone(), v.clone())),
                Token::Arg(_) => None,
            })
            .collect()
    }

    /// The argv and env as one line.
    pub fn render(&self) -> String {
        let env: Vec<String> = self
            .env()
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        format!(
            "env [{}] args {:?} (host {}, resolv.conf {:?}, {})",
            env.join(" "),
            self.args(),
            HOSTS[self.host].name,
            RESOLV[self.resolv].0,
            if self.pinned {
                "ours pinned by --ipv6/--dns-servers"
            } else {
                "ours reads the host"
            }
        )
    }

    /// The flags that pin ours to this case's host facts, as Istio derives them.
    pub fn pinned_args(&self) -> Vec<String> {
        let Some((plain, dual)) = HOSTS[self.host].ipv6 else {
            return Vec::new();
        };
        let ipv6 = if self.dual_stack() { dual } else { plain };
        vec![
            format!("--ipv6={ipv6}"),
            format!("--dns-servers={}", RESOLV[self.resolv].1.join(",")),
        ]
    }

    /// `--dual-stack` as Istio resolves it: the last flag, else the later valid variable.
    fn dual_stack(&self) -> bool {
        let mut flag = None;
        let mut env = None;
        for t in &self.tokens {
            match t {
                Token::Arg(w) if w[0] == "--dual-stack" => flag = Some(true),
                Token::Arg(w) => {
                    if let Some(v) = w[0].strip_prefix("--dual-stack=") {
                        flag = go_bool(v).or(flag);
                    }
                }
                Token::Env(k, v) if k == "DUAL_STACK" && env.is_none() => env = go_bool(v),
                Token::Env(k, v) if k == "ISTIO_DUAL_STACK" => env = go_bool(v).or(env),
                Token::Env(..) => {}
            }
        }
        flag.or(env).unwrap_or(false)
    }
}

/// The flag a command-line word names (its long name) and the value written in the same token.
pub fn flag_and_value(words: &[String]) -> Option<(&'static str, &str)> {
    let first = words.first()?;
    let attached = if let Some(long) = first.strip_prefix("--") {
        let (name, value) = long.split_once('=').unwrap_or((long, ""));
        let f = VALUE_FLAGS.iter().find(|f| f.long == name)?;
        (f.long, value)
    } else {
        let letter = first.strip_prefix('-')?.chars().next()?;
        let f = VALUE_FLAGS.iter().find(|f| f.short == Some(letter))?;
        let rest = &first[2..];
        (
            f.long,
            if rest == "=" {
                rest
            } else {
                rest.strip_prefix('=').unwrap_or(rest)
            },
        )
    };
    match words.get(1) {
        Some(v) => Some((attached.0, v.as_str())),
        None => Some(attached),
    }
}

/// Go's strconv.ParseBool.
pub fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// A flag that takes a value: long name, short letter, variable, and its value pool.
struct ValueFlag {
    long: &'static str,
    short: Option<char>,
    env: Option<&'static str>,
    values: fn(&mut Rng) -> String,
}

const PORTS: &[&str] = &["15001", "15006", "8080", "80", "443", "1", "65535", "9090"];
const BAD_PORTS: &[&str] = &["0", "65536", "abc", "-1", "080", "8080a", " 80"];
const UIDS: &[&str] = &["1337", "0", "1000", "65534", "4294967294", "1338"];
const BAD_UIDS: &[&str] = &["4294967295", "abc", "-1", "1e3"];
const IFACES: &[&str] = &["eth1", "eth2", "tun+", "veth0", "cni0", "eth.1", "a_b-c"];
const BAD_IFACES: &[&str] = &["waytoolonginterfacename0", "bad/if", "bad if", "+"];
const CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "192.168.1.0/24",
    "10.1.2.3/8",
    "127.1.2.3/32",
    "0.0.0.0/0",
    "172.16.0.1/32",
    "fd00::/8",
    "2001:DB8::/32",
    "::1/128",
    "::/0",
    "fe80::1/64",
    "::ffff:10.0.0.0/104",
];
const BAD_CIDRS: &[&str] = &["10.0.0.1", "fd00::1", "10.0.0.0/33", "bogus", "fd00::/129"];
const GROUPS: &[&str] = &["1337", "1000", "0", "java", "ftp", "staff", "g_1.x-y"];
const BAD_GROUPS: &[&str] = &["bad name", "a:b", "toolonggroupname0123456789abcdefgh"];

/// A comma list of 0..=4 items from `good`, sometimes one from `bad`, sometimes oddly joined
/// (spaces after commas, empty items, a trailing comma).
fn list(rng: &mut Rng, good: &[&str], bad: &[&str]) -> String {
    let n = rng.below(5);
    let mut items: Vec<String> = (0..n).map(|_| rng.pick(good).to_string()).collect();
    if rng.chance(12) {
        let at = rng.below(items.len() + 1);
        items.insert(at, rng.pick(bad).to_string());
    }
    let sep = match rng.below(20) {
        0 => ", ",
        1 => ",,",
        _ => ",",
    };
    let mut s = items.join(sep);
    if rng.chance(4) {
        s.push(',');
    }
    s
}

fn one(rng: &mut Rng, good: &[&str], bad: &[&str], bad_percent: u64) -> String {
    match rng.chance(bad_percent) {
        true => rng.pick(bad).to_string(),
        false => rng.pick(good).to_string(),
    }
}

fn port(rng: &mut Rng) -> String {
    one(rng, PORTS, BAD_PORTS, 8)
}
fn ports(rng: &mut Rng) -> String {
    list(rng, PORTS, BAD_PORTS)
}
fn uids(rng: &mut Rng) -> String {
    list(rng, UIDS, BAD_UIDS)
}
fn ifaces(rng: &mut Rng) -> String {
    list(rng, IFACES, BAD_IFACES)
}
fn inbound_ports(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => "*".into(),
        1 => " * ".into(),
        _ => ports(rng),
    }
}
fn cidrs(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => "*".into(),
        _ => list(rng, CIDRS, BAD_CIDRS),
    }
}
fn mode(rng: &mut Rng) -> String {
    rng.pick(&[
        "REDIRECT", "TPROXY", "TPROXY", "", "NONE", "tproxy", "redirect", "foo",
    ])
    .to_string()
}
fn mark(rng: &mut Rng) -> String {
    one(
        rng,
        &["1337", "42", "0x539", "100"],
        &["0", "1338", "abc", "-5", "4294967296"],
        20,
    )
}
fn table(rng: &mut Rng) -> String {
    one(
        rng,
        &["133", "100", "1000", "42"],
        &["0", "253", "254", "255", "main", "abc", "-1"],
        20,
    )
}
fn probe_timeout(rng: &mut Rng) -> String {
    one(
        rng,
        &["5s", "100ms", "1m", "1h2m3s", "0s"],
        &["abc", "10", "5 s", ""],
        20,
    )
}
fn force_binary(rng: &mut Rng) -> String {
    one(rng, &["legacy", "nft", ""], &["iptables", "foo", "NFT"], 25)
}
fn netns_path(rng: &mut Rng) -> String {
    rng.pick(&["/var/run/netns/idiff-none", ""]).to_string()
}

const VALUE_FLAGS: &[ValueFlag] = &[
    ValueFlag {
        long: "envoy-port",
        short: Some('p'),
        env: None,
        values: port,
    },
    ValueFlag {
        long: "inbound-capture-port",
        short: Some('z'),
        env: Some("INBOUND_CAPTURE_PORT"),
        values: port,
    },
    ValueFlag {
        long: "inbound-tunnel-port",
        short: Some('e'),
        env: Some("INBOUND_TUNNEL_PORT"),
        values: port,
    },
    ValueFlag {
        long: "proxy-uid",
        short: Some('u'),
        env: Some("PROXY_UID"),
        values: uids,
    },
    ValueFlag {
        long: "proxy-gid",
        short: Some('g'),
        env: Some("PROXY_GID"),
        values: uids,
    },
    ValueFlag {
        long: "istio-inbound-interception-mode",
        short: Some('m'),
        env: Some("ISTIO_INBOUND_INTERCEPTION_MODE"),
        values: mode,
    },
    ValueFlag {
        long: "istio-inbound-ports",
        short: Some('b'),
        env: Some("ISTIO_INBOUND_PORTS"),
        values: inbound_ports,
    },
    ValueFlag {
        long: "istio-local-exclude-ports",
        short: Some('d'),
        env: Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
        values: ports,
    },
    ValueFlag {
        long: "istio-exclude-interfaces",
        short: Some('c'),
        env: Some("ISTIO_EXCLUDE_INTERFACES"),
        values: ifaces,
    },
    ValueFlag {
        long: "istio-service-cidr",
        short: Some('i'),
        env: Some("ISTIO_SERVICE_CIDR"),
        values: cidrs,
    },
    ValueFlag {
        long: "istio-service-exclude-cidr",
        short: Some('x'),
        env: Some("ISTIO_SERVICE_EXCLUDE_CIDR"),
        values: cidrs,
    },
    ValueFlag {
        long: "istio-outbound-ports",
        short: Some('q'),
        env: Some("ISTIO_OUTBOUND_PORTS"),
        values: ports,
    },
    ValueFlag {
        long: "istio-local-outbound-ports-exclude",
        short: Some('o'),
        env: Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
        values: ports,
    },
    ValueFlag {
        long: "kube-virt-interfaces",
        short: Some('k'),
        env: Some("KUBE_VIRT_INTERFACES"),
        values: ifaces,
    },
    ValueFlag {
        long: "istio-inbound-tproxy-mark",
        short: Some('t'),
        env: Some("ISTIO_INBOUND_TPROXY_MARK"),
        values: mark,
    },
    ValueFlag {
        long: "istio-inbound-tproxy-route-table",
        short: Some('r'),
        env: Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
        values: table,
    },
    ValueFlag {
        long: "iptables-probe-port",
        short: None,
        env: Some("IPTABLES_PROBE_PORT"),
        values: port,
    },
    ValueFlag {
        long: "probe-timeout",
        short: None,
        env: Some("PROBE_TIMEOUT"),
        values: probe_timeout,
    },
    ValueFlag {
        long: "network-namespace",
        short: None,
        env: Some("NETWORK_NAMESPACE"),
        values: netns_path,
    },
    ValueFlag {
        long: "force-iptables-binary",
        short: None,
        env: Some("FORCE_IPTABLES_BINARY"),
        values: force_binary,
    },
];

/// Switches and their variables (the later variable wins upstream). `--run-validation` and
/// `--dry-run` are handled apart: the first waits for a probe, the second must always hold.
const SWITCHES: &[(&str, &[&str])] = &[
    ("skip-rule-apply", &["SKIP_RULE_APPLY"]),
    ("redirect-dns", &["REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"]),
    ("drop-invalid", &["DROP_INVALID", "INVALID_DROP"]),
    ("dual-stack", &["DUAL_STACK", "ISTIO_DUAL_STACK"]),
    ("capture-all-dns", &["CAPTURE_ALL_DNS"]),
    ("cni-mode", &["CNI_MODE"]),
    ("reconcile", &["RECONCILE"]),
    ("cleanup-only", &["CLEANUP_ONLY"]),
    ("force-apply", &["FORCE_APPLY"]),
    ("native-nftables", &["NATIVE_NFTABLES"]),
];

const BOOL_WORDS: &[&str] = &[
    "true", "false", "1", "0", "t", "f", "T", "F", "TRUE", "False",
];
const BAD_BOOL_WORDS: &[&str] = &["yes", "", "on", "2"];

fn value_token(rng: &mut Rng, f: &ValueFlag) -> Token {
    let v = (f.values)(rng);
    if let Some(env) = f.env.filter(|_| rng.chance(25)) {
        return Token::Env(env.into(), v);
    }
    let long = format!("--{}", f.long);
    let words = match (rng.below(5), f.short) {
        (0, _) => vec![long, v],
        (1, Some(s)) => vec![format!("-{s}"), v],
        (2, Some(s)) if !v.is_empty() => vec![format!("-{s}{v}")],
        (3, Some(s)) => vec![format!("-{s}={v}")],
        _ => vec![format!("{long}={v}")],
    };
    Token::Arg(words)
}

fn switch_token(rng: &mut Rng, long: &str, envs: &[&str]) -> Token {
    if rng.chance(25) {
        let v = one(rng, BOOL_WORDS, BAD_BOOL_WORDS, 10);
        return Token::Env(rng.pick(envs).to_string(), v);
    }
    match rng.below(3) {
        0 => Token::Arg(vec![format!(
            "--{long}={}",
            one(rng, BOOL_WORDS, BAD_BOOL_WORDS, 5)
        )]),
        _ => Token::Arg(vec![format!("--{long}")]),
    }
}

/// The dry-run switch in one of its spellings; never a false value, so neither tool ever touches
/// the host's iptables (Istio's nftables path ignores it and programs the sandbox namespace).
fn dry_run_token(rng: &mut Rng) -> Token {
    let arg = |s: &str| Token::Arg(vec![s.to_string()]);
    match rng.below(8) {
        0 => arg("-n"),
        1 => arg("--dry-run=true"),
        2 => arg("--dry-run=1"),
        3 => arg("-n=t"),
        4 => Token::Env(
            "DRY_RUN".into(),
            rng.pick(&["true", "1", "t", "TRUE"]).to_string(),
        ),
        _ => arg("--dry-run"),
    }
}

fn env_only_tokens(rng: &mut Rng, out: &mut Vec<Token>) {
    let mut env = |k: &str, v: String| out.push(Token::Env(k.into(), v));
    if rng.chance(15) {
        let v = match rng.below(6) {
            0 => "*".to_string(),
            1 => String::new(),
            2 => (0..65)
                .map(|i| (1000 + i).to_string())
                .collect::<Vec<_>>()
                .join(","),
            3 => (0..64)
                .map(|i| (1000 + i).to_string())
                .collect::<Vec<_>>()
                .join(","),
            _ => list(rng, GROUPS, BAD_GROUPS),
        };
        env("ISTIO_OUTBOUND_OWNER_GROUPS", v);
    }
    if rng.chance(15) {
        env(
            "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
            list(rng, GROUPS, BAD_GROUPS),
        );
    }
    if rng.chance(10) {
        let good = &[
            "127.0.0.1/32",
            "127.0.0.0/8",
            "127.1.0.0/16",
            "127.0.0.2/31",
        ];
        let bad = &[
            "127.0.0.1/7",
            "10.0.0.1/32",
            "::1/128",
            "bogus",
            "127.0.0.1",
            "",
        ];
        env("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", one(rng, good, bad, 35));
    }
    if rng.chance(8) {
        let users = &["istio-proxy", "root", "nobody", "daemon", "nosuchuser", ""];
        env("ENVOY_USER", rng.pick(users).to_string());
    }
}

/// Rarely: input both tools must refuse, or that pflag reads oddly.
fn odd_tokens(rng: &mut Rng, out: &mut Vec<Token>) {
    let arg = |w: &[&str]| Token::Arg(w.iter().map(|s| s.to_string()).collect());
    match rng.below(60) {
        0 => out.push(arg(&["--bogus-flag"])),
        1 => out.push(arg(&["extra-positional"])),
        2 => out.push(arg(&["--redirect-dns", "false"])),
        3 => out.push(arg(&["-Z"])),
        4 => out.push(arg(&["--log_output_level=default:info"])),
        5 => out.push(arg(&["--log_output_level=nonsense"])),
        6 => out.push(arg(&[
            "--log_caller=default",
            "--log_stacktrace_level=default:none",
        ])),
        7 => out.push(arg(&["--iptables-probe-port"])),
        8 => {
            // Validation without rules fails in both; a short timeout keeps the case quick.
            out.push(arg(&["--run-validation", "--probe-timeout=50ms"]));
        }
        _ => {}
    }
}

/// The `index`-th case of the run seeded with `seed` (independent of the other cases, so a
/// failure names its seed and index and reproduces alone).
pub fn case(seed: u64, index: u64) -> Case {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0xa076_1d64_78bd_642f));
    let mut tokens = vec![dry_run_token(&mut rng)];
    for f in VALUE_FLAGS {
        if rng.chance(30) {
            tokens.push(value_token(&mut rng, f));
            if rng.chance(6) {
                tokens.push(value_token(&mut rng, f));
            }
        }
    }
    for (long, envs) in SWITCHES {
        if rng.chance(18) {
            tokens.push(switch_token(&mut rng, long, envs));
        }
    }
    env_only_tokens(&mut rng, &mut tokens);
    // Argv order is shuffled (pflag takes flags in any order); variables are a set.
    for i in (1..tokens.len()).rev() {
        let j = rng.below(i + 1);
        tokens.swap(i, j);
    }
    // Last, so a flag missing its value cannot take the dry-run switch as its value.
    odd_tokens(&mut rng, &mut tokens);
    let host = *rng.pick(&[0, 0, 0, 0, 1, 1, 2, 2, 3, 4]);
    let resolv = rng.below(RESOLV.len());
    let pinned = HOSTS[host].ipv6.is_some() && rng.chance(50);
    Case {
        tokens,
        host,
        resolv,
        pinned,
    }
}
