//! The plugin's kubeconfig: server from the in-cluster service env, CA embedded (or
//! skip-verify), the service-account token embedded. Rendered as the same YAML bytes Istio writes
//! (keys sorted, as sigs.k8s.io/yaml emits them).

use std::path::Path;

/// Errors building the kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error(
        "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set to write the plugin \
         kubeconfig (is this not running within a pod?)"
    )]
    NoService,
    #[error("reading {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
}

/// Inputs of the kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeconfigInputs {
    pub server: String,
    /// `None` = insecure-skip-tls-verify.
    pub ca: Option<Vec<u8>>,
    pub token: String,
}

/// `<protocol>://<host>:<port>`, IPv6 hosts bracketed.
pub fn server_url(
    protocol: &str,
    host: Option<&str>,
    port: Option<&str>,
) -> Result<String, KubeconfigError> {
    let (Some(host), Some(port)) = (
        host.filter(|h| !h.is_empty()),
        port.filter(|p| !p.is_empty()),
    ) else {
        return Err(KubeconfigError::NoService);
    };
    let protocol = if protocol.is_empty() {
        "https"
    } else {
        protocol
    };
    if host.contains(':') && !host.starts_with('[') {
        Ok(format!("{protocol}://[{host}]:{port}"))
    } else {
        Ok(format!("{protocol}://{host}:{port}"))
    }
}

/// Reads the CA (unless skipping TLS verification) and the token.
pub fn read_inputs(
    server: String,
    skip_tls_verify: bool,
    ca_file: &Path,
    token_file: &Path,
) -> Result<KubeconfigInputs, KubeconfigError> {
    let read = |what: &'static str, path: &Path| {
        super::fsutil::read_bounded(path).map_err(|e| KubeconfigError::Read {
            what,
            path: path.display().to_string(),
            source: e.source,
        })
    };
    let ca = if skip_tls_verify {
        None
    } else {
        Some(read("CA file", ca_file)?)
    };
    let token = String::from_utf8(read("service-account token", token_file)?).map_err(|_| {
        KubeconfigError::Read {
            what: "service-account token",
            path: token_file.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
        }
    })?;
    Ok(KubeconfigInputs { server, ca, token })
}

/// Renders the kubeconfig YAML.
pub fn render(inputs: &KubeconfigInputs) -> String {
    let mut out = String::from("apiVersion: v1\nclusters:\n- cluster:\n");
    match &inputs.ca {
        Some(ca) => {
            out.push_str("    certificate-authority-data: ");
            out.push_str(&base64(ca));
            out.push('\n');
        }
        None => out.push_str("    insecure-skip-tls-verify: true\n"),
    }
    out.push_str(&format!("    server: {}\n", yaml_scalar(&inputs.server)));
    out.push_str(
        "  name: local\ncontexts:\n- context:\n    cluster: local\n    user: istio-cni\n  \
         name: istio-cni-context\ncurrent-context: istio-cni-context\nkind: Config\nusers:\n\
         - name: istio-cni\n  user:\n",
    );
    out.push_str(&format!("    token: {}\n", yaml_scalar(&inputs.token)));
    out
}

/// The same text with the token replaced, for logging.
pub fn redacted(inputs: &KubeconfigInputs) -> String {
    let mut i = inputs.clone();
    i.token = "<redacted>".to_string();
    i.ca = i.ca.map(|_| b"<ca>".to_vec());
    render(&i)
}

/// A plain scalar when that is unambiguous, else a double-quoted (JSON-compatible) one.
fn yaml_scalar(s: &str) -> String {
    let plain_safe = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '+' | '=')
        })
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '/' || c == '_' || c == '.')
        && !s.ends_with(':')
        && !s.contains(": ")
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "y" | "n"
        )
        && s.parse::<f64>().is_err();
    if plain_safe {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
    }
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/install/");

    fn golden(name: &str) -> String {
        std::fs::read_to_string(format!("{TD}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn inputs(host: &str, skip: bool) -> KubeconfigInputs {
        KubeconfigInputs {
            server: server_url("https", Some(host), Some("443")).expect("server"),
            ca: if skip {
                None
            } else {
                Some(golden("kube-ca.crt").into_bytes())
            },
            token: "service_account_token_string".to_string(),
        }
    }

    #[test]
    fn tls_golden() {
        pretty_assertions::assert_eq!(
            render(&inputs("10.96.0.1", false)),
            golden("kubeconfig-tls")
        );
    }

    #[test]
    fn skip_tls_golden() {
        pretty_assertions::assert_eq!(
            render(&inputs("10.96.0.1", true)),
            golden("kubeconfig-skip-tls")
        );
    }

    #[test]
    fn newhost_golden() {
        pretty_assertions::assert_eq!(
            render(&inputs("50.76.2.1", false)),
            golden("kubeconfig-newhost")
        );
    }

    #[test]
    fn server_rules() {
        assert_eq!(
            server_url("", Some("fd00::1"), Some("6443")).expect("v6"),
            "https://[fd00::1]:6443"
        );
        assert_eq!(
            server_url("http", Some("h"), Some("80")).expect("http"),
            "http://h:80"
        );
        assert!(server_url("https", None, Some("1")).is_err());
        assert!(server_url("https", Some("h"), Some("")).is_err());
    }

    #[test]
    fn odd_tokens_are_quoted_and_redaction_hides_the_token() {
        let mut i = inputs("10.0.0.1", true);
        i.token = "a b: c\n".to_string();
        assert!(render(&i).contains("token: \"a b: c\\n\"\n"));
        i.token = "eyJhbGciOi.JSUzI1-_Ni".to_string();
        assert!(render(&i).contains("token: eyJhbGciOi.JSUzI1-_Ni\n"));
        assert!(!redacted(&i).contains("eyJ"));
    }

    #[test]
    fn base64_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
    }
}
