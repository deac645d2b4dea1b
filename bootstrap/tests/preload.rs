//! Preloaded images checked against the bootstrap data's ClusterConfiguration
//! (`kubernetesVersion: v1.31.4`, no imageRepository: registry.k8s.io) on CABPK-shaped data.

mod common;

use common::*;
use ingot_bootstrap::{parse, preload_warnings};

fn warnings(data: &str, refs: &[&str]) -> Vec<String> {
    let b = parse(data.as_bytes()).unwrap();
    let refs: Vec<String> = refs.iter().map(|r| r.to_string()).collect();
    preload_warnings(&b, &refs)
}

fn init() -> String {
    fixture_text("cloud-config-controlplane-init.yaml")
}

#[test]
fn matching_preloads_and_other_images_give_no_warning() {
    let w = warnings(
        &init(),
        &[
            "registry.k8s.io/kube-apiserver:v1.31.4",
            "registry.k8s.io/kube-controller-manager:v1.31.4",
            "registry.k8s.io/kube-scheduler:v1.31.4",
            "registry.k8s.io/kube-proxy:v1.31.4",
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/etcd:3.5.15-0",
            "registry.k8s.io/coredns/coredns:v1.11.3",
            "docker.io/calico/node:v3.28.0",
            "example.invalid/ingot/busybox:1.0",
        ],
    );
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn a_wrong_version_names_the_image_kubeadm_expects() {
    let w = warnings(
        &init(),
        &[
            "registry.k8s.io/kube-apiserver:v1.30.8",
            "registry.k8s.io/kube-proxy:v1.31.4",
        ],
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("preloaded image registry.k8s.io/kube-apiserver:v1.30.8 does not match"),
        "{w:?}"
    );
    assert!(w[0].contains("kubernetesVersion v1.31.4"), "{w:?}");
    assert!(
        w[0].contains("kubeadm expects registry.k8s.io/kube-apiserver:v1.31.4"),
        "{w:?}"
    );
}

#[test]
fn a_wrong_repository_names_the_image_kubeadm_expects() {
    let w = warnings(
        &init(),
        &[
            "k8s.gcr.io/pause:3.10",
            "mirror.example/etcd:3.5.15-0",
            "registry.k8s.io/coredns:v1.11.3",
        ],
    );
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(
        w[0].contains("kubeadm expects registry.k8s.io/pause:3.10"),
        "{w:?}"
    );
    assert!(
        w[1].contains("kubeadm expects registry.k8s.io/etcd:3.5.15-0"),
        "{w:?}"
    );
    assert!(
        w[2].contains("kubeadm expects registry.k8s.io/coredns/coredns:v1.11.3"),
        "{w:?}"
    );
}

#[test]
fn the_configured_image_repository_is_the_expected_one() {
    let data = init().replace(
        "      kind: ClusterConfiguration\n      kubernetesVersion: v1.31.4\n",
        "      imageRepository: mirror.example/k8s\n      kind: ClusterConfiguration\n      kubernetesVersion: 1.31.4\n",
    );
    assert!(data.contains("mirror.example/k8s"));
    let w = warnings(
        &data,
        &[
            "mirror.example/k8s/kube-scheduler:v1.31.4",
            "mirror.example/k8s/coredns:v1.11.3",
            "registry.k8s.io/pause:3.10",
        ],
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("imageRepository mirror.example/k8s")
            && w[0].contains("kubeadm expects mirror.example/k8s/pause:3.10"),
        "{w:?}"
    );
}

#[test]
fn a_join_without_cluster_configuration_is_not_checked() {
    let w = warnings(
        &fixture_text("cloud-config-worker-join.yaml"),
        &["k8s.gcr.io/pause:3.10"],
    );
    assert!(w.is_empty(), "{w:?}");
}
