//! Object UIDs as Kubernetes makes them: random version-4 UUIDs, so UIDs of separate runs never
//! collide (the agent's /proc scan matches pods by UID across restarts); given ones must be UUIDs.

/// A random version-4 UUID (RFC 9562), lower-case hex.
pub fn new_v4() -> Result<String, String> {
    let mut b = [0u8; 16];
    let mut filled = 0;
    while filled < b.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("getrandom for a pod UID: {e}"));
            }
            continue;
        }
        filled += n as usize;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// Checks that `uid` is a UUID in its text form (8-4-4-4-12 hex digits).
pub fn check(uid: &str) -> Result<(), String> {
    let groups: Vec<&str> = uid.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    let hex = groups
        .iter()
        .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()));
    if lengths == [8, 4, 4, 4, 12] && hex {
        Ok(())
    } else {
        Err(format!(
            "metadata.uid {uid:?} is not a UUID (8-4-4-4-12 hex digits, e.g. \
             863b91d4-4b68-4efa-917f-4b560e3e86aa)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_uids_are_random_version_4_uuids() {
        let a = new_v4().expect("uid");
        let b = new_v4().expect("uid");
        assert_ne!(a, b);
        check(&a).expect("a UUID");
        assert_eq!(&a[14..15], "4", "{a}: version 4");
        assert!("89ab".contains(&a[19..20]), "{a}: RFC variant");
    }

    #[test]
    fn only_uuids_are_accepted() {
        check("863b91d4-4b68-4efa-917f-4b560e3e86aa").expect("ok");
        for bad in [
            "",
            "u1",
            "5c1f1c9e-demo-0001",
            "863b91d4-4b68-4efa-917f-4b560e3e86a",
            "863b91d4-4b68-4efa-917f-4b560e3e86aaa",
            "863b91d44b684efa917f4b560e3e86aa",
            "863b91d4-4b68-4efa-917f-4b560e3e86ag",
        ] {
            let e = check(bad).expect_err(bad);
            assert!(e.contains("metadata.uid") && e.contains(bad), "{e}");
        }
    }
}

#[cfg(test)]
mod server_tests {
    use crate::apiserver::{TestApiServer, TestServerError};

    fn pod(uid: Option<&str>) -> k8s_openapi::api::core::v1::Pod {
        let mut meta = serde_json::json!({"name": "p", "namespace": "n"});
        if let Some(uid) = uid {
            meta["uid"] = uid.into();
        }
        serde_json::from_value(serde_json::json!({"metadata": meta})).expect("pod")
    }

    #[test]
    fn the_server_refuses_made_up_uids_and_makes_v4_ones() {
        let (server, _rt) = TestApiServer::start_blocking();
        match server.add_pod(pod(Some("5c1f1c9e-demo-0001"))) {
            Err(TestServerError::InvalidObject(e)) => assert!(e.contains("not a UUID"), "{e}"),
            other => panic!("a made-up uid was accepted: {other:?}"),
        }
        assert!(server.pod("n", "p").is_none(), "nothing stored");
        let made = server.add_pod(pod(None)).expect("add");
        let uid = made.metadata.uid.expect("uid");
        super::check(&uid).expect("a UUID");
        assert_eq!(&uid[14..15], "4", "{uid}");
        let given = "863b91d4-4b68-4efa-917f-4b560e3e86aa";
        let kept = server.add_pod(pod(Some(given))).expect("add");
        assert_eq!(kept.metadata.uid.as_deref(), Some(given));
    }
}
