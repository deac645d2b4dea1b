//! The writer's steps, one module each, named as the stages are reported.

pub mod esp;
pub mod partition_table;
pub mod plan;
pub mod write;
