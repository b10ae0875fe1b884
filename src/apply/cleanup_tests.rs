//! The cleanup plan: Istio's list, the state pass, and the real run matching the dry run.
use super::*;
use crate::apply::exec::{CmdOutput, SpawnError};
use crate::rules::capture::{CaptureConfig, InboundPorts, InterceptionMode, build};

/// Every `expected` step is in the plan.
fn assert_has_all(lines: &[String], expected: &[&str]) {
    for e in expected {
        assert!(lines.iter().any(|l| l == e), "{e} missing: {lines:#?}");
    }
}

fn tproxy_cfg() -> CaptureConfig {
    CaptureConfig {
        mode: InterceptionMode::Tproxy,
        inbound_ports: InboundPorts::List(vec!["80".into()]),
        exclude_interfaces: vec!["eth9".into()],
        ..Default::default()
    }
}

#[test]
fn without_state_the_plan_is_istios_list_and_keeps_builtin_rules_of_any_target() {
    let rules = build(&tproxy_cfg());
    let lines: Vec<String> = family_steps(Family::V4, &rules.v4, &[], None)
        .iter()
        .map(CleanupStep::display)
        .collect();
    assert_has_all(
        &lines,
        &[
            "iptables -t mangle -D OUTPUT -p tcp -m connmark --mark 1337 -j CONNMARK --restore-mark",
            "iptables -t mangle -D PREROUTING -p tcp -m mark --mark 1337 -j CONNMARK --save-mark",
            "iptables -t nat -D PREROUTING -i eth9 -j RETURN",
            "iptables -t mangle -D OUTPUT -o eth9 -j RETURN",
            "iptables -t nat -D OUTPUT -j ISTIO_OUTPUT",
            "iptables -t mangle -F ISTIO_DIVERT",
            "iptables -t mangle -X ISTIO_DIVERT",
        ],
    );
    assert!(!lines.iter().any(|l| l.contains("-D ISTIO_REDIRECT")));
}

#[test]
fn with_state_leftover_jumps_and_our_other_chains_go_but_user_chains_stay() {
    let state = crate::rules::iptables_save_decode::decode_save(
        "*nat\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_OUTPUT_DNS - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\n-A OUTPUT -o lo -j ISTIO_OUTPUT_DNS\n-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS\nCOMMIT\n*filter\n:ISTIO_FW - [0:0]\n:INPUT ACCEPT [0:0]\n-A INPUT -j ISTIO_FW\nCOMMIT\n",
    );
    let rules = build(&CaptureConfig::default());
    let lines: Vec<String> = family_steps(Family::V4, &rules.v4, &[], Some(&state))
        .iter()
        .map(CleanupStep::display)
        .collect();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("-D OUTPUT -j ISTIO_OUTPUT"))
            .count(),
        1,
        "{lines:#?}"
    );
    assert_has_all(
        &lines,
        &[
            "iptables -t nat -D OUTPUT -o lo -j ISTIO_OUTPUT_DNS",
            "iptables -t nat -D ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS",
            "iptables -t nat -F ISTIO_OUTPUT_DNS",
            "iptables -t nat -X ISTIO_OUTPUT_DNS",
        ],
    );
    assert!(!lines.iter().any(|l| l.contains("ISTIO_FW")), "{lines:#?}");
}

#[test]
fn undo_text_removes_what_a_committed_table_added() {
    let rules = build(&tproxy_cfg());
    let text = undo_restore_text(&rules.v4, &BTreeSet::from([Table::Mangle]));
    assert!(text.starts_with("*mangle\n"), "{text}");
    assert!(
        text.contains("-D PREROUTING -p tcp -j ISTIO_INBOUND\n"),
        "{text}"
    );
    assert!(text.contains("-X ISTIO_TPROXY\n"), "{text}");
    assert!(!text.contains("*nat"), "{text}");
}

/// Answers saves with canned text and records every command.
struct Recorder {
    saves: [String; 2],
    ran: Vec<String>,
}

impl Executor for Recorder {
    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, SpawnError> {
        self.ran.push(cmd.display());
        let stdout = match cmd.program.as_str() {
            "iptables-save" => self.saves[0].clone(),
            "ip6tables-save" => self.saves[1].clone(),
            _ => String::new(),
        };
        Ok(CmdOutput {
            success: true,
            stdout,
            ..Default::default()
        })
    }
}

#[test]
fn the_real_run_performs_exactly_the_dry_run_transcript() {
    let cfg = CaptureConfig {
        enable_ipv6: true,
        ..tproxy_cfg()
    };
    let v4_only = build(&tproxy_cfg());
    let both = build(&cfg);
    let v6_state =
        "*nat\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\nCOMMIT\n";
    let mut rec = Recorder {
        saves: [String::new(), v6_state.to_string()],
        ran: vec![],
    };
    let (b4, b6) = (Binaries::plain(Family::V4), Binaries::plain(Family::V6));
    let bins = [Some(&b4), Some(&b6)];
    // IPv6 not enabled for this run, but ip6tables holds our chains: both families go.
    let input = CleanupInput {
        v4: &v4_only.v4,
        v6: &both.v6,
        ipv6_enabled: false,
        also: [&[], &[]],
    };
    let plan = make_plan(&mut rec, bins, &input, &[]).unwrap();
    rec.saves[1].clear();
    run_plan(&mut rec, bins, &plan, &[]).unwrap();
    assert_eq!(rec.ran, plan.transcript());
    assert!(
        plan.transcript()
            .iter()
            .any(|l| l.starts_with("ip6tables -t mangle -D PREROUTING"))
    );
    assert_eq!(plan.transcript().last().unwrap(), "ip6tables-save");
}

#[test]
fn a_chain_of_ours_left_at_the_end_is_an_error() {
    let saved = "*nat\n:ISTIO_OUTPUT - [0:0]\nCOMMIT\n".to_string();
    let mut rec = Recorder {
        saves: [saved, String::new()],
        ran: vec![],
    };
    let b4 = Binaries::plain(Family::V4);
    let rules = build(&CaptureConfig::default());
    let input = CleanupInput {
        v4: &rules.v4,
        v6: &[],
        ipv6_enabled: false,
        also: [&[], &[]],
    };
    let plan = make_plan(&mut rec, [Some(&b4), None], &input, &[]).unwrap();
    let err = run_plan(&mut rec, [Some(&b4), None], &plan, &[]).unwrap_err();
    assert!(err.to_string().contains("iptables"), "{err}");
}
