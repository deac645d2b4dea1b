//! Preloaded images against the cluster's kubeadm configuration.
//!
//! A node has no network at first boot for all ingot knows: kubeadm and the kubelet find the
//! control-plane images and the pause image in containerd only under the exact names kubeadm
//! derives from the `ClusterConfiguration` (`imageRepository`, default `registry.k8s.io`;
//! `kubernetesVersion` as the tag of kube-apiserver, kube-controller-manager, kube-scheduler and
//! kube-proxy). A preload under another name is dead weight and the node pulls (or, offline,
//! never comes up), so staging says so, naming the image kubeadm will look for.

use serde_norway::Value;

use crate::Bootstrap;

/// The default of `ClusterConfiguration.imageRepository`.
const DEFAULT_REPOSITORY: &str = "registry.k8s.io";
/// Images tagged with `kubernetesVersion`.
const VERSIONED: [&str; 4] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
];

/// What the bootstrap data's `ClusterConfiguration` makes kubeadm pull.
#[derive(Debug, PartialEq, Eq)]
struct Cluster {
    version: Option<String>,
    repository: String,
    etcd_repository: Option<String>,
    dns_repository: Option<String>,
}

/// One warning per preloaded image (`references`, as containerd lists them) that is a
/// control-plane image, etcd, CoreDNS or pause but not under the name the bootstrap data's
/// `ClusterConfiguration` makes kubeadm use. Pause, etcd and CoreDNS tags depend on the kubeadm
/// release, so only their repository is compared. Nothing when the data has no
/// `ClusterConfiguration` (a join reads it from the cluster).
pub fn preload_warnings(b: &Bootstrap, references: &[String]) -> Vec<String> {
    let Some((path, cluster)) = cluster_configuration(b) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for reference in references {
        let (repo, name, tag) = split_reference(reference);
        let expected = match name {
            n if VERSIONED.contains(&n) => {
                let want_tag = cluster.version.as_deref().unwrap_or(tag);
                (repo != cluster.repository || tag != want_tag)
                    .then(|| format!("{}/{n}:{want_tag}", cluster.repository))
            }
            "pause" => {
                (repo != cluster.repository).then(|| format!("{}/pause:{tag}", cluster.repository))
            }
            "etcd" => {
                let want = cluster
                    .etcd_repository
                    .as_deref()
                    .unwrap_or(&cluster.repository);
                (repo != want).then(|| format!("{want}/etcd:{tag}"))
            }
            "coredns" => {
                // kubeadm keeps CoreDNS one level deeper in the default repository only.
                let want = match &cluster.dns_repository {
                    Some(r) => r.clone(),
                    None if cluster.repository == DEFAULT_REPOSITORY => {
                        format!("{DEFAULT_REPOSITORY}/coredns")
                    }
                    None => cluster.repository.clone(),
                };
                (repo != want).then(|| format!("{want}/coredns:{tag}"))
            }
            _ => None,
        };
        if let Some(expected) = expected {
            out.push(format!(
                "preloaded image {reference} does not match {path}'s ClusterConfiguration \
                 (kubernetesVersion {}, imageRepository {}): kubeadm expects {expected}, which \
                 the node would have to pull",
                cluster.version.as_deref().unwrap_or("unset"),
                cluster.repository
            ));
        }
    }
    out
}

/// The first `ClusterConfiguration` among the data's files, with the file's path.
fn cluster_configuration(b: &Bootstrap) -> Option<(String, Cluster)> {
    for file in &b.files {
        let Ok(text) = std::str::from_utf8(&file.content) else {
            continue;
        };
        if !text.contains("ClusterConfiguration") {
            continue;
        }
        // Too deep for serde_norway, and slow to find out: skipped like any unreadable file.
        if crate::parse::yaml_scan(text).too_deep.is_some() {
            continue;
        }
        for doc in serde_norway::Deserializer::from_str(text) {
            let Ok(doc) = <Value as serde::Deserialize>::deserialize(doc) else {
                break;
            };
            if doc.get("kind").and_then(Value::as_str) != Some("ClusterConfiguration") {
                continue;
            }
            let string = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
            let cluster = Cluster {
                version: string(doc.get("kubernetesVersion")).map(|v| normalize_version(&v)),
                repository: string(doc.get("imageRepository"))
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| DEFAULT_REPOSITORY.to_string()),
                etcd_repository: string(
                    doc.get("etcd")
                        .and_then(|e| e.get("local"))
                        .and_then(|l| l.get("imageRepository")),
                ),
                dns_repository: string(doc.get("dns").and_then(|d| d.get("imageRepository"))),
            };
            return Some((file.path.display().to_string(), cluster));
        }
    }
    None
}

/// kubeadm accepts `1.31.4` for `v1.31.4` and tags images with the `v`.
fn normalize_version(v: &str) -> String {
    if v.starts_with(|c: char| c.is_ascii_digit()) {
        format!("v{v}")
    } else {
        v.to_string()
    }
}

/// `REPOSITORY/NAME:TAG[@DIGEST]` → (repository, name, tag); the tag is `latest` when absent.
fn split_reference(reference: &str) -> (&str, &str, &str) {
    let without_digest = reference.split('@').next().unwrap_or(reference);
    let (path, tag) = match without_digest.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, t),
        _ => (without_digest, "latest"),
    };
    match path.rsplit_once('/') {
        Some((repo, name)) => (repo, name, tag),
        None => ("", path, tag),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_name_and_tag() {
        assert_eq!(
            split_reference("registry.k8s.io/coredns/coredns:v1.11.3"),
            ("registry.k8s.io/coredns", "coredns", "v1.11.3")
        );
        assert_eq!(
            split_reference("localhost:5000/pause"),
            ("localhost:5000", "pause", "latest")
        );
        assert_eq!(
            split_reference("r.example/etcd:3.5.15-0@sha256:00"),
            ("r.example", "etcd", "3.5.15-0")
        );
    }
}
