//! The all-or-nothing rules of [`super::apply_sidecar`], driven by a scripted executor.

use super::*;
use crate::apply::exec::{CmdOutput, SpawnError};
use crate::rules::capture::{CaptureConfig, InboundPorts, InterceptionMode, build};

/// Answers saves from a per-family text, fails restores whose stdin contains a marker, records
/// every command (program, args, stdin).
struct Script {
    saves: [String; 2],
    fail_restore_containing: Option<(&'static str, &'static str)>,
    ran: Vec<Cmd>,
}

impl Script {
    fn new() -> Script {
        Script {
            saves: [String::new(), String::new()],
            fail_restore_containing: None,
            ran: vec![],
        }
    }

    fn writes(&self) -> Vec<&Cmd> {
        self.ran
            .iter()
            .filter(|c| !c.program.ends_with("-save") && !c.args.contains(&"-C".to_string()))
            .collect()
    }
}

impl Executor for Script {
    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, SpawnError> {
        self.ran.push(cmd.clone());
        let mut out = CmdOutput {
            success: true,
            ..Default::default()
        };
        match cmd.program.as_str() {
            "iptables-save" => out.stdout = self.saves[0].clone(),
            "ip6tables-save" => out.stdout = self.saves[1].clone(),
            p if p.ends_with("-restore") => {
                if let (Some((marker, stderr)), Some(stdin)) =
                    (self.fail_restore_containing, &cmd.stdin)
                    && stdin.contains(marker)
                {
                    out.success = false;
                    out.stderr = stderr.to_string();
                }
            }
            _ => {}
        }
        Ok(out)
    }
}

fn tproxy() -> CaptureConfig {
    CaptureConfig {
        mode: InterceptionMode::Tproxy,
        inbound_ports: InboundPorts::List(vec!["80".into()]),
        ..Default::default()
    }
}

const REDIRECT_APPLIED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_INBOUND - [0:0]\n:ISTIO_IN_REDIRECT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_REDIRECT - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN\nCOMMIT\n";

#[test]
fn a_fresh_namespace_costs_one_restore_per_family_and_nothing_else() {
    let mut script = Script::new();
    let rules = build(&CaptureConfig {
        enable_ipv6: true,
        ..tproxy()
    });
    let fresh = Fresh::from([(Family::V4, BTreeSet::new()), (Family::V6, BTreeSet::new())]);
    let outcome = apply_sidecar(
        &mut script,
        &[Binaries::plain(Family::V4), Binaries::plain(Family::V6)],
        &rules,
        &SidecarOptions::default(),
        &fresh,
    )
    .unwrap();
    assert_eq!(outcome, RuleChange::Applied);
    let programs: Vec<&str> = script.ran.iter().map(|c| c.program.as_str()).collect();
    assert_eq!(programs, ["iptables-restore", "ip6tables-restore"]);
}

#[test]
fn drift_without_reconcile_is_refused_before_any_write() {
    let mut script = Script::new();
    script.saves[0] = REDIRECT_APPLIED.to_string();
    let rules = build(&tproxy());
    let err = apply_sidecar(
        &mut script,
        &[Binaries::plain(Family::V4)],
        &rules,
        &SidecarOptions::default(),
        &Fresh::new(),
    )
    .unwrap_err();
    assert!(matches!(err, ApplyError::Drift { .. }), "{err}");
    assert!(script.writes().is_empty(), "{:#?}", script.writes());
}

#[test]
fn a_fresh_restore_failing_in_a_later_table_undoes_the_committed_one() {
    let mut script = Script::new();
    let rules = build(&tproxy());
    // mangle (lines before nat) commits, nat fails on its first rule.
    let text = render_restore(&rules.v4);
    let nat_line = text.lines().position(|l| l == "* nat").unwrap() + 2;
    let stderr: &'static str = format!("iptables-restore: line {nat_line} failed").leak();
    script.fail_restore_containing = Some(("* nat", stderr));
    let fresh = Fresh::from([(Family::V4, BTreeSet::new())]);
    let err = apply_sidecar(
        &mut script,
        &[Binaries::plain(Family::V4)],
        &rules,
        &SidecarOptions::default(),
        &fresh,
    )
    .unwrap_err();
    assert!(matches!(err, ApplyError::Failed { .. }), "{err}");
    let writes = script.writes();
    assert_eq!(writes.len(), 2, "{writes:#?}");
    let undo = writes[1].stdin.as_deref().unwrap();
    assert_eq!(
        undo,
        undo_restore_text(&rules.v4, &BTreeSet::from([Table::Mangle]))
    );
}

#[test]
fn a_failing_second_family_undoes_the_first() {
    let mut script = Script::new();
    let rules = build(&CaptureConfig {
        enable_ipv6: true,
        ..tproxy()
    });
    script.fail_restore_containing = Some(("::1/128", "ip6tables-restore: line 3 failed"));
    let fresh = Fresh::from([(Family::V4, BTreeSet::new()), (Family::V6, BTreeSet::new())]);
    apply_sidecar(
        &mut script,
        &[Binaries::plain(Family::V4), Binaries::plain(Family::V6)],
        &rules,
        &SidecarOptions::default(),
        &fresh,
    )
    .unwrap_err();
    let undo = script
        .writes()
        .iter()
        .find(|c| c.program == "iptables-restore" && c.stdin.as_ref().unwrap().contains("-X"))
        .map(|c| c.stdin.clone().unwrap())
        .expect("IPv4 undone");
    assert!(undo.contains("*mangle") && undo.contains("*nat"), "{undo}");
}

#[test]
fn a_failed_reconcile_puts_every_touched_table_back_from_the_snapshot() {
    let mut script = Script::new();
    script.saves[0] = REDIRECT_APPLIED.to_string();
    script.fail_restore_containing = Some(("ISTIO_TPROXY", "iptables-restore: line 4 failed"));
    let rules = build(&tproxy());
    let opts = SidecarOptions {
        reconcile: true,
        ..Default::default()
    };
    // After the (scripted) failure the state reads differently: the rollback must replace nat.
    let err = {
        let mut exec = Changing {
            inner: &mut script,
            after_writes: "*nat\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
        };
        apply_sidecar(
            &mut exec,
            &[Binaries::plain(Family::V4)],
            &rules,
            &opts,
            &Fresh::new(),
        )
        .unwrap_err()
    };
    assert!(matches!(err, ApplyError::Failed { .. }), "{err}");
    let last = script.ran.last().unwrap();
    assert_eq!(last.program, "iptables-restore");
    assert!(!last.args.contains(&"--noflush".to_string()));
    assert_eq!(
        last.stdin.as_deref(),
        Some(REDIRECT_APPLIED),
        "nat is replaced by its snapshot"
    );
}

/// Reports `after_writes` from saves once anything other than a save ran.
struct Changing<'a> {
    inner: &'a mut Script,
    after_writes: &'static str,
}

impl Executor for Changing<'_> {
    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, SpawnError> {
        if !self.inner.writes().is_empty() {
            self.inner.saves[0] = self.after_writes.to_string();
        }
        self.inner.run(cmd)
    }
}

#[test]
fn committed_tables_follow_the_failing_line() {
    let text = "*mangle\n-N A\nCOMMIT\n*nat\n-N B\nCOMMIT\n";
    assert_eq!(
        committed_tables(text, "iptables-restore: line 5 failed"),
        BTreeSet::from([Table::Mangle])
    );
    assert_eq!(
        committed_tables(text, "Error occurred at line: 3"),
        BTreeSet::new()
    );
    assert_eq!(
        committed_tables(text, "something else"),
        BTreeSet::from([Table::Mangle, Table::Nat])
    );
}
