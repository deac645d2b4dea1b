//! The bootstrap data `ingot vm` gives the writer, as CAPH gives a server its node's: the data
//! given (`--bootstrap`), or a minimal cloud-config with the hostname; with `--ssh-key`, the key
//! authorized for root in either, so a VM of any data can be logged into.

/// The data cannot take the key.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "--ssh-key with --bootstrap needs cloud-config data (its first line `#cloud-config`, \
         after an optional `## template: jinja`); for Ignition, put the key in \
         passwd.users[].sshAuthorizedKeys"
    )]
    NotCloudConfig,
    #[error(
        "--ssh-key with --bootstrap: the data already has a top-level ssh_authorized_keys; \
         add the key there instead"
    )]
    HasKeys,
    #[error("the SSH public key is not one line of `TYPE BASE64 [COMMENT]`: {0:?}")]
    Key(String),
}

/// The data to write: `given` (or a minimal cloud-config naming `hostname`), with `key` (an SSH
/// public key's line) authorized for root when given.
pub fn data(
    hostname: &str,
    given: Option<Vec<u8>>,
    key: Option<&str>,
) -> Result<Vec<u8>, BootstrapError> {
    let key = key.map(checked_key).transpose()?;
    match (given, key) {
        (None, None) => Ok(format!("#cloud-config\nhostname: {hostname}\n").into_bytes()),
        (None, Some(key)) => Ok(format!(
            "#cloud-config\nhostname: {hostname}\nusers:\n  - name: root\n    ssh_authorized_keys:\n      - {key}\n"
        )
        .into_bytes()),
        (Some(data), None) => Ok(data),
        (Some(data), Some(key)) => with_key(data, key),
    }
}

fn checked_key(key: &str) -> Result<&str, BootstrapError> {
    let key = key.trim();
    let fields: Vec<&str> = key.split_whitespace().collect();
    if key.contains('\n') || fields.len() < 2 || !fields[0].contains('-') {
        return Err(BootstrapError::Key(key.chars().take(60).collect()));
    }
    Ok(key)
}

/// Cloud-config `data` with a top-level `ssh_authorized_keys` (installed for root: ingot has no
/// distro default user) added at its end. Appended as text, not re-serialized: a jinja
/// template's header and expressions stay exactly as given.
fn with_key(mut data: Vec<u8>, key: &str) -> Result<Vec<u8>, BootstrapError> {
    let text = std::str::from_utf8(&data).map_err(|_| BootstrapError::NotCloudConfig)?;
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim_start().starts_with("## template:"));
    if lines.next().map(str::trim_end) != Some("#cloud-config") {
        return Err(BootstrapError::NotCloudConfig);
    }
    if text
        .lines()
        .any(|l| l.starts_with("ssh_authorized_keys:") || l.starts_with("\"ssh_authorized_keys\""))
    {
        return Err(BootstrapError::HasKeys);
    }
    if !data.ends_with(b"\n") {
        data.push(b'\n');
    }
    data.extend_from_slice(format!("ssh_authorized_keys:\n  - {key}\n").as_bytes());
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG me@host\n";

    #[test]
    fn generated_data_names_the_host_and_authorizes_the_key() {
        let d = String::from_utf8(data("n1", None, Some(KEY)).unwrap()).unwrap();
        assert!(d.starts_with("#cloud-config\nhostname: n1\n"), "{d}");
        assert!(d.contains("      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG me@host\n"));
        assert_eq!(
            data("n1", None, None).unwrap(),
            b"#cloud-config\nhostname: n1\n"
        );
    }

    #[test]
    fn the_key_is_appended_to_given_cloud_config_leaving_the_rest_as_it_was() {
        let given = "## template: jinja\n#cloud-config\nwrite_files:\n-   path: /x\n    content: |\n      {{ ds.meta_data.hostname }}";
        let d = data("n1", Some(given.into()), Some(KEY)).unwrap();
        let d = String::from_utf8(d).unwrap();
        assert_eq!(
            d,
            format!("{given}\nssh_authorized_keys:\n  - {}\n", KEY.trim())
        );
        // The result is still YAML with the key at the top level.
        let v: serde_norway::Value = serde_norway::from_str(&d).unwrap();
        assert_eq!(v["ssh_authorized_keys"][0].as_str(), Some(KEY.trim()));
        assert_eq!(v["write_files"][0]["path"].as_str(), Some("/x"));
    }

    #[test]
    fn what_cannot_take_the_key_is_refused() {
        let ignition = br#"{"ignition":{"version":"3.2.0"}}"#.to_vec();
        assert!(matches!(
            data("n", Some(ignition), Some(KEY)),
            Err(BootstrapError::NotCloudConfig)
        ));
        let keyed = b"#cloud-config\nssh_authorized_keys:\n  - ssh-rsa AAAA x\n".to_vec();
        assert!(matches!(
            data("n", Some(keyed), Some(KEY)),
            Err(BootstrapError::HasKeys)
        ));
        for bad in ["", "AAAA", "ssh-ed25519 A\nssh-rsa B"] {
            assert!(
                matches!(data("n", None, Some(bad)), Err(BootstrapError::Key(_))),
                "{bad:?}"
            );
        }
    }
}
