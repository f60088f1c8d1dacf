//! Assignments and abandons as the protobuf actions Envoy reads.

use crate::proto::rlqs::BucketId;
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;
use crate::proto::rlqs::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use crate::proto::types::rate_limit_strategy::{BlanketRule, Strategy as WireStrategy};
use crate::proto::types::{RateLimitStrategy, TokenBucket};

use super::strategy::{Assignment, Strategy};
use super::validate::BucketPairs;

/// The action assigning `assignment` to the bucket `id`.
pub fn assign(id: &BucketPairs, assignment: &Assignment) -> BucketAction {
    let strategy = match assignment.strategy {
        Strategy::AllowAll => WireStrategy::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::DenyAll => WireStrategy::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval,
        } => WireStrategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(tokens_per_fill.into()),
            fill_interval: Some(fill_interval.into()),
        }),
    };
    BucketAction {
        bucket_id: Some(bucket_id(id)),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(assignment.ttl.into()),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// The action telling the client to forget the bucket `id`.
pub fn abandon(id: &BucketPairs) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(id)),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn bucket_id(id: &BucketPairs) -> BucketId {
    BucketId {
        bucket: id.iter().cloned().collect(),
    }
}
