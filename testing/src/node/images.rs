//! The node's images, all made on this machine (no registry is reachable): the sandbox ("pause")
//! image and the test workload image, each one static binary of testing/node in an image of its
//! own made by `podman import`; any image podman holds (ours, from scripts/image); all saved as
//! docker archives and imported into containerd's `k8s.io` namespace with ctr, where the CRI
//! plugin (and so kubelet) sees them.

use std::path::Path;
use std::process::Command;

use super::NodeError;

/// The sandbox image containerd is configured with.
pub const PAUSE_IMAGE: &str = "localhost/istio-cni-test-pause:1";
/// The workload image: `/workload -tcp PORTS -http PORTS -name NAME` (testing/node/workload).
pub const WORKLOAD_IMAGE: &str = "localhost/istio-cni-test-workload:1";

pub(super) fn run(command: &mut Command, what: &str) -> Result<String, NodeError> {
    let out = command.output().map_err(|source| NodeError::Io {
        what: what.to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(NodeError::Command {
            what: what.to_string(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Makes `reference` in podman: one static binary at `/<name>` as the whole root filesystem,
/// the binary as its entrypoint.
fn podman_image_of_binary(binary: &Path, reference: &str, work: &Path) -> Result<(), NodeError> {
    let name = binary
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("bin")
        .to_string();
    let root = work.join(format!("{name}-root"));
    std::fs::create_dir_all(&root)
        .and_then(|_| std::fs::copy(binary, root.join(&name)).map(|_| ()))
        .map_err(|source| NodeError::Io {
            what: format!("stage {} for {reference}", binary.display()),
            source,
        })?;
    let tar = work.join(format!("{name}.tar"));
    run(
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("--owner=0")
            .arg("--group=0")
            .arg("-cf")
            .arg(&tar)
            .arg(&name),
        &format!("tar {}", root.display()),
    )?;
    run(
        Command::new("podman")
            .args(["import", "--quiet", "--change"])
            .arg(format!("ENTRYPOINT [\"/{name}\"]"))
            .arg(&tar)
            .arg(reference),
        &format!("podman import {reference}"),
    )?;
    Ok(())
}

/// Builds the pause and workload images from `bins` (target/node) in podman.
pub(super) fn build_test_images(bins: &Path, work: &Path) -> Result<(), NodeError> {
    podman_image_of_binary(&bins.join("pause"), PAUSE_IMAGE, work)?;
    podman_image_of_binary(&bins.join("workload"), WORKLOAD_IMAGE, work)
}

/// Saves podman's `references` into one archive and imports it into containerd at `socket`.
pub(super) fn import(
    ctr: &Path,
    socket: &Path,
    references: &[&str],
    work: &Path,
) -> Result<(), NodeError> {
    let archive = work.join(format!("images-{}.tar", references.len()));
    let _ = std::fs::remove_file(&archive);
    run(
        Command::new("podman")
            .args(["save", "--quiet", "--multi-image-archive", "-o"])
            .arg(&archive)
            .args(references),
        &format!("podman save {}", references.join(" ")),
    )?;
    run(
        Command::new(ctr)
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&archive),
        &format!("ctr images import {}", references.join(" ")),
    )?;
    let _ = std::fs::remove_file(&archive);
    Ok(())
}
