//! The "node" the image test's container runs on: a netns of its own (the pod's host network)
//! where the real kube-apiserver answers on loopback (a relay, `ControlPlane::forward_into`), a
//! release of the chart there (`chart_helm/release.rs`: its ServiceAccount, RBAC, ConfigMap and
//! DaemonSet), the chart's host paths as temp dirs, the service account mount (a bound token of the
//! chart's ServiceAccount), a procfs of its own holding a kubelet, and the host side of the CNI
//! chain (bridge + loopback +
//! the plugin install-cni put on the host, run from the node netns in a mount namespace where the
//! node's /var/run/istio-cni is this test's dir, as on a real node; the machine's is not touched).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use istio_cni_testing::controlplane::{self, Forwarder, pod_on_node, unique_name};

use crate::ambient_node::{PodNs, in_netns};
use crate::chart::Rendered;
use crate::install_support::{Dirs, http_get};
use crate::podman::{Container, Mount, Spec};
use crate::release::{self, Release};
use crate::support::Netns;
use crate::support::cni_driver::{Attachment, Chain};
use crate::support::node_proc::NodeProc;
use crate::support::zds_peer::ZdsPeer;

/// The primary CNI config the node starts with (install-cni merges its entry into it).
pub const PRIMARY: &str = "10-image.conflist";
/// Where Kubernetes mounts a pod's service account.
const SA_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

pub struct Host {
    pub release: Release,
    /// The API server on the node's loopback.
    relay: Forwarder,
    pub ns: Netns,
    /// Before `dirs`: its mount is under their temp dir and is detached first.
    node_proc: NodeProc,
    pub dirs: Dirs,
    ztunnel: PathBuf,
    _ipam: tempfile::TempDir,
}

impl Host {
    /// A node for `r`'s DaemonSet, its release applied to the real API server.
    pub fn new(r: &Rendered) -> Host {
        let ns = Netns::new("imgnode");
        let cp = controlplane::shared();
        let relay = cp
            .forward_into(Path::new(&ns.path()))
            .expect("relay into the node");
        let release = release::install(cp, r, None, |_| {});
        let dirs = Dirs::new();
        // The service account as Kubernetes mounts it: a bound token, the server's CA.
        release.write_service_account(&dirs.sa);
        let ipam = tempfile::tempdir().expect("tempdir");
        let conflist = json!({
            "cniVersion": "1.0.0", "name": "image-net",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]],
                          "dataDir": ipam.path().display().to_string()}},
                {"type": "loopback"}
            ]
        });
        dirs.put(PRIMARY, conflist.to_string().as_bytes());
        let ztunnel = dirs.tmp.path().join("ztunnel");
        std::fs::create_dir_all(&ztunnel).expect("mkdir");
        let node_proc = NodeProc::start(&ns.path(), dirs.tmp.path());
        Host {
            release,
            relay,
            ns,
            dirs,
            ztunnel,
            node_proc,
            _ipam: ipam,
        }
    }

    /// The host path for each of the chart's hostPath volumes (every one must be known here).
    fn host_path(&self, volume: &str, chart_path: &str) -> String {
        let d = &self.dirs;
        let p = |p: &Path| p.display().to_string();
        match volume {
            "cni-bin-dir" => p(&d.bin),
            "cni-net-dir" => p(&d.net),
            "cni-socket-dir" => p(&d.run),
            // The runtime's result cache: this node's runtime is the test, which caches nothing.
            "cni-results-dir" => {
                let dir = d.run.join("cni-results");
                std::fs::create_dir_all(&dir).expect("the results cache dir");
                p(&dir)
            }
            "cni-ztunnel-sock-dir" => p(&self.ztunnel),
            "cni-host-procfs" => p(&self.node_proc.dir),
            // The machine's own: `ip netns add` puts the test's pods there.
            "cni-netns-dir" => {
                assert_eq!(chart_path, "/var/run/netns");
                "/run/netns".to_string()
            }
            other => panic!(
                "the chart mounts a host path this test does not map: {other} ({chart_path})"
            ),
        }
    }

    /// Runs the image with the rendered container's command, args, env, mounts and
    /// securityContext, on this node's network.
    pub fn start_container(&mut self, r: &Rendered, image: &str) -> Container {
        std::fs::create_dir_all(&self.dirs.run).expect("mkdir run");
        let c = r.container();
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().expect("a string").to_string())
                .collect()
        };
        let host_paths = r.host_paths();
        let mut mounts: Vec<Mount> = c["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .map(|m| {
                let volume = m["name"].as_str().expect("volume name");
                Mount {
                    host: self.host_path(volume, &host_paths[volume]),
                    container: m["mountPath"].as_str().expect("mountPath").to_string(),
                    read_only: m["readOnly"] == true,
                    host_to_container: m["mountPropagation"] == "HostToContainer",
                }
            })
            .collect();
        mounts.push(Mount {
            host: self.dirs.sa.display().to_string(),
            container: SA_MOUNT.to_string(),
            read_only: true,
            host_to_container: false,
        });
        // The fieldRefs as the kubelet resolves them for the release's pod.
        let mut env = r.container_env();
        self.release.resolve(&mut env);
        let mut env: Vec<(String, String)> = env.into_iter().collect();
        // What the kubelet adds for every pod: the API service (here on the node's loopback).
        let port = self.relay.port().to_string();
        env.push(("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()));
        env.push(("KUBERNETES_SERVICE_PORT".into(), port));
        let sc = &c["securityContext"];
        let user = format!(
            "{}:{}",
            sc["runAsUser"].as_u64().expect("runAsUser"),
            sc["runAsGroup"].as_u64().expect("runAsGroup")
        );
        Container::start(&Spec {
            image,
            netns: Path::new(&self.ns.path()),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            env,
            mounts,
            cap_add: strings(&sc["capabilities"]["add"]),
            cap_drop_all: strings(&sc["capabilities"]["drop"]) == ["ALL"],
            user,
        })
    }

    pub fn get(&self, port: u16, path: &str) -> Option<(u16, String)> {
        let path = path.to_string();
        self.ns
            .spawn(move || http_get(port, &path))
            .join()
            .expect("http thread")
    }

    /// The test ZDS peer (ztunnel's stand-in) on the agent's socket in the host's ztunnel dir.
    pub fn peer(&self) -> ZdsPeer {
        ZdsPeer::start(&self.ztunnel.join("ztunnel.sock"))
    }

    /// A namespace of a name unique on the server, starting with `name`; returns that name.
    pub fn namespace(&self, name: &str, labels: &[(&str, &str)]) -> String {
        let name = unique_name(name);
        self.release.cp.create_namespace(&name, labels);
        name
    }

    /// A pod on this node (the API server gives it its UID); returns the UID.
    pub fn pod(&self, namespace: &str, name: &str) -> String {
        let pod = pod_on_node(namespace, name, &self.release.node);
        let stored = self.release.cp.create_pod(&pod);
        stored.metadata.uid.expect("uid")
    }

    /// ADD through the merged chain, run as the runtime on the node runs it: from the node netns,
    /// with the plugin install-cni put on the host, seeing the node's /var/run/istio-cni.
    pub fn add(
        &self,
        conflist: &str,
        pod: &PodNs,
        k8s_ns: &str,
        name: &str,
    ) -> Result<Value, String> {
        let wrap = self.dirs.tmp.path().join("host-view");
        std::fs::create_dir_all(&wrap).expect("mkdir");
        let script = wrap.join("istio-cni");
        // The plugin's config names /var/run/istio-cni (the chart's host path). The machine's is
        // left alone: in a mount namespace of the plugin's own, /run is a fresh tmpfs holding the
        // machine's netns dir (the pods' handles, moved over with their mounts) and this test's
        // run dir as istio-cni.
        let old_run = wrap.join("machine-run");
        std::fs::create_dir_all(&old_run).expect("mkdir");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nexec unshare --mount --propagation private sh -ec '\
                 mount --rbind /run \"$0\" && mount -t tmpfs tmpfs /run && \
                 mkdir /run/netns /run/istio-cni && mount --rbind \"$0/netns\" /run/netns && \
                 mount --bind \"$1\" /run/istio-cni && shift && exec \"$@\"' \
                 {} {} {} \"$@\"\n",
                old_run.display(),
                self.dirs.run.display(),
                self.dirs.bin.join("istio-cni").display()
            ),
        )
        .expect("write the host-view wrapper");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let chain = Chain {
            conflist: serde_json::from_str(conflist).expect("conflist JSON"),
            cni_path: vec![wrap, PathBuf::from("/usr/lib/cni")],
        };
        let netns = pod.guard.path();
        let id = pod.guard.name.clone();
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={id}"
        );
        in_netns(Path::new(&self.ns.path()), move || {
            chain.add(&Attachment {
                container_id: &id,
                netns: &netns,
                ifname: "eth0",
                args: &args,
            })
        })
    }
}
