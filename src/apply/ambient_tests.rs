use super::super::exec::Executor;
use super::*;
use crate::rules::ambient::{AmbientConfig, PodOverrides, host_rules, inpod_rules};
use crate::rules::iptables::render_restore;
use crate::rules::iptables_save_decode::decode_save;
use crate::rules::iptables_state::{DecodedRule, RuleAt};

fn cfg(dns: bool) -> AmbientConfig {
    AmbientConfig {
        redirect_dns: dns,
        ..AmbientConfig::default()
    }
}

/// The text iptables-save shows after the plan was restored (spelled as the kernel prints it).
fn saved_text_after(rules: &[Rule]) -> String {
    let text = render_restore(rules)
        .replace("* ", "*")
        .replace(" -s 169.254.7.127 ", " -s 169.254.7.127/32 ")
        .replace("--to-port 15053", "--to-ports 15053");
    let mut out = String::new();
    for line in text.lines() {
        match line.strip_prefix("-N ") {
            Some(chain) => out.push_str(&format!(":{chain} - [0:0]\n")),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
        if line
            .strip_prefix('*')
            .is_some_and(|t| ["mangle", "nat", "raw"].contains(&t))
        {
            for builtin in ["PREROUTING", "OUTPUT", "INPUT", "POSTROUTING"] {
                out.push_str(&format!(":{builtin} ACCEPT [0:0]\n"));
            }
        }
    }
    out
}

/// The state iptables-save shows after the plan was restored.
fn saved_after(rules: &[Rule]) -> IptablesState {
    decode_save(&saved_text_after(rules))
}

/// `saved_text_after(rules)` with the rule lines of `table` edited, read back.
fn saved_edited(rules: &[Rule], table: &str, edit: impl FnOnce(&mut Vec<String>)) -> IptablesState {
    let text = saved_text_after(rules);
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let start = lines
        .iter()
        .position(|l| *l == format!("*{table}"))
        .unwrap()
        + 1;
    let end = start + lines[start..].iter().position(|l| l == "COMMIT").unwrap();
    let mut section: Vec<String> = lines.drain(start..end).collect();
    edit(&mut section);
    for (i, line) in section.into_iter().enumerate() {
        lines.insert(start + i, line);
    }
    decode_save(&lines.join("\n"))
}

#[test]
fn an_empty_netns_gets_our_chains_and_rules() {
    let rules = inpod_rules(&cfg(true), &PodOverrides::default());
    let text = plan_family(&IptablesState::default(), &rules.v4, INPOD_CHAINS).expect("changes");
    assert!(
        text.starts_with(
            "*mangle\n:ISTIO_PRERT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A PREROUTING -j ISTIO_PRERT\n"
        ),
        "{text}"
    );
    assert!(text.contains("*raw\n") && !text.contains("-D ") && !text.contains("-X "));
}

#[test]
fn the_same_state_again_changes_nothing() {
    for dns in [false, true] {
        let rules = inpod_rules(&cfg(dns), &PodOverrides::default());
        let state = saved_after(&rules.v4);
        assert_eq!(
            plan_family(&state, &rules.v4, INPOD_CHAINS),
            None,
            "dns {dns}"
        );
    }
    let host = host_rules(&AmbientConfig::default());
    let state = saved_after(&host.v4);
    assert_eq!(plan_family(&state, &host.v4, HOST_CHAINS), None);
}

#[test]
fn a_changed_plan_replaces_our_chains_and_drops_unused_ones() {
    let before = inpod_rules(&cfg(true), &PodOverrides::default());
    let state = saved_after(&before.v4);
    let after = inpod_rules(&cfg(false), &PodOverrides::default());
    let text = plan_family(&state, &after.v4, INPOD_CHAINS).expect("DNS went off");
    let raw = &text[text.find("*raw").expect("raw cleaned")..];
    assert!(
        raw.contains("-D OUTPUT -j ISTIO_OUTPUT\n-D PREROUTING -j ISTIO_PRERT\n"),
        "{raw}"
    );
    assert!(
        raw.contains("-X ISTIO_PRERT\n-X ISTIO_OUTPUT\nCOMMIT"),
        "{raw}"
    );
    // The other tables: old jumps deleted once, then the plan appended.
    assert!(text.contains("*nat\n:ISTIO_PRERT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n-D OUTPUT -j ISTIO_OUTPUT\n-D PREROUTING -j ISTIO_PRERT\n"), "{text}");
}

#[test]
fn a_doubled_jump_or_a_foreign_rule_in_our_chain_is_drift() {
    let rules = inpod_rules(&cfg(false), &PodOverrides::default());
    let state = saved_edited(&rules.v4, "nat", |lines| {
        lines.push("-A OUTPUT -j ISTIO_OUTPUT".into())
    });
    let text = plan_family(&state, &rules.v4, INPOD_CHAINS).expect("doubled jump");
    assert_eq!(
        text.matches("-D OUTPUT -j ISTIO_OUTPUT").count(),
        3,
        "{text}"
    );
    let state = saved_edited(&rules.v4, "nat", |lines| {
        lines.push("-A ISTIO_OUTPUT -j ACCEPT".into())
    });
    assert!(plan_family(&state, &rules.v4, INPOD_CHAINS).is_some());
}

#[test]
fn a_flushed_table_a_deleted_rule_or_a_replaced_jump_is_drift() {
    let rules = inpod_rules(&cfg(false), &PodOverrides::default());
    // `iptables -t nat -F`: our chains stay declared, every rule of the table goes.
    let flushed = saved_edited(&rules.v4, "nat", |lines| {
        lines.retain(|l| !l.starts_with("-A "))
    });
    let text = plan_family(&flushed, &rules.v4, INPOD_CHAINS).expect("flushed nat");
    assert!(text.contains("-A PREROUTING -j ISTIO_PRERT"), "{text}");
    // One rule of ours deleted.
    let deleted = saved_edited(&rules.v4, "nat", |lines| {
        let prert: Vec<usize> = (0..lines.len())
            .filter(|i| lines[*i].starts_with("-A ISTIO_PRERT "))
            .collect();
        assert!(prert.len() > 1);
        lines.remove(prert[0]);
    });
    assert!(plan_family(&deleted, &rules.v4, INPOD_CHAINS).is_some());
    // PREROUTING's jump into our chain replaced by a jump elsewhere: ours is put back, the
    // foreign rule is not ours to delete.
    let replaced = saved_edited(&rules.v4, "nat", |lines| {
        let jump = lines
            .iter_mut()
            .find(|r| r.as_str() == "-A PREROUTING -j ISTIO_PRERT")
            .expect("our jump");
        *jump = "-A PREROUTING -j OTHER".into();
    });
    let text = plan_family(&replaced, &rules.v4, INPOD_CHAINS).expect("replaced jump");
    assert!(text.contains("-A PREROUTING -j ISTIO_PRERT"), "{text}");
    assert!(!text.contains("OTHER"), "{text}");
}

#[test]
fn removing_is_the_plan_without_rules() {
    let rules = inpod_rules(&cfg(true), &PodOverrides::default());
    let state = saved_after(&rules.v4);
    let text = plan_family(&state, &[], INPOD_CHAINS).expect("something to remove");
    assert!(!text.contains("-A "), "{text}");
    assert_eq!(text.matches("-X ").count(), 6, "{text}");
    assert_eq!(
        plan_family(&IptablesState::default(), &[], INPOD_CHAINS),
        None
    );
    // Foreign chains and rules are never touched.
    let foreign =
        decode_save("*nat\n:PREROUTING ACCEPT\n:KUBE-X - [0:0]\n-A PREROUTING -j KUBE-X\nCOMMIT\n");
    assert_eq!(plan_family(&foreign, &[], INPOD_CHAINS), None);
}

#[test]
fn the_nft_transaction_deletes_tables_the_pod_no_longer_uses() {
    let text = inpod_nft_transaction(&cfg(false), &PodOverrides::default()).render();
    // Every table of ours goes first (with anything added to it), then the used ones return.
    for t in ["nat", "mangle", "raw"] {
        let delete =
            format!("add table inet istio-ambient-{t}\ndelete table inet istio-ambient-{t}\n");
        assert!(
            text.starts_with(&crate::rules::nftables::render_cleanup(
                &NftTable::AMBIENT_POD
            )),
            "{text}"
        );
        assert_eq!(text.matches(&delete).count(), 1, "{text}");
    }
    assert!(
        !text.contains("flush table inet istio-ambient-raw"),
        "{text}"
    );
    assert!(
        text.contains("flush table inet istio-ambient-nat"),
        "{text}"
    );
    let with_dns = inpod_nft_transaction(&cfg(true), &PodOverrides::default()).render();
    assert!(
        with_dns.contains("flush table inet istio-ambient-raw"),
        "{with_dns}"
    );
}

/// Records what would run; every command succeeds with no output (an empty netns's `*-save`).
#[derive(Default)]
struct Recorder(Vec<String>);

impl Executor for Recorder {
    fn run(
        &mut self,
        cmd: &super::super::exec::Cmd,
    ) -> Result<super::super::exec::CmdOutput, super::super::exec::SpawnError> {
        self.0.push(cmd.program.clone());
        Ok(super::super::exec::CmdOutput {
            success: true,
            code: Some(0),
            stdout: String::new(),
            stderr: String::new(),
        })
    }
}

#[test]
fn a_netns_without_tables_is_programmed_without_reading_it_first() {
    let rules = inpod_rules(&cfg(false), &PodOverrides::default());
    let opts = AmbientApply::default();
    let mut known_empty = Recorder::default();
    apply_iptables_with(&mut known_empty, &rules, INPOD_CHAINS, &opts, &|_| {
        Some(IptablesState::default())
    })
    .unwrap();
    assert!(
        !known_empty.0.is_empty() && known_empty.0.iter().all(|p| p.contains("restore")),
        "{:?}",
        known_empty.0
    );
    let mut unknown = Recorder::default();
    apply_iptables(&mut unknown, &rules, INPOD_CHAINS, &opts).unwrap();
    let (saves, restores): (Vec<&String>, Vec<&String>) =
        unknown.0.iter().partition(|p| p.contains("save"));
    assert!(!saves.is_empty(), "a save per family otherwise: {saves:?}");
    assert_eq!(restores, known_empty.0.iter().collect::<Vec<_>>());
}

#[test]
fn rules_read_back_as_the_plan_start_no_process_and_a_typed_difference_is_healed() {
    let rules = inpod_rules(&cfg(false), &PodOverrides::default());
    let opts = AmbientApply::default();
    let mut same = Recorder::default();
    let outcome = apply_iptables_with(&mut same, &rules, INPOD_CHAINS, &opts, &|b| {
        Some(saved_after(rules.family(b.family)))
    })
    .unwrap();
    assert_eq!(outcome, RuleChange::AlreadyApplied);
    assert!(same.0.is_empty(), "{:?}", same.0);
    // The typed read saw a difference it cannot heal over netlink (a jump into our chain read
    // without a handle): read with `*-save`, then restored anyway.
    let differs = |b: &Binaries| {
        let mut state = saved_after(rules.family(b.family));
        if b.family == Family::V6 {
            return Some(state);
        }
        state.rules.push(DecodedRule {
            table: "nat".into(),
            chain: "OUTPUT".into(),
            at: RuleAt::SavedArgs("-m comment --comment x -j ISTIO_OUTPUT".into()),
            jumps_to: Some("ISTIO_OUTPUT".into()),
            rule: Err(crate::rules::model::ForeignRule("comment".into())),
        });
        Some(state)
    };
    let mut healed = Recorder::default();
    let outcome = apply_iptables_with(&mut healed, &rules, INPOD_CHAINS, &opts, &differs).unwrap();
    assert_eq!(outcome, RuleChange::Applied);
    assert!(
        healed.0.iter().any(|p| p.contains("restore")),
        "{:?}",
        healed.0
    );
}

#[test]
fn a_typed_difference_without_a_netlink_encoding_is_healed_with_save_and_restore() {
    // The host's SNAT to a probe set has no netlink encoding: no transaction, the text path.
    let rules = host_rules(&AmbientConfig::default());
    let opts = AmbientApply::default();
    let drifted = |_: &Binaries| {
        let mut state = IptablesState::default();
        state.chains.insert(("nat".into(), "POSTROUTING".into()));
        Some(state)
    };
    let mut healed = Recorder::default();
    let outcome = apply_iptables_with(&mut healed, &rules, HOST_CHAINS, &opts, &drifted).unwrap();
    assert_eq!(outcome, RuleChange::Applied);
    assert!(
        healed.0.iter().any(|p| p.contains("save")),
        "{:?}",
        healed.0
    );
    assert!(
        healed.0.iter().any(|p| p.contains("restore")),
        "{:?}",
        healed.0
    );
}
