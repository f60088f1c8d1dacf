//! What a Redis error means for a decision: the backend error kinds, and whether a reply says
//! that the node lacks the script or the function (so the call did not run and may go again).

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::backend::BackendError;

/// Whether a reply says that the node does not know the script or the function, so the
/// call did not run.
pub(crate) fn is_missing(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => {
            e.kind() == Some(ServerErrorKind::NoScript)
                || (e.code() == "ERR" && e.details() == Some(FUNCTION_NOT_FOUND))
        }
        _ => false,
    }
}

/// Whether an error says that the node does not know the script or the function.
pub(crate) fn is_missing_error(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
        || (err.code() == Some("ERR") && err.detail() == Some(FUNCTION_NOT_FOUND))
}

/// What Redis answers (after `ERR`) to an `FCALL` of a function it does not have.
const FUNCTION_NOT_FOUND: &str = "Function not found";

/// Maps a Redis error to the backend's error kinds, in words that carry no address or
/// credential: transport failures are `Unavailable`, answers from the server `Failed`.
///
/// Server errors keep their code first (`CLUSTERDOWN`, `LOADING`, `TRYAGAIN`, `MASTERDOWN`,
/// `READONLY`, `NOSCRIPT`, ...) and say whether waiting can help, so logs and operators can
/// tell a failover from a broken script.
pub(crate) fn classify(err: &RedisError) -> BackendError {
    match err.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => {
            BackendError::Unavailable(err.to_string())
        }
        ErrorKind::Server(_) | ErrorKind::Extension => server_error(err),
        ErrorKind::AuthenticationFailed => BackendError::failed("authentication failed"),
        _ => BackendError::failed(format!("{}: {err}", err.category())),
    }
}

/// A server's error reply as a `Failed` error with its code and whether waiting can help.
pub(crate) fn server_error(err: &RedisError) -> BackendError {
    let code = err.code().unwrap_or("ERR");
    let transient = matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
        )
    ) || code == "BUSY";
    let detail = err.detail().unwrap_or("");
    let class = if transient { "transient" } else { "permanent" };
    BackendError::Failed {
        detail: format!("{code} ({class}): {detail}"),
        transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(reply: &[u8]) -> RedisError {
        match redis::parse_redis_value(reply).unwrap() {
            Value::ServerError(e) => RedisError::from(e),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn errors_are_classified_with_their_code() {
        for (reply, code, class) in [
            (
                &b"-CLUSTERDOWN The cluster is down\r\n"[..],
                "CLUSTERDOWN",
                "transient",
            ),
            (
                b"-LOADING Redis is loading the dataset\r\n",
                "LOADING",
                "transient",
            ),
            (
                b"-TRYAGAIN Multiple keys request during rehashing\r\n",
                "TRYAGAIN",
                "transient",
            ),
            (
                b"-BUSY Redis is busy running a script\r\n",
                "BUSY",
                "transient",
            ),
            (b"-NOSCRIPT No matching script\r\n", "NOSCRIPT", "permanent"),
            (
                b"-ERR floodgate fixed_window: bad arguments\r\n",
                "ERR",
                "permanent",
            ),
        ] {
            let err = server(reply);
            let classified = classify(&err);
            let BackendError::Failed { detail: text, .. } = &classified else {
                panic!("{err:?} is not Failed");
            };
            assert!(text.starts_with(&format!("{code} ({class})")), "{text}");
            assert_eq!(classified.is_transient(), class == "transient", "{text}");
        }
        assert!(is_missing_error(&server(
            b"-NOSCRIPT No matching script\r\n"
        )));
        assert!(is_missing_error(&server(b"-ERR Function not found\r\n")));
        assert!(!is_missing_error(&server(b"-ERR floodgate batch: bad\r\n")));
        let reply = redis::parse_redis_value(b"-ERR Function not found\r\n").unwrap();
        assert!(is_missing(&reply));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(classify(&io), BackendError::Unavailable(_)));
        assert!(classify(&io).is_transient());
    }
}
