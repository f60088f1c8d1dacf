//! The rule source variables that are more than a table row: the reference's default xDS
//! server and `XDS_CLIENT_BACKOFF_*` jitter (`CONFIG_TYPE`, `CONFIG_GRPC_XDS_*`, the other
//! backoff variables and the start/readiness switches are rows of [`super::table`]).

use super::*;

impl Mapper<'_> {
    /// What the table's rows leave to the rule source: the reference's default server, and
    /// the backoff spread of two variables.
    pub(super) fn xds(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        let xds = &mut args.xds;
        if xds.config_source == ConfigSource::Xds
            && xds.xds_server.is_none()
            && self.is_set("CONFIG_TYPE")
        {
            // The reference's own default: a drop-in that relied on it keeps working.
            xds.xds_server = Some(REFERENCE_XDS_SERVER.to_owned());
        }
        let jitter = [
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
            "XDS_CLIENT_BACKOFF_JITTER",
        ];
        if self.claim(XDS_BACKOFF_JITTER, &jitter) {
            let factor = self.parse(jitter[0], |value| match value.parse::<f64>() {
                Ok(factor) if (0.0..=1.0).contains(&factor) => Ok(factor),
                _ => Err(BadValue::NotA {
                    value: value.to_owned(),
                    expected: "a factor between 0 and 1",
                }),
            })?;
            let enabled = self.parse(jitter[1], parse_bool)?;
            xds.xds_backoff_jitter = match enabled {
                Some(false) => 0.0,
                _ => factor.unwrap_or(REFERENCE_XDS_JITTER),
            };
        }
        Ok(())
    }
}
