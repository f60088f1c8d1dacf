//! Envoy Gateway's rate-limit rules as it really sends them (issue 48): each case is the
//! `RateLimitConfig` Envoy Gateway's own translator test expects
//! (`internal/xds/translator/testdata/out/ratelimit-config/<case>.yaml` in envoyproxy/gateway,
//! at the commit cited per case), served by the test ADS server, and the ShouldRateLimit
//! descriptors its route actions produce for a request (`<case>.routes.yaml` beside it). Each
//! runs on memory, Redis and a 3-master Cluster.
//!
//! Shapes, by release: every release through v1.9.3 (the latest, October 2026; v1.9.2 before
//! it) nests a rule under its route, `<route> -> rule-<i>-match-<j>`, in a domain named after
//! the listener; a `shared` rule lives in a domain named after its policy, under the key
//! `<ns>/<policy>/rule/<i>`. The main branch after v1.9 puts that policy-rule level between
//! route and rule for unshared rules too (PR #9466). The expected files are test data, read
//! as facts; the YAML below keeps only the fields that are set.

use crate::common;
use crate::xds::{
    AdsServer, RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, TYPE_URL, start_floodgate,
    xds_settings,
};

use common::redis::{RedisCluster, RedisServer};
use common::{TestServer, descriptor, redis_options, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::Any;
use floodgate::backend::BackendSettings;
use floodgate::clock::Clock;
use prost::Message;
use serde::Deserialize;
use std::time::Duration;

/// A descriptor a request produces: its domain and entries.
type Sent = (&'static str, &'static [(&'static str, &'static str)]);

/// What a case's requests must get.
enum Expect {
    /// The rule matched: its limit per unit (the `current_limit` of the answer).
    Limit(Sent, u32, i32),
    /// No rule matches: no `current_limit`, and OK.
    Unmatched(Sent),
    /// The first `n` calls are admitted and the next one denied.
    Admits(Sent, u32),
    /// Every call is admitted (a shadow rule), whatever its status says.
    AlwaysAdmitted(Sent, u32),
}

/// One testdata case.
struct Case {
    /// `<case>.yaml`, its commit, and the shape.
    source: &'static str,
    /// The expected resources, YAML documents in Envoy Gateway's field names.
    config: &'static str,
    expect: &'static [Expect],
}

/// Entries many cases send: the route's, the first policy's rule's, a header match's.
const FIRST_ROUTE: (&str, &str) = ("first-route", "first-route");
const POLICY_1_RULE_0: (&str, &str) = (
    "test-namespace/test-policy-1/rule/0",
    "test-namespace/test-policy-1/rule/0",
);
const RULE_0_MATCH_0: (&str, &str) = ("rule-0-match-0", "rule-0-match-0");

/// Envoy's `RateLimitUnit` numbers.
const SECOND: i32 = 1;
const HOUR: i32 = 3;
const MONTH: i32 = 5;
const YEAR: i32 = 6;

const CASES: &[Case] = &[
    Case {
        source: "distinct-match.yaml @ 8e8b1048 (routes @ 23cea5a6): releases through v1.9.3",
        config: "
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: rule-0-match-0
        rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[
            // `x-user-id: alice` (request_headers): one bucket per value.
            Expect::Limit(
                (
                    "first-listener",
                    &[FIRST_ROUTE, ("rule-0-match-0", "alice")],
                ),
                5,
                SECOND,
            ),
            // Without the header Envoy drops the descriptor; the route's entry alone does
            // not match a rule two levels deep.
            Expect::Unmatched(("first-listener", &[FIRST_ROUTE])),
        ],
    },
    Case {
        source: "distinct-match.yaml @ 0e47507f: main after v1.9 (the policy-rule level)",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: test-namespace/test-policy-1/rule/0
        value: test-namespace/test-policy-1/rule/0
        descriptors:
          - key: rule-0-match-0
            rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[Expect::Limit(
            (
                "first-listener",
                &[FIRST_ROUTE, POLICY_1_RULE_0, ("rule-0-match-0", "bob")],
            ),
            5,
            SECOND,
        )],
    },
    Case {
        source: "shared-and-unshared.yaml @ 55170fc5: a shared rule in its policy's domain, \
                 an unshared one per route in the listener's",
        config: "
name: default/policy-for-route
domain: default/policy-for-route
descriptors:
  - key: default/policy-for-route/rule/0
    value: default/policy-for-route/rule/0
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {requests_per_unit: 3, unit: HOUR}
---
name: envoy-gateway/gateway-1/http
domain: envoy-gateway/gateway-1/http
descriptors:
  - key: httproute/default/httproute-1/rule/0/match/0/gateway_envoyproxy_io
    value: httproute/default/httproute-1/rule/0/match/0/gateway_envoyproxy_io
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {requests_per_unit: 3, unit: HOUR}
  - key: httproute/default/httproute-2/rule/0/match/0/gateway_envoyproxy_io
    value: httproute/default/httproute-2/rule/0/match/0/gateway_envoyproxy_io
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {requests_per_unit: 3, unit: HOUR}
",
        expect: &[
            // `x-user-id: one` on either route: one shared budget of 3 (the descriptor
            // names the rule, not the route).
            Expect::Admits(
                (
                    "default/policy-for-route",
                    &[
                        (
                            "default/policy-for-route/rule/0",
                            "default/policy-for-route/rule/0",
                        ),
                        RULE_0_MATCH_0,
                    ],
                ),
                3,
            ),
            // `x-user-id: two`: each route its own 3.
            Expect::Admits(
                (
                    "envoy-gateway/gateway-1/http",
                    &[
                        (
                            "httproute/default/httproute-1/rule/0/match/0/gateway_envoyproxy_io",
                            "httproute/default/httproute-1/rule/0/match/0/gateway_envoyproxy_io",
                        ),
                        RULE_0_MATCH_0,
                    ],
                ),
                3,
            ),
            Expect::Admits(
                (
                    "envoy-gateway/gateway-1/http",
                    &[
                        (
                            "httproute/default/httproute-2/rule/0/match/0/gateway_envoyproxy_io",
                            "httproute/default/httproute-2/rule/0/match/0/gateway_envoyproxy_io",
                        ),
                        RULE_0_MATCH_0,
                    ],
                ),
                3,
            ),
        ],
    },
    Case {
        source: "global-shared-distinct-match (routes @ 8453c4c5): a shared rule with a \
                 distinct header",
        config: "
name: test-namespace/test-policy-1
domain: test-namespace/test-policy-1
descriptors:
  - key: test-namespace/test-policy-1/rule/0
    value: test-namespace/test-policy-1/rule/0
    descriptors:
      - key: rule-0-match-0
        rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[Expect::Limit(
            (
                "test-namespace/test-policy-1",
                &[POLICY_1_RULE_0, ("rule-0-match-0", "carol")],
            ),
            5,
            SECOND,
        )],
    },
    Case {
        source: "month-year-rule.yaml @ 51b0d443 (routes @ 289852c4): MONTH and YEAR units",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {requests_per_unit: 5, unit: MONTH}
  - key: second-route
    value: second-route
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {requests_per_unit: 1, unit: YEAR}
",
        expect: &[
            Expect::Limit(("first-listener", &[FIRST_ROUTE, RULE_0_MATCH_0]), 5, MONTH),
            Expect::Admits(
                (
                    "first-listener",
                    &[("second-route", "second-route"), RULE_0_MATCH_0],
                ),
                1,
            ),
        ],
    },
    Case {
        source: "global-shadow-mode.yaml @ 40b4b045 (routes @ 727a0abb): shadow_mode on every \
                 node of the rule's chain",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        shadow_mode: true
        descriptors:
          - key: rule-0-match-1
            value: rule-0-match-1
            shadow_mode: true
            descriptors:
              - key: rule-0-match-2
                value: rule-0-match-2
                shadow_mode: true
                descriptors:
                  - key: masked_remote_address
                    value: 0.0.0.0/0
                    shadow_mode: true
                    rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[Expect::AlwaysAdmitted(
            (
                "first-listener",
                &[
                    FIRST_ROUTE,
                    RULE_0_MATCH_0,
                    ("rule-0-match-1", "rule-0-match-1"),
                    ("rule-0-match-2", "rule-0-match-2"),
                    ("masked_remote_address", "0.0.0.0/0"),
                ],
            ),
            12,
        )],
    },
    Case {
        source: "global-detailed-metric.yaml @ 580b7d9b (no routes file in the release): the \
                 rule's own entry with an empty value (any value), detailed_metric on it, \
                 every field Envoy Gateway writes, the route level's rate_limit null",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    rate_limit: null
    descriptors:
      - key: rule-0-match-0
        value: \"\"
        rate_limit:
          requests_per_unit: 5
          unit: SECOND
          unlimited: false
          name: \"\"
          replaces: []
        descriptors: []
        shadow_mode: false
        quota_mode: false
        detailed_metric: true
        value_to_metric: false
        share_threshold: false
    shadow_mode: false
    quota_mode: false
    detailed_metric: false
    value_to_metric: false
    share_threshold: false
",
        expect: &[
            // What the generic key action of a rule without selectors sends.
            Expect::Admits(("first-listener", &[FIRST_ROUTE, RULE_0_MATCH_0]), 5),
            Expect::Limit(
                (
                    "first-listener",
                    &[FIRST_ROUTE, ("rule-0-match-0", "other")],
                ),
                5,
                SECOND,
            ),
        ],
    },
    Case {
        source: "masked-remote-address-match.yaml @ 675bfdaf (routes @ 289852c4): a CIDR \
                 range, not distinct",
        config: "
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: masked_remote_address
        value: 192.168.0.0/16
        rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[
            // A client at 192.168.7.9 (RemoteAddressMatch sends the range itself).
            Expect::Limit(
                (
                    "first-listener",
                    &[FIRST_ROUTE, ("masked_remote_address", "192.168.0.0/16")],
                ),
                5,
                SECOND,
            ),
            // A client outside the range, with the older masked action: its own /16.
            Expect::Unmatched((
                "first-listener",
                &[FIRST_ROUTE, ("masked_remote_address", "10.1.0.0/16")],
            )),
        ],
    },
    Case {
        source: "distinct-remote-address-match.yaml @ 23cea5a6: one bucket per client \
                 address in the range",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: masked_remote_address
        value: 192.168.0.0/16
        descriptors:
          - key: remote_address
            rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[Expect::Limit(
            (
                "first-listener",
                &[
                    FIRST_ROUTE,
                    ("masked_remote_address", "192.168.0.0/16"),
                    ("remote_address", "192.168.7.9"),
                ],
            ),
            5,
            SECOND,
        )],
    },
    Case {
        source: "ratelimit-sourceip-invert.yaml @ 5c23dc01 (routes @ 3248db1b): an inverted \
                 CIDR match (v1.8.0)",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: masked_remote_address
        value: invert:192.168.0.0/24
        rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[Expect::Limit(
            (
                "first-listener",
                &[
                    FIRST_ROUTE,
                    ("masked_remote_address", "invert:192.168.0.0/24"),
                ],
            ),
            5,
            SECOND,
        )],
    },
    Case {
        source: "query-parameters-match.yaml @ 0e47507f: a header and a query parameter, \
                 main after v1.9",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: test-namespace/test-policy-1/rule/0
        value: test-namespace/test-policy-1/rule/0
        descriptors:
          - key: rule-0-match-0
            value: rule-0-match-0
            descriptors:
              - key: rule-0-match-1
                value: rule-0-match-1
                rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[
            // `x-user-id: one` and `?user=alice`.
            Expect::Limit(
                (
                    "first-listener",
                    &[
                        FIRST_ROUTE,
                        POLICY_1_RULE_0,
                        RULE_0_MATCH_0,
                        ("rule-0-match-1", "rule-0-match-1"),
                    ],
                ),
                5,
                SECOND,
            ),
            // Without the query parameter Envoy drops the whole descriptor; the header's
            // entry alone stops a level short.
            Expect::Unmatched((
                "first-listener",
                &[FIRST_ROUTE, POLICY_1_RULE_0, RULE_0_MATCH_0],
            )),
        ],
    },
    Case {
        source: "header-and-cidr-matches.yaml @ 0e47507f: three header matches and a CIDR, \
                 main after v1.9",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: test-namespace/test-policy-1/rule/0
        value: test-namespace/test-policy-1/rule/0
        descriptors:
          - key: rule-0-match-0
            value: rule-0-match-0
            descriptors:
              - key: rule-0-match-1
                value: rule-0-match-1
                descriptors:
                  - key: rule-0-match-2
                    value: rule-0-match-2
                    descriptors:
                      - key: masked_remote_address
                        value: 0.0.0.0/0
                        rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[Expect::Limit(
            (
                "first-listener",
                &[
                    FIRST_ROUTE,
                    POLICY_1_RULE_0,
                    RULE_0_MATCH_0,
                    ("rule-0-match-1", "rule-0-match-1"),
                    ("rule-0-match-2", "rule-0-match-2"),
                    ("masked_remote_address", "0.0.0.0/0"),
                ],
            ),
            5,
            SECOND,
        )],
    },
    Case {
        source: "multiple-domains.yaml (routes @ 6daffccb): a shared rule in its policy's \
                 domain beside an unshared one in the listener's, v1.9.x",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: second-route
    value: second-route
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {requests_per_unit: 5, unit: SECOND}
---
name: test-namespace/test-policy-1
domain: test-namespace/test-policy-1
descriptors:
  - key: test-namespace/test-policy-1/rule/0
    value: test-namespace/test-policy-1/rule/0
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[
            // `first-route` with `x-user-id: one`: the shared rule's domain.
            Expect::Limit(
                (
                    "test-namespace/test-policy-1",
                    &[POLICY_1_RULE_0, RULE_0_MATCH_0],
                ),
                5,
                SECOND,
            ),
            // `second-route` with `x-user-id: one`: the listener's.
            Expect::Limit(
                (
                    "first-listener",
                    &[("second-route", "second-route"), RULE_0_MATCH_0],
                ),
                5,
                SECOND,
            ),
        ],
    },
    Case {
        source: "multiple-listeners-distinct-match (routes @ 0e47507f): two listeners, one \
                 domain each, main after v1.9",
        config: "
name: first-listener
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: test-namespace/test-policy-1/rule/0
        value: test-namespace/test-policy-1/rule/0
        descriptors:
          - key: rule-0-match-0
            rate_limit: {requests_per_unit: 5, unit: SECOND}
---
name: second-listener
domain: second-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: test-namespace/test-policy-2/rule/0
        value: test-namespace/test-policy-2/rule/0
        descriptors:
          - key: rule-0-match-0
            rate_limit: {requests_per_unit: 5, unit: SECOND}
",
        expect: &[
            Expect::Limit(
                (
                    "second-listener",
                    &[
                        FIRST_ROUTE,
                        (
                            "test-namespace/test-policy-2/rule/0",
                            "test-namespace/test-policy-2/rule/0",
                        ),
                        ("rule-0-match-0", "dave"),
                    ],
                ),
                5,
                SECOND,
            ),
            // The first listener's rule is not the second's.
            Expect::Unmatched((
                "second-listener",
                &[FIRST_ROUTE, POLICY_1_RULE_0, ("rule-0-match-0", "dave")],
            )),
        ],
    },
];

/// A unit's name in Envoy Gateway's files, as Envoy's number.
fn unit(name: &str) -> i32 {
    match name {
        "SECOND" => SECOND,
        "MINUTE" => 2,
        "HOUR" => HOUR,
        "DAY" => 4,
        "MONTH" => MONTH,
        "YEAR" => YEAR,
        "WEEK" => 7,
        other => panic!("unit {other}"),
    }
}

fn node(yaml: &serde_yaml::Value) -> RateLimitDescriptor {
    let text = |key: &str| yaml[key].as_str().unwrap_or_default().to_owned();
    let flag = |key: &str| yaml[key].as_bool().unwrap_or(false);
    let rate_limit = yaml["rate_limit"].as_mapping().map(|_| {
        let policy = &yaml["rate_limit"];
        RateLimitPolicy {
            unit: policy["unit"].as_str().map_or(0, unit),
            requests_per_unit: policy["requests_per_unit"].as_u64().unwrap_or(0) as u32,
            unlimited: policy["unlimited"].as_bool().unwrap_or(false),
            name: policy["name"].as_str().unwrap_or_default().to_owned(),
        }
    });
    RateLimitDescriptor {
        key: text("key"),
        value: text("value"),
        rate_limit,
        descriptors: yaml["descriptors"]
            .as_sequence()
            .map(|children| children.iter().map(node).collect())
            .unwrap_or_default(),
        shadow_mode: flag("shadow_mode"),
        detailed_metric: flag("detailed_metric"),
        quota_mode: flag("quota_mode"),
    }
}

/// The resources of a case's YAML documents, each named after its `name` (or domain).
fn resources(config: &str) -> Vec<Any> {
    serde_yaml::Deserializer::from_str(config)
        .map(|document| {
            let yaml = serde_yaml::Value::deserialize(document).expect("a YAML document");
            let domain = yaml["domain"].as_str().expect("domain").to_owned();
            let resource = RateLimitConfig {
                name: yaml["name"].as_str().unwrap_or(&domain).to_owned(),
                domain,
                descriptors: yaml["descriptors"]
                    .as_sequence()
                    .map(|nodes| nodes.iter().map(node).collect())
                    .unwrap_or_default(),
            };
            Any {
                type_url: TYPE_URL.into(),
                value: resource.encode_to_vec(),
            }
        })
        .collect()
}

/// Runs every case against floodgate on `backend` (memory when `None`).
async fn every_case_answers(backend: impl Fn() -> Option<BackendSettings>) {
    common::away_from_an_hour_boundary().await;
    for case in CASES {
        let ads = AdsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Some(("v1".into(), resources(case.config))),
        )
        .await;
        let addr = ads.addr;
        let backend = backend();
        let server = start_floodgate(|settings| {
            settings.xds = Some(xds_settings(addr));
            if let Some(backend) = backend {
                settings.backend = backend;
                settings.limiter.backend_timeout = Duration::from_secs(2);
            }
        })
        .await;
        for expect in case.expect {
            check(&server, expect, case.source).await;
        }
        server.stop().await;
    }
}

async fn check(server: &TestServer, expect: &Expect, source: &str) {
    let mut client = server.client().await;
    let call = |(domain, entries): Sent| request(domain, vec![descriptor(entries)]);
    match *expect {
        Expect::Limit(sent, limit, unit) => {
            let answer = should_rate_limit(&mut client, call(sent)).await;
            let current = answer.statuses[0].current_limit.as_ref();
            let got = current.map(|c| (c.requests_per_unit, c.unit));
            assert_eq!(got, Some((limit, unit)), "{source}: {sent:?}");
        }
        Expect::Unmatched(sent) => {
            let answer = should_rate_limit(&mut client, call(sent)).await;
            assert!(
                answer.statuses[0].current_limit.is_none(),
                "{source}: {sent:?}"
            );
            assert_eq!(answer.overall_code, Code::Ok as i32, "{source}");
        }
        Expect::Admits(sent, admitted) => {
            // Some of these limits are per second: all the calls fall in one.
            common::start_of_the_next_second().await;
            for i in 0..=admitted {
                let answer = should_rate_limit(&mut client, call(sent)).await;
                let wanted = if i < admitted {
                    Code::Ok
                } else {
                    Code::OverLimit
                };
                assert_eq!(answer.overall_code, wanted as i32, "{source}: call {i}");
            }
        }
        Expect::AlwaysAdmitted(sent, calls) => {
            for i in 0..calls {
                let answer = should_rate_limit(&mut client, call(sent)).await;
                assert_eq!(answer.overall_code, Code::Ok as i32, "{source}: call {i}");
                assert!(answer.statuses[0].current_limit.is_some(), "{source}");
            }
        }
    }
}

#[tokio::test]
async fn envoy_gateways_rule_shapes_answer_on_memory() {
    every_case_answers(|| None).await;
}

#[tokio::test]
async fn envoy_gateways_rule_shapes_answer_on_redis() {
    let redis = RedisServer::start();
    every_case_answers(|| {
        Some(BackendSettings::Redis {
            url: redis.url(),
            options: redis_options(Duration::from_secs(2)),
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_rule_shapes_answer_on_a_cluster() {
    let cluster = RedisCluster::start_async().await;
    every_case_answers(|| {
        Some(BackendSettings::Cluster {
            urls: cluster.urls(),
            options: redis_options(Duration::from_secs(2)),
        })
    })
    .await;
}

/// Envoy AI Gateway's `QuotaPolicy` as its translator renders it
/// (`internal/ratelimit/translator/translator.go` in envoyproxy/ai-gateway @ 31d1f94a): one
/// domain, `ai-gateway-quota`, a backend, a model, a bucket rule on header `x-tenant`
/// exact `a` (100 a minute) and the default bucket (10 a minute), every leaf `quota_mode`.
const QUOTA_POLICY: &str = "
name: ai-gateway-quota
domain: ai-gateway-quota
descriptors:
  - key: backend_name
    value: default/openai
    descriptors:
      - key: model_name_override
        value: gpt-4
        descriptors:
          - key: rule-0-x-tenant|a-match-0
            value: rule-0-x-tenant|a-match-0
            quota_mode: true
            rate_limit: {requests_per_unit: 100, unit: MINUTE}
          - key: rule-1-match--1
            value: rule-1-match--1
            quota_mode: true
            rate_limit: {requests_per_unit: 10, unit: MINUTE}
";

/// What AI Gateway's filter (`internal/extensionserver/quota_ratelimit.go` @ 31d1f94a)
/// sends for a request of tenant `tenant` (`Some("a")` matches the bucket rule): one
/// descriptor per rule that applies, each `(backend_name, model_name_override, rule)`, with
/// `hits_addend` `cost` (1 at request time; the response's `quota_cost` at stream end).
fn quota_request(
    tenant_a: bool,
    cost: u64,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    let mut descriptors = Vec::new();
    let rules: &[&str] = if tenant_a {
        &["rule-0-x-tenant|a-match-0", "rule-1-match--1"]
    } else {
        &["rule-1-match--1"]
    };
    for rule in rules {
        let mut entry = descriptor(&[
            ("backend_name", "default/openai"),
            ("model_name_override", "gpt-4"),
            (rule, rule),
        ]);
        entry.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: cost });
        descriptors.push(entry);
    }
    request("ai-gateway-quota", descriptors)
}

/// floodgate as `envoy-ai-gateway-ratelimit` (node id and rules over xDS as AI Gateway's
/// runner serves them): a request is checked at 1, its response's tokens are charged at
/// stream end (xDS rules `consume`), and it is refused only once every quota bucket it
/// names is spent, as `quota_mode` says.
#[tokio::test]
async fn ai_gateways_quota_policy_spends_and_refuses_as_its_filter_expects() {
    // A minute's window: keep the few calls below inside one.
    let into_minute = floodgate::clock::SystemClock.now_ms().rem_euclid(60_000);
    if into_minute > 55_000 {
        tokio::time::sleep(Duration::from_millis((60_500 - into_minute) as u64)).await;
    }
    let ads = AdsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(("v1".into(), resources(QUOTA_POLICY))),
    )
    .await;
    let addr = ads.addr;
    let server = start_floodgate(|settings| {
        let mut xds = xds_settings(addr);
        xds.node_id = "envoy-ai-gateway-ratelimit".into();
        settings.xds = Some(xds);
    })
    .await;
    let mut client = server.client().await;
    let code = |answer: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        answer.overall_code
    };
    // Tenant a asks, and its response costs 12 tokens: the default bucket (10) is spent,
    // the tenant's (100) is not, so its next request passes.
    let asked = should_rate_limit(&mut client, quota_request(true, 1)).await;
    assert_eq!(code(&asked), Code::Ok as i32);
    should_rate_limit(&mut client, quota_request(true, 12)).await;
    let again = should_rate_limit(&mut client, quota_request(true, 1)).await;
    assert_eq!(
        code(&again),
        Code::Ok as i32,
        "one quota bucket still has room"
    );
    assert_eq!(again.statuses[1].code, Code::OverLimit as i32);
    // Another tenant names only the default bucket: refused.
    let other = should_rate_limit(&mut client, quota_request(false, 1)).await;
    assert_eq!(code(&other), Code::OverLimit as i32);
    // A response of 200 tokens spends tenant a's too: now refused.
    should_rate_limit(&mut client, quota_request(true, 200)).await;
    let spent = should_rate_limit(&mut client, quota_request(true, 1)).await;
    assert_eq!(code(&spent), Code::OverLimit as i32);
    server.stop().await;
}
