//! Generated protobuf and gRPC code for Envoy's RLS v3 and RLQS v3 and the xDS rule source (from
//! `proto/`), with proto3 JSON.
//!
//! The modules mirror the protobuf packages because generated code refers to other packages
//! by relative path. Kept in its own module so generated code gets its own lint allowances.
#![allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::allow_attributes_without_reason,
    reason = "generated code: its shape is prost's and tonic's, not ours"
)]

/// Includes the prost and pbjson output of one package.
macro_rules! package {
    ($file:literal) => {
        include!(concat!(env!("OUT_DIR"), "/", $file, ".rs"));
        include!(concat!(env!("OUT_DIR"), "/", $file, ".serde.rs"));
    };
}

pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                package!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            package!("envoy.r#type.v3");
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    package!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                package!("envoy.service.ratelimit.v3");
            }
        }
        pub mod discovery {
            pub mod v3 {
                package!("envoy.service.discovery.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                package!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
}

pub mod google {
    pub mod rpc {
        package!("google.rpc");
    }
}

pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                package!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

pub use envoy::config::core::v3 as core;
pub use envoy::extensions::common::ratelimit::v3 as common;
pub use envoy::service::discovery::v3 as discovery;
pub use envoy::service::rate_limit_quota::v3 as rlqs;
pub use envoy::service::ratelimit::v3 as rls;
pub use envoy::r#type::v3 as types;
pub use ratelimit::config::ratelimit::v3 as rls_conf;
