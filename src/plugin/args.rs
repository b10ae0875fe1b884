//! `CNI_ARGS`: `KEY=VALUE` pairs separated by `;`. Keys other than the Kubernetes ones are an
//! error unless `IgnoreUnknown` is true (runtimes always send it).

/// Why `CNI_ARGS` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("ARGS: invalid pair {0:?}")]
    InvalidPair(String),
    #[error(
        "ARGS: error parsing value of pair {pair:?}: boolean unmarshal error: invalid value {value:?}"
    )]
    BadBool { pair: String, value: String },
    #[error("ARGS: unknown args {0:?}")]
    Unknown(Vec<String>),
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
    }
}
