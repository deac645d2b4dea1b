//! The `tpm` setting (`require`, `prefer`, `off`) and what it decides on this machine with this
//! stack: seal the node's secrets to the TPM under the release's signed PCR 11 policy, write them
//! in the clear and say why, or refuse the run in `gate`.
//!
//! | setting | TPM 2.0 and a signed PCR policy | no TPM 2.0 | no PCR policy (or no signed UKI here) |
//! |---|---|---|---|
//! | `require` | sealed | `tpm-missing` | `pcr-policy-missing` |
//! | `prefer` | sealed | in the clear (`no-tpm`) | in the clear (`no-pcr-policy`, `no-signed-uki`) |
//! | `off` | in the clear (`setting-off`) | in the clear | in the clear |

use ingot_machine::{Facts, GateFailure};
use serde::{Deserialize, Serialize};

/// What the run does with the node's secrets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TpmSetting {
    /// Seal, or refuse the run in `gate`.
    Require,
    /// Seal where the machine and the stack allow it, else write in the clear and say so.
    #[default]
    Prefer,
    /// Never seal; the secrets lie in the clear (and the status file says so).
    Off,
}

impl TpmSetting {
    /// The setting's name, as the settings file and `--tpm` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            TpmSetting::Require => "require",
            TpmSetting::Prefer => "prefer",
            TpmSetting::Off => "off",
        }
    }

    /// `--tpm`, else the settings' `tpm`, else `prefer`.
    pub fn effective(flag: Option<TpmSetting>, file: Option<TpmSetting>) -> TpmSetting {
        flag.or(file).unwrap_or_default()
    }

    /// What a gate failure names as the cause.
    fn named(self) -> String {
        format!("the setting tpm = {}", self.as_str())
    }
}

/// Why the secrets are written in the clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clear {
    /// `tpm = off`.
    SettingOff,
    /// The machine shows no TPM 2.0 (the major version it shows, if any).
    NoTpm(Option<u8>),
    /// The machine is a fixture (`--sysroot`) whose TPM 2.0 no device reaches
    /// (`INGOT_TPM2_DEVICE` unset): sealing with the TPM of the computer the writer runs on
    /// would bind the secrets to the wrong machine.
    TpmUnreachable,
    /// The machine does not boot the release's signed UKI (the stack has none, or the machine
    /// boots with BIOS): nothing measures the boot chain the policy would sign.
    NoSignedUki,
    /// The stack's UKI carries no `.pcrpkey` and `.pcrsig`.
    NoPcrPolicy,
}

impl Clear {
    /// The stable name in the status file's `details.secrets.reason`.
    pub fn name(self) -> &'static str {
        match self {
            Clear::SettingOff => "setting-off",
            Clear::NoTpm(_) => "no-tpm",
            Clear::TpmUnreachable => "tpm-unreachable",
            Clear::NoSignedUki => "no-signed-uki",
            Clear::NoPcrPolicy => "no-pcr-policy",
        }
    }

    /// Why, for a human.
    pub fn why(self) -> String {
        match self {
            Clear::SettingOff => "the setting tpm = off".into(),
            Clear::NoTpm(None) => "this machine has no TPM".into(),
            Clear::NoTpm(Some(v)) => format!("this machine's TPM is a {v}.x, not 2.0"),
            Clear::TpmUnreachable => {
                "this fixture machine's TPM is not reachable from the writer (INGOT_TPM2_DEVICE \
                 is unset)"
                    .into()
            }
            Clear::NoSignedUki => {
                "this machine does not boot a signed UKI of the stack (none in the stack, or BIOS \
                 firmware)"
                    .into()
            }
            Clear::NoPcrPolicy => {
                "the stack's UKI carries no signed PCR policy (.pcrpkey, .pcrsig)".into()
            }
        }
    }
}

/// What the run does with the secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Seal them under this PCR public key (the UKI's `.pcrpkey`, PEM). The node opens them
    /// with the `.pcrsig` of the UKI it booted.
    Seal { public_key: Vec<u8> },
    /// Write them in the clear, for this reason.
    Clear(Clear),
}

/// The machine half of the decision, in `gate` before any disk is read: `require` needs a TPM
/// 2.0 the writer reaches (`reachable`: the machine's own, or a device named for a fixture).
pub fn gate_machine(
    setting: TpmSetting,
    facts: &Facts,
    reachable: bool,
) -> Result<(), GateFailure> {
    if setting == TpmSetting::Require {
        ingot_machine::gate_tpm(facts, &setting.named())?;
        if !reachable {
            return Err(ingot_machine::tpm_unreachable(
                &setting.named(),
                &Clear::TpmUnreachable.why(),
            ));
        }
    }
    Ok(())
}

/// What the stack offers this machine to seal under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// No signed UKI boots here (the stack has none, or the machine boots with BIOS).
    NoSignedUki,
    /// The signed UKI carries no `.pcrpkey` with a `.pcrsig`.
    None,
    /// The UKI's `.pcrpkey` (PEM), beside a `.pcrsig`.
    Key { public_key: Vec<u8> },
}

impl Policy {
    /// The policy of the release's signed UKI this machine boots (None: none, or BIOS).
    pub fn of(uki: Option<&[u8]>) -> Policy {
        let Some(uki) = uki else {
            return Policy::NoSignedUki;
        };
        // A key without signatures opens nothing.
        let key = ingot_artifact::uki::section(uki, ".pcrpkey");
        let sig = ingot_artifact::uki::section(uki, ".pcrsig");
        match (key, sig) {
            (Ok(key), Ok(sig)) if !key.is_empty() && !sig.is_empty() => Policy::Key {
                public_key: key.to_vec(),
            },
            _ => Policy::None,
        }
    }
}

/// The whole decision, once the stack is verified: `tpm` is the machine's TPM major version,
/// `reachable` whether the writer can seal with it ([`gate_machine`]).
pub fn decide(
    setting: TpmSetting,
    tpm: Option<u8>,
    reachable: bool,
    policy: Policy,
) -> Result<Decision, GateFailure> {
    let clear = |why: Clear| -> Result<Decision, GateFailure> {
        match setting {
            TpmSetting::Require => Err(match why {
                // Normally stopped earlier by [`gate_machine`]; the same failure here.
                Clear::NoTpm(found) => ingot_machine::tpm_missing(found, &setting.named()),
                Clear::TpmUnreachable => {
                    ingot_machine::tpm_unreachable(&setting.named(), &why.why())
                }
                _ => ingot_machine::pcr_policy_missing(&setting.named(), &why.why()),
            }),
            _ => Ok(Decision::Clear(why)),
        }
    };
    if setting == TpmSetting::Off {
        return Ok(Decision::Clear(Clear::SettingOff));
    }
    if tpm != Some(2) {
        return clear(Clear::NoTpm(tpm));
    }
    if !reachable {
        return clear(Clear::TpmUnreachable);
    }
    match policy {
        Policy::Key { public_key } => Ok(Decision::Seal { public_key }),
        Policy::None => clear(Clear::NoPcrPolicy),
        Policy::NoSignedUki => clear(Clear::NoSignedUki),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_machine::Reason;

    /// A machine's facts that matter here: its TPM.
    fn no_tpm_facts(tpm: Option<u8>) -> Facts {
        Facts {
            uefi: true,
            pci: vec![],
            nvidia_gpu: false,
            cpu_virt_flags: false,
            kvm_device: false,
            virtualization: false,
            tpm,
            disks: vec![],
        }
    }

    #[test]
    fn the_flag_wins_over_the_file_over_prefer() {
        use TpmSetting::*;
        assert_eq!(TpmSetting::effective(None, None), Prefer);
        assert_eq!(TpmSetting::effective(None, Some(Off)), Off);
        assert_eq!(TpmSetting::effective(Some(Require), Some(Off)), Require);
        assert_eq!(TpmSetting::effective(Some(Prefer), None), Prefer);
    }

    #[test]
    fn the_setting_parses_from_toml_in_kebab_case() {
        #[derive(Deserialize)]
        struct S {
            tpm: TpmSetting,
        }
        for (text, want) in [
            ("require", TpmSetting::Require),
            ("prefer", TpmSetting::Prefer),
            ("off", TpmSetting::Off),
        ] {
            let s: S = toml::from_str(&format!("tpm = \"{text}\"")).unwrap();
            assert_eq!(s.tpm, want);
            assert_eq!(want.as_str(), text);
        }
        assert!(toml::from_str::<S>("tpm = \"always\"").is_err());
    }

    #[test]
    fn the_decision_table() {
        use TpmSetting::*;
        let key = || Policy::Key {
            public_key: b"PEM".to_vec(),
        };
        let seal = Decision::Seal {
            public_key: b"PEM".to_vec(),
        };
        let gate = |r: Result<Decision, GateFailure>| r.unwrap_err().reason;
        // TPM 2.0 × policy × setting.
        assert_eq!(decide(Require, Some(2), true, key()).unwrap(), seal);
        assert_eq!(decide(Prefer, Some(2), true, key()).unwrap(), seal);
        assert_eq!(
            decide(Off, Some(2), true, key()).unwrap(),
            Decision::Clear(Clear::SettingOff)
        );
        for (policy, why) in [
            (Policy::None, Clear::NoPcrPolicy),
            (Policy::NoSignedUki, Clear::NoSignedUki),
        ] {
            assert_eq!(
                gate(decide(Require, Some(2), true, policy.clone())),
                Reason::PcrPolicyMissing
            );
            assert_eq!(
                decide(Prefer, Some(2), true, policy.clone()).unwrap(),
                Decision::Clear(why)
            );
            assert_eq!(
                decide(Off, Some(2), true, policy).unwrap(),
                Decision::Clear(Clear::SettingOff)
            );
        }
        // No TPM 2.0, with and without a policy.
        for tpm in [None, Some(1)] {
            for policy in [key(), Policy::None, Policy::NoSignedUki] {
                assert_eq!(
                    gate(decide(Require, tpm, true, policy.clone())),
                    Reason::TpmMissing
                );
                assert_eq!(
                    decide(Prefer, tpm, true, policy.clone()).unwrap(),
                    Decision::Clear(Clear::NoTpm(tpm))
                );
                assert_eq!(
                    decide(Off, tpm, true, policy).unwrap(),
                    Decision::Clear(Clear::SettingOff)
                );
            }
        }
    }

    #[test]
    fn a_fixture_tpm_no_device_reaches_is_not_sealed_with() {
        use TpmSetting::*;
        let key = Policy::Key {
            public_key: b"PEM".to_vec(),
        };
        assert_eq!(
            decide(Prefer, Some(2), false, key.clone()).unwrap(),
            Decision::Clear(Clear::TpmUnreachable)
        );
        let err = decide(Require, Some(2), false, key).unwrap_err();
        assert_eq!(err.reason, Reason::TpmMissing);
        assert!(err.message.contains("INGOT_TPM2_DEVICE"), "{err}");
        let mut facts = no_tpm_facts(Some(2));
        assert!(gate_machine(Require, &facts, true).is_ok());
        assert_eq!(
            gate_machine(Require, &facts, false).unwrap_err().reason,
            Reason::TpmMissing
        );
        facts.tpm = None;
        assert!(gate_machine(Prefer, &facts, false).is_ok());
    }

    #[test]
    fn garbage_is_no_policy_and_no_uki_is_named() {
        assert_eq!(Policy::of(None), Policy::NoSignedUki);
        assert_eq!(Policy::of(Some(b"MZ not a PE")), Policy::None);
    }

    #[test]
    fn gate_failures_name_the_tpm_and_the_setting() {
        let err = decide(TpmSetting::Require, None, true, Policy::None).unwrap_err();
        assert!(err.message.contains("tpm = require"), "{err}");
        assert!(err.message.contains("TPM 2.0"), "{err}");
        let err = decide(TpmSetting::Require, Some(2), true, Policy::NoSignedUki).unwrap_err();
        assert!(err.message.contains("tpm = require"), "{err}");
        assert!(err.message.contains("signed UKI"), "{err}");
        let facts = no_tpm_facts(None);
        assert!(gate_machine(TpmSetting::Prefer, &facts, true).is_ok());
        assert!(gate_machine(TpmSetting::Off, &facts, true).is_ok());
        assert_eq!(
            gate_machine(TpmSetting::Require, &facts, true)
                .unwrap_err()
                .reason,
            Reason::TpmMissing
        );
    }
}
