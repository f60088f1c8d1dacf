//! The quota service's (RLQS) metrics, `floodgate_rlqs_*`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{KindLabels, ReasonLabels};

/// The metrics of the quota service (RLQS), `floodgate_rlqs_*`.
#[derive(Clone, Default)]
pub struct RlqsMetrics {
    /// Open quota streams.
    pub streams: Gauge,
    /// Buckets held by open streams.
    pub buckets: Gauge,
    /// Bucket usage reports received.
    pub reports: Counter,
    /// Assignments sent, by strategy (`allow_all`, `deny_all`, `token_bucket`).
    pub assignments: Family<KindLabels, Counter>,
    /// Buckets abandoned for want of demand or of reports.
    pub abandons: Counter,
    /// Buckets of reports left unanswered, by reason (one of [`RLQS_SKIP_REASONS`]).
    pub skipped: Family<ReasonLabels, Counter>,
    /// Streams ended by the server, by reason (one of [`RLQS_STREAM_END_REASONS`]).
    pub stream_ends: Family<ReasonLabels, Counter>,
}

/// The strategies `RlqsMetrics::assignments` counts, created up front so dashboards show 0.
pub const RLQS_STRATEGIES: [&str; 3] = ["allow_all", "deny_all", "token_bucket"];
/// Why a reported bucket is skipped: a malformed id or `time_elapsed`, or a bound on the
/// buckets held.
pub const RLQS_SKIP_REASONS: [&str; 4] = ["empty_id", "bad_id", "bad_time_elapsed", "bucket_limit"];
/// Why the server ends a stream: a message it cannot decode, a frame that breaks gRPC's
/// framing (a compressed flag without `grpc-encoding`, a flag other than 0 or 1, a message
/// cut short), a bad domain, a client that does not read its answers.
pub const RLQS_STREAM_END_REASONS: [&str; 4] = [
    "undecodable",
    "malformed_frame",
    "bad_domain",
    "not_reading",
];

impl RlqsMetrics {
    /// Counts one assignment sent with `strategy` (one of [`RLQS_STRATEGIES`]).
    pub fn assigned(&self, strategy: &str) {
        self.assignments
            .get_or_create(&KindLabels {
                kind: strategy.to_owned(),
            })
            .inc();
    }

    /// Counts one reported bucket skipped for `reason` (one of [`RLQS_SKIP_REASONS`]).
    pub fn skipped(&self, reason: &'static str) {
        self.skipped.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts one stream ended for `reason` (one of [`RLQS_STREAM_END_REASONS`]).
    pub fn stream_ended(&self, reason: &'static str) {
        self.stream_ends
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        for strategy in RLQS_STRATEGIES {
            let _ = self.assignments.get_or_create(&KindLabels {
                kind: strategy.to_owned(),
            });
        }
        for reason in RLQS_SKIP_REASONS {
            let _ = self.skipped.get_or_create(&ReasonLabels { reason });
        }
        for reason in RLQS_STREAM_END_REASONS {
            let _ = self.stream_ends.get_or_create(&ReasonLabels { reason });
        }
        let rlqs = registry.sub_registry_with_prefix("rlqs");
        rlqs.register("streams", "Open RLQS streams", self.streams.clone());
        rlqs.register(
            "buckets",
            "Buckets held by open RLQS streams",
            self.buckets.clone(),
        );
        rlqs.register(
            "reports",
            "RLQS bucket usage reports received",
            self.reports.clone(),
        );
        rlqs.register(
            "assignments",
            "RLQS quota assignments sent, by strategy (kind)",
            self.assignments.clone(),
        );
        rlqs.register(
            "abandons",
            "RLQS buckets abandoned after no demand for --rlqs-abandon-after",
            self.abandons.clone(),
        );
        rlqs.register(
            "skipped_buckets",
            "RLQS reported buckets left unanswered, by reason",
            self.skipped.clone(),
        );
        rlqs.register(
            "stream_ends",
            "RLQS streams ended by the server, by reason",
            self.stream_ends.clone(),
        );
    }
}
