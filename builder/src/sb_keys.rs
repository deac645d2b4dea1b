//! `ingot key secure-boot`: a Secure Boot key set for tests and labs: PK, KEK and db, each an
//! RSA-2048 key and a self-signed certificate (`openssl req`), an EFI signature list
//! (`cert-to-efi-sig-list`) and an authenticated variable update (`sign-efi-sig-list`: PK signs
//! PK and KEK, KEK signs db), the `.auth` files systemd-boot's `secure-boot-enroll` and the
//! firmware's own menus enroll. The db key and certificate are what `ingot build
//! --secure-boot-key/--secure-boot-cert` signs with. Production keys belong in an HSM; this set
//! is for machines you own and can put back into Setup Mode.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tool::{run, ToolError};

/// The three keys, in enrollment order; each is signed by the one named after it.
pub const KEYS: [(&str, &str); 3] = [("PK", "PK"), ("KEK", "PK"), ("db", "KEK")];

/// Why no key set was made.
#[derive(Debug, thiserror::Error)]
pub enum KeySetError {
    #[error("{} exists (use --force to overwrite)", .0.display())]
    Exists(PathBuf),
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--name {name:?}: {reason}")]
    Name { name: String, reason: String },
    #[error(transparent)]
    Tool(#[from] ToolError),
}

/// X.520's upper bound for a common name; the longest suffix (` KEK`) must fit too.
pub const MAX_NAME: usize = 64 - " KEK".len();

/// Checks a common-name prefix before it reaches `openssl req -subj`, where `/` starts another
/// attribute, `=` and `+` split one, `\` escapes and a control character ends up in every
/// certificate the firmware shows; non-ASCII would be taken as Latin-1 (no `-utf8`).
pub fn check_name(name: &str) -> Result<(), KeySetError> {
    let refuse = |reason: String| {
        Err(KeySetError::Name {
            name: name.to_owned(),
            reason,
        })
    };
    if name.trim().is_empty() {
        return refuse("the name is empty".into());
    }
    if name.trim() != name {
        return refuse("the name starts or ends with white space".into());
    }
    if name.len() > MAX_NAME {
        return refuse(format!(
            "{} bytes, more than the {MAX_NAME} a common name holds beside ` KEK`",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(' '..='~').contains(c) || matches!(c, '/' | '=' | '+' | '\\'))
    {
        return refuse(format!(
            "{c:?} is not allowed (printable ASCII other than / = + \\)"
        ));
    }
    Ok(())
}

/// Makes the key set in `dir` (created), certificates named `NAME PK` ...; `owner` is the
/// signature owner GUID written into the lists. Returns the files written.
pub fn generate(
    dir: &Path,
    name: &str,
    owner: &str,
    force: bool,
) -> Result<Vec<PathBuf>, KeySetError> {
    check_name(name)?;
    fs::create_dir_all(dir).map_err(|source| KeySetError::Io {
        what: "creating",
        path: dir.to_owned(),
        source,
    })?;
    let file = |k: &str, ext: &str| dir.join(format!("{k}.{ext}"));
    let mut written = Vec::new();
    for (k, _) in KEYS {
        for ext in ["key", "crt", "esl", "auth"] {
            let f = file(k, ext);
            if f.exists() && !force {
                return Err(KeySetError::Exists(f));
            }
            written.push(f);
        }
    }
    for (k, signer) in KEYS {
        run(
            "openssl",
            "openssl",
            Command::new("openssl")
                .args([
                    "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
                ])
                .args(["-days", "3650", "-subj"])
                .arg(format!("/CN={name} {k}/"))
                .arg("-keyout")
                .arg(file(k, "key"))
                .arg("-out")
                .arg(file(k, "crt")),
        )?;
        run(
            "cert-to-efi-sig-list",
            "efitools",
            Command::new("cert-to-efi-sig-list")
                .args(["-g", owner])
                .arg(file(k, "crt"))
                .arg(file(k, "esl")),
        )?;
        run(
            "sign-efi-sig-list",
            "efitools",
            Command::new("sign-efi-sig-list")
                .args(["-g", owner, "-c"])
                .arg(file(signer, "crt"))
                .arg("-k")
                .arg(file(signer, "key"))
                .arg(k)
                .arg(file(k, "esl"))
                .arg(file(k, "auth")),
        )?;
    }
    let guid = dir.join("owner.guid");
    fs::write(&guid, format!("{owner}\n")).map_err(|source| KeySetError::Io {
        what: "writing",
        path: guid.clone(),
        source,
    })?;
    written.push(guid);
    Ok(written)
}
