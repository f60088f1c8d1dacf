//! A gRPC client that sends already-encoded ShouldRateLimit requests.

use std::net::SocketAddr;
use std::time::Duration;

use prost::bytes::{BufMut, Bytes};
use tonic::client::Grpc;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::{ProstCodec, ProstDecoder};

use crate::proto::rls::{RateLimitRequest, RateLimitResponse};

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `overall_code` of an OK answer.
const CODE_OK: i32 = 1;
/// `overall_code` of an OVER_LIMIT answer.
const CODE_OVER_LIMIT: i32 = 2;

/// How one call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered OK.
    Ok,
    /// Answered OVER_LIMIT.
    OverLimit,
    /// Answered with an unknown overall code, or not answered (the gRPC code).
    Error(tonic::Code),
}

/// Writes the request bytes as they are.
#[derive(Default)]
struct PreEncoded;

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Codec for PreEncoded {
    type Encode = Bytes;
    type Decode = RateLimitResponse;
    type Encoder = RawEncoder;
    type Decoder = ProstDecoder<RateLimitResponse>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<RateLimitRequest, RateLimitResponse>::new().decoder()
    }
}

/// Opens `count` HTTP/2 connections to `target`; each reconnects on its own if the service
/// goes away mid-run (its calls fail meanwhile and count as errors).
///
/// # Errors
/// The first connection that cannot be made.
pub async fn connect(target: SocketAddr, count: usize) -> Result<Vec<Channel>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|error| error.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        // Past its deadline the generator resets a call, and the service's answer to it may
        // already be on the way; h2 then resets that stream again on its own, and past 1,024
        // such resets closed the whole connection (GOAWAY ENHANCE_YOUR_CALM), failing every
        // call on it as UNKNOWN or RESOURCE_EXHAUSTED. Against a service on loopback this
        // guard only distorts overload runs.
        .http2_max_local_error_reset_streams(None);
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = endpoint
            .connect()
            .await
            .map_err(|error| format!("cannot connect to {target}: {error}"))?;
        channels.push(channel);
    }
    Ok(channels)
}

/// One caller over one channel.
#[derive(Clone)]
pub struct Caller {
    grpc: Grpc<Channel>,
    path: PathAndQuery,
    timeout: Duration,
}

impl Caller {
    /// A caller whose every call has the deadline `timeout`.
    pub fn new(channel: Channel, timeout: Duration) -> Caller {
        Caller {
            grpc: Grpc::new(channel),
            path: PathAndQuery::from_static(PATH),
            timeout,
        }
    }

    /// Sends one request and classifies the answer. Never takes much longer than the
    /// timeout: the deadline is sent to the server and also enforced here.
    pub async fn call(&mut self, body: Bytes) -> Outcome {
        let attempt = async {
            self.grpc
                .ready()
                .await
                .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
            let mut request = tonic::Request::new(body);
            request.set_timeout(self.timeout);
            self.grpc
                .unary(request, self.path.clone(), PreEncoded)
                .await
        };
        let grace = self.timeout + Duration::from_millis(100);
        match tokio::time::timeout(grace, attempt).await {
            Ok(Ok(response)) => match response.get_ref().overall_code {
                CODE_OK => Outcome::Ok,
                CODE_OVER_LIMIT => Outcome::OverLimit,
                _ => Outcome::Error(tonic::Code::Unknown),
            },
            Ok(Err(status)) => Outcome::Error(status.code()),
            Err(_) => Outcome::Error(tonic::Code::DeadlineExceeded),
        }
    }
}
