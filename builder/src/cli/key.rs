//! `ingot key`: minisign key pairs for signing stacks, cosign key pairs for signing their
//! manifests, PCR policy keys for the UKI's signed PCR 11 policy, Secure Boot key sets.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use ingot_artifact::sign::SecretKey;

/// Signing keys, in the format of the `minisign` CLI (or cosign's, with --cosign).
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Make a new key pair: an unencrypted secret key (mode 0600) for `ingot build --sign-key`
    /// and `minisign -S -s`, and a public key for `ingot verify --trust-key` and `minisign -V -p`.
    ///
    /// With --cosign, a cosign key pair as `cosign generate-key-pair` writes it: `cosign.key`
    /// (ECDSA P-256, encrypted with the password in COSIGN_PASSWORD or --password-file; empty
    /// is allowed, as cosign allows it) for `ingot publish --cosign-key`, cosign and skopeo's
    /// `--sign-by-sigstore-private-key`, and `cosign.pub` for `--trust-key`, `cosign verify
    /// --key` and a `policy.json` `sigstoreSigned` requirement.
    ///
    /// With --pcr, a PCR policy key pair: `pcr.key` (RSA-2048, PKCS#8 PEM, unencrypted, mode
    /// 0600) for `ingot build --pcr-key`, and `pcr.pub` (its public half, PEM, what the UKI's
    /// `.pcrpkey` section carries and `systemd-creds --tpm2-public-key` takes).
    #[command(after_help = super::exit_status::PLAIN)]
    Generate {
        /// Where to write the secret key [default: ingot.key, with --cosign cosign.key, with
        /// --pcr pcr.key].
        #[arg(long, short = 's', value_name = "PATH")]
        secret: Option<PathBuf>,
        /// Where to write the public key [default: ingot.pub, with --cosign cosign.pub, with
        /// --pcr pcr.pub].
        #[arg(long, short = 'p', value_name = "PATH")]
        public: Option<PathBuf>,
        /// Make a cosign key pair instead of a minisign one.
        #[arg(long, conflicts_with = "pcr")]
        cosign: bool,
        /// Make a PCR policy key pair (RSA) instead of a minisign one.
        #[arg(long)]
        pcr: bool,
        /// With --cosign: read the private key's password from this file (its first line),
        /// instead of COSIGN_PASSWORD.
        #[arg(long, value_name = "FILE", requires = "cosign")]
        password_file: Option<PathBuf>,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Make a Secure Boot key set for tests and labs in DIR: PK, KEK and db, each as `.key`
    /// (RSA, PEM, unencrypted), `.crt` (self-signed), `.esl` (EFI signature list) and `.auth`
    /// (signed update: PK by PK, KEK by PK, db by KEK), plus `owner.guid`. `ingot build
    /// --secure-boot-key DIR/db.key --secure-boot-cert DIR/db.crt` signs with it; a machine in
    /// Setup Mode enrolls the `.auth` files (docs/boot-contract.md, "Secure Boot"). Needs openssl
    /// and efitools.
    #[command(after_help = super::exit_status::PLAIN)]
    SecureBoot {
        /// The directory to write.
        #[arg(long, short = 'o', value_name = "DIR")]
        out: PathBuf,
        /// The certificates' common name prefix (`NAME PK`, `NAME KEK`, `NAME db`): printable
        /// ASCII without `/`, `=`, `+` or `\`, at most 60 bytes.
        #[arg(long, default_value = "ingot")]
        name: String,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
}

fn write_new(path: &Path, text: &str, mode: u32, force: bool) -> anyhow::Result<()> {
    let mut opts = OpenOptions::new();
    opts.write(true).mode(mode);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {} (use --force to overwrite)", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// The password of a cosign private key: the first line of `file` (without its line end), else
/// `COSIGN_PASSWORD` (as cosign and skopeo read them).
pub fn cosign_password(file: Option<&Path>, flag: &str) -> anyhow::Result<Vec<u8>> {
    if let Some(file) = file {
        let text = std::fs::read(file)
            .with_context(|| format!("reading the password file {}", file.display()))?;
        let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
        return Ok(line.strip_suffix(b"\r").unwrap_or(line).to_vec());
    }
    match std::env::var_os("COSIGN_PASSWORD") {
        Some(p) => Ok(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec()),
        None => anyhow::bail!(
            "the cosign key's password: set COSIGN_PASSWORD (empty is allowed) or give {flag} FILE"
        ),
    }
}

fn generate_cosign(
    secret: &Path,
    public: &Path,
    password_file: Option<&Path>,
    force: bool,
) -> anyhow::Result<ExitCode> {
    let password = cosign_password(password_file, "--password-file")?;
    let sk = ingot_artifact::cosign::SigningKey::generate();
    let pk = sk.public_key();
    write_new(secret, &sk.to_encrypted_pem(&password), 0o600, force)?;
    write_new(public, &pk.to_pem(), 0o644, force)?;
    println!("key id     {}", pk.key_id());
    println!("secret key {}", secret.display());
    println!("public key {}", public.display());
    Ok(ExitCode::SUCCESS)
}

pub fn run(cmd: KeyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KeyCommand::Generate {
            secret,
            public,
            cosign: true,
            password_file,
            force,
            ..
        } => generate_cosign(
            &secret.unwrap_or_else(|| "cosign.key".into()),
            &public.unwrap_or_else(|| "cosign.pub".into()),
            password_file.as_deref(),
            force,
        ),
        KeyCommand::Generate {
            secret,
            public,
            pcr: true,
            force,
            ..
        } => {
            let secret = secret.unwrap_or_else(|| "pcr.key".into());
            let public = public.unwrap_or_else(|| "pcr.pub".into());
            let (key, pem) = ingot_artifact::pcr_policy::PcrKey::generate()?;
            write_new(&secret, &pem, 0o600, force)?;
            write_new(&public, key.public_pem(), 0o644, force)?;
            println!("key id     {}", key.fingerprint_hex());
            println!("secret key {}", secret.display());
            println!("public key {}", public.display());
            Ok(ExitCode::SUCCESS)
        }
        KeyCommand::Generate {
            secret,
            public,
            force,
            ..
        } => {
            let secret = secret.unwrap_or_else(|| "ingot.key".into());
            let public = public.unwrap_or_else(|| "ingot.pub".into());
            let sk = SecretKey::generate();
            write_new(&secret, &sk.to_minisign(), 0o600, force)?;
            write_new(&public, &sk.public_key().to_minisign(), 0o644, force)?;
            println!("key id     {}", sk.key_id());
            println!("secret key {}", secret.display());
            println!("public key {}", public.display());
            Ok(ExitCode::SUCCESS)
        }
        KeyCommand::SecureBoot { out, name, force } => {
            let owner = uuid::Uuid::new_v4().to_string();
            let files = crate::sb_keys::generate(&out, &name, &owner, force)
                .with_context(|| format!("making a Secure Boot key set in {}", out.display()))?;
            for f in files {
                println!("{}", f.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
