//! Namespaces that hold unrelated user state in every place a sidecar apply touches, and the
//! observable state a cleanup or a refused apply must leave exactly as it was.

use super::Netns;

/// Which iptables flavour the namespace uses.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Flavour {
    Nft,
    Legacy,
}

impl Flavour {
    pub fn tool(self, family: &str, suffix: &str) -> String {
        match self {
            Flavour::Nft => format!("{family}-nft{suffix}"),
            Flavour::Legacy => format!("{family}-legacy{suffix}"),
        }
    }
}

pub fn run(ns: &Netns, program: &str, args: &[&str]) -> String {
    let out = ns.try_exec(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace with an interface holding an IPv4 and a ULA IPv6 address, and user state in every
/// place a sidecar apply touches: a filter chain named `ISTIO_FW` (both families), a nat OUTPUT
/// rule, an nft table, a policy rule and a route table.
pub fn namespace_with_user_state(tag: &str, flavour: Flavour) -> Netns {
    let ns = Netns::new(tag);
    for line in [
        "link add eth0 type veth peer name eth0p",
        "link set eth0p up",
        "link set eth0 up",
        "addr add 10.254.7.2/24 dev eth0",
        "addr add fd00::7:2/64 dev eth0 nodad",
        "rule add fwmark 0x99 lookup 99 pref 500",
        "route add local default dev lo table 99",
    ] {
        run(&ns, "ip", &line.split_whitespace().collect::<Vec<_>>());
    }
    for family in ["iptables", "ip6tables"] {
        let ipt = flavour.tool(family, "");
        run(&ns, &ipt, &["-t", "filter", "-N", "ISTIO_FW"]);
        run(
            &ns,
            &ipt,
            &[
                "-t", "filter", "-A", "ISTIO_FW", "-p", "tcp", "--dport", "9", "-j", "ACCEPT",
            ],
        );
        run(
            &ns,
            &ipt,
            &["-t", "filter", "-A", "INPUT", "-j", "ISTIO_FW"],
        );
    }
    run(
        &ns,
        &flavour.tool("iptables", ""),
        &[
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-d",
            "192.0.2.1/32",
            "-j",
            "RETURN",
        ],
    );
    run(
        &ns,
        "nft",
        &[
            "add table inet userfw; add chain inet userfw c; add rule inet userfw c tcp dport 9999 accept",
        ],
    );
    ns
}

/// Everything a cleanup must give back, as text: rules of both families (no counters), the nft
/// ruleset, policy rules, every route table and the addresses on lo. Tables are listed in name
/// order (the kernel lists them in creation order, which carries no meaning here).
pub fn observed(ns: &Netns, flavour: Flavour) -> String {
    let mut out = String::new();
    for family in ["iptables", "ip6tables"] {
        let save = run(ns, &flavour.tool(family, "-save"), &[]);
        let lines: Vec<&str> = save
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|line| match line.strip_prefix(':') {
                Some(_) => line.split(" [").next().unwrap_or(line),
                None => line,
            })
            .collect();
        out.push_str(&format!(
            "## {family}\n{}",
            sorted_blocks(&lines, |l| l == "COMMIT")
        ));
    }
    let nft = run(ns, "nft", &["list", "ruleset"]);
    // nft prints an xtables target (TPROXY) as `xt target NAME` or not at all, depending on the
    // target revision iptables probed; iptables-save above shows the rule itself.
    // Chains are listed in creation order, which carries no meaning either: sorted per table.
    // Counters count traffic (IPv6 neighbour discovery...), not configuration.
    let uncounted: Vec<String> = nft
        .lines()
        .map(|l| match l.split_once("counter packets ") {
            Some((head, tail)) => {
                let rest = tail.splitn(4, ' ').nth(3).unwrap_or("");
                format!("{head}counter {rest}")
            }
            None => l.to_string(),
        })
        .collect();
    let lines: Vec<&str> = uncounted
        .iter()
        .map(|l| l.split(" xt target ").next().unwrap_or(l).trim_end())
        .filter(|l| !l.is_empty())
        .collect();
    let mut tables = Vec::new();
    let mut table: Vec<&str> = Vec::new();
    for line in lines {
        if line == "}" {
            // iptables-nft tables: their rules are compared through `*-save` above (nft prints
            // xtables targets differently depending on who encoded them); their tables, chains,
            // hooks and policies are compared here.
            let iptables_nft = table
                .first()
                .is_some_and(|h| h.starts_with("table ip ") || h.starts_with("table ip6 "));
            if iptables_nft {
                table.retain(|l| !l.starts_with("\t\t") || l.starts_with("\t\ttype "));
            }
            let (head, chains) = table
                .split_first()
                .map_or((None, &[][..]), |(h, c)| (Some(*h), c));
            tables.push(format!(
                "{}\n{}}}\n",
                head.unwrap_or(""),
                sorted_blocks(chains, |l| l == "\t}")
            ));
            table.clear();
        } else {
            table.push(line);
        }
    }
    tables.sort();
    out.push_str(&format!("## nft\n{}", tables.concat()));
    for (title, program, args) in [
        ("rule4", "ip", vec!["-4", "rule"]),
        ("rule6", "ip", vec!["-6", "rule"]),
        ("route4", "ip", vec!["-4", "route", "show", "table", "all"]),
        ("route6", "ip", vec!["-6", "route", "show", "table", "all"]),
        ("lo", "ip", vec!["addr", "show", "dev", "lo"]),
    ] {
        // Link-local addresses come and go with IPv6 duplicate address detection: not ours.
        let text = run(ns, program, &args);
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("fe80")).collect();
        out.push_str(&format!("## {title}\n{}\n", lines.join("\n")));
    }
    out
}

/// The lines grouped into blocks (each ends with a line `ends` accepts), blocks sorted.
fn sorted_blocks(lines: &[&str], ends: impl Fn(&str) -> bool) -> String {
    let mut blocks = Vec::new();
    let mut block = String::new();
    for line in lines {
        block.push_str(line);
        block.push('\n');
        if ends(line) {
            blocks.push(std::mem::take(&mut block));
        }
    }
    blocks.push(block);
    blocks.sort();
    blocks.concat()
}

/// Legacy tables, once loaded, cannot be unloaded: compare legacy states without the table
/// sections that hold nothing but empty built-in chains that accept everything.
pub fn without_idle_legacy_tables(text: &str) -> String {
    let mut out = Vec::new();
    let mut table: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('*') {
            table = vec![line];
        } else if !table.is_empty() {
            table.push(line);
            if line == "COMMIT" {
                let idle = table[1..table.len() - 1]
                    .iter()
                    .all(|l| l.starts_with(':') && l.ends_with(" ACCEPT"));
                if !idle {
                    out.append(&mut table);
                }
                table.clear();
            }
        } else {
            out.push(line);
        }
    }
    out.join("\n")
}

/// Asserts equal states, showing only the lines that differ.
#[track_caller]
pub fn assert_same(actual: &str, expected: &str, what: &str) {
    if actual == expected {
        return;
    }
    let only = |a: &str, b: &str| -> Vec<String> {
        let theirs: Vec<&str> = b.lines().collect();
        a.lines()
            .filter(|l| !theirs.contains(l))
            .map(str::to_string)
            .collect()
    };
    let (a, e): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), expected.lines().collect());
    let first = a
        .iter()
        .zip(&e)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(e.len()));
    let around = |v: &[&str]| v[first.saturating_sub(3)..(first + 6).min(v.len())].join("\n");
    panic!(
        "{what}\nonly in actual:\n{}\nonly in expected:\n{}\nfirst difference, actual:\n{}\nexpected:\n{}\n(full actual:\n{actual})",
        only(actual, expected).join("\n"),
        only(expected, actual).join("\n"),
        around(&a),
        around(&e)
    );
}
