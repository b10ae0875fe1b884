//! Unit tests of the installer against temp dirs and the Istio goldens.

use super::*;
use crate::install::cniconf;
use serde_json::Value;

const TD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/install/");

struct Env {
    _tmp: tempfile::TempDir,
    net: PathBuf,
    bin: PathBuf,
    cfg: InstallConfig,
    exe: PathBuf,
}

fn env() -> Env {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().to_path_buf();
    let (net, bin, sa) = (root.join("net"), root.join("bin"), root.join("sa"));
    for d in [&net, &bin, &sa] {
        fs::create_dir_all(d).expect("mkdir");
    }
    fs::copy(format!("{TD}kube-ca.crt"), sa.join("ca.crt")).expect("ca");
    fs::write(sa.join("token"), "service_account_token_string").expect("token");
    let exe = root.join("exe");
    fs::write(&exe, b"#!/bin/true\n").expect("exe");
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).expect("chmod");
    let cfg = InstallConfig {
        owned_filename: "02-istio-conf.conflist".to_string(),
        cni_bin_dirs: vec![bin.clone(), root.join("missing-bin")],
        kube_ca_file: sa.join("ca.crt"),
        service_account_dir: sa,
        k8s_service_host: Some("10.96.0.1".to_string()),
        k8s_service_port: Some("443".to_string()),
        ..InstallConfig::for_tests(net.clone())
    };
    Env {
        _tmp: tmp,
        net,
        bin,
        cfg,
        exe,
    }
}

impl Env {
    /// The temp dir holding the conf dir, the bin dir and anything else a test needs.
    fn root(&self) -> &Path {
        self.net.parent().expect("root")
    }
}

/// The goldens embed `cni_agent_run_dir: /path/to/kubeconfig`; the kubeconfig itself must go
/// somewhere writable, so the run dir is swapped after building the plugin entry.
fn installer_with(e: &Env, tweak: impl FnOnce(&mut InstallConfig)) -> Installer {
    let mut cfg = e.cfg.clone();
    tweak(&mut cfg);
    let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
    i.cfg.run_dir = e.root().join("run");
    i
}

fn installer(e: &Env) -> Installer {
    installer_with(e, |_| {})
}

/// A fresh env with `src` put in as `name`, and an installer that has run one pass over it.
fn installed(name: &str, src: &str) -> (Env, Installer) {
    let e = env();
    put(&e, name, src);
    let mut i = installer(&e);
    i.install_all().expect("installs");
    (e, i)
}

/// The primary named in the config, as `CNI_CONF_NAME` sets it.
fn conf_named(name: &str) -> impl FnOnce(&mut InstallConfig) + '_ {
    move |cfg| cfg.cni_conf_name = Some(name.to_string())
}

/// Owned mode: the istio-owned file, which needs ambient as well.
fn owned_ambient(cfg: &mut InstallConfig) {
    cfg.istio_owned_cni_config = true;
    cfg.ambient_enabled = true;
}

/// `src` copied into a `store` dir beside the conf dir, for a conf-dir link to point at.
fn stored(e: &Env, src: &str) -> PathBuf {
    let store = e.root().join("store");
    fs::create_dir(&store).expect("store");
    fs::copy(format!("{TD}{src}"), store.join(src)).expect("target");
    store
}

fn golden(name: &str) -> String {
    fs::read_to_string(format!("{TD}{name}")).expect("golden")
}

fn put(e: &Env, name: &str, src: &str) {
    fs::copy(format!("{TD}{src}"), e.net.join(name)).expect("copy input");
}

fn read(e: &Env, name: &str) -> String {
    fs::read_to_string(e.net.join(name)).unwrap_or_else(|err| panic!("{name}: {err}"))
}

#[test]
fn merges_into_the_first_list_and_installs_everything() {
    let e = env();
    put(&e, "10-list.conflist", "list.conflist");
    put(&e, "20-bridge.conf", "bridge.conf");
    let mut i = installer(&e);
    assert_eq!(i.install_all().expect("installs"), InstallPass::Installed);
    pretty_assertions::assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist.golden"));
    assert!(fsutil::same_content(&e.exe, &e.bin.join("istio-cni")).expect("cmp"));
    let kc = fs::read_to_string(i.cfg.kubeconfig_path()).expect("kubeconfig");
    pretty_assertions::assert_eq!(kc, golden("kubeconfig-tls"));
    assert_eq!(i.validate(), Ok(()));
}

#[test]
fn single_conf_becomes_conflist_and_is_restored() {
    let (e, mut i) = installed("10-bridge.conf", "bridge.conf");
    assert!(!e.net.join("10-bridge.conf").exists());
    pretty_assertions::assert_eq!(read(&e, "10-bridge.conflist"), golden("bridge.conf.golden"));
    assert_eq!(i.validate(), Ok(()));
    i.cleanup();
    assert!(!e.net.join("10-bridge.conflist").exists());
    assert_eq!(read(&e, "10-bridge.conf"), golden("bridge.conf"));
    assert!(!e.bin.join("istio-cni").exists());
    assert!(!i.cfg.kubeconfig_path().exists());
}

#[test]
fn named_primary_variants() {
    for (name, src) in [
        ("list.conflist", "list.conflist"),
        ("list.conf", "list.conflist"),
        ("undetectable.file", "list.conflist"),
    ] {
        let e = env();
        let file = if name == "list.conf" {
            "list.conflist"
        } else {
            name
        };
        put(&e, file, src);
        let mut i = installer_with(&e, conf_named(name));
        i.install_all().expect("installs");
        pretty_assertions::assert_eq!(
            read(&e, file),
            golden("list.conflist.golden"),
            "case {name}"
        );
        assert_eq!(
            i.validate(),
            Ok(()),
            "case {name}: the result must validate"
        );
    }
}

#[test]
fn named_bridge_conflist_falls_back_to_conf() {
    let e = env();
    put(&e, "bridge.conf", "bridge.conf");
    let mut i = installer_with(&e, conf_named("bridge.conflist"));
    i.install_all().expect("installs");
    pretty_assertions::assert_eq!(read(&e, "bridge.conflist"), golden("bridge.conf.golden"));
}

#[test]
fn replaces_an_old_entry_and_cleanup_matches_golden() {
    let (e, mut i) = installed("10-list.conflist", "list-with-istio.conflist");
    pretty_assertions::assert_eq!(
        read(&e, "10-list.conflist"),
        golden("list-with-istio.conflist.golden")
    );
    i.cleanup();
    pretty_assertions::assert_eq!(
        read(&e, "10-list.conflist"),
        golden("list-no-istio.conflist")
    );
}

#[test]
fn owned_mode_writes_a_separate_file_and_deletes_only_it() {
    for (src, golden_name) in [
        ("list.conflist", "istio-owned.conflist.golden"),
        ("bridge.conf", "istio-owned-bridge.conflist.golden"),
    ] {
        let e = env();
        put(&e, &format!("10-{src}"), src);
        let mut i = installer_with(&e, owned_ambient);
        i.install_all().expect("installs");
        pretty_assertions::assert_eq!(read(&e, "02-istio-conf.conflist"), golden(golden_name));
        assert_eq!(
            read(&e, &format!("10-{src}")),
            golden(src),
            "primary untouched"
        );
        assert_eq!(i.validate(), Ok(()));
        // L9: a content change in the primary invalidates our copy.
        let changed = golden(src).replace("cni0", "cni1");
        fs::write(e.net.join(format!("10-{src}")), changed).expect("edit");
        assert!(i.validate().is_err());
        i.install_all().expect("reinstalls");
        assert!(read(&e, "02-istio-conf.conflist").contains("cni1"));
        i.cleanup();
        assert!(!e.net.join("02-istio-conf.conflist").exists());
        assert!(e.net.join(format!("10-{src}")).exists());
    }
}

#[test]
fn owned_mode_with_a_config_sorting_first_validates_instead_of_rewriting() {
    // The owned file's name is fixed, so a rewrite cannot win priority back: a validation that
    // failed here made every pass rewrite the file, in a loop, and readiness never came.
    let e = env();
    put(&e, "00-list.conflist", "list.conflist");
    let mut i = installer_with(&e, owned_ambient);
    i.install_all().expect("installs");
    pretty_assertions::assert_eq!(
        read(&e, "02-istio-conf.conflist"),
        golden("istio-owned.conflist.golden")
    );
    assert_eq!(i.validate(), Ok(()));
    // A stale copy is still found, and rewritten from the primary that sorts first.
    let changed = golden("list.conflist").replace("cni0", "cni1");
    fs::write(e.net.join("00-list.conflist"), changed).expect("edit");
    assert!(i.validate().is_err());
    i.install_all().expect("reinstalls");
    assert!(read(&e, "02-istio-conf.conflist").contains("cni1"));
    assert_eq!(i.validate(), Ok(()));
}

#[test]
fn owned_flag_without_ambient_never_deletes_the_primary() {
    // Istio bug B2: cleanup deleted the primary here.
    let e = env();
    put(&e, "10-list.conflist", "list.conflist");
    let mut i = installer_with(&e, |c| c.istio_owned_cni_config = true);
    i.install_all().expect("installs");
    pretty_assertions::assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist.golden"));
    i.cleanup();
    pretty_assertions::assert_eq!(
        read(&e, "10-list.conflist"),
        String::from_utf8(cniconf::marshal(
            &serde_json::from_str::<Value>(&golden("list.conflist")).expect("json")
        ))
        .expect("utf8")
    );
}

#[test]
fn standalone_default_and_named() {
    for name in [None, Some("specific-name.conf")] {
        let e = env();
        let mut i = installer_with(&e, |c| {
            c.chained = false;
            c.cni_conf_name = name.map(str::to_string);
        });
        i.install_all().expect("installs");
        let file = name.unwrap_or("YYY-istio-cni.conf");
        pretty_assertions::assert_eq!(read(&e, file), golden("istio-cni.conf"));
        assert_eq!(i.validate(), Ok(()));
        i.cleanup();
        assert!(!e.net.join(file).exists());
    }
}

#[test]
fn waits_without_a_primary_and_detects_preemption() {
    let e = env();
    let mut i = installer(&e);
    assert!(matches!(
        i.install_all(),
        Ok(InstallPass::WaitingForPrimary(_))
    ));
    put(&e, "10-list.conflist", "list.conflist");
    i.install_all().expect("installs");
    assert_eq!(i.validate(), Ok(()));
    put(&e, "05-other.conflist", "list.conflist");
    assert!(i.validate().is_err(), "a higher-priority file preempts us");
    i.install_all().expect("reinstalls");
    assert_eq!(i.validate(), Ok(()));
    pretty_assertions::assert_eq!(
        read(&e, "05-other.conflist"),
        golden("list.conflist.golden")
    );
}

#[test]
fn cleanup_removes_our_entry_from_every_primary_we_used() {
    let (e, mut i) = installed("10-list.conflist", "list.conflist");
    put(&e, "05-other.conflist", "list.conflist");
    assert!(i.validate().is_err());
    i.install_all().expect("moves to the new primary");
    assert!(
        read(&e, "10-list.conflist").contains("istio-cni"),
        "the old one keeps its entry meanwhile"
    );
    i.cleanup();
    for f in ["05-other.conflist", "10-list.conflist"] {
        pretty_assertions::assert_eq!(read(&e, f), golden("list-no-istio.conflist"), "{f}");
    }
}

#[test]
fn invalid_files_sorting_first_are_skipped() {
    let e = env();
    fs::write(e.net.join("00-garbage.conf"), "not json").expect("w");
    fs::write(e.net.join("01-empty.conflist"), "").expect("w");
    fs::write(e.net.join("02-notype.conf"), r#"{"name":"x"}"#).expect("w");
    fs::write(
        e.net.join("03-noname.conflist"),
        r#"{"plugins":[{"type":"x"}]}"#,
    )
    .expect("w");
    fs::write(e.net.join("04-noplugins.conflist"), r#"{"name":"x"}"#).expect("w");
    fs::write(e.net.join("05-ignored.txt"), r#"{"type":"x"}"#).expect("w");
    put(&e, "10-list.conflist", "list.conflist");
    let mut i = installer(&e);
    i.install_all().expect("installs");
    pretty_assertions::assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist.golden"));
    assert_eq!(read(&e, "00-garbage.conf"), "not json", "never touched");
    assert_eq!(i.validate(), Ok(()));
}

#[test]
fn a_named_primary_that_appears_later_is_waited_for() {
    let e = env();
    put(&e, "05-other.conflist", "list.conflist");
    let mut i = installer_with(&e, conf_named("10-list.conflist"));
    assert!(
        matches!(i.install_all(), Ok(InstallPass::WaitingForPrimary(w)) if w.contains("10-list.conflist"))
    );
    put(&e, "10-list.conf", "list.conflist");
    // The .conf variant stands in for the named .conflist.
    i.install_all().expect("installs");
    assert!(read(&e, "10-list.conf").contains("istio-cni"));
    assert_eq!(
        read(&e, "05-other.conflist"),
        golden("list.conflist"),
        "intentionally preempting file untouched"
    );
    assert_eq!(i.validate(), Ok(()));
}

#[test]
fn missing_or_empty_conf_dir_waits() {
    let e = env();
    let mut i = installer(&e);
    fs::remove_dir(&e.net).expect("rm dir");
    assert!(matches!(
        i.install_all(),
        Ok(InstallPass::WaitingForPrimary(_))
    ));
    fs::create_dir(&e.net).expect("mkdir");
    assert!(matches!(
        i.install_all(),
        Ok(InstallPass::WaitingForPrimary(_))
    ));
}

#[test]
fn token_rotation_and_binary_changes_invalidate() {
    let (e, mut i) = installed("10-list.conflist", "list.conflist");
    fs::write(e.cfg.service_account_dir.join("token"), "bar").expect("rotate");
    assert!(i.validate().is_err());
    i.install_all().expect("reinstalls");
    assert!(
        fs::read_to_string(i.cfg.kubeconfig_path())
            .expect("kc")
            .contains("token: bar\n")
    );
    fs::write(e.bin.join("istio-cni"), b"other").expect("tamper");
    assert!(i.validate().is_err());
    i.install_all().expect("reinstalls");
    assert_eq!(i.validate(), Ok(()));
}

#[test]
fn json_files_count_in_priority_order() {
    let e = env();
    fs::write(
        e.net.join("05-first.json"),
        r#"{"cniVersion":"0.4.0","name":"n","type":"bridge"}"#,
    )
    .expect("json");
    put(&e, "10-list.conflist", "list.conflist");
    let mut i = installer(&e);
    i.install_all().expect("installs");
    assert!(!e.net.join("05-first.json").exists());
    assert!(read(&e, "05-first.conflist").contains("istio-cni"));
    assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist"));
    i.cleanup();
    assert!(e.net.join("05-first.json").exists());
    assert!(!e.net.join("05-first.conflist").exists());
}

/// The converted list with its plugins rewritten by `f`, as a primary rewriting it would.
fn rewrite_plugins(e: &Env, name: &str, f: impl FnOnce(&mut Vec<Value>)) {
    let mut v: Value = serde_json::from_str(&read(e, name)).expect("json");
    f(v.get_mut("plugins")
        .and_then(Value::as_array_mut)
        .expect("plugins"));
    fs::write(e.net.join(name), cniconf::marshal(&v)).expect("rewrite");
}

fn drop_istio(p: &mut Vec<Value>) {
    p.retain(|x| x.get("type").and_then(Value::as_str) != Some(cniconf::ISTIO_TYPE));
}

#[test]
fn the_restore_record_survives_the_primary_dropping_our_entry() {
    // Re-added by a pass, or cleanup arriving before the re-add: the .conf comes back either way.
    for readd in [true, false] {
        let (e, mut i) = installed("10-bridge.conf", "bridge.conf");
        rewrite_plugins(&e, "10-bridge.conflist", drop_istio);
        if readd {
            assert!(i.validate().is_err());
            i.install_all().expect("re-adds");
            pretty_assertions::assert_eq!(
                read(&e, "10-bridge.conflist"),
                golden("bridge.conf.golden")
            );
        }
        i.cleanup();
        assert!(!e.net.join("10-bridge.conflist").exists(), "readd={readd}");
        assert_eq!(
            read(&e, "10-bridge.conf"),
            golden("bridge.conf"),
            "readd={readd}"
        );
        assert!(!i.cfg.run_dir.join(RESTORE_RECORD).exists());
    }
}

#[test]
fn a_real_change_to_the_converted_list_keeps_the_owners_content() {
    // With or without our entry still in it: their content wins, no .conf comes back.
    for keep_ours in [true, false] {
        let (e, mut i) = installed("10-bridge.conf", "bridge.conf");
        rewrite_plugins(&e, "10-bridge.conflist", |p| {
            if !keep_ours {
                drop_istio(p);
            }
            p[0]["bridge"] = Value::String("cni1".to_string());
        });
        i.cleanup();
        assert!(
            !e.net.join("10-bridge.conf").exists(),
            "keep_ours={keep_ours}"
        );
        let left = read(&e, "10-bridge.conflist");
        assert!(
            left.contains("cni1") && !left.contains("istio-cni"),
            "keep_ours={keep_ours}: {left}"
        );
    }
}

#[test]
fn a_symlinked_conf_is_converted_and_the_link_comes_back() {
    let e = env();
    let store = stored(&e, "bridge.conf");
    std::os::unix::fs::symlink("../store/bridge.conf", e.net.join("10-bridge.conf")).expect("link");
    let mut i = installer(&e);
    i.install_all().expect("installs");
    pretty_assertions::assert_eq!(read(&e, "10-bridge.conflist"), golden("bridge.conf.golden"));
    assert!(
        fs::symlink_metadata(e.net.join("10-bridge.conf")).is_err(),
        "link replaced"
    );
    assert_eq!(i.validate(), Ok(()));
    i.cleanup();
    assert!(!e.net.join("10-bridge.conflist").exists());
    assert_eq!(
        fs::read_link(e.net.join("10-bridge.conf")).expect("link is back"),
        Path::new("../store/bridge.conf")
    );
    assert_eq!(
        fs::read_to_string(store.join("bridge.conf")).expect("target"),
        golden("bridge.conf"),
        "the target was never written"
    );
}

#[test]
fn symlinked_lists_are_written_through_and_dangling_ones_skipped() {
    let e = env();
    let store = stored(&e, "list.conflist");
    std::os::unix::fs::symlink("../store/list.conflist", e.net.join("10-list.conflist"))
        .expect("link");
    std::os::unix::fs::symlink("nowhere", e.net.join("01-gone.conflist")).expect("dangling");
    std::os::unix::fs::symlink("../store", e.net.join("02-dir.conflist")).expect("dir link");
    let mut i = installer(&e);
    i.install_all().expect("installs");
    assert!(
        fs::symlink_metadata(e.net.join("10-list.conflist"))
            .expect("lstat")
            .file_type()
            .is_symlink()
    );
    pretty_assertions::assert_eq!(
        fs::read_to_string(store.join("list.conflist")).expect("target"),
        golden("list.conflist.golden")
    );
    assert_eq!(i.validate(), Ok(()));
    assert!(
        i.watch_targets()
            .iter()
            .any(|t| t.dir == fs::canonicalize(&store).expect("abs")
                && t.only.as_deref() == Some("list.conflist"))
    );
    i.cleanup();
    pretty_assertions::assert_eq!(
        fs::read_to_string(store.join("list.conflist")).expect("target"),
        golden("list-no-istio.conflist")
    );
    assert!(
        fs::symlink_metadata(e.net.join("10-list.conflist"))
            .expect("lstat")
            .file_type()
            .is_symlink()
    );
}

#[test]
fn install_errors_are_typed_keep_their_source_and_map_to_istio_labels() {
    use std::error::Error as _;
    let e = env();
    let mut cfg = e.cfg.clone();
    cfg.cni_bin_dirs = vec![e.root().join("nowhere")];
    let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
    let err = i.install_all().expect_err("no bin dir");
    assert!(matches!(err, InstallError::NoBinDir { .. }), "{err:?}");
    assert_eq!(err.metric_label(), "COPY_BINARIES_FAILURE");
    assert!(err.to_string().contains("nowhere"), "{err}");

    let missing = e.root().join("no-such-exe");
    let err = Installer::new(e.cfg.clone(), missing)
        .err()
        .expect("missing exe");
    assert!(matches!(err, InstallError::ReadSelf { .. }), "{err:?}");
    assert!(err.source().is_some(), "the io::Error is kept");

    let mut i = installer(&e);
    fs::remove_file(e.cfg.service_account_dir.join("token")).expect("rm token");
    let err = i.install_all().expect_err("no token");
    assert!(matches!(err, InstallError::KubeconfigInputs(_)), "{err:?}");
    assert_eq!(err.metric_label(), "CREATE_KUBECONFIG_FAILURE");
    assert!(err.source().is_some(), "the kubeconfig error is kept");
}

#[test]
fn a_restore_record_naming_anything_but_plain_conf_names_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(RESTORE_RECORD);
    let good = RestoreRecord {
        conflist: "10-bridge.conflist".to_string(),
        original: "10-bridge.conf".to_string(),
        content: "{}".to_string(),
        mode: 0o644,
        link: Some(PathBuf::from("/etc/cni/store/bridge.conf")),
    };
    let read_back = |r: &RestoreRecord| {
        fs::write(&path, serde_json::to_vec(r).expect("json")).expect("write");
        RestoreRecord::read(&path)
    };
    assert_eq!(read_back(&good), Some(good.clone()));
    type Spoil = fn(&mut RestoreRecord);
    let bad: [(&str, Spoil); 9] = [
        ("absolute original", |r| r.original = "/dev/null".into()),
        ("dotdot original", |r| {
            r.original = "../../etc/x.conf".into();
            r.conflist = "../../etc/x.conflist".into();
        }),
        ("original is ..", |r| r.original = "..".into()),
        ("empty original", |r| r.original = String::new()),
        ("conflist elsewhere", |r| {
            r.conflist = "../10-bridge.conflist".into()
        }),
        ("conflist not derived", |r| {
            r.conflist = "99-other.conflist".into()
        }),
        ("original not .conf", |r| {
            r.original = "10-bridge".into();
            r.conflist = "10-bridge.conflist".into();
        }),
        ("setuid mode", |r| r.mode = 0o4755),
        ("empty link", |r| r.link = Some(PathBuf::new())),
    ];
    for (what, spoil) in bad {
        let mut r = good.clone();
        spoil(&mut r);
        assert_eq!(read_back(&r), None, "{what}");
    }
    // Not JSON, too large, and a FIFO are ignored the same way (and the FIFO does not block).
    fs::write(&path, b"{").expect("write");
    assert_eq!(RestoreRecord::read(&path), None);
    fs::write(&path, vec![b' '; 2 << 20]).expect("write");
    assert_eq!(RestoreRecord::read(&path), None);
    fs::remove_file(&path).expect("rm");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("fifo");
    assert_eq!(RestoreRecord::read(&path), None);
}

#[test]
fn a_malformed_or_oversized_config_is_skipped_and_never_the_primary() {
    let e = env();
    put(&e, "20-list.conflist", "list.conflist");
    // Sorts first, but over the read limit: skipped without being held in memory.
    let mut big = fs::read(format!("{TD}list.conflist")).expect("list");
    big.extend(std::iter::repeat_n(b' ', 2 << 20));
    fs::write(e.net.join("05-big.conflist"), &big).expect("big");
    fs::write(e.net.join("06-broken.conflist"), b"{\"plugins\": [").expect("broken");
    let mut i = installer(&e);
    assert_eq!(i.install_all().expect("installs"), InstallPass::Installed);
    assert!(cniconf::has_istio_entry(
        &serde_json::from_str::<Value>(&read(&e, "20-list.conflist")).expect("json")
    ));
    assert_eq!(
        i.skipped_logged.keys().cloned().collect::<Vec<_>>(),
        ["05-big.conflist", "06-broken.conflist"]
    );
    assert!(i.skipped_logged["05-big.conflist"].contains("read limit"));
}
