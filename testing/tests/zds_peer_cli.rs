//! The `zds-peer` binary's command line: `--help` prints the usage and exits, a missing or
//! flag-like socket path is a usage error; none of them waits for a socket.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn help_prints_usage_and_exits_and_flags_are_not_socket_paths() {
    let cases: [(&[&str], i32); 4] = [(&["--help"], 0), (&["-h"], 0), (&[], 2), (&["--bogus"], 2)];
    for (args, code) in cases {
        let mut child = Command::new(env!("CARGO_BIN_EXE_zds-peer"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("zds-peer");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("zds-peer {args:?} did not exit (it took a flag for the socket path)");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(code), "{args:?}");
        let out = child.wait_with_output().expect("output");
        let all = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(all.contains("usage: zds-peer"), "{args:?}: {all}");
    }
}
