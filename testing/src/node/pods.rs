//! Pods on the node as tests look at them: waiting for a phase, the pid of a pod's container (from
//! containerd, by the container ID kubelet reports), running code inside a pod's network
//! namespace, deleting and waiting until the pod is gone.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

use super::{Node, NodeError};
use crate::controlplane::ControlPlane;

/// Runs `f` on a thread of its own that has entered the network namespace of process `pid`.
pub fn in_netns<T: Send + 'static>(
    pid: u32,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NodeError> {
    let path = format!("/proc/{pid}/ns/net");
    let file = std::fs::File::open(&path).map_err(|source| NodeError::Io {
        what: format!("open {path}"),
        source,
    })?;
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| NodeError::Io {
                what: format!("setns {path}"),
                source: e.into(),
            })
            .map(|()| f())
    })
    .join()
    .expect("netns thread panicked")
}

fn pod_summary(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let containers: Vec<String> = status
        .container_statuses
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let state = serde_json::to_string(&c.state).unwrap_or_default();
            format!("{} ready={} {state}", c.name, c.ready)
        })
        .collect();
    format!(
        "phase={:?} conditions={} containers=[{}]",
        status.phase,
        serde_json::to_string(&status.conditions).unwrap_or_default(),
        containers.join("; ")
    )
}

impl Node {
    /// The pod as stored now.
    pub fn get_pod(&self, cp: &ControlPlane, namespace: &str, name: &str) -> Option<Pod> {
        let (client, ns, name) = (self.client.clone(), namespace.to_string(), name.to_string());
        cp.block_on(async move { Api::<Pod>::namespaced(client, &ns).get_opt(&name).await })
            .ok()
            .flatten()
    }

    /// Waits until `pred` holds for the pod; the error shows the pod's last state.
    pub fn wait_pod(
        &self,
        cp: &ControlPlane,
        namespace: &str,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Pod) -> bool,
    ) -> Result<Pod, NodeError> {
        let mut found = None;
        self.wait_for(
            &format!("pod {namespace}/{name} {what}"),
            timeout,
            || match self.get_pod(cp, namespace, name) {
                Some(p) if pred(&p) => {
                    found = Some(p);
                    Ok(())
                }
                Some(p) => Err(pod_summary(&p)),
                None => Err("no such pod".into()),
            },
        )?;
        Ok(found.expect("found"))
    }

    /// Waits until the pod runs with every container ready.
    pub fn wait_pod_ready(
        &self,
        cp: &ControlPlane,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Pod, NodeError> {
        self.wait_pod(cp, namespace, name, "ready", timeout, |p| {
            let s = p.status.clone().unwrap_or_default();
            s.phase.as_deref() == Some("Running")
                && s.container_statuses
                    .unwrap_or_default()
                    .iter()
                    .all(|c| c.ready)
        })
    }

    /// The host pid of a running container of `pod` (by kubelet's containerID and containerd's
    /// task list).
    pub fn container_pid(&self, pod: &Pod, container: &str) -> Result<u32, NodeError> {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        let id = statuses
            .iter()
            .find(|c| c.name == container)
            .and_then(|c| c.container_id.clone())
            .and_then(|id| id.strip_prefix("containerd://").map(str::to_string))
            .ok_or_else(|| NodeError::Io {
                what: format!("container {container} of pod {:?}", pod.metadata.name),
                source: std::io::Error::other("no containerd container ID in the pod status"),
            })?;
        let tasks = self.ctr(&["tasks", "ls"])?;
        tasks
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?, f.next()?.parse::<u32>().ok()?))
            })
            .find(|(task, _)| *task == id)
            .map(|(_, pid)| pid)
            .ok_or_else(|| NodeError::Io {
                what: format!("task of container {id}"),
                source: std::io::Error::other(format!("not in ctr tasks ls:\n{tasks}")),
            })
            .and_then(|pid| self.host_pid(pid))
    }

    /// The host pid of the process containerd (in the node's PID namespace) calls `pid`.
    pub fn host_pid(&self, pid: u32) -> Result<u32, NodeError> {
        match &self.namespaces {
            None => Ok(pid),
            Some(ns) => ns.host_pid(pid).ok_or_else(|| NodeError::Io {
                what: format!("the host pid of the node's pid {pid}"),
                source: std::io::Error::other("no such process in the node's PID namespace"),
            }),
        }
    }

    /// The host pid of the node's pid 1 (the pid 1 the agent's hostPath /proc shows).
    pub fn init_pid(&self) -> Option<u32> {
        self.namespaces.as_ref().map(|ns| ns.init_pid())
    }

    /// Deletes the pod and waits until the API server no longer has it (kubelet confirmed the
    /// containers and sandbox are gone).
    pub fn delete_pod(
        &self,
        cp: &ControlPlane,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let (client, ns, n) = (self.client.clone(), namespace.to_string(), name.to_string());
        let _ = cp.block_on(async move {
            Api::<Pod>::namespaced(client, &ns)
                .delete(&n, &DeleteParams::default())
                .await
                .map(|_| ())
        });
        self.wait_for(
            &format!("pod {namespace}/{name} gone"),
            timeout,
            || match self.get_pod(cp, namespace, name) {
                None => Ok(()),
                Some(p) => Err(pod_summary(&p)),
            },
        )
    }
}
