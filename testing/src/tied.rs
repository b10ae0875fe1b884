//! Child processes tied to the test process: spawned from one thread that lives as long as the
//! process (PR_SET_PDEATHSIG fires when the spawning *thread* ends, and a test's thread ends with
//! the test), so the kernel kills them when the test process dies. The control plane and the
//! node both start their children here.

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use parking_lot::Mutex;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn keeper() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static KEEPER: std::sync::OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> =
        std::sync::OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("child-keeper".into())
            .spawn(move || {
                // Ends only with the process: the sender is in a static.
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("child keeper thread");
        Mutex::new(tx)
    })
}

/// Spawns `command` with no stdin and the given stdout and stderr, so that it dies with the test
/// process.
pub fn spawn(mut command: Command, stdout: File, stderr: File) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: getpid is async-signal-safe; the closure below only calls prctl, getppid, _exit.
    let parent = unsafe { libc::getpid() };
    unsafe {
        command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died before the prctl took effect.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
    }
    let gone = || std::io::Error::other("the child keeper thread is gone");
    let (tx, rx) = mpsc::channel();
    keeper().lock().send((command, tx)).map_err(|_| gone())?;
    rx.recv().map_err(|_| gone())?
}
