//! The backend variables: `BACKEND_TYPE`, `REDIS_*` (URL, type, auth, TLS, pool) onto
//! `--backend`, `--redis-url` and the Redis TLS flags.

use super::*;

impl Mapper<'_> {
    pub(super) fn backend(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        let redis_set: Vec<_> = REDIS_VARIABLES
            .into_iter()
            .filter(|name| self.is_set(name))
            .collect();
        let choosers = ["BACKEND_TYPE", "REDIS_TYPE"];
        if self.claim(BACKEND, &choosers) {
            args.backend = self.reference_backend()?;
        } else if !self.explicit(BACKEND) && !redis_set.is_empty() {
            // No chooser set: the reference's default backend, Redis, is what these describe.
            args.backend = self.reference_backend()?;
            self.report.applied.push((redis_set[0], BACKEND.flag));
        }
        if args.backend == BackendKind::Memory {
            let tls_set: Vec<_> = REDIS_TLS_VARIABLES
                .into_iter()
                .map(|(name, _)| name)
                .filter(|name| self.is_set(name))
                .collect();
            let unused = redis_set
                .into_iter()
                .filter(|name| *name != "REDIS_TYPE")
                .chain(tls_set);
            self.report
                .overridden
                .extend(unused.map(|name| (name, BACKEND.flag)));
            return Ok(());
        }
        for (variable, setting) in REDIS_TLS_VARIABLES {
            if self.claim(setting, &[variable]) {
                let path = self.get(variable).map(PathBuf::from);
                match setting {
                    REDIS_TLS_CLIENT_CERT => args.redis_tls_client_cert = path,
                    REDIS_TLS_CLIENT_KEY => args.redis_tls_client_key = path,
                    _ => args.redis_ca_file = path,
                }
            }
        }
        let url_variables = ["REDIS_URL", "REDIS_AUTH", "REDIS_TLS", "REDIS_SOCKET_TYPE"];
        if !self.is_set("REDIS_URL") && !self.explicit(REDIS_URL) {
            for name in &url_variables[1..] {
                if self.is_set(name) {
                    self.warn(name, "has no effect without REDIS_URL; --redis-url applies");
                }
            }
        } else if self.claim(REDIS_URL, &url_variables) {
            args.redis_url = self.redis_urls(args.backend)?;
        }
        if self.claim(REDIS_POOL_SIZE, &["REDIS_POOL_SIZE"]) {
            let size = self.parse("REDIS_POOL_SIZE", |value| match value.parse::<u32>() {
                Ok(size) if size > 0 => Ok(size),
                _ => Err(format!("`{value}` is not a positive number of connections")),
            })?;
            args.redis_pool_size = size.unwrap_or(args.redis_pool_size);
            if args.backend == BackendKind::RedisCluster {
                self.warn(
                    "REDIS_POOL_SIZE",
                    "the Redis Cluster client multiplexes one connection per node; \
                     the pool size applies to --backend redis only",
                );
            }
        }
        Ok(())
    }

    /// The backend the reference would use: `BACKEND_TYPE` (default redis), then
    /// `REDIS_TYPE` (default single).
    fn reference_backend(&self) -> Result<BackendKind, ReferenceEnvError> {
        let backend_type = self
            .get("BACKEND_TYPE")
            .map(|value| value.to_ascii_lowercase());
        match backend_type.as_deref() {
            None | Some("redis") => self.redis_kind(),
            Some("memcache") => Err(invalid(
                "BACKEND_TYPE",
                "memcache is not supported; use Redis (BACKEND_TYPE=redis or --backend)",
            )),
            Some(other) => Err(invalid(
                "BACKEND_TYPE",
                format!("`{other}` is not a backend (expected redis)"),
            )),
        }
    }

    fn redis_kind(&self) -> Result<BackendKind, ReferenceEnvError> {
        let redis_type = self
            .get("REDIS_TYPE")
            .map(|value| value.to_ascii_lowercase());
        match redis_type.as_deref() {
            None | Some("single") => Ok(BackendKind::Redis),
            Some("cluster") => Ok(BackendKind::RedisCluster),
            Some("sentinel") => Err(invalid(
                "REDIS_TYPE",
                "Redis Sentinel is not supported; use REDIS_TYPE=single with the master's \
                 address, or a Redis Cluster",
            )),
            Some(other) => Err(invalid(
                "REDIS_TYPE",
                format!("`{other}` is not a Redis type (expected single or cluster)"),
            )),
        }
    }

    /// `REDIS_URL`'s comma-separated `host:port` seeds (or socket paths) as URLs, with the
    /// scheme from `REDIS_TLS` / `REDIS_SOCKET_TYPE` and the credentials of `REDIS_AUTH`.
    fn redis_urls(&mut self, backend: BackendKind) -> Result<Vec<RedisUrl>, ReferenceEnvError> {
        // A Sentinel URL is `master,sentinel:port,...`: it must never read as seed nodes.
        self.redis_kind()?;
        let tls = self.parse("REDIS_TLS", parse_bool)? == Some(true);
        let unix = self.parse("REDIS_SOCKET_TYPE", |value| {
            match value.to_ascii_lowercase().as_str() {
                "tcp" => Ok(false),
                "unix" => Ok(true),
                _ => Err(format!("`{value}` is neither `tcp` nor `unix`")),
            }
        })?;
        let auth = self
            .get("REDIS_AUTH")
            .map(|auth| match auth.split_once(':') {
                Some((user, password)) => Credentials {
                    user: Some(user.to_owned()),
                    password: password.to_owned(),
                },
                None => Credentials {
                    user: None,
                    password: auth,
                },
            });
        let mut urls = Vec::new();
        let mut scheme_kept = false;
        for seed in self.get("REDIS_URL").unwrap_or_default().split(',') {
            let seed = seed.trim();
            if seed.is_empty() {
                continue;
            }
            let url = if seed.contains("://") {
                scheme_kept |= tls && seed.starts_with("redis://");
                seed.to_owned()
            } else if unix.unwrap_or_else(|| seed.starts_with('/')) {
                if tls {
                    return Err(invalid("REDIS_TLS", "TLS does not apply to a Unix socket"));
                }
                if backend == BackendKind::RedisCluster {
                    return Err(invalid(
                        "REDIS_SOCKET_TYPE",
                        "a Redis Cluster is not reachable through a Unix socket",
                    ));
                }
                if !seed.starts_with('/') {
                    return Err(invalid("REDIS_URL", "a Unix socket needs an absolute path"));
                }
                format!("unix://{seed}")
            } else {
                let scheme = if tls { "rediss" } else { "redis" };
                format!("{scheme}://{seed}")
            };
            let url = match &auth {
                Some(credentials) => credentials.insert_into(&url)?,
                None => url,
            };
            let url = RedisUrl::from(url);
            url.check()
                .map_err(|message| invalid("REDIS_URL", message))?;
            urls.push(url);
        }
        if urls.is_empty() {
            return Err(invalid("REDIS_URL", "names no Redis node"));
        }
        if scheme_kept {
            self.warn(
                "REDIS_TLS",
                "a `redis://` scheme given in REDIS_URL is kept",
            );
        }
        Ok(urls)
    }
}

/// `REDIS_AUTH`: `password` or `user:password`.
struct Credentials {
    user: Option<String>,
    password: String,
}

impl Credentials {
    /// `url` with these credentials: in the userinfo for TCP, as `user`/`pass` query
    /// parameters for a Unix socket (redis-rs reads them there). The `url` crate encodes
    /// them, so any character of a password survives.
    fn insert_into(&self, url: &str) -> Result<String, ReferenceEnvError> {
        // Never quote the URL: it is about to hold a password.
        let mut url = Url::parse(url).map_err(|_| invalid("REDIS_URL", "is not a valid URL"))?;
        if url.scheme().ends_with("unix") {
            let mut query = url.query_pairs_mut();
            if let Some(user) = &self.user {
                query.append_pair("user", user);
            }
            query.append_pair("pass", &self.password);
            drop(query);
            return Ok(url.into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid(
                "REDIS_AUTH",
                "REDIS_URL already carries credentials; set them in one place",
            ));
        }
        url.set_username(self.user.as_deref().unwrap_or_default())
            .and_then(|()| url.set_password(Some(&self.password)))
            .map_err(|()| invalid("REDIS_URL", "names no host to log in to"))?;
        Ok(url.into())
    }
}
