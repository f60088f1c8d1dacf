//! Clients this project did not write (issue 30): Python grpcio (gRPC C-core) and Node
//! @grpc/grpc-js call ShouldRateLimit and health over TCP and over the unix socket, with the
//! `:authority` each sends by default and with the ones Envoy and Istio send: an Istio
//! cluster name (with `|`), a raw socket path (grpc-java's way) and a percent-encoded one
//! (C-core's way). `make clients` (run by `.ci/run`) installs both clients; the scripts are
//! in `tests/clients/`.

mod common;

use std::path::{Path, PathBuf};

use common::TestServer;

const CONFIG: &str = "domain: clients\ndescriptors:\n  - key: caller\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// The authorities tried besides each client's default.
const AUTHORITIES: [&str; 3] = [
    "outbound|8081||ratelimit.default.svc.cluster.local",
    "/var/run/rl.sock",
    "tmp%2Frl.sock",
];

/// A client: how to run its script.
struct Client {
    name: &'static str,
    program: PathBuf,
    script: PathBuf,
}

fn clients() -> [Client; 2] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/clients/python/bin/python");
    let grpc_js = root.join("tests/clients/node_modules/@grpc/grpc-js");
    for (what, path) in [("Python grpcio", &python), ("Node grpc-js", &grpc_js)] {
        assert!(
            path.exists(),
            "{what} is not installed ({}): run `make clients`",
            path.display()
        );
    }
    [
        Client {
            name: "python-grpcio",
            program: python,
            script: root.join("tests/clients/rls_check.py"),
        },
        Client {
            name: "node-grpc-js",
            program: PathBuf::from("node"),
            script: root.join("tests/clients/rls_check.js"),
        },
    ]
}

/// Runs every client against `target` with each authority, each call with its own caller so
/// that it sees a fresh bucket, and asserts each was answered OK (remaining 999 of 1,000)
/// and health SERVING.
async fn every_client_is_answered(target: &str) {
    let mut runs = Vec::new();
    for client in clients() {
        for authority in std::iter::once(None).chain(AUTHORITIES.map(Some)) {
            let caller = format!("{}-{}", client.name, runs.len());
            let mut command = std::process::Command::new(&client.program);
            command
                .arg(&client.script)
                .args([target, "clients", "caller", &caller]);
            command.args(authority);
            let output = tokio::task::spawn_blocking(move || command.output())
                .await
                .expect("client task")
                .expect("client runs");
            let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            let answer: Option<serde_json::Value> = serde_json::from_str(&stdout).ok();
            let expected = serde_json::json!({"code": 1, "remaining": 999, "health": 1});
            assert!(
                output.status.success() && answer.as_ref() == Some(&expected),
                "{} on {target} with authority {authority:?}: {stdout} {stderr}",
                client.name
            );
            runs.push((client.name, authority));
        }
    }
    assert_eq!(runs.len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_node_clients_are_answered_over_tcp() {
    let server = TestServer::start(&[("clients.yaml", CONFIG)]).await;
    every_client_is_answered(&server.grpc.to_string()).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_node_clients_are_answered_over_the_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rl.sock");
    let grpc_addr = format!("unix:{}", socket.display());
    let target = grpc_addr.clone();
    let server = TestServer::start_with(&[("clients.yaml", CONFIG)], move |settings| {
        settings.grpc_addr = grpc_addr;
    })
    .await;
    every_client_is_answered(&target).await;
    server.stop().await;
}
