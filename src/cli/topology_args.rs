//! The flags of Redis Sentinel and of a second backend for per-second rules
//! (docs/backends.md#redis-sentinel, docs/backends.md#per-second-backend).

use super::FlagError;
use clap::Args;

use super::{BackendKind, RedisUrl};
use crate::backend::BackendSettings;
use crate::backend::redis::DEFAULT_POOL_SIZE;
use crate::backend::redis::{NodeAuth, RedisOptions, SentinelSettings};
use crate::redact::SecretText;

/// Redis Sentinel and the per-second backend.
#[derive(Debug, Clone, Args)]
pub struct TopologyArgs {
    /// With `--backend redis`: the master's name as Redis Sentinel monitors it. --redis-url
    /// then lists the sentinels (`redis://[:password@]host:port`, `rediss://` for TLS to the
    /// sentinels and the data nodes), and floodgate follows the master through failovers.
    #[arg(long, env = "FLOODGATE_REDIS_SENTINEL_MASTER", value_name = "NAME")]
    pub redis_sentinel_master: Option<String>,
    /// `[user:]password` of the data nodes found through Sentinel (the sentinels' own
    /// password goes in their URLs).
    #[arg(
        long,
        env = "FLOODGATE_REDIS_MASTER_AUTH",
        value_name = "[USER:]PASSWORD",
        hide_env_values = true
    )]
    pub redis_master_auth: Option<SecretText>,
    /// A second backend for the rules whose unit is `second`; every other rule stays in
    /// --backend. A request spanning both stays all-or-nothing.
    #[arg(
        long,
        env = "FLOODGATE_PER_SECOND_BACKEND",
        value_enum,
        value_name = "BACKEND"
    )]
    pub per_second_backend: Option<BackendKind>,
    /// Redis URL(s) of --per-second-backend, as --redis-url for --backend.
    #[arg(
        long,
        env = "FLOODGATE_PER_SECOND_REDIS_URL",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub per_second_redis_url: Vec<RedisUrl>,
    /// Connections per Redis pool of --per-second-backend.
    #[arg(
        long,
        env = "FLOODGATE_PER_SECOND_REDIS_POOL_SIZE",
        value_name = "N",
        default_value_t = DEFAULT_POOL_SIZE,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub per_second_redis_pool_size: u32,
    /// With `--per-second-backend redis`: the Sentinel master name; --per-second-redis-url
    /// then lists the sentinels.
    #[arg(
        long,
        env = "FLOODGATE_PER_SECOND_REDIS_SENTINEL_MASTER",
        value_name = "NAME"
    )]
    pub per_second_redis_sentinel_master: Option<String>,
    /// `[user:]password` of the per-second data nodes found through Sentinel.
    #[arg(
        long,
        env = "FLOODGATE_PER_SECOND_REDIS_MASTER_AUTH",
        value_name = "[USER:]PASSWORD",
        hide_env_values = true
    )]
    pub per_second_redis_master_auth: Option<SecretText>,
}

/// One backend as the flags describe it.
pub(super) struct BackendFlags<'a> {
    pub kind: BackendKind,
    pub urls: &'a [RedisUrl],
    pub sentinel_master: Option<&'a str>,
    pub master_auth: Option<&'a SecretText>,
    /// The flag names, for messages: (backend, URL, sentinel master, master auth).
    pub names: [&'static str; 4],
}

impl BackendFlags<'_> {
    /// Checks what clap cannot: URL schemes, and the Sentinel flags only with a one-node
    /// Redis backend.
    pub fn check(&self) -> Result<(), FlagError> {
        self.urls.iter().try_for_each(RedisUrl::check)?;
        let [backend, url, master, auth] = self.names;
        if self.sentinel_master.is_some() && self.kind != BackendKind::Redis {
            return Err(FlagError::Needs {
                flag: master.to_owned(),
                needs: format!("`{backend} redis`"),
            });
        }
        if self.master_auth.is_some() && self.sentinel_master.is_none() {
            return Err(FlagError::AuthWithoutSentinel { auth, master, url });
        }
        if self.sentinel_master.is_some()
            && self.urls.iter().any(|u| {
                !u.as_str().starts_with("redis://") && !u.as_str().starts_with("rediss://")
            })
        {
            return Err(FlagError::SentinelScheme { master, url });
        }
        Ok(())
    }

    /// The backend settings, with `options` already holding the pool size and TLS files.
    pub fn settings(&self, options: RedisOptions, max_buckets: usize) -> BackendSettings {
        let urls = || -> Vec<String> {
            self.urls
                .iter()
                .map(|url| url.as_str().to_owned())
                .collect()
        };
        match (self.kind, self.sentinel_master) {
            (BackendKind::Memory, _) => BackendSettings::Memory { max_buckets },
            (BackendKind::Redis, Some(master)) => BackendSettings::Sentinel {
                sentinel: SentinelSettings {
                    master: master.to_owned(),
                    sentinels: urls(),
                    node_auth: self.master_auth.map(|auth| NodeAuth::parse(auth.as_str())),
                },
                options,
            },
            (BackendKind::Redis, None) => BackendSettings::Redis {
                url: urls().into_iter().next().unwrap_or_default(),
                options,
            },
            (BackendKind::RedisCluster, _) => BackendSettings::Cluster {
                urls: urls(),
                options,
            },
        }
    }
}

impl TopologyArgs {
    /// The per-second backend's flags, when one is asked for.
    pub(super) fn per_second(&self) -> Option<BackendFlags<'_>> {
        Some(BackendFlags {
            kind: self.per_second_backend?,
            urls: &self.per_second_redis_url,
            sentinel_master: self.per_second_redis_sentinel_master.as_deref(),
            master_auth: self.per_second_redis_master_auth.as_ref(),
            names: [
                "--per-second-backend",
                "--per-second-redis-url",
                "--per-second-redis-sentinel-master",
                "--per-second-redis-master-auth",
            ],
        })
    }

    /// Checks the per-second flags that only make sense with --per-second-backend.
    pub(super) fn check_per_second(&self) -> Result<(), FlagError> {
        match self.per_second() {
            Some(flags) => {
                if flags.kind != BackendKind::Memory && flags.urls.is_empty() {
                    return Err(FlagError::Needs {
                        flag: "--per-second-backend".to_owned(),
                        needs: "--per-second-redis-url".to_owned(),
                    });
                }
                flags.check()
            }
            None => {
                let set = [
                    (
                        !self.per_second_redis_url.is_empty(),
                        "--per-second-redis-url",
                    ),
                    (
                        self.per_second_redis_sentinel_master.is_some(),
                        "--per-second-redis-sentinel-master",
                    ),
                    (
                        self.per_second_redis_master_auth.is_some(),
                        "--per-second-redis-master-auth",
                    ),
                ];
                match set.iter().find(|(given, _)| *given) {
                    Some((_, flag)) => Err(FlagError::Needs {
                        flag: (*flag).to_owned(),
                        needs: "--per-second-backend".to_owned(),
                    }),
                    None => Ok(()),
                }
            }
        }
    }
}
