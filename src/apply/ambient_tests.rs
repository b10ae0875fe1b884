use super::super::exec::Executor;
use super::*;
use crate::rules::ambient::{AmbientConfig, PodOverrides, host_rules, inpod_rules};
use crate::rules::iptables::render_restore;

fn cfg(dns: bool) -> AmbientConfig {
    AmbientConfig {
        redirect_dns: dns,
        ..AmbientConfig::default()
    }
}

/// The state iptables-save shows after the plan was restored (spelled as the kernel prints it).
fn saved_after(rules: &[Rule]) -> State {
    let text = render_restore(rules)
        .replace("* ", "*")
        .replace("-N ", ":")
        .replace(" -s 169.254.7.127 ", " -s 169.254.7.127/32 ")
        .replace("--to-port 15053", "--to-ports 15053");
    let mut state = parse_save(&text);
    for table in ["mangle", "nat", "raw"] {
        if let Some(chains) = state.get_mut(table) {
            for builtin in ["PREROUTING", "OUTPUT", "INPUT", "POSTROUTING"] {
                chains.entry(builtin.to_string()).or_default();
            }
        }
    }
    state
}

#[test]
fn an_empty_netns_gets_our_chains_and_rules() {
    let rules = inpod_rules(&cfg(true), &PodOverrides::default());
    let text = plan_family(&State::new(), &rules.v4, INPOD_CHAINS).expect("changes");
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
    let mut state = saved_after(&rules.v4);
    state
        .get_mut("nat")
        .unwrap()
        .get_mut("OUTPUT")
        .unwrap()
        .push("-j ISTIO_OUTPUT".into());
    let text = plan_family(&state, &rules.v4, INPOD_CHAINS).expect("doubled jump");
    assert_eq!(
        text.matches("-D OUTPUT -j ISTIO_OUTPUT").count(),
        3,
        "{text}"
    );
    let mut state = saved_after(&rules.v4);
    state
        .get_mut("nat")
        .unwrap()
        .get_mut("ISTIO_OUTPUT")
        .unwrap()
        .push("-j ACCEPT".into());
    assert!(plan_family(&state, &rules.v4, INPOD_CHAINS).is_some());
}

#[test]
fn a_flushed_table_a_deleted_rule_or_a_replaced_jump_is_drift() {
    let rules = inpod_rules(&cfg(false), &PodOverrides::default());
    // `iptables -t nat -F`: our chains stay declared, every rule of the table goes.
    let mut flushed = saved_after(&rules.v4);
    flushed
        .get_mut("nat")
        .unwrap()
        .values_mut()
        .for_each(Vec::clear);
    let text = plan_family(&flushed, &rules.v4, INPOD_CHAINS).expect("flushed nat");
    assert!(text.contains("-A PREROUTING -j ISTIO_PRERT"), "{text}");
    // One rule of ours deleted.
    let mut deleted = saved_after(&rules.v4);
    let prert = deleted
        .get_mut("nat")
        .unwrap()
        .get_mut("ISTIO_PRERT")
        .unwrap();
    assert!(prert.len() > 1);
    prert.remove(0);
    assert!(plan_family(&deleted, &rules.v4, INPOD_CHAINS).is_some());
    // PREROUTING's jump into our chain replaced by a jump elsewhere: ours is put back, the
    // foreign rule is not ours to delete.
    let mut replaced = saved_after(&rules.v4);
    let prerouting = replaced
        .get_mut("nat")
        .unwrap()
        .get_mut("PREROUTING")
        .unwrap();
    let jump = prerouting
        .iter_mut()
        .find(|r| r.as_str() == "-j ISTIO_PRERT")
        .expect("our jump");
    *jump = "-j OTHER".into();
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
    assert_eq!(plan_family(&State::new(), &[], INPOD_CHAINS), None);
    // Foreign chains and rules are never touched.
    let foreign =
        parse_save("*nat\n:PREROUTING ACCEPT\n:KUBE-X - [0:0]\n-A PREROUTING -j KUBE-X\nCOMMIT\n");
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
    apply_iptables_with(&mut known_empty, &rules, INPOD_CHAINS, &opts, &|_, _, _| {
        Known::Empty
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
    let outcome = apply_iptables_with(&mut same, &rules, INPOD_CHAINS, &opts, &|_, _, _| {
        Known::Same
    })
    .unwrap();
    assert_eq!(outcome, RuleChange::AlreadyApplied);
    assert!(same.0.is_empty(), "{:?}", same.0);
    // The typed read saw a difference the saved text would hide: read, then restored anyway.
    let differs = |_: &Binaries, _: &[Rule], _: OwnedChains| Known::Differs("foreign rule".into());
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
    let drifted = |_: &Binaries, _: &[Rule], _: OwnedChains| Known::Drifted {
        how: "a jump missing".into(),
        state: OwnedState::default(),
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
