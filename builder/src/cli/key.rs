//! `ingot key`: minisign key pairs for signing stacks.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use ingot_artifact::sign::SecretKey;

/// Signing keys, in the format of the `minisign` CLI.
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Make a new key pair: an unencrypted secret key (mode 0600) for `ingot build --sign-key`
    /// and `minisign -S -s`, and a public key for `ingot verify --trust-key` and `minisign -V -p`.
    #[command(after_help = super::exit_status::PLAIN)]
    Generate {
        /// Where to write the secret key.
        #[arg(long, short = 's', value_name = "PATH", default_value = "ingot.key")]
        secret: PathBuf,
        /// Where to write the public key.
        #[arg(long, short = 'p', value_name = "PATH", default_value = "ingot.pub")]
        public: PathBuf,
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

pub fn run(cmd: KeyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KeyCommand::Generate {
            secret,
            public,
            force,
        } => {
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
