//! A gRPC client for the load generator that costs less per call than the service does.
//!
//! Calls go straight onto HTTP/2 streams (`h2`): the request is encoded up front, the answer
//! is read only for its gRPC status and `overall_code`. A tonic channel adds two task hops
//! per call (its buffer and hyper's dispatch) and decodes whole responses; with it the
//! generator used a full core before the service did, so overload runs measured the
//! generator rather than the service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::poll_fn;
use h2::client::SendRequest;
use prost::bytes::{BufMut, Bytes, BytesMut};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::Code;
use tonic::codegen::http::{self, HeaderValue, Method, Uri, header};

use super::BenchError;
use crate::listener::Coalesced;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `overall_code` of an OK answer.
const CODE_OK: u64 = 1;
/// `overall_code` of an OVER_LIMIT answer.
const CODE_OVER_LIMIT: u64 = 2;
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Least time between two attempts to reconnect one link, so that callers of a service
/// that is down wait instead of spinning.
const RECONNECT_EVERY: Duration = Duration::from_millis(100);
/// Receive windows: answers to wide requests are a few KB each, and hundreds are in flight.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// How one call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered OK.
    Ok,
    /// Answered OVER_LIMIT.
    OverLimit,
    /// Answered with an unknown overall code, or not answered (the gRPC code).
    Error(Code),
    /// Not sent: its deadline passed while it waited for a free caller (open loop past the
    /// most calls in flight). A client with a deadline does not send a call already late.
    Expired,
    /// Not sent: it was due while every caller was busy, and `--fail-when-busy` fails such
    /// a call at once.
    Overflow,
}

/// One HTTP/2 connection to the target, shared by several callers, reopened when it breaks
/// (a replica restarted mid-run): calls fail meanwhile and count as errors.
pub struct Link {
    target: SocketAddr,
    current: tokio::sync::Mutex<Connected>,
}

/// The link's connection: its sender (none while down), which connection it is, and when
/// it was last attempted.
struct Connected {
    sender: Option<SendRequest<Bytes>>,
    generation: u64,
    attempted: Instant,
}

impl Link {
    /// The sender of the link's connection if it is newer than `seen`; reconnects when the
    /// connection `seen` is still the current one and the last attempt is long enough ago.
    async fn renew(&self, seen: u64) -> Option<(SendRequest<Bytes>, u64)> {
        let mut current = self.current.lock().await;
        if current.generation == seen || current.sender.is_none() {
            let next_attempt = current.attempted + RECONNECT_EVERY;
            if Instant::now() < next_attempt {
                drop(current);
                tokio::time::sleep_until(next_attempt).await;
                return None;
            }
            current.attempted = Instant::now();
            current.sender = open(self.target).await.ok();
            current.generation += 1;
        }
        let sender = current.sender.clone()?;
        Some((sender, current.generation))
    }
}

/// Opens one HTTP/2 connection and spawns its driver.
/// Its writes are coalesced as the service's are ([`Coalesced`]): one syscall per round of
/// calls rather than one per call.
async fn open(target: SocketAddr) -> Result<SendRequest<Bytes>, BenchError> {
    let failed = |reason: String| BenchError::Connect { target, reason };
    let connect = async {
        let tcp = TcpStream::connect(target)
            .await
            .map_err(|error| failed(error.to_string()))?;
        tcp.set_nodelay(true)
            .map_err(|error| failed(error.to_string()))?;
        h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            // Past its deadline the generator resets a call whose answer may already be on
            // the way; h2 then resets that stream again, and past 1,024 such resets it closed
            // the whole connection (ENHANCE_YOUR_CALM), failing every call on it. Against a
            // service on loopback this guard only distorts overload runs.
            .max_local_error_reset_streams(None)
            .handshake::<_, Bytes>(Coalesced::new(tcp))
            .await
            .map_err(|error| failed(error.to_string()))
    };
    let (sender, connection) = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| failed("timed out".to_owned()))??;
    tokio::spawn(async move {
        // The connection's end shows up as errors on its calls.
        let _ = connection.await;
    });
    Ok(sender)
}

/// Opens `count` HTTP/2 connections to `target`.
///
/// # Errors
/// The first connection that cannot be made.
pub async fn connect(target: SocketAddr, count: usize) -> Result<Vec<Arc<Link>>, BenchError> {
    let mut links = Vec::with_capacity(count);
    for _ in 0..count {
        let sender = open(target).await?;
        links.push(Arc::new(Link {
            target,
            current: tokio::sync::Mutex::new(Connected {
                sender: Some(sender),
                generation: 1,
                attempted: Instant::now(),
            }),
        }));
    }
    Ok(links)
}

/// One caller over one link.
pub struct Caller {
    link: Arc<Link>,
    /// The sender of the connection this caller last used, and which one it was.
    sender: Option<SendRequest<Bytes>>,
    generation: u64,
    uri: Uri,
    timeout: Duration,
    timeout_header: HeaderValue,
}

impl Caller {
    /// A caller whose every call has the deadline `timeout`.
    pub fn new(link: Arc<Link>, timeout: Duration) -> Caller {
        let uri = Uri::builder()
            .scheme("http")
            .authority(link.target.to_string())
            .path_and_query(PATH)
            .build()
            .expect("a socket address and a fixed path make a URI");
        Caller {
            link,
            sender: None,
            generation: 0,
            uri,
            timeout,
            timeout_header: grpc_timeout(timeout),
        }
    }

    /// Sends one request (an encoded `RateLimitRequest`) started at `started` (its intended
    /// start in open loop) and classifies the answer. The call's deadline is `started` plus
    /// the timeout: the time left is what `grpc-timeout` tells the server, as a gRPC client
    /// propagates a deadline, and a call with no time left is not sent. Never takes much
    /// longer than the deadline; a call given up on is reset.
    pub async fn call(&mut self, body: Bytes, started: Instant) -> Outcome {
        let left = (started + self.timeout).saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Outcome::Expired;
        }
        let grace = left + Duration::from_millis(100);
        match tokio::time::timeout(grace, self.attempt(body, left)).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(code)) => Outcome::Error(code),
            Err(_) => Outcome::Error(Code::DeadlineExceeded),
        }
    }

    /// One call; `Err` carries the gRPC code of a failure (`Unknown`: the answer was not gRPC,
    /// or had no known overall code).
    async fn attempt(&mut self, body: Bytes, left: Duration) -> Result<Outcome, Code> {
        let request = self.request(left);
        let sender = match &mut self.sender {
            Some(sender) => sender,
            None => {
                let (sender, generation) = self
                    .link
                    .renew(self.generation)
                    .await
                    .ok_or(Code::Unavailable)?;
                self.generation = generation;
                self.sender.insert(sender)
            }
        };
        let sent = async {
            poll_fn(|cx| sender.poll_ready(cx)).await?;
            let (response, mut stream) = sender.send_request(request, false)?;
            stream.send_data(frame(&body), true)?;
            response.await
        };
        let response = match sent.await {
            Ok(response) => response,
            Err(error) => {
                if !error.is_reset() {
                    // The connection is gone; the next call takes a new one.
                    self.sender = None;
                }
                return Err(code_of(&error));
            }
        };
        let (head, mut body) = response.into_parts();
        if head.status != http::StatusCode::OK {
            return Err(Code::Unknown);
        }
        if let Some(status) = grpc_status(&head.headers) {
            // Trailers-only: an error without a body.
            return Err(status);
        }
        let mut message = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|error| code_of(&error))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            message.put_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(|error| code_of(&error))?;
        match trailers.as_ref().and_then(grpc_status) {
            Some(Code::Ok) => {}
            Some(code) => return Err(code),
            None => return Err(Code::Unknown),
        }
        match message.get(5..).and_then(overall_code) {
            Some(CODE_OK) => Ok(Outcome::Ok),
            Some(CODE_OVER_LIMIT) => Ok(Outcome::OverLimit),
            _ => Err(Code::Unknown),
        }
    }

    /// The request's head, with `left` as its deadline.
    fn request(&self, left: Duration) -> http::Request<()> {
        let mut request = http::Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        let deadline = if left >= self.timeout {
            self.timeout_header.clone()
        } else {
            grpc_timeout(left)
        };
        headers.insert("grpc-timeout", deadline);
        request
    }
}

/// A message in gRPC framing: uncompressed, with its length.
fn frame(message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(message);
    framed.freeze()
}

/// `grpc-timeout` for `timeout`: at most 8 digits, in the finest unit that fits.
fn grpc_timeout(timeout: Duration) -> HeaderValue {
    let micros = timeout.as_micros();
    let text = if micros <= 99_999_999 {
        format!("{micros}u")
    } else {
        format!("{}m", timeout.as_millis().min(99_999_999))
    };
    HeaderValue::from_str(&text).expect("digits and a unit make a header value")
}

fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(Code::from_i32(value))
}

/// The gRPC code of a call that failed in HTTP/2 (the gRPC spec's mapping of reset codes).
fn code_of(error: &h2::Error) -> Code {
    match error.reason() {
        _ if error.is_io() => Code::Unavailable,
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        _ if error.is_go_away() => Code::Unavailable,
        _ => Code::Internal,
    }
}

/// Field 1 (`overall_code`) of an encoded `RateLimitResponse`, reading past every other
/// field without decoding it.
fn overall_code(mut message: &[u8]) -> Option<u64> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    let mut code = None;
    while !message.is_empty() {
        let (tag, wire_type) = decode_key(&mut message).ok()?;
        if tag == 1 && wire_type == WireType::Varint {
            code = Some(decode_varint(&mut message).ok()?);
        } else {
            skip_field(wire_type, tag, &mut message, DecodeContext::default()).ok()?;
        }
    }
    Some(code.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::proto::rls::RateLimitResponse;
    use crate::proto::rls::rate_limit_response::DescriptorStatus;

    #[test]
    fn reads_the_overall_code_past_other_fields() {
        let response = RateLimitResponse {
            overall_code: 2,
            statuses: vec![DescriptorStatus {
                code: 1,
                limit_remaining: 7,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(overall_code(&response.encode_to_vec()), Some(2));
        assert_eq!(overall_code(&[]), Some(0));
        assert_eq!(overall_code(&[0x08]), None, "a truncated varint");
    }

    #[test]
    fn deadline_header_uses_the_finest_unit_that_fits() {
        assert_eq!(grpc_timeout(Duration::from_millis(20)), "20000u");
        assert_eq!(grpc_timeout(Duration::from_secs(3600)), "3600000m");
    }
}
