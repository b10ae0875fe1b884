//! Inputs that arrive over sockets, files and argv: kubeconfig, log.sock records, ZDS frames,
//! `istio-iptables` argv and its capture values, and the rule model's restore text.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use argh::FromArgs;
use istio_cni::cli::normalise_args;
use istio_cni::iptables_cmd::flags::{Flags, SHAPES};
use istio_cni::iptables_cmd::resolve;
use istio_cni::kube::config_from_kubeconfig_file;
use istio_cni::plugin::log::format_record;
use istio_cni::rules::capture_values as values;
use istio_cni::rules::iptables::{render_restore, rule_args};
use istio_cni::rules::iptables_save_decode::decode_save;
use istio_cni::rules::iptables_state::RuleAt;
use istio_cni::rules::model::parts;
use istio_cni::rules::{Position, Rule, Table, Target};
use istio_cni::telemetry::logging::{Controls, IstioFormat, escape_controls, escape_json_controls};
use istio_cni::telemetry::logsink::emit_batch;
use istio_cni::zds::PodWorkload;
use istio_cni::zds::proto::{self, Ack, Reply, Request, WorkloadRequest, WorkloadResponse, pb};
use proptest::prelude::*;
use prost::Message;
use serde_json::{Map, Value};

use super::{any_json, config as cases, nasty_string};

/// A log writer appending to a shared buffer.
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Kubeconfig text: arbitrary, or YAML with the right keys and any values.
fn kubeconfig_text() -> impl Strategy<Value = String> {
    prop_oneof![
        nasty_string(),
        (nasty_string(), nasty_string(), nasty_string(), any::<bool>()).prop_map(|(server, ca, token, insecure)| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server:?}\n    \
                 certificate-authority-data: {ca:?}\n    insecure-skip-tls-verify: {insecure}\ncontexts:\n- name: x\n  \
                 context: {{cluster: c, user: u}}\ncurrent-context: x\nusers:\n- name: u\n  user: {{token: {token:?}}}\n"
            )
        }),
        any_json().prop_map(|v| v.to_string()),
    ]
}

/// Flag words of `istio-iptables` (several spellings) mixed with values and junk.
fn iptables_argv() -> impl Strategy<Value = Vec<String>> {
    let word = prop_oneof![
        prop::sample::select(
            &[
                "-p",
                "-z",
                "-e",
                "-u",
                "-g",
                "-m",
                "-b",
                "-d",
                "-c",
                "-i",
                "-x",
                "-q",
                "-o",
                "-k",
                "-t",
                "-r",
                "-n",
                "--envoy-port",
                "--proxy-uid",
                "--istio-inbound-ports",
                "--redirect-dns",
                "--redirect-dns=false",
                "--istio-inbound-tproxy-mark",
                "--istio-inbound-tproxy-route-table",
                "--probe-timeout",
                "--ipv6",
                "--dns-servers",
                "--",
                "-h",
                "--cni-mode",
                "--istio-service-cidr",
            ][..]
        )
        .prop_map(str::to_string),
        prop::sample::select(
            &[
                "15001",
                "0",
                "65536",
                "*",
                "10.0.0.0/8",
                "1337,1338",
                "",
                " , ",
                "0x0",
                "254",
                "5s",
                "REDIRECT",
                "TPROXY"
            ][..]
        )
        .prop_map(str::to_string),
        nasty_string(),
    ];
    prop::collection::vec(word, 0..10)
}

/// Runs argv through the whole pure pipeline of `istio-iptables` (normalise, argh, resolve, check).
fn iptables_pipeline(argv: &[String], env: &HashMap<String, String>) -> Result<(), String> {
    let normalised = normalise_args(argv, &SHAPES).map_err(|e| e.to_string())?;
    let refs: Vec<&str> = normalised.args.iter().map(String::as_str).collect();
    let parsed = Flags::from_args(&["istio-iptables"], &refs).map_err(|e| e.output)?;
    let settings = parsed
        .resolve(env, &normalised.explicit_false)
        .map_err(|e| e.to_string())?;
    resolve::check_capture(&parsed, env, &settings.capture).map_err(|e| e.to_string())
}

/// Rules with the shapes the rule model renders, tokens without spaces.
fn rules() -> impl Strategy<Value = Vec<Rule>> {
    let table = prop::sample::select(&[Table::Nat, Table::Mangle, Table::Raw, Table::Filter][..]);
    let chain = prop_oneof![
        prop::sample::select(&["PREROUTING", "OUTPUT", "ISTIO_INBOUND", "ISTIO_OUTPUT"][..])
            .prop_map(str::to_string),
        "ISTIO_[A-Z_]{1,12}",
    ];
    let port = (1u16..).prop_map(|p| p.to_string());
    let m = prop_oneof![
        (port.clone(), any::<bool>()).prop_map(|(p, n)| parts::dport(&p, n)),
        (any::<[u8; 4]>(), 0u8..=32, any::<bool>())
            .prop_map(|(a, l, n)| parts::dst(&format!("{}/{l}", std::net::Ipv4Addr::from(a)), n)),
        "[a-z][a-z0-9]{0,10}".prop_map(|i| parts::in_iface(&i)),
        Just(parts::TCP),
    ];
    let target = prop_oneof![
        "ISTIO_[A-Z_]{1,12}".prop_map(|c| parts::jump(&c)),
        (port, any::<bool>()).prop_map(|(p, plural)| parts::redirect(&p, plural)),
        Just(Target::Return),
        Just(Target::Accept),
    ];
    let rule = (
        table,
        chain,
        prop::option::of(1u32..5),
        prop::collection::vec(m, 0..4),
        target,
    )
        .prop_map(|(table, chain, insert, mut matches, target)| {
            // The protocol comes first when a port match needs it, as the builders write it.
            matches.sort_by_key(|m| !matches!(m, istio_cni::rules::Match::Proto(_)));
            Rule {
                table,
                chain,
                position: insert.map_or(Position::Append, Position::Insert),
                matches,
                target,
            }
        });
    prop::collection::vec(rule, 0..12)
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn kubeconfig_never_panics_and_errors_name_the_file(text in kubeconfig_text()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("istio-cni-kubeconfig");
        std::fs::write(&path, &text).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        if let Err(e) = rt.block_on(config_from_kubeconfig_file(&path)) {
            prop_assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
        }
    }

    #[test]
    fn log_records_never_panic_and_stay_json(lines in prop::collection::vec(
        prop_oneof![nasty_string(), any_json().prop_map(|v| v.to_string()),
                    (prop::sample::select(&["info", "warn", "error", "debug", "x"][..]), any_json(), any_json(), any_json())
                        .prop_map(|(l, m, t, extra)| serde_json::json!(
                            {"level": l, "msg": m, "time": t, "scope": "cni", "extra\u{9b}": extra}).to_string())],
        0..6)) {
        // The agent's JSON formatter, so formatting runs and every re-emitted line is checked.
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        let sub = tracing_subscriber::fmt()
            .event_format(IstioFormat {
                json: true,
                scope: istio_cni::telemetry::logging::AGENT_SCOPE,
            })
            .with_writer(move || SharedBuf(sink.clone()))
            .with_max_level(tracing::Level::TRACE)
            .finish();
        tracing::subscriber::with_default(sub, || emit_batch(&lines));
        let text = String::from_utf8(out.lock().unwrap().clone()).expect("UTF-8 log");
        for line in text.lines() {
            prop_assert!(serde_json::from_str::<Value>(line).is_ok(), "not JSON: {line}");
            prop_assert!(!line.chars().any(char::is_control), "raw control in {line:?}");
        }
    }

    #[test]
    fn log_records_keep_their_text(msg in nasty_string(), key in "[a-z_]{1,8}", value in any_json(), secs in 0u64..4_000_000_000) {
        let mut fields = Map::new();
        fields.insert(key.clone(), value.clone());
        let line = format_record(&tracing::Level::WARN, SystemTime::UNIX_EPOCH + Duration::from_secs(secs), &msg, &fields);
        prop_assert!(!line.chars().any(char::is_control), "{line:?}");
        let back: Value = serde_json::from_str(&line).expect("a record is one JSON object");
        // DEL and C1 come back as visible escapes; everything else as it was.
        let msg = escape_controls(&msg, Controls::BeyondAscii);
        prop_assert_eq!(back["msg"].as_str(), Some(&*msg));
        prop_assert_eq!(back["level"].as_str(), Some("warn"));
        if !["level", "time", "msg"].contains(&key.as_str()) {
            prop_assert_eq!(&back[&key], &escape_json_controls(value));
        }
    }

    #[test]
    fn zds_frames_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128), truncated in any::<bool>()) {
        let _ = proto::decode_hello(&bytes);
        let _ = proto::decode_reply(&bytes, truncated);
    }

    #[test]
    fn zds_replies_round_trip(error in nasty_string(), cut in any::<prop::sample::Index>()) {
        let frame = WorkloadResponse { payload: Some(pb::workload_response::Payload::Ack(Ack { error: error.clone() })) }
            .encode_to_vec();
        let reply = proto::decode_reply(&frame, false).expect("decode");
        if error.is_empty() {
            prop_assert_eq!(reply, Reply::Ack);
        } else {
            prop_assert_eq!(reply, Reply::Nack { message: error.clone(), truncated: false });
            // A NACK cut anywhere after its headers still reads as a NACK with the text's start.
            let head = frame.len() - error.len();
            let len = head + cut.index(error.len() + 1);
            if let Ok(Reply::Nack { message, truncated: true }) = proto::decode_reply(&frame[..len], true) {
                let lossless = String::from_utf8_lossy(&error.as_bytes()[..len - head]).into_owned();
                prop_assert!(lossless.starts_with(message.trim_end_matches('\u{fffd}')), "{message:?} vs {lossless:?}");
            } else {
                prop_assert!(false, "a cut NACK of {len} bytes was not read as one");
            }
        }
    }

    #[test]
    fn zds_requests_round_trip(uid in nasty_string(), name in nasty_string(), ns in nasty_string(), sa in nasty_string(), which in 0u8..4) {
        let info = PodWorkload { name: name.clone(), namespace: ns.clone(), service_account: sa.clone() };
        let req = match which {
            0 => Request::Add { uid: &uid, info: &info },
            1 => Request::Keep { uid: &uid },
            2 => Request::Del { uid: &uid },
            _ => Request::SnapshotSent,
        };
        let bytes = req.encode();
        prop_assert!(!bytes.is_empty(), "an empty datagram reads as EOF");
        let back = WorkloadRequest::decode(bytes.as_slice()).expect("decode");
        use pb::workload_request::Payload;
        let ok = match (back.payload.expect("payload"), which) {
            (Payload::Add(a), 0) => a.uid == uid && a.workload_info == Some(pb::WorkloadInfo { name, namespace: ns, service_account: sa }),
            (Payload::Keep(k), 1) => k.uid == uid,
            (Payload::Del(d), 2) => d.uid == uid,
            (Payload::SnapshotSent(_), 3) => true,
            _ => false,
        };
        prop_assert!(ok);
    }

    #[test]
    fn iptables_argv_never_panics(argv in iptables_argv(), env_value in nasty_string(),
                                  var in prop::sample::select(&["PROXY_UID", "ISTIO_INBOUND_PORTS", "INBOUND_CAPTURE_PORT",
                                      "ISTIO_OUTBOUND_OWNER_GROUPS", "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "REDIRECT_DNS", "PROBE_TIMEOUT"][..])) {
        let env = HashMap::from([(var.to_string(), env_value)]);
        let _ = iptables_pipeline(&argv, &env);
    }

    #[test]
    fn iptables_bad_values_name_their_flag(
        (flag, value) in prop_oneof![
            ("--envoy-port", prop_oneof![Just("0".to_string()), Just("65536".to_string()), "[a-z]{1,5}"]),
            ("--inbound-capture-port", prop_oneof![Just("99999".to_string()), "-[0-9]{1,3}"]),
            ("--istio-inbound-tproxy-route-table", prop::sample::select(&["0", "253", "254", "255", "main"][..]).prop_map(str::to_string)),
            ("--istio-inbound-tproxy-mark", prop::sample::select(&["0", "0x", "1338", "x1"][..]).prop_map(str::to_string)),
            ("--proxy-uid", prop::sample::select(&["4294967295", "-1", "root"][..]).prop_map(str::to_string)),
        ],
    ) {
        let argv = vec![format!("{flag}={value}")];
        let err = iptables_pipeline(&argv, &HashMap::new()).expect_err("bad value accepted");
        prop_assert!(err.contains(flag.trim_start_matches('-')), "{flag}={value}: {err}");
    }

    #[test]
    fn capture_values_parse_what_they_print(p in 1u16.., mark in 1u32.., table in 256u32.., s in nasty_string()) {
        prop_assert_eq!(values::parse_port(&p.to_string()), Ok(p));
        prop_assert_eq!(values::parse_tproxy_mark(&format!("{mark:#x}")), if mark == 1338 { values::parse_tproxy_mark("1338") } else { Ok(mark) });
        prop_assert_eq!(values::parse_route_table(&table.to_string()), Ok(table));
        for check in [values::check_interface, values::check_group, values::check_loopback_v4] {
            let _ = check(&s);
        }
        let _ = (values::parse_port(&s), values::parse_tproxy_mark(&s), values::parse_route_table(&s), values::parse_owner_id(&s));
    }

    #[test]
    fn restore_text_parses_back_to_the_rules(rules in rules()) {
        let state = decode_save(&render_restore(&rules));
        let mut expected: std::collections::BTreeMap<(String, String), Vec<String>> = Default::default();
        for r in &rules {
            expected.entry((r.table.name().into(), r.chain.clone())).or_default().push(rule_args(r).join(" "));
        }
        for ((table, chain), want) in expected {
            let got: Vec<String> = state.chain(&table, &chain).map(|r| match &r.at {
                RuleAt::SavedArgs(args) => args.clone(),
                RuleAt::Handle(h) => format!("handle {h}"),
            }).collect();
            prop_assert_eq!(got, want, "{}/{}", table, chain);
        }
    }

    #[test]
    fn save_text_never_panics(text in prop::collection::vec(prop_oneof![nasty_string(),
        prop::sample::select(&["*nat", "* filter", ":ISTIO_OUTPUT - [0:0]", "-A", "-I X 3", "-I X", "COMMIT", "-N"][..]).prop_map(str::to_string)], 0..12)) {
        let _ = decode_save(&text.join("\n"));
    }
}

#[test]
fn explicit_false_is_unused_by_the_generators() {
    // resolve() takes the set normalise_args built; an empty one is the no-flags case.
    let flags = Flags::default();
    assert!(flags.resolve(&HashMap::new(), &HashSet::new()).is_ok());
}
