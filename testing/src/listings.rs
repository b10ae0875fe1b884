//! Readers of what the kernel's own tools print (`nft list`, `ipset save`), for tests that compare
//! the product's work with what an operator sees. The product itself reads the kernel over
//! netlink into typed rules, so none of this ships.

use istio_cni::apply::probe_set::Entries;

/// The `table <family> <prefix>*` blocks of an `nft list ruleset` text only, without rule
/// handles and counter values, which differ between two identical rule sets.
pub fn normalise_nft_listing(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut ours = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("table ") {
            ours = rest
                .split_whitespace()
                .nth(1)
                .is_some_and(|name| name.starts_with(prefix));
        }
        if !ours {
            continue;
        }
        let line = line.split(" # handle ").next().unwrap_or(line);
        let mut words: Vec<&str> = line.split(' ').collect();
        while let Some(i) = words.iter().position(|w| *w == "packets") {
            // `counter packets N bytes M` -> `counter`
            words.drain(i..(i + 4).min(words.len()));
        }
        out.push_str(&words.join(" "));
        out.push('\n');
    }
    out
}

/// The in-pod ambient tables (`istio-ambient-*`) of an `nft list ruleset` text, normalised.
pub fn normalise_ambient_nft_listing(text: &str) -> String {
    normalise_nft_listing(text, istio_cni::apply::ambient::OUR_NFT_TABLES)
}

/// `ipset save` lines `add SET IP comment "UID"`.
pub fn parse_ipset_save(text: &str) -> Entries {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("add ")?;
            let mut words = rest.splitn(3, ' ');
            let (_set, ip) = (words.next()?, words.next()?.parse().ok()?);
            let uid = words
                .next()
                .and_then(|tail| tail.split("comment \"").nth(1))
                .and_then(|c| c.split('"').next())
                .unwrap_or_default();
            Some((ip, uid.to_string()))
        })
        .collect()
}

/// `nft list set` output: `elements = { IP comment "UID", ... }` (possibly over several lines).
pub fn parse_nft_set(text: &str) -> Entries {
    let Some(start) = text.find("elements = {") else {
        return Entries::new();
    };
    let body = &text[start + "elements = {".len()..];
    let body = &body[..body.find('}').unwrap_or(body.len())];
    body.split(',')
        .filter_map(|item| {
            let item = item.trim();
            let ip = item.split_whitespace().next()?.parse().ok()?;
            let uid = item
                .split("comment \"")
                .nth(1)
                .and_then(|c| c.split('"').next())
                .unwrap_or_default();
            Some((ip, uid.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[(&str, &str)]) -> Entries {
        list.iter()
            .map(|(ip, uid)| (ip.parse().unwrap(), uid.to_string()))
            .collect()
    }

    fn listing(handle: u32, packets: u32, verdict: &str) -> String {
        format!(
            "table inet other {{\n}}\ntable inet istio-proxy-nat {{\n\tchain output {{\n\t\tmeta l4proto tcp counter packets {packets} bytes {packets} {verdict} # handle {handle}\n\t}}\n}}\n"
        )
    }

    #[test]
    fn listings_compare_without_handles_counters_and_other_tables() {
        let a = normalise_nft_listing(&listing(1, 0, "accept"), "istio-proxy-");
        assert_eq!(
            a,
            normalise_nft_listing(&listing(7, 42, "accept"), "istio-proxy-")
        );
        assert!(!a.contains("other"));
        assert_eq!(
            normalise_nft_listing(&listing(1, 0, "accept"), "istio-ambient-"),
            ""
        );
        assert_ne!(
            a,
            normalise_nft_listing(&listing(1, 0, "drop"), "istio-proxy-")
        );
    }

    #[test]
    fn ambient_listings_compare_without_handles_counters_or_foreign_tables() {
        let listing = |handle: u32, packets: u32| {
            format!(
                "table inet istio-ambient-nat {{ # handle {handle}\n\tchain istio-output {{ # handle 4\n\t\tmeta l4proto tcp counter packets {packets} bytes {} accept # handle {}\n\t}}\n}}\ntable ip filter {{ # handle 9\n\tchain x {{\n\t}}\n}}\n",
                packets * 60,
                handle + 10
            )
        };
        let a = normalise_ambient_nft_listing(&listing(1, 0));
        assert_eq!(a, normalise_ambient_nft_listing(&listing(7, 42)));
        assert!(a.contains("meta l4proto tcp counter accept"), "{a}");
        assert!(!a.contains("filter"), "{a}");
        assert_ne!(
            a,
            normalise_ambient_nft_listing(&listing(1, 0).replace("accept #", "drop #"))
        );
    }

    #[test]
    fn parses_both_listings() {
        let saved = "create istio-inpod-probes-v4 hash:ip family inet hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x1\nadd istio-inpod-probes-v4 10.0.0.1 comment \"uid-1\"\nadd istio-inpod-probes-v4 10.0.0.2\n";
        assert_eq!(
            parse_ipset_save(saved),
            entries(&[("10.0.0.1", "uid-1"), ("10.0.0.2", "")])
        );
        let listed = "table inet istio-ambient-nat {\n\tset istio-inpod-probes-v4 {\n\t\ttype ipv4_addr\n\t\tcomment \"UUID of the pods\"\n\t\telements = { 10.0.0.1 comment \"u1\",\n\t\t\t     10.0.0.2 comment \"u2\" }\n\t}\n}\n";
        assert_eq!(
            parse_nft_set(listed),
            entries(&[("10.0.0.1", "u1"), ("10.0.0.2", "u2")])
        );
        assert!(parse_nft_set("table inet x {\n\tset s {\n\t}\n}\n").is_empty());
    }
}
