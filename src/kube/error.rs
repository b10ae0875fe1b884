//! The error type of the Kubernetes client module: every failure names the call, the object and why.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Which API call failed. Displayed as a short verb phrase ("get pod").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    GetPod,
    GetNamespace,
    ListPods,
    ListNamespaces,
    /// The watch half of a store's list-then-watch (the list half is `ListPods`/`ListNamespaces`).
    WatchPods,
    WatchNamespaces,
    PatchPod,
    PatchPodStatus,
    DeletePod,
    CreateEvent,
    GetDaemonSet,
    GetNode,
}

impl Call {
    /// The RBAC verb and resource the call needs (what a ClusterRole must grant).
    pub fn permission(self) -> (&'static str, &'static str) {
        match self {
            Call::GetPod => ("get", "pods"),
            Call::GetNamespace => ("get", "namespaces"),
            Call::ListPods => ("list", "pods"),
            Call::ListNamespaces => ("list", "namespaces"),
            Call::WatchPods => ("watch", "pods"),
            Call::WatchNamespaces => ("watch", "namespaces"),
            Call::PatchPod => ("patch", "pods"),
            Call::PatchPodStatus => ("patch", "pods/status"),
            Call::DeletePod => ("delete", "pods"),
            Call::CreateEvent => ("create", "events"),
            Call::GetDaemonSet => ("get", "daemonsets"),
            Call::GetNode => ("get", "nodes"),
        }
    }

    /// Whether the call is about an object in a namespace (its object is then `<ns>/<name>...`).
    fn is_namespaced(self) -> bool {
        matches!(
            self,
            Call::GetPod
                | Call::PatchPod
                | Call::PatchPodStatus
                | Call::DeletePod
                | Call::CreateEvent
                | Call::GetDaemonSet
        )
    }
}

/// The scope a 403 was about: " in namespace X" for namespaced calls, " at cluster scope" otherwise.
fn scope_of(call: Call, object: &str) -> String {
    match object.split_once('/') {
        Some((namespace, _)) if call.is_namespaced() => format!(" in namespace {namespace}"),
        _ if call.is_namespaced() => String::new(),
        _ => " at cluster scope".to_string(),
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Call::GetPod => "get pod",
            Call::GetNamespace => "get namespace",
            Call::ListPods => "list pods",
            Call::ListNamespaces => "list namespaces",
            Call::WatchPods => "watch pods",
            Call::WatchNamespaces => "watch namespaces",
            Call::PatchPod => "patch pod",
            Call::PatchPodStatus => "patch pod status",
            Call::DeletePod => "delete pod",
            Call::CreateEvent => "create event",
            Call::GetDaemonSet => "get daemonset",
            Call::GetNode => "get node",
        })
    }
}

/// A call the API server refused with a status callers decide on (404, 403, 401, 409): the call,
/// its object and the server's message.
#[derive(Debug)]
pub struct ApiRefusal {
    pub call: Call,
    pub object: String,
    pub message: String,
}

/// What a TLS failure names besides the call.
#[derive(Debug)]
pub struct TlsDetail {
    /// The server URL, as the kubeconfig names it.
    pub server: String,
    /// The certificate verifier's own words (e.g. "invalid peer certificate: UnknownIssuer").
    pub cause: String,
}

/// Why building a client failed, or why one call failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "cannot load kubeconfig {path}: {}",
        kubeconfig_reason(source, Some(path))
    )]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot load kubeconfig from $KUBECONFIG: {}", kubeconfig_reason(.0, None))]
    KubeconfigEnv(#[source] kube::config::KubeconfigError),
    #[error("cannot load in-cluster config (is this not running within a pod?): {0}")]
    InCluster(#[source] kube::config::InClusterError),
    #[error("cannot build Kubernetes client: {0}")]
    BuildClient(#[source] kube::Error),

    /// Refused before any request: the name cannot be part of a request path.
    #[error("{call}: invalid {field}: {source}")]
    InvalidName {
        call: Call,
        /// "namespace", "pod name", "daemonset name" or "node name".
        field: &'static str,
        #[source]
        source: super::names::InvalidName,
    },
    #[error("{call} {object}: no answer within {timeout:?}")]
    Timeout {
        call: Call,
        object: String,
        timeout: Duration,
    },
    #[error("{} {}: not found: {}", .0.call, .0.object, .0.message)]
    NotFound(ApiRefusal),
    #[error(
        "{} {}: forbidden: the service account in the kubeconfig cannot {verb} {resource}{scope}; \
         grant it in the istio-cni ClusterRole (API server: {})",
        .0.call,
        .0.object,
        .0.message,
        verb = .0.call.permission().0,
        resource = .0.call.permission().1,
        scope = scope_of(.0.call, &.0.object)
    )]
    Forbidden(ApiRefusal),
    #[error("{} {}: unauthorized (bad or expired token): {}", .0.call, .0.object, .0.message)]
    Unauthorized(ApiRefusal),
    #[error("{} {}: conflict: {}", .0.call, .0.object, .0.message)]
    Conflict(ApiRefusal),
    #[error("{call} {object}: API server answered {code} {reason}: {message}")]
    Api {
        call: Call,
        object: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("{call} {object}: connection refused by the API server: {source}")]
    ConnectRefused {
        call: Call,
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The API server's certificate was refused (wrong CA in the kubeconfig, expired, wrong
    /// name). Not transient: retrying cannot fix a certificate.
    #[error(
        "{call} {object}: TLS with the API server {} failed: {}; the server's certificate does \
         not verify against the certificate authority in the kubeconfig (wrong CA, expired or \
         issued for another name)",
        .detail.server,
        .detail.cause
    )]
    Tls {
        call: Call,
        object: String,
        /// Boxed: every call's `Result` carries this enum.
        detail: Box<TlsDetail>,
        #[source]
        source: kube::Error,
    },
    #[error("{call} {object}: cannot reach the API server: {source}")]
    Transport {
        call: Call,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{call} {object}: {source}")]
    Other {
        call: Call,
        object: String,
        #[source]
        source: kube::Error,
    },
}

impl KubeError {
    /// Sorts a kube error from one call into the variant that says why it failed.
    #[cfg(test)]
    pub(crate) fn from_call(call: Call, object: impl Into<String>, err: kube::Error) -> Self {
        Self::from_call_to("(unknown)", call, object, err)
    }

    /// [`KubeError::from_call`] for a client that knows its server URL (named by TLS errors).
    pub fn from_call_to(
        server: &str,
        call: Call,
        object: impl Into<String>,
        err: kube::Error,
    ) -> Self {
        let object = object.into();
        match err {
            kube::Error::Api(status) => {
                let refusal = ApiRefusal {
                    call,
                    object,
                    message: status.message.clone(),
                };
                match status.code {
                    404 => KubeError::NotFound(refusal),
                    403 => KubeError::Forbidden(refusal),
                    401 => KubeError::Unauthorized(refusal),
                    409 => KubeError::Conflict(refusal),
                    code => KubeError::Api {
                        call: refusal.call,
                        object: refusal.object,
                        code,
                        reason: status.reason.clone(),
                        message: refusal.message,
                    },
                }
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) => {
                if let Some(cause) = certificate_error(&err) {
                    KubeError::Tls {
                        call,
                        object,
                        detail: Box::new(TlsDetail {
                            server: server.to_string(),
                            cause,
                        }),
                        source: err,
                    }
                } else if io_error_kind(&err) == Some(std::io::ErrorKind::ConnectionRefused) {
                    KubeError::ConnectRefused {
                        call,
                        object,
                        source: err,
                    }
                } else {
                    KubeError::Transport {
                        call,
                        object,
                        source: err,
                    }
                }
            }
            other => KubeError::Other {
                call,
                object,
                source: other,
            },
        }
    }

    /// The call that failed, when the error is about one call (not about building a client).
    #[cfg(test)]
    pub(crate) fn call(&self) -> Option<Call> {
        match self {
            KubeError::Kubeconfig { .. }
            | KubeError::KubeconfigEnv(_)
            | KubeError::InCluster(_)
            | KubeError::BuildClient(_) => None,
            KubeError::NotFound(r)
            | KubeError::Forbidden(r)
            | KubeError::Unauthorized(r)
            | KubeError::Conflict(r) => Some(r.call),
            KubeError::InvalidName { call, .. }
            | KubeError::Timeout { call, .. }
            | KubeError::Api { call, .. }
            | KubeError::Tls { call, .. }
            | KubeError::ConnectRefused { call, .. }
            | KubeError::Transport { call, .. }
            | KubeError::Other { call, .. } => Some(*call),
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, KubeError::NotFound { .. })
    }

    #[cfg(test)]
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, KubeError::Timeout { .. })
    }

    /// True when only an operator can fix it: RBAC (403), the token (401) or the certificate
    /// authority (TLS). A store whose first list fails so gives up at once instead of waiting
    /// out its sync deadline.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            KubeError::Forbidden(_) | KubeError::Unauthorized(_) | KubeError::Tls { .. }
        )
    }

    /// True when trying the same call again later may succeed: the server was slow, unreachable,
    /// overloaded (429) or failed on its side (5xx). A bad name, 400, 401, 403, 404, 409 and 422
    /// need something else to change first, so callers fail at once on them.
    pub fn is_transient(&self) -> bool {
        match self {
            KubeError::Timeout { .. }
            | KubeError::ConnectRefused { .. }
            | KubeError::Transport { .. } => true,
            KubeError::Api { code, .. } => *code >= 500 || *code == 429,
            _ => false,
        }
    }
}

/// kube's kubeconfig errors print paths with `{:?}` inside quotes (`'"/path"'`); say the same
/// with each path shown once and plainly (`named`: the path the message already shows).
fn kubeconfig_reason(err: &kube::config::KubeconfigError, named: Option<&PathBuf>) -> String {
    use kube::config::{KubeconfigError as K, LoadDataError as D};
    let data = |what: &str, e: &D| match e {
        D::ReadFile(io, path) => format!("cannot read {what} {}: {io}", path.display()),
        other => format!("cannot load {what}: {other}"),
    };
    match err {
        K::ReadConfig(io, path) if Some(path) == named => io.to_string(),
        K::ReadConfig(io, path) => format!("cannot read {}: {io}", path.display()),
        K::LoadCertificateAuthority(e) => data("certificate authority", e),
        K::LoadClientCertificate(e) => data("client certificate", e),
        K::LoadClientKey(e) => data("client key", e),
        other => other.to_string(),
    }
}

/// The certificate verifier's message when the error chain holds one. rustls' errors reach us
/// boxed inside an `io::Error` (hyper-rustls), and rustls is not a direct dependency, so the
/// error is recognised by rustls' stable wording for a refused peer certificate.
fn certificate_error(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        let text = e.to_string();
        if let Some(at) = text.find("invalid peer certificate") {
            return Some(text[at..].to_string());
        }
        current = e.source();
    }
    None
}

/// The kind of the first `std::io::Error` in the error's source chain, if any. Connect failures
/// arrive wrapped several layers deep (hyper-util -> tower buffer -> kube).
fn io_error_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("boom", reason).with_code(code),
        ))
    }

    #[test]
    fn api_status_codes_map_to_variants() {
        let cases = [
            (404, "NotFound"),
            (403, "Forbidden"),
            (401, "Unauthorized"),
            (409, "Conflict"),
        ];
        for (code, reason) in cases {
            let err = KubeError::from_call(Call::GetPod, "ns1/p1", api_error(code, reason));
            let text = err.to_string();
            assert!(text.starts_with("get pod ns1/p1: "), "{text}");
            match (code, &err) {
                (404, KubeError::NotFound { .. })
                | (403, KubeError::Forbidden { .. })
                | (401, KubeError::Unauthorized { .. })
                | (409, KubeError::Conflict { .. }) => {}
                _ => panic!("code {code} mapped to {err:?}"),
            }
            assert!(!err.is_transient());
        }
    }

    #[test]
    fn server_errors_are_transient_and_keep_code() {
        let err = KubeError::from_call(Call::ListPods, "node=n1", api_error(500, "InternalError"));
        assert!(err.is_transient());
        assert_eq!(err.call(), Some(Call::ListPods));
        assert!(err.to_string().contains("500 InternalError"), "{err}");
    }

    #[test]
    fn connection_refused_is_found_in_the_source_chain() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = KubeError::from_call(
            Call::GetNamespace,
            "istio-system",
            kube::Error::Service(Box::new(io)),
        );
        assert!(matches!(err, KubeError::ConnectRefused { .. }), "{err:?}");
        assert!(err.is_transient());
    }

    #[test]
    fn a_refused_certificate_is_a_tls_error_naming_the_server_and_not_transient() {
        let rustls_like = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        let err = KubeError::from_call_to(
            "https://10.96.0.1:443",
            Call::ListPods,
            "node=n1",
            kube::Error::Service(Box::new(rustls_like)),
        );
        assert!(matches!(err, KubeError::Tls { .. }), "{err:?}");
        assert!(!err.is_transient() && err.needs_operator());
        let text = err.to_string();
        for part in [
            "list pods node=n1",
            "https://10.96.0.1:443",
            "invalid peer certificate: UnknownIssuer",
            "certificate authority",
        ] {
            assert!(text.contains(part), "{part:?} missing: {text}");
        }
        // Other transport failures stay transient.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let err = KubeError::from_call(Call::ListPods, "x", kube::Error::Service(Box::new(reset)));
        assert!(err.is_transient() && !err.needs_operator(), "{err:?}");
    }

    #[test]
    fn kubeconfig_paths_are_shown_once_without_debug_quotes() {
        let err = KubeError::Kubeconfig {
            path: "/run/istio-cni/istio-cni-kubeconfig".into(),
            source: kube::config::KubeconfigError::ReadConfig(
                std::io::ErrorKind::NotFound.into(),
                "/run/istio-cni/istio-cni-kubeconfig".into(),
            ),
        };
        let text = err.to_string();
        assert!(!text.contains('"') && !text.contains('\''), "{text}");
        assert_eq!(
            text,
            "cannot load kubeconfig /run/istio-cni/istio-cni-kubeconfig: entity not found"
        );
        let ca = KubeError::KubeconfigEnv(kube::config::KubeconfigError::LoadCertificateAuthority(
            kube::config::LoadDataError::ReadFile(
                std::io::ErrorKind::PermissionDenied.into(),
                "/etc/ca.crt".into(),
            ),
        ));
        assert_eq!(
            ca.to_string(),
            "cannot load kubeconfig from $KUBECONFIG: cannot read certificate authority \
             /etc/ca.crt: permission denied"
        );
    }

    #[test]
    fn timeout_message_names_call_object_and_limit() {
        let err = KubeError::Timeout {
            call: Call::PatchPodStatus,
            object: "ns/p".into(),
            timeout: Duration::from_millis(200),
        };
        assert_eq!(
            err.to_string(),
            "patch pod status ns/p: no answer within 200ms"
        );
        assert!(err.is_timeout() && err.is_transient());
    }
}
