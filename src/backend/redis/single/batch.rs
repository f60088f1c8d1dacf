//! Natural batching: requests bound for the node while script calls are in flight wait in a
//! queue, and the next call takes all of them as one `lua/batch.lua` call. At low load a
//! request finds a free slot and goes out at once; under load one call carries many
//! requests, so Redis parses one command and floodgate makes one round trip for all of
//! them. No timer ever holds a request back.

use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::Node;
use crate::backend::redis::scripts::{self, BatchCall};
use crate::backend::{BackendError, Outcome};

/// Script calls in flight at once on the node's connections; more requests wait and share
/// the next call. Redis runs one script at a time, so two keep it busy (one runs while the
/// other travels); more would only split the queue into smaller calls, and each call has a
/// fixed cost in Redis (about as much as five items: `TIME`, the call, the reply).
const MAX_IN_FLIGHT: usize = 2;
/// Most items in one call: bounds how long one script keeps Redis busy.
const MAX_ITEMS: usize = 256;

/// One request waiting for its call.
pub(super) struct Job {
    /// The request's group, encoded.
    pub call: BatchCall,
    /// When its caller stops waiting.
    pub deadline: Instant,
    /// Where its outcomes go.
    pub reply: oneshot::Sender<Result<Vec<Outcome>, BackendError>>,
}

/// Takes queued jobs into calls, at most `MAX_IN_FLIGHT` at a time, until the backend is
/// dropped (its sender closes the queue), then lets the calls in flight finish.
///
/// The calls run inside this task (polled together), not in a task each: a batch costs no
/// spawn and no extra wake-up between the batcher and the connection's driver.
pub(super) async fn run(node: Arc<Node>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut in_flight = FuturesUnordered::new();
    let mut held = None;
    loop {
        if in_flight.len() >= MAX_IN_FLIGHT {
            in_flight.next().await;
            continue;
        }
        let first = match held.take() {
            Some(job) => job,
            None => tokio::select! {
                // A call that ends frees its slot; an empty set disables this branch.
                Some(()) = in_flight.next() => continue,
                job = jobs.recv() => match job {
                    Some(job) => job,
                    None => break,
                },
            },
        };
        let mut items = first.call.len();
        let mut batch = vec![first];
        while let Ok(job) = jobs.try_recv() {
            if items + job.call.len() > MAX_ITEMS {
                held = Some(job);
                break;
            }
            items += job.call.len();
            batch.push(job);
        }
        in_flight.push(send(&node, batch));
    }
    while in_flight.next().await.is_some() {}
}

/// Sends one call for `jobs` and hands each job its outcomes (or the call's error).
async fn send(node: &Node, jobs: Vec<Job>) {
    let now = Instant::now();
    // A caller that gave up or ran out of time is not sent: nothing is booked for it.
    let (live, late): (Vec<Job>, Vec<Job>) = jobs
        .into_iter()
        .partition(|job| !job.reply.is_closed() && job.deadline > now);
    for job in late {
        let _ = job.reply.send(Err(BackendError::Timeout));
    }
    let Some(deadline) = live.iter().map(|job| job.deadline).max() else {
        return;
    };
    let calls: Vec<&BatchCall> = live.iter().map(|job| &job.call).collect();
    let result = node.run_batch(&calls, deadline).await;
    match result {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for job in live {
                let mine = outcomes.by_ref().take(job.call.len()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(error) => {
            for job in live {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
    }
}

impl Node {
    /// Runs one batch call until `deadline`; a node that does not know the script or the
    /// function (flushed, restarted, promoted) gets it again, as `EVAL` or after the
    /// library's load in the same round trip: the first call did not run.
    async fn run_batch(
        &self,
        calls: &[&BatchCall],
        deadline: Instant,
    ) -> Result<Vec<Outcome>, BackendError> {
        let mut conn = self.borrow(deadline).await?;
        let mut reply = Value::Nil;
        for retry in [false, true] {
            let (load, via) = match retry {
                false => (None, self.scripting.first()),
                true => self.scripting.again(&self.scripts),
            };
            let mut pipe = redis::pipe();
            // The server's error comes back as the reply, so a missing script can be told
            // apart.
            pipe.ignore_errors();
            if let Some(load) = load {
                pipe.add_command(load);
            }
            pipe.add_command(BatchCall::command(calls, &self.scripts, via));
            let mut values = conn
                .query(&pipe, deadline)
                .await
                .map_err(|e| self.secrets.scrub(e))?;
            reply = values.pop().unwrap_or(Value::Nil);
            if !scripts::is_missing(&reply) {
                break;
            }
        }
        let items = calls.iter().map(|call| call.len()).sum();
        scripts::batch_outcomes(reply, items).map_err(|e| self.secrets.scrub(e))
    }
}
