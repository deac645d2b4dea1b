//! The reboot after a successful provisioning run.

use ingot_machine::host::Host;

/// Reboots after `delay` seconds, from a detached shell started through the host seam, so
/// this process can exit and the provisioner can read its result first.
pub fn schedule(host: &dyn Host, delay: u64) -> std::io::Result<()> {
    host.spawn_detached("sh", &["-c", &format!("sleep {delay}; sync; reboot")])
}

#[cfg(test)]
mod tests {
    use ingot_machine::host::Fixture;

    #[test]
    fn the_reboot_goes_through_the_host_and_a_failure_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let host = Fixture::new(dir.path());
        super::schedule(&host, 3).unwrap();
        let ran = std::fs::read_to_string(dir.path().join("host/ran")).unwrap();
        assert_eq!(ran, "sh -c sleep 3; sync; reboot\n");
        std::fs::create_dir_all(dir.path().join("host/fail")).unwrap();
        std::fs::write(dir.path().join("host/fail/sh"), "no shell").unwrap();
        let e = super::schedule(&host, 3).unwrap_err();
        assert!(e.to_string().contains("no shell"), "{e}");
    }
}
