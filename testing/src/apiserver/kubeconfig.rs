//! The kubeconfig the server hands out: the layout install-cni writes (cluster `local`, user
//! `istio-cni`, context `istio-cni-context`), with the token and, over TLS, the CA embedded.

use std::path::Path;

use serde_json::Value;

use super::TestServerError;

pub(super) fn write_kubeconfig(
    path: &Path,
    url: &str,
    token: Option<&str>,
    ca_pem: Option<&str>,
) -> Result<(), TestServerError> {
    use base64::Engine as _;
    // JSON strings are valid YAML scalars, so quoting through serde_json escapes safely.
    let quote = |s: &str| Value::String(s.to_string()).to_string();
    let ca = ca_pem.map_or_else(String::new, |pem| {
        let data = base64::engine::general_purpose::STANDARD.encode(pem);
        format!("    certificate-authority-data: {data}\n")
    });
    let user = match token {
        Some(token) => format!("    token: {}\n", quote(token)),
        None => "    {}\n".to_string(),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n{ca}    server: {server}\n  name: local\n\
         contexts:\n- context:\n    cluster: local\n    user: istio-cni\n  name: istio-cni-context\n\
         current-context: istio-cni-context\npreferences: {{}}\nusers:\n- name: istio-cni\n  user:\n{user}",
        server = quote(url),
    );
    std::fs::write(path, text).map_err(|source| TestServerError::WriteKubeconfig {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_written_for_the_server_parses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        write_kubeconfig(&path, "http://127.0.0.1:1234", Some("tok\"en"), None).expect("writes");
        let text = std::fs::read_to_string(&path).expect("reads");
        let parsed = kube::config::Kubeconfig::from_yaml(&text).expect("parses");
        assert_eq!(parsed.current_context.as_deref(), Some("istio-cni-context"));
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("http://127.0.0.1:1234"));
        // The token itself is a secrecy type; check the escaped form is what was written.
        assert!(text.contains(r#"token: "tok\"en""#), "{text}");
    }
}
