//! `CNI_ARGS`: `KEY=VALUE` pairs separated by `;`. Keys other than the Kubernetes ones are an
//! error unless `IgnoreUnknown` is true (runtimes always send it).

use crate::kube::names::{self, InvalidName, echo};

/// Why `CNI_ARGS` could not be read. Values are echoed bounded and escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("ARGS: invalid pair \"{}\"", echo(.0))]
    InvalidPair(String),
    #[error(
        "ARGS: error parsing value of pair \"{}\": boolean unmarshal error: invalid value \"{}\"",
        echo(pair),
        echo(value)
    )]
    BadBool { pair: String, value: String },
    #[error("ARGS: unknown args [{}]", .0.iter().map(|p| format!("\"{}\"", echo(p))).collect::<Vec<_>>().join(", "))]
    Unknown(Vec<String>),
    /// `K8S_POD_NAMESPACE` / `K8S_POD_NAME` that is not a Kubernetes name: no pod can have it, and
    /// it must never become part of an API request path.
    #[error("CNI_ARGS {key}: {source}")]
    InvalidName {
        key: &'static str,
        #[source]
        source: InvalidName,
    },
}

/// The keys the plugin understands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub ignore_unknown: bool,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_infra_container_id: String,
    pub pod_uid: String,
}

/// libcni's bool spelling for `IgnoreUnknown`: 1/0 or true/false in any case.
fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" => Some(true),
        "0" | "false" => Some(false),
        _ => None,
    }
}

impl CniArgs {
    pub fn parse(raw: &str) -> Result<CniArgs, ArgsError> {
        let mut args = CniArgs::default();
        if raw.is_empty() {
            return Ok(args);
        }
        let mut unknown = Vec::new();
        for pair in raw.split(';') {
            let mut kv = pair.split('=');
            let (Some(key), Some(value), None) = (kv.next(), kv.next(), kv.next()) else {
                return Err(ArgsError::InvalidPair(pair.to_string()));
            };
            let value = value.to_string();
            match key {
                "IgnoreUnknown" => {
                    args.ignore_unknown = parse_bool(&value).ok_or_else(|| ArgsError::BadBool {
                        pair: pair.to_string(),
                        value: value.clone(),
                    })?;
                }
                "K8S_POD_NAME" => args.pod_name = value,
                "K8S_POD_NAMESPACE" => args.pod_namespace = value,
                "K8S_POD_INFRA_CONTAINER_ID" => args.pod_infra_container_id = value,
                "K8S_POD_UID" => args.pod_uid = value,
                _ => unknown.push(pair.to_string()),
            }
        }
        if !unknown.is_empty() && !args.ignore_unknown {
            return Err(ArgsError::Unknown(unknown));
        }
        Ok(args)
    }

    /// The pod's namespace must be a DNS-1123 label and its name a DNS-1123 subdomain, as the
    /// API server requires of every pod.
    pub fn check_kubernetes_names(&self) -> Result<(), ArgsError> {
        let named = |key, checked: Result<(), InvalidName>| {
            checked.map_err(|source| ArgsError::InvalidName { key, source })
        };
        named(
            "K8S_POD_NAMESPACE",
            names::check_namespace(&self.pod_namespace),
        )?;
        named("K8S_POD_NAME", names::check_pod_name(&self.pod_name))
    }

    /// Both Kubernetes identity keys are present.
    pub fn is_kubernetes_pod(&self) -> bool {
        !self.pod_name.is_empty() && !self.pod_namespace.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_style_args() {
        let a = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u1;FOO=bar",
        )
        .unwrap();
        assert_eq!(a.pod_name, "p");
        assert_eq!(a.pod_namespace, "ns");
        assert_eq!(a.pod_uid, "u1");
        assert!(a.ignore_unknown && a.is_kubernetes_pod());
    }

    #[test]
    fn unknown_keys_need_ignore_unknown_wherever_it_appears() {
        assert_eq!(
            CniArgs::parse("FOO=bar;K8S_POD_NAME=p").unwrap_err(),
            ArgsError::Unknown(vec!["FOO=bar".into()])
        );
        assert!(CniArgs::parse("FOO=bar;IgnoreUnknown=true").is_ok());
        assert!(CniArgs::parse("FOO=bar;IgnoreUnknown=0").is_err());
    }

    #[test]
    fn malformed_pairs() {
        assert_eq!(
            CniArgs::parse("K8S_POD_NAME").unwrap_err(),
            ArgsError::InvalidPair("K8S_POD_NAME".into())
        );
        assert!(CniArgs::parse("a=b=c").is_err());
        assert!(CniArgs::parse("K8S_POD_NAME=p;").is_err());
        assert!(matches!(
            CniArgs::parse("IgnoreUnknown=yes").unwrap_err(),
            ArgsError::BadBool { .. }
        ));
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        let long = format!("K8S_POD_NAME{}", "x\n".repeat(5000));
        let text = CniArgs::parse(&long).unwrap_err().to_string();
        assert!(text.len() < 200 && !text.contains('\n'), "{text}");
    }

    #[test]
    fn kubernetes_names_are_checked_naming_the_key() {
        let a = CniArgs::parse("K8S_POD_NAMESPACE=../../etc;K8S_POD_NAME=a/b").unwrap();
        let err = a.check_kubernetes_names().unwrap_err();
        assert!(matches!(
            err,
            ArgsError::InvalidName {
                key: "K8S_POD_NAMESPACE",
                ..
            }
        ));
        assert!(
            err.to_string().starts_with(
                "CNI_ARGS K8S_POD_NAMESPACE: \"../../etc\" is not a valid DNS-1123 label"
            ),
            "{err}"
        );
        let a = CniArgs::parse("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=a/b").unwrap();
        let err = a.check_kubernetes_names().unwrap_err().to_string();
        assert!(
            err.starts_with("CNI_ARGS K8S_POD_NAME: \"a/b\" is not a valid DNS-1123 subdomain"),
            "{err}"
        );
        let a = CniArgs::parse("K8S_POD_NAMESPACE=istio-system;K8S_POD_NAME=web-0.x").unwrap();
        assert_eq!(a.check_kubernetes_names(), Ok(()));
    }
}
