//! kubelet serving certificates under cluster-api-provider-hetzner.
//!
//! CAPH's CSR controller approves a kubelet's serving-certificate request only when kubelet asks
//! for one (`rotate-server-certificates`, or `serverTLSBootstrap: true` in a
//! KubeletConfiguration) and brings no certificate of its own (`tls-cert-file`,
//! `tls-private-key-file`). Otherwise `kubectl logs`/`exec` and metrics-server fail on the node
//! later, far from the cause, so staging names the setting up front.

use serde_norway::Value;

use crate::Bootstrap;

/// One warning per setting that keeps the kubelet's serving certificate from CAPH's approval,
/// read from the kubeadm configuration files among the bootstrap data's files
/// (`InitConfiguration`/`JoinConfiguration` `nodeRegistration.kubeletExtraArgs`, map or
/// kubeadm v1beta4's name/value list, and `KubeletConfiguration`). Nothing when the data runs no
/// kubeadm.
pub fn serving_cert_warnings(b: &Bootstrap) -> Vec<String> {
    if b.kubeadm.is_none() {
        return Vec::new();
    }
    let mut rotate = false;
    let mut found = Vec::new();
    for file in &b.files {
        let Ok(text) = std::str::from_utf8(&file.content) else {
            continue;
        };
        if !text.contains("kind:") {
            continue;
        }
        let path = file.path.display();
        // Too deep for serde_norway, and slow to find out: skipped like any unreadable file.
        if crate::parse::yaml_scan(text).too_deep.is_some() {
            continue;
        }
        for doc in serde_norway::Deserializer::from_str(text) {
            let Ok(doc) = <Value as serde::Deserialize>::deserialize(doc) else {
                break;
            };
            match doc.get("kind").and_then(Value::as_str) {
                Some("InitConfiguration" | "JoinConfiguration") => {
                    for (name, value) in extra_args(&doc) {
                        match name.as_str() {
                            "rotate-server-certificates" => rotate |= value == "true",
                            "tls-cert-file" | "tls-private-key-file" => found.push(format!(
                                "{path}: nodeRegistration.kubeletExtraArgs sets {name}"
                            )),
                            _ => {}
                        }
                    }
                }
                Some("KubeletConfiguration") => {
                    rotate |= doc.get("serverTLSBootstrap").and_then(Value::as_bool) == Some(true);
                    for key in ["tlsCertFile", "tlsPrivateKeyFile"] {
                        if doc.get(key).is_some_and(|v| !v.is_null()) {
                            found.push(format!("{path}: KubeletConfiguration sets {key}"));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut out: Vec<String> = found
        .into_iter()
        .map(|f| {
            format!(
                "kubelet serving certificate: {f}; CAPH's CSR controller approves serving \
                 certificates only for kubelets without their own (drop the setting)"
            )
        })
        .collect();
    if !rotate {
        out.push(
            "kubelet serving certificate: the kubeadm configuration does not set \
             rotate-server-certificates: \"true\" in nodeRegistration.kubeletExtraArgs (or \
             serverTLSBootstrap: true): kubelet then serves a self-signed certificate and \
             kubectl logs/exec and metrics-server cannot verify it"
                .to_string(),
        );
    }
    out
}

/// `nodeRegistration.kubeletExtraArgs` as (name, value): kubeadm v1beta3's map or v1beta4's list
/// of `{name, value}`.
fn extra_args(doc: &Value) -> Vec<(String, String)> {
    let scalar = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    };
    match doc
        .get("nodeRegistration")
        .and_then(|n| n.get("kubeletExtraArgs"))
    {
        Some(Value::Mapping(m)) => m
            .iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), scalar(v))))
            .collect(),
        Some(Value::Sequence(s)) => s
            .iter()
            .filter_map(|e| {
                Some((
                    e.get("name")?.as_str()?.to_string(),
                    e.get("value").map(scalar).unwrap_or_default(),
                ))
            })
            .collect(),
        _ => Vec::new(),
    }
}
