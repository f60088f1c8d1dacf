//! TLS settings that a plaintext scheme would silently ignore: each such pair stops startup
//! (exit 2) naming both settings, instead of sending rules, tokens or bucket keys in the
//! clear. The reference's variables map onto these flags first, so they are checked too.

use std::path::PathBuf;

use super::{BackendKind, ConfigSource, ServeArgs};

/// Every pair of a TLS setting and a plaintext scheme or mode in `args`, as messages.
pub(super) fn conflicts(args: &ServeArgs) -> Vec<String> {
    let mut found = Vec::new();
    if args.backend != BackendKind::Memory {
        let redis_tls = [
            ("--redis-ca-file", &args.redis_ca_file),
            ("--redis-tls-client-cert", &args.redis_tls_client_cert),
            ("--redis-tls-client-key", &args.redis_tls_client_key),
        ];
        for url in args.redis_url.iter().filter(|url| !url.is_tls()) {
            for flag in given(&redis_tls) {
                found.push(format!(
                    "{flag} is a TLS setting, but --redis-url `{}` is plaintext (use rediss://)",
                    url.redacted()
                ));
            }
        }
    }
    let xds = &args.xds;
    if xds.config_source == ConfigSource::Xds {
        let server = xds.xds_server.as_deref().unwrap_or_default();
        let plaintext_url = server.starts_with("http://");
        if xds.xds_tls && plaintext_url {
            found.push(format!(
                "--xds-tls asks for TLS, but --xds-server `{}` is plaintext (use https:// or \
                 host:port)",
                crate::redact::url(server)
            ));
        }
        let tls_files = [
            ("--xds-tls-ca", &xds.xds_tls_ca),
            ("--xds-tls-cert", &xds.xds_tls_cert),
            ("--xds-tls-key", &xds.xds_tls_key),
        ];
        let san = xds.xds_tls_san.as_ref().map(|_| "--xds-tls-san");
        if !xds.xds_tls && !server.starts_with("https://") {
            for flag in given(&tls_files).chain(san) {
                found.push(format!(
                    "{flag} is a TLS setting, but the connection to --xds-server is plaintext \
                     (add --xds-tls, or use an https:// URL)"
                ));
            }
        }
    }
    found
}

fn given<'a>(
    settings: &'a [(&'static str, &Option<PathBuf>)],
) -> impl Iterator<Item = &'static str> + 'a {
    settings
        .iter()
        .filter(|(_, value)| value.is_some())
        .map(|(flag, _)| *flag)
}
