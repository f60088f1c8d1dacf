//! Rules over xDS: a State of the World subscription on the aggregated discovery service
//! (ADS), as the reference service's `CONFIG_TYPE=GRPC_XDS_SOTW` client does.
//!
//! One stream, one resource type ([`convert::TYPE_URL`]), a wildcard subscription. Every
//! response holds the whole rule set; it is converted through the YAML files' validation
//! ([`convert`]) and either swapped in atomically and ACKed (its version and nonce), or
//! NACKed with the error text while the previous rules keep serving. A broken stream is
//! reopened after a backoff ([`backoff`]), resubscribing with the last ACKed version; the
//! rules in force stay in force meanwhile. Loads count in `config_load_success` /
//! `config_load_error` like file reloads.

pub mod backoff;
pub mod convert;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use backoff::{Backoff, BackoffError};

use crate::config::{self, ConfigErrors};
use crate::limiter::Limiter;
use crate::matcher::Matcher;
use crate::proto::core::Node;
use crate::proto::core::node::UserAgentVersionType;
use crate::proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::discovery::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::google::rpc::Status as RpcStatus;

/// Longest NACK message sent back; a huge invalid config must not make a huge request.
const MAX_ERROR_DETAIL_BYTES: usize = 16 * 1024;
/// Default bound on connecting to the management server and on opening the stream there
/// ([`XdsSettings::stall_timeout`]).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Default largest xDS response, in bytes (tonic's and gRPC's usual 4 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;
/// HTTP/2 pings on the channel, so a half-open connection (a peer that vanished without a
/// FIN) is noticed and reconnected instead of keeping stale rules in force forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// An unanswered ping closes the channel after this.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// gRPC status code INVALID_ARGUMENT, carried in a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// How to reach the management server and present this client to it.
#[derive(Clone, PartialEq)]
pub struct XdsSettings {
    /// `host:port` (plain, or TLS when `tls` is set) or a full `http(s)://` URL.
    pub server: String,
    /// `node.id`: the management server picks the snapshot by it.
    pub node_id: String,
    /// `node.metadata`, as string values.
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent with the stream (e.g. an authorization token).
    pub headers: Vec<(String, String)>,
    /// TLS towards the server; `None` for plaintext.
    pub tls: Option<XdsTls>,
    /// Reconnect schedule.
    pub backoff: Backoff,
    /// Bound on connecting and on opening the stream: a server that accepts and never
    /// answers is left and retried (with backoff) instead of keeping the rules stale.
    pub stall_timeout: Duration,
    /// Largest response accepted from the server, in bytes (the reference's
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`); a larger one fails the stream, which reconnects.
    pub max_message_bytes: usize,
}

/// Client TLS towards the management server. Files are read at every connect, so rotated
/// certificates apply at the next reconnect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XdsTls {
    /// PEM client certificate chain (mutual TLS), with `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// PEM CA bundle that signs the server; the public web roots when absent.
    pub ca: Option<PathBuf>,
    /// Name to verify in the server certificate instead of the URL's host.
    pub san: Option<String>,
}

/// Header values may be credentials: only their names are shown.
impl fmt::Debug for XdsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("XdsSettings")
            .field("server", &self.shown_server())
            .field("node_id", &self.node_id)
            .field("node_metadata", &self.node_metadata)
            .field("header_names", &header_names)
            .field("tls", &self.tls)
            .field("backoff", &self.backoff)
            .finish()
    }
}

/// Why xDS settings cannot be used; never echoes a header value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum XdsSettingsError {
    /// The server is not a URL tonic can connect to (shown with credentials masked).
    #[error("invalid xDS server `{server}`: {reason}")]
    Server {
        /// The server, masked.
        server: String,
        /// Why.
        reason: String,
    },
    /// A client header name is not a valid gRPC metadata key.
    #[error("invalid xDS client header name `{0}`")]
    HeaderName(String),
    /// A client header value is not valid ASCII metadata (the value is not shown).
    #[error("the value of xDS client header `{0}` is not valid")]
    HeaderValue(String),
    /// A client certificate without its key, or a key without its certificate.
    #[error("xDS client TLS needs both a certificate and its key, or neither")]
    TlsPair,
    /// The reconnect schedule.
    #[error(transparent)]
    Backoff(#[from] BackoffError),
}

impl XdsSettings {
    /// Checks what can be checked before connecting, never echoing a header value.
    ///
    /// # Errors
    /// An unusable server URL, header, TLS file pairing or backoff.
    pub fn check(&self) -> Result<(), XdsSettingsError> {
        Endpoint::from_shared(self.uri()).map_err(|error| XdsSettingsError::Server {
            server: self.shown_server(),
            reason: error.to_string(),
        })?;
        for (name, value) in &self.headers {
            AsciiMetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|_| XdsSettingsError::HeaderName(name.clone()))?;
            AsciiMetadataValue::try_from(value.as_str())
                .map_err(|_| XdsSettingsError::HeaderValue(name.clone()))?;
        }
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            return Err(XdsSettingsError::TlsPair);
        }
        Ok(self.backoff.check()?)
    }

    /// The server as logs show it: credentials in the URL masked.
    pub fn shown_server(&self) -> String {
        crate::redact::url(&self.server)
    }

    /// The server as a URI: a bare `host:port` gets the scheme its TLS setting implies.
    fn uri(&self) -> String {
        if self.server.contains("://") {
            return self.server.clone();
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.server)
    }

    fn node(&self) -> Node {
        let metadata: pbjson_types::Struct = self
            .node_metadata
            .iter()
            .map(|(key, value)| (key.clone(), pbjson_types::Value::from(value.clone())))
            .collect();
        Node {
            id: self.node_id.clone(),
            cluster: String::new(),
            metadata: Some(metadata),
            user_agent_name: "floodgate".to_owned(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").to_owned(),
            )),
        }
    }

    fn request(&self, version: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(self.node()),
            resource_names: Vec::new(),
            type_url: convert::TYPE_URL.to_owned(),
            response_nonce: nonce.to_owned(),
            error_detail: error.map(|message| RpcStatus {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            }),
        }
    }
}

/// The running subscription; stopped when dropped.
pub struct XdsClient {
    task: JoinHandle<()>,
    hangups: Option<JoinHandle<()>>,
    applied: watch::Receiver<bool>,
}

impl XdsClient {
    /// Starts subscribing; rules go into `limiter` as they arrive.
    pub fn start(settings: XdsSettings, limiter: Arc<Limiter>) -> XdsClient {
        let (applied_tx, applied) = watch::channel(false);
        let task = tokio::spawn(run(settings, limiter, applied_tx));
        XdsClient {
            task,
            hangups: ignore_hangups(),
            applied,
        }
    }

    /// Becomes true once a first update has been applied, and stays true.
    pub fn applied(&self) -> watch::Receiver<bool> {
        self.applied.clone()
    }

    /// Waits until a first update has been applied.
    pub async fn first_update(&self) {
        let mut applied = self.applied.clone();
        // The sender lives in the task, which only ends when aborted (by our drop).
        let _ = applied.wait_for(|applied| *applied).await;
    }
}

impl Drop for XdsClient {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(hangups) = &self.hangups {
            hangups.abort();
        }
    }
}

/// With xDS, SIGHUP has nothing to reload; catching it keeps its default action (exit) from
/// ending a process that operators signal out of habit.
fn ignore_hangups() -> Option<JoinHandle<()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup()).ok()?;
        Some(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::info!("SIGHUP ignored: the rules come from the xDS server");
            }
        }))
    }
    #[cfg(not(unix))]
    None
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("stream failed: {0}")]
    Status(#[from] tonic::Status),
    #[error("cannot send on the stream")]
    Send,
}

async fn run(settings: XdsSettings, limiter: Arc<Limiter>, applied: watch::Sender<bool>) {
    let mut acked = String::new();
    let mut delays = settings.backoff.delays();
    for (name, _) in &settings.headers {
        tracing::debug!(header = %name, "xDS client header set");
    }
    let server = settings.shown_server();
    let secrets = crate::redact::Secrets::of(&[&settings.server]);
    loop {
        match stream(&settings, &limiter, &applied, &mut acked, &mut delays).await {
            Ok(()) => tracing::warn!(%server, "xDS stream closed by the server"),
            Err(error) => {
                let error = secrets.scrub(error.to_string());
                tracing::warn!(%server, %error, "xDS stream down");
            }
        }
        let delay = delays.next_delay();
        tracing::info!(
            delay_ms = delay.as_millis() as u64,
            version = %acked,
            "reconnecting to the xDS server; the current rules keep serving"
        );
        tokio::time::sleep(delay).await;
    }
}

/// One stream: subscribe (with the last ACKed version), then answer every response.
async fn stream(
    settings: &XdsSettings,
    limiter: &Arc<Limiter>,
    applied: &watch::Sender<bool>,
    acked: &mut String,
    delays: &mut backoff::Delays,
) -> Result<(), StreamError> {
    let channel = connect(settings).await?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(settings.max_message_bytes);
    let (mut requests, outgoing) = futures::channel::mpsc::channel::<DiscoveryRequest>(4);
    requests
        .send(settings.request(acked, "", None))
        .await
        .map_err(|_| StreamError::Send)?;
    let mut call = tonic::Request::new(outgoing);
    for (name, value) in &settings.headers {
        // Checked at startup (`XdsSettings::check`).
        if let (Ok(name), Ok(value)) = (
            AsciiMetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()),
            AsciiMetadataValue::try_from(value.as_str()),
        ) {
            call.metadata_mut().insert(name, value);
        }
    }
    let opened = tokio::time::timeout(
        settings.stall_timeout,
        client.stream_aggregated_resources(call),
    );
    let mut responses = opened
        .await
        .map_err(|_| StreamError::Connect("no answer to opening the stream".into()))??
        .into_inner();
    let server = settings.shown_server();
    tracing::info!(%server, node = %settings.node_id, "xDS stream open");
    while let Some(response) = responses.message().await? {
        delays.reset();
        let reply = answer(settings, limiter, &response, acked).await;
        if reply.error_detail.is_none() {
            applied.send_replace(true);
        }
        requests.send(reply).await.map_err(|_| StreamError::Send)?;
    }
    Ok(())
}

async fn connect(settings: &XdsSettings) -> Result<Channel, StreamError> {
    let mut endpoint = Endpoint::from_shared(settings.uri())
        .map_err(|error| StreamError::Connect(error.to_string()))?
        .connect_timeout(settings.stall_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if let Some(tls) = &settings.tls {
        endpoint = endpoint
            .tls_config(tls_config(tls).await?)
            .map_err(|error| StreamError::Connect(error.to_string()))?;
    }
    endpoint
        .connect()
        .await
        .map_err(|error| StreamError::Connect(error.to_string()))
}

async fn tls_config(tls: &XdsTls) -> Result<ClientTlsConfig, StreamError> {
    async fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>, StreamError> {
        tokio::fs::read(path).await.map_err(|error| {
            StreamError::Connect(format!(
                "cannot read the xDS {what} {}: {error}",
                path.display()
            ))
        })
    }
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca, "CA").await?)),
        None => config.with_webpki_roots(),
    };
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        let identity = Identity::from_pem(
            read(cert, "client certificate").await?,
            read(key, "client key").await?,
        );
        config = config.identity(identity);
    }
    if let Some(san) = &tls.san {
        config = config.domain_name(san.clone());
    }
    Ok(config)
}

/// Applies one response and builds its ACK, or its NACK with the old rules kept.
async fn answer(
    settings: &XdsSettings,
    limiter: &Limiter,
    response: &DiscoveryResponse,
    acked: &mut String,
) -> DiscoveryRequest {
    let metrics = limiter.metrics();
    match apply(limiter, response).await {
        Ok(()) => {
            metrics.config_load_success.inc();
            acked.clone_from(&response.version_info);
            settings.request(acked, &response.nonce, None)
        }
        Err(error) => {
            metrics.config_load_error.inc();
            tracing::error!(
                version = %response.version_info,
                %error,
                "xDS update rejected (NACK); keeping the previous rules"
            );
            settings.request(acked, &response.nonce, Some(bounded(error.to_string())))
        }
    }
}

/// Why an xDS response is refused (NACK); the text is the NACK's detail.
#[derive(Debug, thiserror::Error)]
enum Rejected {
    /// Resources of a type this client did not ask for.
    #[error("type `{0}` was not subscribed to (expected {TYPE_URL})", TYPE_URL = convert::TYPE_URL)]
    Type(String),
    /// Rules that do not load, every error named.
    #[error(transparent)]
    Rules(#[from] ConfigErrors),
    /// The conversion task died.
    #[error("converting the resources failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

async fn apply(limiter: &Limiter, response: &DiscoveryResponse) -> Result<(), Rejected> {
    if response.type_url != convert::TYPE_URL {
        return Err(Rejected::Type(response.type_url.clone()));
    }
    let resources = response.resources.clone();
    let mut domains = tokio::task::spawn_blocking(move || convert::domains(&resources))
        .await?
        .map_err(ConfigErrors)?;
    config::apply_default_accounting(&mut domains, limiter.accounting());
    if limiter.rules().compiled_from(&domains) {
        tracing::debug!(version = %response.version_info, "xDS update unchanged");
        return Ok(());
    }
    let count = domains.len();
    if count == 0 && !limiter.rules().compiled_from(&[]) {
        // As the reference does, an empty snapshot is applied; but it is almost always a
        // management server's mistake, so it is said loudly (and alerted on: no domains).
        tracing::warn!(
            version = %response.version_info,
            "xDS update removes every rate limit rule; every call is now answered OK"
        );
    }
    limiter.replace_rules(Matcher::new(domains));
    tracing::info!(
        version = %response.version_info,
        domains = count,
        rules = limiter.rules().rules().len(),
        "xDS rules applied"
    );
    Ok(())
}

/// `text` cut to [`MAX_ERROR_DETAIL_BYTES`] on a character boundary.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_ERROR_DETAIL_BYTES {
        let mut end = MAX_ERROR_DETAIL_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" ...");
    }
    text
}

/// Parses the reference's `k=v,k2=v2` node metadata; entries without `=` are skipped with
/// a warning, as the reference skips them.
pub fn parse_node_metadata(text: &str) -> Vec<(String, String)> {
    parse_pairs(text, '=', "node metadata")
}

/// Parses the reference's `name:value,name2:value2` additional headers (envconfig's map
/// format); entries without `:` are skipped with a warning.
pub fn parse_headers(text: &str) -> Vec<(String, String)> {
    parse_pairs(text, ':', "client header")
}

fn parse_pairs(text: &str, separator: char, what: &str) -> Vec<(String, String)> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| match entry.split_once(separator) {
            Some((key, value)) if !key.trim().is_empty() => {
                Some((key.trim().to_owned(), value.trim().to_owned()))
            }
            _ => {
                // Only the part before any separator: a malformed header may hold a secret.
                tracing::warn!("xDS {what} entry without `{separator}` ignored");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> XdsSettings {
        XdsSettings {
            server: "cp:18000".into(),
            node_id: "n".into(),
            node_metadata: vec![],
            headers: vec![("authorization".into(), "Bearer s3cret".into())],
            tls: None,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            backoff: Backoff::default(),
        }
    }

    #[test]
    fn credentials_in_the_server_url_are_never_shown() {
        let mut xds = settings();
        xds.server = "http://user:pa55word@cp:18000".into();
        let shown = format!("{xds:?} {}", xds.shown_server());
        assert!(!shown.contains("pa55word"), "{shown}");
        assert!(shown.contains("cp:18000"), "{shown}");
        xds.server = "http://user:pa55word@[bad".into();
        let error = xds.check().unwrap_err().to_string();
        assert!(!error.contains("pa55word"), "{error}");
    }

    #[test]
    fn pairs_parse_like_the_reference() {
        assert_eq!(
            parse_node_metadata("a=1, b=x=y,,bad,c:3"),
            [("a".into(), "1".into()), ("b".into(), "x=y".into())]
        );
        assert_eq!(
            parse_headers("x-token:abc,x-b: d:e"),
            [
                ("x-token".into(), "abc".into()),
                ("x-b".into(), "d:e".into())
            ]
        );
    }

    #[test]
    fn uri_scheme_follows_tls_and_headers_stay_secret() {
        let mut xds = settings();
        assert_eq!(xds.uri(), "http://cp:18000");
        xds.tls = Some(XdsTls::default());
        assert_eq!(xds.uri(), "https://cp:18000");
        xds.server = "http://explicit:1".into();
        assert_eq!(xds.uri(), "http://explicit:1");
        let shown = format!("{xds:?}");
        assert!(
            shown.contains("authorization") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn settings_are_checked() {
        assert!(settings().check().is_ok());
        let mut bad = settings();
        bad.headers = vec![("bad header".into(), "v".into())];
        assert!(bad.check().is_err());
        let mut bad = settings();
        bad.tls = Some(XdsTls {
            cert: Some("c.pem".into()),
            ..XdsTls::default()
        });
        assert!(bad.check().is_err());
        let mut bad = settings();
        bad.server = "http://[bad".into();
        assert!(bad.check().is_err());
    }

    #[test]
    fn nack_text_is_bounded() {
        let long = "é".repeat(MAX_ERROR_DETAIL_BYTES);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_ERROR_DETAIL_BYTES + 4 && cut.ends_with(" ..."));
        assert_eq!(bounded("short".into()), "short");
    }

    #[test]
    fn requests_carry_node_version_nonce_and_error() {
        let mut xds = settings();
        xds.node_metadata = vec![("zone".into(), "a".into())];
        let nack = xds.request("v1", "n2", Some("bad".into()));
        assert_eq!(
            (nack.version_info.as_str(), nack.response_nonce.as_str()),
            ("v1", "n2")
        );
        assert_eq!(nack.type_url, convert::TYPE_URL);
        assert_eq!(nack.error_detail.unwrap().message, "bad");
        let node = nack.node.unwrap();
        assert_eq!(node.id, "n");
        assert!(node.metadata.unwrap().fields.contains_key("zone"));
    }
}
