//! `--response-dynamic-metadata` on the wire, decoded with the independent `envoy-types`
//! protos: the request's shape, and the merged rule `metadata` of every descriptor that did
//! not end over its limit.

use crate::common;

use common::{TestServer, descriptor, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use serde_json::{Value as Json, json};

const API: &str = "\
domain: api
descriptors:
  - key: user
    metadata: {team: a, route: {cluster: one}}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: ip
    metadata: {team: b, route: {cluster: two, zone: z}, blocked: true}
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: path
    metadata: {team: c, route: {zone: y, weight: 2}}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 100}
";

fn json(value: &Value) -> Json {
    match value.kind.as_ref() {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::NumberValue(number)) => json!(number),
        Some(Kind::StringValue(text)) => json!(text),
        Some(Kind::BoolValue(flag)) => json!(flag),
        Some(Kind::StructValue(fields)) => object(fields),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(json).collect()),
    }
}

fn object(fields: &Struct) -> Json {
    Json::Object(
        fields
            .fields
            .iter()
            .map(|(key, value)| (key.clone(), json(value)))
            .collect(),
    )
}

#[tokio::test]
async fn dynamic_metadata_carries_the_request_and_the_merged_rule_metadata() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start_with(&[("api.yaml", API)], |settings| {
        settings.response_dynamic_metadata = true;
    })
    .await;
    let mut client = server.client().await;
    let mut with_addend = descriptor(&[("path", "/x")]);
    with_addend.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 2 });
    let mut call = request(
        "api",
        vec![
            descriptor(&[("user", "u1")]),
            descriptor(&[("ip", "10.0.0.1")]),
            with_addend,
            descriptor(&[("plain", "p")]),
        ],
    );
    call.hits_addend = 3;
    let response = should_rate_limit(&mut client, call).await;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    let metadata = object(&response.dynamic_metadata.expect("dynamic metadata"));
    assert_eq!(
        metadata,
        json!({
            "domain": "api",
            "hitsAddend": 3.0,
            "descriptors": [
                {"entries": ["user=u1"]},
                {"entries": ["ip=10.0.0.1"]},
                {"entries": ["path=/x"], "hitsAddend": 2.0},
                {"entries": ["plain=p"]},
            ],
            // `ip` is over its limit: its metadata is left out; `user` wrote first.
            "metadata": {"team": "a", "route": {"cluster": "one", "zone": "y", "weight": 2.0}},
        })
    );
    server.stop().await;
}

#[tokio::test]
async fn no_dynamic_metadata_unless_asked() {
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut client = server.client().await;
    let response = should_rate_limit(
        &mut client,
        request("api", vec![descriptor(&[("user", "u")])]),
    )
    .await;
    assert!(response.dynamic_metadata.is_none());
    server.stop().await;
}
