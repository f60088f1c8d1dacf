//! The backend variables: `BACKEND_TYPE`, `REDIS_*` (URL, type, auth, TLS, pool, Sentinel)
//! onto `--backend`, `--redis-url`, the Sentinel and Redis TLS flags, and `REDIS_PERSECOND*`
//! onto the `--per-second-*` flags.

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
            let tls_set: Vec<_> = table::variables(Gate::Redis)
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
        self.rows(args, Gate::Redis)?;
        self.redis_connection(args, &MAIN_REDIS)?;
        if self.claim(REDIS_POOL_SIZE, &["REDIS_POOL_SIZE"]) {
            args.redis_pool_size = self
                .pool_size("REDIS_POOL_SIZE", args.backend)?
                .unwrap_or(args.redis_pool_size);
        }
        Ok(())
    }

    /// `REDIS_PERSECOND=true` with the `REDIS_PERSECOND_*` variables: a second backend for
    /// the rules whose unit is `second`.
    pub(super) fn per_second(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        let vars = &PER_SECOND_REDIS;
        let details: Vec<_> = vars.all().into_iter().filter(|n| self.is_set(n)).collect();
        if self.parse("REDIS_PERSECOND", parse_bool)? != Some(true) {
            for name in details {
                self.warn(name, "has no effect without REDIS_PERSECOND=true");
            }
            return Ok(());
        }
        if !self.claim(PER_SECOND_BACKEND, &["REDIS_PERSECOND"]) {
            let flag = PER_SECOND_BACKEND.flag;
            self.report
                .overridden
                .extend(details.into_iter().map(|name| (name, flag)));
            return Ok(());
        }
        let kind = self.redis_type(vars)?.backend();
        args.topology.per_second_backend = Some(kind);
        if !self.is_set(vars.url) && !self.explicit(vars.settings.url) {
            return Err(invalid(
                "REDIS_PERSECOND",
                "needs REDIS_PERSECOND_URL (or --per-second-redis-url); the reference's default \
                 twemproxy socket is not assumed",
            ));
        }
        self.redis_connection(args, vars)?;
        if self.claim(PER_SECOND_REDIS_POOL_SIZE, &[vars.pool_size]) {
            args.topology.per_second_redis_pool_size = self
                .pool_size(vars.pool_size, kind)?
                .unwrap_or(args.topology.per_second_redis_pool_size);
        }
        Ok(())
    }

    /// The URL, type, auth and TLS variables of `vars` onto the URL flag of its backend and,
    /// for Sentinel, its master name and data-node credentials.
    fn redis_connection(
        &mut self,
        args: &mut ServeArgs,
        vars: &RedisVars,
    ) -> Result<(), ReferenceEnvError> {
        let backend = if vars.settings.url == REDIS_URL {
            args.backend
        } else {
            args.topology
                .per_second_backend
                .unwrap_or(BackendKind::Redis)
        };
        let sentinel = self.redis_type(vars)? == RedisType::Sentinel;
        if sentinel && backend != BackendKind::Redis {
            return Err(invalid(
                vars.kind,
                "Redis Sentinel runs as the `redis` backend, not `redis-cluster`",
            ));
        }
        let auth = if sentinel {
            vars.sentinel_auth
        } else {
            if self.is_set(vars.sentinel_auth) {
                self.warn(
                    vars.sentinel_auth,
                    "applies only to the `sentinel` Redis type",
                );
            }
            vars.auth
        };
        let url_variables = [vars.url, auth, vars.tls, vars.socket_type];
        if !self.is_set(vars.url) && !self.explicit(vars.settings.url) {
            if sentinel {
                return Err(invalid(
                    vars.kind,
                    format!("Redis Sentinel needs {}=master,host:port,...", vars.url),
                ));
            }
            for name in &url_variables[1..] {
                if self.is_set(name) {
                    self.warn(
                        name,
                        "has no effect without its URL variable; the URL flag applies",
                    );
                }
            }
            return Ok(());
        }
        if !self.claim(vars.settings.url, &url_variables) {
            return Ok(());
        }
        let (master, urls) = self.redis_urls(vars, backend, sentinel)?;
        let auth = self.get(vars.auth).map(SecretText::from);
        let settings = vars.settings;
        let master_auth = sentinel && self.claim(settings.master_auth, &[vars.auth]);
        let master = master.filter(|_| self.claim(settings.sentinel_master, &[vars.kind]));
        if settings.url == REDIS_URL {
            args.redis_url = urls;
            args.topology.redis_sentinel_master =
                master.or(args.topology.redis_sentinel_master.take());
            if master_auth {
                args.topology.redis_master_auth = auth;
            }
        } else {
            args.topology.per_second_redis_url = urls;
            args.topology.per_second_redis_sentinel_master =
                master.or(args.topology.per_second_redis_sentinel_master.take());
            if master_auth {
                args.topology.per_second_redis_master_auth = auth;
            }
        }
        Ok(())
    }

    /// A pool size variable, with a warning when the backend has no pool.
    fn pool_size(
        &mut self,
        name: &'static str,
        backend: BackendKind,
    ) -> Result<Option<u32>, ReferenceEnvError> {
        let size = self.parse(name, |value| match value.parse::<u32>() {
            Ok(size) if size > 0 => Ok(size),
            _ => Err(BadValue::NotA {
                value: value.to_owned(),
                expected: "a positive number of connections",
            }),
        })?;
        if backend == BackendKind::RedisCluster {
            self.warn(
                name,
                "the Redis Cluster client multiplexes one connection per node; \
                 the pool size applies to the `redis` backend only",
            );
        }
        Ok(size)
    }

    /// The backend the reference would use: `BACKEND_TYPE` (default redis), then
    /// `REDIS_TYPE` (default single).
    fn reference_backend(&self) -> Result<BackendKind, ReferenceEnvError> {
        let backend_type = self
            .get("BACKEND_TYPE")
            .map(|value| value.to_ascii_lowercase());
        match backend_type.as_deref() {
            None | Some("redis") => Ok(self.redis_type(&MAIN_REDIS)?.backend()),
            Some("memcache") => Err(invalid(
                "BACKEND_TYPE",
                "memcache is not supported: memcache has no server-side scripts, so it cannot \
                 decide a charge atomically; use Redis (BACKEND_TYPE=redis or --backend)",
            )),
            Some(other) => Err(invalid(
                "BACKEND_TYPE",
                format!("`{other}` is not a backend (expected redis)"),
            )),
        }
    }

    fn redis_type(&self, vars: &RedisVars) -> Result<RedisType, ReferenceEnvError> {
        let redis_type = self.get(vars.kind).map(|value| value.to_ascii_lowercase());
        match redis_type.as_deref() {
            None | Some("single") => Ok(RedisType::Single),
            Some("cluster") => Ok(RedisType::Cluster),
            Some("sentinel") => Ok(RedisType::Sentinel),
            Some(other) => Err(invalid(
                vars.kind,
                format!("`{other}` is not a Redis type (expected single, cluster or sentinel)"),
            )),
        }
    }

    /// The URL variable's comma-separated `host:port` seeds (or socket paths) as URLs, with
    /// the scheme from the TLS / socket-type variables and the credentials of the auth
    /// variable. For Sentinel the first entry is the master's name, the others are sentinels
    /// that get the sentinel auth variable's password instead.
    fn redis_urls(
        &mut self,
        vars: &RedisVars,
        backend: BackendKind,
        sentinel: bool,
    ) -> Result<(Option<String>, Vec<RedisUrl>), ReferenceEnvError> {
        let tls = self.parse(vars.tls, parse_bool)? == Some(true);
        let unix = self.parse(vars.socket_type, |value| {
            match value.to_ascii_lowercase().as_str() {
                "tcp" => Ok(false),
                "unix" => Ok(true),
                _ => Err(BadValue::NotOneOf {
                    value: value.to_owned(),
                    expected: "tcp, unix",
                }),
            }
        })?;
        let auth = if sentinel {
            // The reference sends the sentinels a bare `AUTH <password>`.
            self.get(vars.sentinel_auth).map(|password| Credentials {
                user: None,
                password,
            })
        } else {
            self.get(vars.auth).map(|auth| match auth.split_once(':') {
                Some((user, password)) => Credentials {
                    user: Some(user.to_owned()),
                    password: password.to_owned(),
                },
                None => Credentials {
                    user: None,
                    password: auth,
                },
            })
        };
        let value = self.get(vars.url).unwrap_or_default();
        let mut seeds = value.split(',').map(str::trim).filter(|s| !s.is_empty());
        let master = if sentinel {
            match seeds.next() {
                Some(name) if !name.contains("://") => Some(name.to_owned()),
                _ => {
                    return Err(invalid(
                        vars.url,
                        "with sentinel, the first entry is the master's name: \
                         `master,host:port,...`",
                    ));
                }
            }
        } else {
            None
        };
        let mut urls = Vec::new();
        let mut scheme_kept = false;
        for seed in seeds {
            let url = if seed.contains("://") {
                scheme_kept |= tls && seed.starts_with("redis://");
                seed.to_owned()
            } else if unix.unwrap_or_else(|| seed.starts_with('/')) {
                if tls {
                    return Err(invalid(vars.tls, "TLS does not apply to a Unix socket"));
                }
                if backend == BackendKind::RedisCluster || sentinel {
                    return Err(invalid(
                        vars.socket_type,
                        "a Redis Cluster or a sentinel is not reachable through a Unix socket",
                    ));
                }
                if !seed.starts_with('/') {
                    return Err(invalid(vars.url, "a Unix socket needs an absolute path"));
                }
                format!("unix://{seed}")
            } else {
                let scheme = if tls { "rediss" } else { "redis" };
                format!("{scheme}://{seed}")
            };
            let url = match &auth {
                Some(credentials) => credentials.insert_into(&url, vars)?,
                None => url,
            };
            let url = RedisUrl::from(url);
            url.check()
                .map_err(|error| invalid(vars.url, error.to_string()))?;
            urls.push(url);
        }
        if urls.is_empty() {
            let what = if sentinel {
                "no sentinel"
            } else {
                "no Redis node"
            };
            return Err(invalid(vars.url, format!("names {what}")));
        }
        if scheme_kept {
            self.warn(vars.tls, "a `redis://` scheme given in the URL is kept");
        }
        Ok((master, urls))
    }
}

/// The reference variables of one Redis backend, and the floodgate settings they map to.
struct RedisVars {
    url: &'static str,
    kind: &'static str,
    auth: &'static str,
    tls: &'static str,
    socket_type: &'static str,
    sentinel_auth: &'static str,
    pool_size: &'static str,
    settings: RedisSettings,
}

/// The floodgate settings of one Redis backend's connection.
#[derive(Clone, Copy)]
struct RedisSettings {
    url: Setting,
    sentinel_master: Setting,
    master_auth: Setting,
}

impl RedisVars {
    /// Every variable besides the switch, for reporting them together.
    fn all(&self) -> [&'static str; 7] {
        [
            self.url,
            self.kind,
            self.auth,
            self.tls,
            self.socket_type,
            self.sentinel_auth,
            self.pool_size,
        ]
    }
}

const MAIN_REDIS: RedisVars = RedisVars {
    url: "REDIS_URL",
    kind: "REDIS_TYPE",
    auth: "REDIS_AUTH",
    tls: "REDIS_TLS",
    socket_type: "REDIS_SOCKET_TYPE",
    sentinel_auth: "REDIS_SENTINEL_AUTH",
    pool_size: "REDIS_POOL_SIZE",
    settings: RedisSettings {
        url: REDIS_URL,
        sentinel_master: REDIS_SENTINEL_MASTER,
        master_auth: REDIS_MASTER_AUTH,
    },
};

const PER_SECOND_REDIS: RedisVars = RedisVars {
    url: "REDIS_PERSECOND_URL",
    kind: "REDIS_PERSECOND_TYPE",
    auth: "REDIS_PERSECOND_AUTH",
    tls: "REDIS_PERSECOND_TLS",
    socket_type: "REDIS_PERSECOND_SOCKET_TYPE",
    sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
    pool_size: "REDIS_PERSECOND_POOL_SIZE",
    settings: RedisSettings {
        url: PER_SECOND_REDIS_URL,
        sentinel_master: PER_SECOND_REDIS_SENTINEL_MASTER,
        master_auth: PER_SECOND_REDIS_MASTER_AUTH,
    },
};

/// `REDIS_TYPE` and `REDIS_PERSECOND_TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RedisType {
    Single,
    Cluster,
    Sentinel,
}

impl RedisType {
    fn backend(self) -> BackendKind {
        match self {
            RedisType::Single | RedisType::Sentinel => BackendKind::Redis,
            RedisType::Cluster => BackendKind::RedisCluster,
        }
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
    fn insert_into(&self, url: &str, vars: &RedisVars) -> Result<String, ReferenceEnvError> {
        // Never quote the URL: it is about to hold a password.
        let mut url = Url::parse(url).map_err(|_| invalid(vars.url, "is not a valid URL"))?;
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
                vars.auth,
                "the URL already carries credentials; set them in one place",
            ));
        }
        url.set_username(self.user.as_deref().unwrap_or_default())
            .and_then(|()| url.set_password(Some(&self.password)))
            .map_err(|()| invalid(vars.url, "names no host to log in to"))?;
        Ok(url.into())
    }
}
