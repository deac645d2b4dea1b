//! Layers: filled in by the ext4 writer work (issue 3).

pub mod descriptor;
pub mod select;
