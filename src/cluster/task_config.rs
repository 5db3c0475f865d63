//! [`ConfigBuilder::from_tf_config`]: a task's configuration with its job and index taken
//! from `TF_CONFIG`, which already names them (here, beside the `TF_CONFIG` reader, as
//! the cluster builds on the configuration and not the other way round).

use std::ffi::OsString;

use super::spec::{TfConfig, ENV_TF_CONFIG};
use crate::config::{Config, ConfigBuilder, ConfigError};

/// What a `TF_CONFIG` for [`ConfigBuilder::from_tf_config`] must be.
const EXPECTED: &str = "a JSON object with a cluster and a \"task\": {\"type\": JOB, \
                        \"index\": N}, as training operators set it (without one, use \
                        ConfigBuilder::from_env(job, index))";

/// At most this many characters of `TF_CONFIG` are shown in an error.
const SHOWN: usize = 80;

impl ConfigBuilder {
    /// [`from_env`](ConfigBuilder::from_env) for the task `TF_CONFIG` names: its `task`'s
    /// `type` is the job and its `index` the task index, so a program started by a
    /// training operator does not repeat them. `TF_CONFIG` unset or empty, not a valid
    /// spec, or without a `task`: a [`ConfigError`] naming `TF_CONFIG` and saying which.
    ///
    /// ```
    /// use starwire::config::ConfigBuilder;
    ///
    /// # std::env::set_var("TF_CONFIG",
    /// #     r#"{"cluster": {"ps": ["ps-0:2222"]}, "task": {"type": "ps", "index": 0}}"#);
    /// // TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}'
    /// let config = ConfigBuilder::from_tf_config()?.build()?;
    /// assert_eq!((config.job(), config.task_index()), ("ps", 0));
    /// # Ok::<(), starwire::config::ConfigError>(())
    /// ```
    pub fn from_tf_config() -> Result<ConfigBuilder, ConfigError> {
        ConfigBuilder::from_tf_config_lookup(|name| std::env::var_os(name))
    }

    /// [`from_tf_config`](ConfigBuilder::from_tf_config) reading the environment through
    /// `lookup`.
    fn from_tf_config_lookup(
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> Result<ConfigBuilder, ConfigError> {
        let bad = |value: String, why: String| ConfigError::new(ENV_TF_CONFIG, value, why);
        let text = match lookup(ENV_TF_CONFIG) {
            None => return Err(bad("(unset)".into(), EXPECTED.into())),
            Some(v) if v.is_empty() => return Err(bad("\"\"".into(), EXPECTED.into())),
            Some(v) => v
                .into_string()
                .map_err(|v| bad(format!("{v:?}"), format!("valid UTF-8: {EXPECTED}")))?,
        };
        let shown = || match text.char_indices().nth(SHOWN) {
            None => format!("{text:?}"),
            Some((end, _)) => format!("{:?}...", &text[..end]),
        };
        let tf = TfConfig::parse_all(&text).map_err(|errors| {
            let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
            bad(shown(), format!("{EXPECTED}; {}", problems.join("; ")))
        })?;
        let Some(task) = tf.task else {
            return Err(bad(shown(), format!("{EXPECTED}; it has no \"task\"")));
        };
        ConfigBuilder::from_lookup(&task.job, task.index, lookup)
    }
}

impl Config {
    /// The configuration of the task `TF_CONFIG` names, from the environment. Shorthand
    /// for `ConfigBuilder::from_tf_config()?.build()`.
    pub fn from_tf_config() -> Result<Config, ConfigError> {
        ConfigBuilder::from_tf_config()?.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_task_comes_from_tf_config() {
        let tf = r#"{"cluster": {"ps": ["a:1", "b:1"], "worker": ["c:1"]},
                     "task": {"type": "ps", "index": 1}}"#;
        let b = ConfigBuilder::from_tf_config_lookup(lookup(&[
            ("TF_CONFIG", tf),
            ("NETWORK_PS_CORE_NUMBER", "3"),
        ]))
        .unwrap();
        let config = b.build().unwrap();
        assert_eq!((config.job(), config.task_index()), ("ps", 1));
        // The rest of the environment, read as for that task's job.
        assert_eq!(config.loop_count(100, 64), 3);
    }

    #[test]
    fn without_a_task_the_error_says_why() {
        let e = ConfigBuilder::from_tf_config_lookup(lookup(&[])).unwrap_err();
        assert_eq!(e.name(), "TF_CONFIG");
        assert!(
            e.to_string()
                .starts_with("TF_CONFIG=(unset): expected a JSON object with a cluster"),
            "{e}"
        );
        assert!(e.to_string().contains("ConfigBuilder::from_env"), "{e}");
        let e = ConfigBuilder::from_tf_config_lookup(lookup(&[(
            "TF_CONFIG",
            r#"{"cluster": {"ps": ["a:1"]}}"#,
        )]))
        .unwrap_err();
        assert!(e.to_string().ends_with("; it has no \"task\""), "{e}");
        let e = ConfigBuilder::from_tf_config_lookup(lookup(&[("TF_CONFIG", r#"{"cluster": ["#)]))
            .unwrap_err();
        assert!(e.to_string().contains("invalid JSON at byte"), "{e}");
        let e = ConfigBuilder::from_tf_config_lookup(lookup(&[("TF_CONFIG", "")])).unwrap_err();
        assert!(e.to_string().starts_with("TF_CONFIG=\"\": expected"), "{e}");
    }
}
