//! One script call routed by its key through the client, which follows `MOVED` and `ASK`:
//! what goes again when a node lacks the script, and the `MOVED` the client leaves unfollowed.

use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use tokio::time::{Instant, timeout_at};

use super::{Cluster, MAX_MOVED};
use crate::backend::BackendError;
use crate::backend::redis::calls::Call;
use crate::backend::redis::errors;

impl Cluster {
    /// Runs one script call; after `NOSCRIPT` or `Function not found` (a node that never saw
    /// the script, such as a freshly promoted replica) it goes again as `EVAL`, or after the
    /// library's load on the node that owns the key.
    pub(super) async fn run(&self, call: &Call, work_ends: Instant) -> Result<Value, BackendError> {
        let mut conn = self.conn.clone();
        let first = call.command(&self.scripts, self.scripting.first());
        match timeout_at(work_ends, follow_moved(&mut conn, first)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if errors::is_missing_error(&e) => {
                let (load, via) = self.scripting.again(&self.scripts);
                if let Some(load) = load {
                    let owner = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_key(call.key(), SlotAddr::Master),
                    ));
                    self.bounded(work_ends, conn.route_command(load, owner))
                        .await?;
                }
                let again = call.command(&self.scripts, via);
                self.bounded(work_ends, follow_moved(&mut conn, again))
                    .await
            }
            Ok(Err(e)) => Err(self.secrets.scrub(errors::classify(&e))),
            Err(_) => Err(BackendError::Timeout),
        }
    }
}

/// Sends `cmd` (routed by its key through the client, which follows `MOVED` and `ASK` on its
/// own), and when the client still answers `MOVED` (its retries went by a slot map read from
/// a node that had not yet learnt of a slot's move), sends it to the node that the `MOVED`
/// names, up to `MAX_MOVED` times. A `MOVED` means the command did not run, so it never
/// runs twice.
pub(super) async fn follow_moved(
    conn: &mut ClusterConnection,
    cmd: redis::Cmd,
) -> redis::RedisResult<Value> {
    let mut result = cmd.query_async::<Value>(conn).await;
    for _ in 0..MAX_MOVED {
        let target = match &result {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => e
                .redirect_node()
                .and_then(|(address, _)| address.rsplit_once(':'))
                .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?))),
            _ => None,
        };
        let Some((host, port)) = target else { break };
        let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
        result = conn.route_command(cmd.clone(), node).await;
    }
    result
}
