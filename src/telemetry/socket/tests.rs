use super::*;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_missing_directory_is_made_0700_and_an_existing_one_loses_group_and_other_write() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = tmp.path().join("a/b/s.sock");
    let bound = bind(&fresh, Kind::Stream).unwrap();
    assert_eq!(mode(fresh.parent().unwrap()), 0o700);
    assert_eq!(mode(&fresh), SOCKET_MODE);
    assert_eq!(bound.file.state(), SocketState::Ours);

    // The chart's hostPath: the kubelet made it 0777 or 0755; read/search bits stay.
    let host = tmp.path().join("host");
    std::fs::create_dir(&host).unwrap();
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _b = bind(&host.join("s.sock"), Kind::Stream).unwrap();
    assert_eq!(mode(&host), 0o755);
}

#[test]
fn only_a_stale_socket_or_a_dangling_symlink_is_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("s.sock");
    // A socket left by a previous run.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let first = bind(&path, Kind::Stream).unwrap();
    drop(first);
    assert!(std::fs::symlink_metadata(&path).is_err(), "removed on drop");
    // A dangling symlink.
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), &path).unwrap();
    let second = bind(&path, Kind::SeqPacket).unwrap();
    assert_eq!(second.file.state(), SocketState::Ours);
    // Dropping the bound socket removes its file (it is ours).
    drop(second);
    assert!(std::fs::symlink_metadata(&path).is_err(), "removed on drop");

    let target = tmp.path().join("target");
    std::fs::write(&target, b"x").unwrap();
    for (setup, needle) in [
        (
            Box::new(|p: &Path| std::fs::write(p, b"data").unwrap()) as Box<dyn Fn(&Path)>,
            "a regular file",
        ),
        (
            Box::new(|p: &Path| std::fs::create_dir(p).unwrap()),
            "a directory",
        ),
        (
            Box::new(|p: &Path| std::os::unix::fs::symlink(&target, p).unwrap()),
            "a symlink to",
        ),
    ] {
        setup(&path);
        let e = bind(&path, Kind::Stream)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains(needle),
            "{e}"
        );
        assert!(std::fs::symlink_metadata(&path).is_ok(), "left in place");
        let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir(&path));
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"x");
}

#[test]
fn the_file_is_removed_only_while_it_is_ours_and_its_state_is_told() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("s.sock");
    let old = bind(&path, Kind::Stream).unwrap();
    // A second agent (a surge rollout) takes the path over.
    let new = bind(&path, Kind::Stream).unwrap();
    let (_l, new_file) = {
        let _rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _e = _rt.enter();
        new.into_tokio().unwrap()
    };
    match old.file.state() {
        SocketState::Taken(why) => assert!(why.contains("another server (pid"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(!old.file.remove_if_ours());
    assert!(path.exists(), "the survivor's socket stays");
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(new_file.state(), SocketState::Gone(_)));
    std::fs::write(&path, b"x").unwrap();
    assert!(matches!(new_file.state(), SocketState::Taken(w) if w.contains("regular file")));
    std::fs::remove_file(&path).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(matches!(new_file.state(), SocketState::Gone(w) if w.contains("nobody listens")));
}

#[test]
fn only_root_peers_pass() {
    let me = Peer {
        pid: 1,
        uid: 0,
        gid: 0,
    };
    assert_eq!(root_only(Ok(me)).unwrap(), me);
    let e = root_only(Ok(Peer { uid: 1000, ..me })).unwrap_err();
    assert!(e.to_string().contains("pid 1 uid 1000 is not root"), "{e}");
    assert!(root_only(Err(io::Error::other("x"))).is_err());
}

#[test]
fn the_fd_limit_is_raised_to_the_hard_limit() {
    let l = raise_fd_limit(16).unwrap();
    let (soft, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    assert_eq!((l.now, soft), (hard, hard));
    assert!(l.enough);
    assert!(!raise_fd_limit(u64::MAX).unwrap().enough);
}
