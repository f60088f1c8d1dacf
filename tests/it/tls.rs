//! TLS: the gRPC listener with TLS and mTLS (a required client SAN included, on TCP and on
//! a unix socket), certificate rotation without a restart, Redis client certificates against
//! a `redis-server` that requires them, and key material kept out of errors, logs and
//! `/rlconfig`. Every certificate is made here by rcgen.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::pki::{Ca, Pair, Role};
use common::redis::RedisServer;
use common::{TestServer, descriptor, eventually, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::backend::redis::{ClientIdentity, RedisOptions};
use floodgate::backend::{self, BackendSettings};
use floodgate::tls::TlsFiles;
use tempfile::TempDir;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const CONFIG: &str = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

/// A CA, a server pair for `localhost` / `127.0.0.1`, and their files.
struct Pki {
    ca: Ca,
    dir: TempDir,
    cert: PathBuf,
    key: PathBuf,
    ca_file: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let ca = Ca::new("floodgate test CA");
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = ca
            .issue(&["localhost", "127.0.0.1"], Role::Server)
            .write(dir.path(), "server");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        Pki {
            ca,
            dir,
            cert,
            key,
            ca_file,
        }
    }

    fn files(&self, client_ca: Option<&Path>, client_san: Option<&str>) -> TlsFiles {
        TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: client_ca.map(Path::to_path_buf),
            client_san: client_san.map(str::to_owned),
        }
    }
}

async fn start(files: TlsFiles) -> TestServer {
    TestServer::start_with(&[("tls.yaml", CONFIG)], move |settings| {
        settings.grpc_tls = Some(files);
    })
    .await
}

/// An RLS call over TLS trusting `ca_pem`, presenting `identity` if given.
async fn call(server: &TestServer, ca_pem: &str, identity: Option<&Pair>) -> Result<Code, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(&pair.cert_pem, &pair.key_pem));
    }
    let channel = Channel::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client = RateLimitServiceClient::new(channel);
    client
        .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
        .await
        .map(|response| response.into_inner().overall_code())
        .map_err(|status| format!("{status:?}"))
}

#[tokio::test]
async fn tls_calls_succeed_and_plaintext_is_refused() {
    let pki = Pki::new();
    let server = start(pki.files(None, None)).await;
    assert_eq!(call(&server, &pki.ca.pem(), None).await, Ok(Code::Ok));
    // A plaintext client gets no answer from the TLS port.
    let plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await;
    if let Ok(mut plain) = plain {
        let result = plain
            .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
            .await;
        assert!(result.is_err(), "plaintext call answered");
    }
    // The admin port stays plain HTTP.
    let (status, _) = common::http("GET", &server.http_url("/livez"), "").await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test]
async fn mtls_needs_a_client_certificate_from_the_client_ca() {
    let pki = Pki::new();
    let client_ca = Ca::new("client CA");
    let client_ca_file = pki.dir.path().join("client-ca.pem");
    std::fs::write(&client_ca_file, client_ca.pem()).unwrap();
    let server = start(pki.files(Some(&client_ca_file), None)).await;

    let client = client_ca.issue(&["envoy.mesh"], Role::Client);
    assert_eq!(
        call(&server, &pki.ca.pem(), Some(&client)).await,
        Ok(Code::Ok)
    );
    assert!(call(&server, &pki.ca.pem(), None).await.is_err());
    // Signed by the server's CA, which is not the client CA: refused too.
    let stranger = pki.ca.issue(&["envoy.mesh"], Role::Client);
    assert!(call(&server, &pki.ca.pem(), Some(&stranger)).await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn a_client_certificate_without_the_required_san_is_refused() {
    let pki = Pki::new();
    let server = start(pki.files(Some(&pki.ca_file), Some("envoy.mesh"))).await;
    let right = pki.ca.issue(&["envoy.mesh"], Role::Client);
    let wrong = pki.ca.issue(&["other.mesh"], Role::Client);
    assert_eq!(
        call(&server, &pki.ca.pem(), Some(&right)).await,
        Ok(Code::Ok)
    );
    assert!(call(&server, &pki.ca.pem(), Some(&wrong)).await.is_err());
    server.stop().await;
}

/// The leaf certificate the server presents to a new TLS connection.
async fn served_certificate(addr: std::net::SocketAddr, ca_pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.expect("TLS handshake");
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn rotated_certificate_files_are_served_to_new_connections() {
    let pki = Pki::new();
    let first = pki.ca.issue(&["localhost"], Role::Server);
    first.write(pki.dir.path(), "server");
    let server = start(pki.files(None, None)).await;
    assert_eq!(
        served_certificate(server.grpc, &pki.ca.pem()).await,
        first.der
    );

    // An open connection keeps working across the rotation.
    let channel_before = call(&server, &pki.ca.pem(), None).await;
    assert_eq!(channel_before, Ok(Code::Ok));

    let second = pki.ca.issue(&["localhost"], Role::Server);
    second.write(pki.dir.path(), "server");
    let mut served = Vec::new();
    eventually(Duration::from_secs(10), async || {
        served = served_certificate(server.grpc, &pki.ca.pem()).await;
        served == second.der
    })
    .await;
    assert_eq!(served, second.der, "the new certificate was never served");
    assert_eq!(call(&server, &pki.ca.pem(), None).await, Ok(Code::Ok));

    // A broken rewrite keeps the last good pair.
    common::pki::write_atomically(&pki.key, "not a key");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        served_certificate(server.grpc, &pki.ca.pem()).await,
        second.der
    );
    server.stop().await;
}

/// A PEM key whose body is a recognisable marker, so a leak is easy to spot.
const MARKER: &str = "c2VjcmV0LWtleS1tYXRlcmlhbA";

fn broken_key(dir: &Path) -> PathBuf {
    let path = dir.join("broken.key");
    std::fs::write(
        &path,
        format!("-----BEGIN PRIVATE KEY-----\n{MARKER}!!\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn key_errors_name_the_file_never_its_contents() {
    let pki = Pki::new();
    let key = broken_key(pki.dir.path());
    let mut settings = common::settings(pki.dir.path());
    std::fs::write(pki.dir.path().join("tls.yaml"), CONFIG).unwrap();
    settings.grpc_tls = Some(TlsFiles {
        key: key.clone(),
        ..pki.files(None, None)
    });
    let error = match floodgate::server::Server::bind(settings).await {
        Ok(_) => panic!("a broken key was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("--grpc-tls-key"), "{error}");
    assert!(!error.contains(MARKER), "{error}");

    // The binary, too: it exits 1 naming the path, and prints no key bytes anywhere.
    let config = common::config_dir(&[("tls.yaml", CONFIG)]);
    let output = common::serve_command()
        .arg("--config")
        .arg(config.path())
        .arg("--grpc-tls-cert")
        .arg(&pki.cert)
        .arg("--grpc-tls-key")
        .arg(&key)
        .output()
        .unwrap();
    let text = all_output(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains(&key.display().to_string()), "{text}");
    assert!(!text.contains(MARKER), "{text}");

    // A Redis client key that does not parse fails startup the same way.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("serve")
        .arg("--config")
        .arg(config.path())
        .args(["--backend", "redis", "--redis-url", "rediss://127.0.0.1:1"])
        .arg("--redis-tls-client-cert")
        .arg(&pki.cert)
        .arg("--redis-tls-client-key")
        .arg(&key)
        .output()
        .unwrap();
    let text = all_output(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("--redis-tls-client-key"), "{text}");
    assert!(!text.contains(MARKER), "{text}");
}

#[tokio::test]
async fn a_running_server_logs_and_shows_no_key_material() {
    let pki = Pki::new();
    let client = pki.ca.issue(&["floodgate"], Role::Client);
    let (client_cert, client_key) = client.write(pki.dir.path(), "redis-client");
    let key_body: String = pki_body(&std::fs::read_to_string(&pki.key).unwrap());
    let client_key_body = pki_body(&client.key_pem);
    let config = common::config_dir(&[("tls.yaml", CONFIG)]);
    let args = [
        "--config".to_owned(),
        config.path().display().to_string(),
        "--grpc-tls-cert".to_owned(),
        pki.cert.display().to_string(),
        "--grpc-tls-key".to_owned(),
        pki.key.display().to_string(),
        "--backend".to_owned(),
        "redis".to_owned(),
        "--redis-url".to_owned(),
        "rediss://127.0.0.1:1".to_owned(),
        "--redis-tls-client-cert".to_owned(),
        client_cert.display().to_string(),
        "--redis-tls-client-key".to_owned(),
        client_key.display().to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = common::Binary::start(&args, &[("RUST_LOG", "debug")]);
    let (status, rlconfig) =
        common::http("GET", &format!("http://{}/rlconfig", server.http), "").await;
    assert_eq!(status, 200);
    let log = server.log.lock().unwrap().join("\n");
    for body in [&key_body, &client_key_body] {
        assert!(!log.contains(body.as_str()), "key material in the log");
        assert!(
            !rlconfig.contains(body.as_str()),
            "key material in /rlconfig"
        );
    }
    assert!(log.contains("ClientIdentity(<redacted>)"), "{log}");
}

/// The base64 body of a PEM document, on one line, for leak searches (its first 40 chars).
fn pki_body(pem: &str) -> String {
    let body: String = pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    body.chars().take(40).collect()
}

fn redis_options(ca_pem: &str, identity: Option<&Pair>) -> RedisOptions {
    RedisOptions {
        timeout: Duration::from_secs(2),
        tls_ca_pem: Some(ca_pem.as_bytes().to_vec()),
        tls_client: identity.map(|pair| ClientIdentity {
            cert: pair.cert_pem.clone().into_bytes(),
            key: pair.key_pem.clone().into_bytes(),
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn redis_over_tls_with_a_client_certificate() {
    let pki = Pki::new();
    let redis = RedisServer::start_tls(&pki.cert, &pki.key, &pki.ca_file);
    let url = format!("rediss://127.0.0.1:{}", redis.port());
    let client = pki.ca.issue(&["floodgate"], Role::Client);

    let with_cert = BackendSettings::Redis {
        url: url.clone(),
        options: redis_options(&pki.ca.pem(), Some(&client)),
    };
    let backend = backend::connect(&with_cert)
        .await
        .expect("backend connects");
    backend.ping().await.expect("PING over mTLS");

    let without_cert = BackendSettings::Redis {
        url,
        options: redis_options(&pki.ca.pem(), None),
    };
    // The handshake (or the first command) fails: a client without a certificate is refused.
    let refused = match backend::connect(&without_cert).await {
        Err(_) => true,
        Ok(backend) => backend.ping().await.is_err(),
    };
    assert!(refused, "redis accepted a client without a certificate");
}

/// A finished process's stdout and stderr, as one text.
fn all_output(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A TLS connection that finishes its handshake (presenting `identity`) and then sends
/// nothing, as a stalled or hostile client would.
async fn silent_tls(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    identity: &Pair,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.expect("TLS handshake")
}

#[tokio::test]
async fn silent_sockets_do_not_lock_tls_and_mtls_clients_out() {
    let pki = Pki::new();
    let client_ca = Ca::new("client CA");
    let client_ca_file = pki.dir.path().join("client-ca.pem");
    std::fs::write(&client_ca_file, client_ca.pem()).unwrap();
    let client = client_ca.issue(&["envoy.mesh"], Role::Client);
    for mtls in [false, true] {
        let files = pki.files(mtls.then_some(client_ca_file.as_path()), None);
        let server = TestServer::start_with(&[("tls.yaml", CONFIG)], move |settings| {
            settings.grpc_tls = Some(files);
            settings.grpc_limits.max_connections = 3;
        })
        .await;
        // Three raw sockets, or three that finish the (mutual) TLS handshake, then silence.
        let mut raw = Vec::new();
        let mut handshaken = Vec::new();
        for _ in 0..3 {
            if mtls {
                handshaken.push(silent_tls(server.grpc, &pki.ca.pem(), &client).await);
            } else {
                raw.push(tokio::net::TcpStream::connect(server.grpc).await.unwrap());
            }
        }
        for attempt in 0..3 {
            let answer = call(&server, &pki.ca.pem(), Some(&client)).await;
            assert_eq!(answer, Ok(Code::Ok), "mtls {mtls}, call {attempt}");
        }
        drop((raw, handshaken));
        server.stop().await;
    }
}

#[tokio::test]
async fn tls_and_mtls_apply_on_a_unix_socket() {
    let pki = Pki::new();
    let client = pki.ca.issue(&["envoy.mesh"], Role::Client);
    let socket = pki.dir.path().join("rls.sock");
    let grpc_addr = format!("unix:{}", socket.display());
    let files = pki.files(Some(&pki.ca_file), None);
    let server = TestServer::start_with(&[("tls.yaml", CONFIG)], move |settings| {
        settings.grpc_tls = Some(files);
        settings.grpc_addr = grpc_addr;
    })
    .await;
    let over_socket = |identity: Option<&Pair>| {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pki.ca.pem()))
            .domain_name("localhost");
        if let Some(pair) = identity {
            tls = tls.identity(Identity::from_pem(&pair.cert_pem, &pair.key_pem));
        }
        let endpoint = tonic::transport::Endpoint::from_static("https://localhost")
            .tls_config(tls)
            .unwrap();
        common::unix_endpoint(endpoint, &socket, Default::default())
    };
    let channel = over_socket(Some(&client))
        .await
        .expect("mTLS over the socket");
    let answer = RateLimitServiceClient::new(channel)
        .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
        .await
        .expect("answered");
    assert_eq!(answer.into_inner().overall_code(), Code::Ok);
    // Without a client certificate: refused, as on TCP.
    let refused = match over_socket(None).await {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was answered");
    // Plaintext over the socket gets no answer either.
    let plain = common::unix_channel(&socket, Default::default()).await;
    if let Ok(channel) = plain {
        let result = RateLimitServiceClient::new(channel)
            .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
            .await;
        assert!(result.is_err(), "plaintext call answered");
    }
    server.stop().await;
}
