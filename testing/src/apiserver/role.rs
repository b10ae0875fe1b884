//! The hidden `test-apiserver` role: the test API server as a process.

use std::path::PathBuf;

use super::{DEFAULT_TOKEN, TestApiServer, TestServerError, TestServerOptions};

/// Runs the test API server as a process (for the demo and tests that spawn the real binary).
#[derive(argh::FromArgs, Debug)]
#[argh(
    note = "Serves the Kubernetes API for pods and namespaces (list, watch, get, patch, delete, \
events) at the URL it prints, with the bearer token, plus a control endpoint under the same URL \
(same token): \
POST /testserver/objects  a Pod, Namespace, a list of them or a PodList/NamespaceList (JSON); \
adds or replaces them and answers {{\"loaded\": N}}. A pod's metadata.uid, when given, must be \
a UUID (8-4-4-4-12 hex); without one it gets a random version-4 UUID, as Kubernetes does. \
POST /testserver/fault  {{\"kind\":\"fail\",\"code\":500}} | {{\"kind\":\"delay\",\"ms\":300}} | \
{{\"kind\":\"down\",\"ms\":1000}}, with optional \"pathPrefix\" and \"times\". \
DELETE /testserver/fault  clears the faults. \
GET /testserver/requests  every API request so far. \
GET /testserver/pod-gets  single-pod GETs by node. \
POST /testserver/compact  forgets the watch history (clients must re-list)."
)]
struct Args {
    /// port on 127.0.0.1 (0 picks a free one)
    #[argh(option, default = "0")]
    port: u16,
    /// JSON file with a list of Pods/Namespaces (or a Kubernetes List) to start with
    #[argh(option)]
    fixtures: Option<PathBuf>,
    /// write a kubeconfig pointing at the server here
    #[argh(option)]
    kubeconfig_out: Option<PathBuf>,
    /// bearer token to require (default: istio-cni-test-token)
    #[argh(option)]
    token: Option<String>,
    /// accept requests without a token
    #[argh(switch)]
    anonymous: bool,
    /// serve plain HTTP instead of HTTPS with a generated CA
    #[argh(switch)]
    plain_http: bool,
    /// write the generated CA (PEM) here, e.g. as a service account's ca.crt
    #[argh(option)]
    ca_out: Option<PathBuf>,
}

/// Entry point of the `test-apiserver` role: prints the URL on stdout line 1 once listening (an
/// `https://` one unless `--plain-http`; the CA is in the `--kubeconfig-out` file) and serves
/// until SIGTERM/SIGINT.
pub fn main(args: Vec<String>) -> i32 {
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (command, rest) = strs
        .split_first()
        .map_or(("test-apiserver", &[][..]), |(c, r)| (*c, r));
    let parsed = match <Args as argh::FromArgs>::from_args(&[command], rest) {
        Ok(parsed) => parsed,
        Err(exit) => {
            let ok = exit.status.is_ok();
            if ok {
                println!("{}", exit.output);
            } else {
                eprintln!("{}", exit.output);
            }
            return if ok { 0 } else { 2 };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("test-apiserver: cannot start runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(run(parsed)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("test-apiserver: {e}");
            1
        }
    }
}

async fn run(args: Args) -> Result<(), TestServerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let options = TestServerOptions {
        port: args.port,
        token: if args.anonymous {
            None
        } else {
            Some(args.token.unwrap_or_else(|| DEFAULT_TOKEN.to_string()))
        },
        tls: !args.plain_http,
        ..TestServerOptions::default()
    };
    let server = TestApiServer::start_with(options).await?;
    if let Some(path) = &args.fixtures {
        server.load_fixtures(path)?;
    }
    if let Some(path) = &args.kubeconfig_out {
        server.write_kubeconfig(path)?;
    }
    if let (Some(path), Some(ca)) = (&args.ca_out, server.ca_pem()) {
        std::fs::write(path, ca).map_err(|source| TestServerError::WriteCa {
            path: path.clone(),
            source,
        })?;
    }
    let signal_error = |source| TestServerError::Listen {
        addr: server.addr(),
        source,
    };
    let mut terminate = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(signal_error)?;
    println!("{}", server.url());
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Args;

    #[test]
    fn help_documents_the_control_endpoint() {
        let help = match <Args as argh::FromArgs>::from_args(&["test-apiserver"], &["--help"]) {
            Err(exit) => exit.output,
            Ok(args) => panic!("--help parsed as {args:?}"),
        };
        for route in [
            "POST /testserver/objects",
            "POST /testserver/fault",
            "DELETE /testserver/fault",
            "GET /testserver/requests",
            "GET /testserver/pod-gets",
            "POST /testserver/compact",
            "version-4 UUID",
        ] {
            assert!(
                help.contains(route),
                "{route:?} missing from --help:\n{help}"
            );
        }
    }
}
