//! The `outbox.v1` wire contract: messages and gRPC services generated from `proto/outbox/v1`.
//!
//! Clients in other languages generate their code from the same `.proto` files.
#![forbid(unsafe_code)]

/// `package outbox.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("outbox.v1");
}

/// The encoded `FileDescriptorSet` of `outbox.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/outbox_v1_descriptor.bin"));
