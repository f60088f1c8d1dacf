//! Every `:authority` a real client sends is answered (issue 30): Istio's cluster names with
//! `|`, the unix socket path as gRPC C-core (percent-encoded) and grpc-java (raw) send it,
//! the empty string, bytes that are not UTF-8, and none at all; over TCP, the unix socket
//! and TLS. The calls are written as raw HTTP/2 frames, since no client library lets a
//! caller send such values on purpose. A stream h2 still refuses (no `:method`) is reset and
//! counted in `floodgate_http2_resets`. The third-party clients themselves (Python grpcio,
//! Node grpc-js) run in `tests/clients/`.

use crate::common;

use std::sync::Arc;

use common::pki::{Ca, Role};
use common::{TestServer, descriptor, eventually, h2_frame, request, sample, scrape};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use floodgate::tls::TlsFiles;
use prost::Message;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tonic_health::pb::HealthCheckResponse;
use tonic_health::pb::health_check_response::ServingStatus;

const CONFIG: &str = "domain: authority\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH_PATH: &str = "/grpc.health.v1.Health/Check";

/// Each authority a client in the field sends (None: the header is left out).
const AUTHORITIES: [Option<&[u8]>; 8] = [
    Some(b"outbound|8081||ratelimit.default.svc.cluster.local"),
    Some(b"tmp%2Frl.sock"),
    Some(b"/var/run/rl.sock"),
    Some(b""),
    Some(b"\xff\xfe not utf-8"),
    Some(b"with space"),
    Some(b"localhost"),
    None,
];

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// How a raw call ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The response's message (gRPC framing removed).
    Answered(Vec<u8>),
    /// `RST_STREAM` with this code.
    Reset(u32),
    /// `GOAWAY` with this code.
    GoAway(u32),
}

/// An HPACK integer with an `prefix`-bit prefix (RFC 7541 section 5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, mut value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | u8::try_from(value).unwrap());
        return;
    }
    out.push(first | u8::try_from(max).unwrap());
    value -= max;
    while value >= 128 {
        out.push(u8::try_from(value % 128).unwrap() | 0x80);
        value /= 128;
    }
    out.push(u8::try_from(value).unwrap());
}

/// A header field as a literal without indexing, new name, no Huffman coding.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name);
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// One unary gRPC call on a fresh connection, written frame by frame.
async fn raw_call<S: AsyncRead + AsyncWrite + Unpin>(
    mut io: S,
    method: Option<&[u8]>,
    path: &str,
    authority: Option<&[u8]>,
    message: &[u8],
) -> Outcome {
    let mut block = Vec::new();
    if let Some(method) = method {
        literal(&mut block, b":method", method);
    }
    literal(&mut block, b":scheme", b"http");
    literal(&mut block, b":path", path.as_bytes());
    if let Some(authority) = authority {
        literal(&mut block, b":authority", authority);
    }
    literal(&mut block, b"content-type", b"application/grpc");
    literal(&mut block, b"te", b"trailers");
    let mut grpc = vec![0];
    grpc.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    grpc.extend_from_slice(message);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(SETTINGS, 0, 0, &[]));
    out.extend(h2_frame(HEADERS, END_HEADERS, 1, &block));
    out.extend(h2_frame(DATA, END_STREAM, 1, &grpc));
    io.write_all(&out).await.unwrap();
    let mut answer = Vec::new();
    let read = async {
        loop {
            let mut header = [0u8; 9];
            io.read_exact(&mut header).await.expect("a frame header");
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            io.read_exact(&mut payload).await.expect("a frame payload");
            let code = |at: usize| u32::from_be_bytes(payload[at..at + 4].try_into().unwrap());
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    io.write_all(&h2_frame(SETTINGS, ACK, 0, &[]))
                        .await
                        .unwrap();
                }
                DATA if stream == 1 => answer.extend_from_slice(&payload),
                HEADERS if stream == 1 && flags & END_STREAM != 0 => {
                    // The trailers: the message is complete (5 bytes of gRPC framing first).
                    return Outcome::Answered(answer.get(5..).unwrap_or_default().to_vec());
                }
                RST_STREAM if stream == 1 => return Outcome::Reset(code(0)),
                GOAWAY => return Outcome::GoAway(code(4)),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the server answers within 10 s")
}

fn rls_message() -> Vec<u8> {
    request("authority", vec![descriptor(&[("k", "v")])]).encode_to_vec()
}

/// Calls ShouldRateLimit and health with every authority, each on a connection `connect`
/// opens, and asserts each is served.
async fn every_authority_is_served<S, F>(connect: impl Fn() -> F)
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = S>,
{
    for authority in AUTHORITIES {
        let shown = authority.map(String::from_utf8_lossy);
        let outcome = raw_call(
            connect().await,
            Some(b"POST"),
            RLS_PATH,
            authority,
            &rls_message(),
        )
        .await;
        let Outcome::Answered(body) = outcome else {
            panic!("ShouldRateLimit with authority {shown:?}: {outcome:?}");
        };
        let response = RateLimitResponse::decode(body.as_slice()).expect("a RateLimitResponse");
        assert_eq!(response.overall_code(), Code::Ok, "authority {shown:?}");
        let outcome = raw_call(connect().await, Some(b"POST"), HEALTH_PATH, authority, &[]).await;
        let Outcome::Answered(body) = outcome else {
            panic!("health with authority {shown:?}: {outcome:?}");
        };
        let health = HealthCheckResponse::decode(body.as_slice()).expect("a HealthCheckResponse");
        assert_eq!(
            health.status(),
            ServingStatus::Serving,
            "authority {shown:?}"
        );
    }
}

#[tokio::test]
async fn every_authority_is_answered_over_tcp() {
    let server = TestServer::start(&[("authority.yaml", CONFIG)]).await;
    let addr = server.grpc;
    every_authority_is_served(
        || async move { tokio::net::TcpStream::connect(addr).await.unwrap() },
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn every_authority_is_answered_over_the_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rl.sock");
    let grpc_addr = format!("unix:{}", socket.display());
    let server = TestServer::start_with(&[("authority.yaml", CONFIG)], move |settings| {
        settings.grpc_addr = grpc_addr;
    })
    .await;
    let socket = &socket;
    every_authority_is_served(
        || async move { tokio::net::UnixStream::connect(socket).await.unwrap() },
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn every_authority_is_answered_under_tls() {
    use rustls::pki_types::pem::PemObject;
    let ca = Ca::new("authority test CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca
        .issue(&["localhost"], Role::Server)
        .write(dir.path(), "server");
    let files = TlsFiles {
        cert,
        key,
        client_ca: None,
        client_san: None,
    };
    let server = TestServer::start_with(&[("authority.yaml", CONFIG)], move |settings| {
        settings.grpc_tls = Some(files);
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let addr = server.grpc;
    let connector = &connector;
    every_authority_is_served(|| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.expect("TLS handshake")
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_stream_h2_still_refuses_is_reset_and_counted() {
    let server = TestServer::start(&[("authority.yaml", CONFIG)]).await;
    let tcp = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    // No :method: malformed whatever the authority, so h2 resets it (PROTOCOL_ERROR = 1).
    let outcome = raw_call(tcp, None, RLS_PATH, Some(b"localhost"), &rls_message()).await;
    assert_eq!(outcome, Outcome::Reset(1));
    let series = "floodgate_http2_resets_total{kind=\"stream\",code=\"PROTOCOL_ERROR\"}";
    let mut seen = None;
    let counted = eventually(Duration::from_secs(5), async || {
        seen = sample(&scrape(server.http).await, series);
        seen == Some(1.0)
    })
    .await;
    assert!(counted, "{series} = {seen:?}");
    server.stop().await;
}
