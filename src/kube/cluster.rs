//! Reads of the agent's own deployment: its DaemonSet and this node (the installer's upgrade
//! check). Same rules as every call here: names checked first, one deadline, typed errors.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::client::{KubeClient, bounded, check_name};
use super::error::{Call, KubeError};
use super::names::{self, NameRule};

impl KubeClient {
    /// The DaemonSet, or `None` when it does not exist.
    pub async fn get_daemonset(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<DaemonSet>, KubeError> {
        let call = Call::GetDaemonSet;
        check_name(call, "namespace", names::check_namespace(namespace))?;
        check_name(
            call,
            "daemonset name",
            names::check(name, NameRule::Subdomain),
        )?;
        let api: Api<DaemonSet> = Api::namespaced(self.client().clone(), namespace);
        let object = format!("{namespace}/{name}");
        bounded(self.server(), call, object, timeout, api.get_opt(name)).await
    }

    /// The node, or `None` when it does not exist.
    pub async fn get_node(&self, name: &str, timeout: Duration) -> Result<Option<Node>, KubeError> {
        let call = Call::GetNode;
        check_name(call, "node name", names::check(name, NameRule::Subdomain))?;
        let api: Api<Node> = Api::all(self.client().clone());
        bounded(
            self.server(),
            call,
            name.to_string(),
            timeout,
            api.get_opt(name),
        )
        .await
    }
}
