//! Arbitrary bytes as an admin `/json` body: `parse_json_request` (the endpoint's parser)
//! then `to_request` (the validation every request gets). Never a panic; a parsed request
//! survives proto3 JSON and protobuf round trips unchanged, so `/json` and gRPC see the same
//! request.
#![no_main]

use floodgate::admin::parse_json_request;
use floodgate::proto::rls::RateLimitRequest;
use floodgate::service::to_request;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = parse_json_request(data) else {
        return;
    };
    let _ = to_request(&request);
    let json = serde_json::to_vec(&request).expect("a parsed request serializes");
    let again = parse_json_request(&json).expect("serialized JSON parses");
    assert_eq!(again, request, "JSON round trip changed the request");
    let decoded = RateLimitRequest::decode(request.encode_to_vec().as_slice())
        .expect("an encoded request decodes");
    assert_eq!(decoded, request, "protobuf round trip changed the request");
});
