use super::*;

#[test]
fn at_the_bound_the_oldest_idle_connection_makes_room() {
    let slots = Slots::new(2);
    let a = slots.admit().unwrap();
    let b = slots.admit().unwrap();
    let _in_request = a.busy();
    let c = slots.admit().expect("b was idle");
    assert!(b.evict.is_cancelled() && !a.evict.is_cancelled());
    drop(b);
    assert_eq!(slots.open(), 2);
    let _busy_c = c.busy();
    assert!(
        slots.admit().is_none(),
        "every connection is inside a request"
    );
    drop(_busy_c);
    drop(c);
    assert_eq!(slots.open(), 1);
}

#[test]
fn the_byte_budget_allows_a_burst_then_its_rate() {
    let start = Instant::now();
    let mut b = ByteBudget::new(1000, 4000);
    assert!(b.take(4000, start));
    assert!(!b.take(1, start));
    assert!(b.take(500, start + Duration::from_millis(500)));
    assert!(!b.take(600, start + Duration::from_millis(1000)));
    assert!(b.take(500, start + Duration::from_millis(1000)));
}

#[test]
fn warnings_are_throttled_counting_what_was_held_back() {
    let t = Throttled::new();
    assert_eq!(t.allow(), Some(0));
    assert_eq!(t.allow(), None);
    assert_eq!(t.allow(), None);
    t.last.lock().0 = Some(Instant::now() - WARN_EVERY);
    assert_eq!(t.allow(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_socket_is_bound_again_and_readiness_says_so_meanwhile() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.sock");
    let readiness = Readiness::default();
    let server = UnixServer {
        name: "x.sock".into(),
        limits: Limits::new(4, Duration::from_secs(1)),
        readiness: Some(readiness.clone()),
    };
    let handler: UnixHandler = Arc::new(|_s, _a, _slot| Box::pin(async {}));
    let stop = CancellationToken::new();
    let task = tokio::spawn(server.run(bind_unix(&path).unwrap(), handler, stop.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(readiness.is_ready());
    std::fs::remove_file(&path).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut saw_not_ready = None;
    while Instant::now() < deadline {
        if let Some(r) = readiness.not_ready().first() {
            saw_not_ready = Some(r.clone());
        }
        if saw_not_ready.is_some() && readiness.is_ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let why = saw_not_ready.expect("readiness never failed");
    assert!(why.contains("x.sock") && why.contains("removed"), "{why}");
    assert!(readiness.is_ready(), "{:?}", readiness.not_ready());
    assert!(path.exists(), "bound again");
    // A regular file in its place is not touched; readiness names it.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"keep").unwrap();
    tokio::time::sleep(CHECK_INTERVAL * 2).await;
    let why = readiness.not_ready().join(",");
    assert!(why.contains("regular file"), "{why}");
    stop.cancel();
    task.await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"keep");
}
