//! The plugin process's one async runtime, shared by the ADD flow and the log shipper.
//!
//! Current-thread: a CNI call is one short flow, so worker threads would only cost start-up time.
//! Built on first use (VERSION, DEL and CHECK never need it) and never dropped: the process exits
//! right after the call, and dropping would wait for stray blocking work (a hung iptables).

use std::sync::OnceLock;

use tokio::runtime::Runtime;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The process's runtime, built on the first call.
pub fn get() -> std::io::Result<&'static Runtime> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let built = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Two racing first calls: one runtime wins, the other is dropped unused.
    Ok(RUNTIME.get_or_init(|| built))
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_runtime_per_process() {
        let first = super::get().expect("runtime") as *const _;
        let again = std::thread::spawn(|| super::get().expect("runtime") as *const _ as usize)
            .join()
            .expect("thread");
        assert_eq!(first as usize, again);
        assert_eq!(
            super::get().expect("runtime").handle().runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread
        );
    }
}
