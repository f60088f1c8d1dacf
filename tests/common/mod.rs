//! Shared fixtures for the integration tests.

#![allow(dead_code)]

pub mod redis;
