//! The exit statuses each command documents in its `--help` (and docs/cli.md, generated from it).
//! A command-line usage error exits 2 everywhere (clap's own).

pub const PLAIN: &str = "Exit status: 0 done; 1 error (named on stderr); 2 usage error.";

pub const VERIFY: &str = "Exit status: 0 verified; 1 I/O error or malformed input; 2 usage \
error; 3 signature missing, failing or by another key; 4 digest or size mismatch (or the \
manifest disagrees with the descriptor); 5 layer content or verity tree mismatch.";

pub const INSPECT: &str = "Exit status: 0 shown; 1 I/O error or malformed input; 2 usage \
error; 3 signature; 4 digest or size mismatch; 5 layer content or verity mismatch.";

pub const REGISTRY: &str = "Exit status: 0 done; 1 I/O, protocol or layout error; 2 usage \
error or a bad reference; 4 digest or size mismatch; 6 the registry refused the credentials; 7 \
not found; 8 still failing after the retries (connection, timeout, 5xx, too slow); 9 conflict \
(the tag moved).";

pub const DIFF: &str = "Exit status: 0 the stacks are the same; 1 they differ; 2 or more an \
error (2 usage, 3 signature, 4 digest or size, 5 verity, as `ingot verify`).";

pub const VERITY_VERIFY: &str = "Exit status: 0 intact; 1 any other error; 2 a data or hash \
block does not match (the first bad block is named), as veritysetup.";

pub const VM: &str = "Exit status: 0 the node powered off; 1 an error before the boot, or the \
writer failed (named on stderr; nothing is booted); 2 usage error; 3 the node's boot failed (its \
console showed the boot contract's INGOT-BOOT-FAILED line, the TPM refusing the node's sealed \
secrets (INGOT-SECRETS-SEALED) or a kernel panic, repeated on stderr); 4 QEMU ended with an error. `ingot vm ssh`: ssh's.";
