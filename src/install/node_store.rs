//! The ONE node-scoped pod store of install-cni (`spec.nodeName=<node>`): made here, once, when
//! a feature needs this node's pods, and handed to each (the ambient agent, the repair
//! controller). One watch of this node's pods per process, not one per feature.
//!
//! Which node, and whether a store is needed at all, is decided by [`store_node`] (pure).

use tokio_util::sync::CancellationToken;

use super::config::Config;
use crate::kube::stores::{self, PodStore};
use crate::kube::{KubeClient, WatchBackoff};

/// Why no node could be chosen for the pod store. Each names the variable to set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error(
        "ambient node agent: NODE_NAME is empty: the agent watches the pods of its own node only"
    )]
    NoNodeName,
    #[error(
        "repair controller: REPAIR_NODE_NAME is empty: it watches the pods of its own node only \
         (set it from spec.nodeName, or REPAIR_ENABLED=false)"
    )]
    NoRepairNodeName,
    #[error(
        "NODE_NAME ({ambient:?}) and REPAIR_NODE_NAME ({repair:?}) differ: both features share one \
         watch of this node's pods"
    )]
    Differ { ambient: String, repair: String },
}

/// The node whose pods the store holds, or `None` when no feature needs a pod store (sidecar
/// mode with repair off). Ambient reads `NODE_NAME`, repair `REPAIR_NODE_NAME` (the chart sets
/// both from `spec.nodeName`); an empty one a feature needs is an error, never "every node".
pub fn store_node(cfg: &Config) -> Result<Option<String>, NodeError> {
    let ambient = cfg
        .install
        .ambient_enabled
        .then(|| cfg.agent.node_name.trim());
    let repair = cfg.repair.enabled.then(|| cfg.repair.node_name.trim());
    match (ambient, repair) {
        (Some(""), _) => Err(NodeError::NoNodeName),
        (_, Some("")) => Err(NodeError::NoRepairNodeName),
        (Some(a), Some(r)) if a != r => Err(NodeError::Differ {
            ambient: a.to_string(),
            repair: r.to_string(),
        }),
        (Some(node), _) | (None, Some(node)) => Ok(Some(node.to_string())),
        (None, None) => Ok(None),
    }
}

/// The features that need this node's pods, for messages ("ambient node agent and repair
/// controller").
pub fn features(cfg: &Config) -> String {
    let mut names = Vec::new();
    if cfg.install.ambient_enabled {
        names.push("ambient node agent");
    }
    if cfg.repair.enabled {
        names.push("repair controller");
    }
    names.join(" and ")
}

/// What the features share: the client and this node's pod store (watching until `stop`).
#[derive(Clone)]
pub struct NodePods {
    pub client: KubeClient,
    pub pods: PodStore,
}

impl NodePods {
    /// Starts the one pod watch, its retries spaced by `backoff`. Returns at once; readiness
    /// waits for the sync separately.
    pub fn spawn(
        client: KubeClient,
        node: String,
        backoff: WatchBackoff,
        stop: &CancellationToken,
    ) -> NodePods {
        let pods = stores::spawn_pod_store(&client, &node, backoff, stop.clone());
        NodePods { client, pods }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::config::{Parsed, parse};

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let env: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match parse(&["install-cni".to_string()], &env) {
            Ok(Parsed::Run(c)) => *c,
            other => panic!("parse: {other:?}"),
        }
    }

    #[test]
    fn one_node_for_every_feature_and_an_empty_one_names_its_variable() {
        let off = [("REPAIR_ENABLED", "false")];
        assert_eq!(store_node(&cfg(&off)), Ok(None));
        // Repair is on by default (Istio's default).
        assert_eq!(store_node(&cfg(&[])), Err(NodeError::NoRepairNodeName));
        let err = store_node(&cfg(&[])).unwrap_err().to_string();
        assert!(err.contains("REPAIR_NODE_NAME"), "{err}");
        assert_eq!(
            store_node(&cfg(&[("REPAIR_NODE_NAME", "n1")])),
            Ok(Some("n1".into()))
        );
        let ambient = [("AMBIENT_ENABLED", "true"), ("REPAIR_ENABLED", "false")];
        assert_eq!(store_node(&cfg(&ambient)), Err(NodeError::NoNodeName));
        let both = [
            ("AMBIENT_ENABLED", "true"),
            ("NODE_NAME", "n1"),
            ("REPAIR_NODE_NAME", "n1"),
        ];
        assert_eq!(store_node(&cfg(&both)), Ok(Some("n1".into())));
        let differ = [
            ("AMBIENT_ENABLED", "true"),
            ("NODE_NAME", "n1"),
            ("REPAIR_NODE_NAME", "n2"),
        ];
        assert!(matches!(
            store_node(&cfg(&differ)),
            Err(NodeError::Differ { .. })
        ));
    }
}
