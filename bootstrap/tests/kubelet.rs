//! The kubelet serving-certificate warnings CAPH's CSR approval needs (`rotate-server-certificates`
//! set, `tls-cert-file`/`tls-private-key-file` not), on CABPK-shaped data.

mod common;

use common::*;
use ingot_bootstrap::{parse, serving_cert_warnings, stage};

/// The worker-join fixture with its kubeletExtraArgs block replaced by `args` (indented as in
/// the file) and `extra_doc` appended to the kubeadm config as a further YAML document.
fn worker(args: &str, extra_doc: &str) -> Vec<String> {
    let text = fixture_text("cloud-config-worker-join.yaml");
    let old = "        kubeletExtraArgs:\n          cloud-provider: external\n";
    assert!(text.contains(old));
    let mut new = format!("        kubeletExtraArgs:\n{args}");
    new.push_str("        name: '{{ ds.meta_data.hostname }}'\n");
    new.push_str(extra_doc);
    let text = text.replace(
        &format!("{old}        name: '{{{{ ds.meta_data.hostname }}}}'\n"),
        &new,
    );
    let b = parse(text.as_bytes()).unwrap();
    serving_cert_warnings(&b)
}

#[test]
fn missing_rotation_is_named_and_reaches_the_staged_warnings() {
    let w = worker("          cloud-provider: external\n", "");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("rotate-server-certificates"), "{w:?}");
    // stage() carries it, so the writer reports it in output.json and on stdout.
    let b = parse(&fixture("cloud-config-worker-join.yaml")).unwrap();
    let s = stage(&input(b, false), &mut rng(3)).unwrap();
    assert!(
        s.warnings
            .iter()
            .any(|x| x.contains("rotate-server-certificates")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn rotation_asked_for_gives_no_warning() {
    let w = worker(
        "          cloud-provider: external\n          rotate-server-certificates: \"true\"\n",
        "",
    );
    assert!(w.is_empty(), "{w:?}");
    // kubeadm v1beta4 spells extra args as a name/value list.
    let w = worker(
        "        - name: rotate-server-certificates\n          value: \"true\"\n",
        "",
    );
    assert!(w.is_empty(), "{w:?}");
    // A KubeletConfiguration document asks for it as serverTLSBootstrap.
    let w = worker(
        "          cloud-provider: external\n",
        "      ---\n      apiVersion: kubelet.config.k8s.io/v1beta1\n      kind: KubeletConfiguration\n      serverTLSBootstrap: true\n",
    );
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn own_serving_certificate_is_named() {
    let w = worker(
        "          rotate-server-certificates: \"true\"\n          tls-cert-file: /etc/kubernetes/pki/kubelet.crt\n          tls-private-key-file: /etc/kubernetes/pki/kubelet.key\n",
        "",
    );
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("sets tls-cert-file"), "{w:?}");
    assert!(w[1].contains("sets tls-private-key-file"), "{w:?}");
    assert!(
        w[0].contains("/run/kubeadm/kubeadm-join-config.yaml"),
        "{w:?}"
    );
    let w = worker(
        "          cloud-provider: external\n",
        "      ---\n      apiVersion: kubelet.config.k8s.io/v1beta1\n      kind: KubeletConfiguration\n      serverTLSBootstrap: true\n      tlsCertFile: /var/lib/kubelet/pki/kubelet.crt\n",
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("KubeletConfiguration sets tlsCertFile"),
        "{w:?}"
    );
}

#[test]
fn ignition_data_is_read_too() {
    let b = parse(&fixture("ignition-v2-worker-join.json")).unwrap();
    let w = serving_cert_warnings(&b);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("rotate-server-certificates"), "{w:?}");
}
