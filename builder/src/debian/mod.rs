//! Layers made from Debian packages: the manifest's `source.debian` ([`spec`]), the
//! content-addressed `.deb` cache ([`cache`]), `stack.lock` ([`lock`]) and the tree itself, made
//! by mmdebstrap and apt ([`tree`]). ingot only declares, pins and caches: mmdebstrap and apt
//! resolve, download, verify the archive's signatures and install.

pub mod cache;
pub mod deb;
pub mod lock;
pub mod spec;
pub mod tree;
