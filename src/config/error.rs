//! [`ConfigError`], and where a builder value came from, which decides what an error calls it.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;

/// A configuration value that is malformed or out of range.
///
/// Displays as `NAME=VALUE: expected ...`, where `NAME` is the environment variable, or
/// `ConfigBuilder::method` for a value set in code, or `job`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    name: Cow<'static, str>,
    value: String,
    expected: Cow<'static, str>,
}

impl ConfigError {
    pub(crate) fn new(
        name: impl Into<Cow<'static, str>>,
        value: String,
        expected: impl Into<Cow<'static, str>>,
    ) -> ConfigError {
        ConfigError {
            name: name.into(),
            value,
            expected: expected.into(),
        }
    }

    /// The environment variable or builder method the value came from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rejected value as shown in the message (environment values quoted).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What a valid value looks like.
    pub fn expected(&self) -> &str {
        &self.expected
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={}: expected {}",
            self.name, self.value, self.expected
        )
    }
}

impl Error for ConfigError {}

/// Where a builder value came from; decides what an error calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Default,
    Env,
    Builder,
}

/// A builder value and where it came from.
#[derive(Clone, Copy)]
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    pub(crate) origin: Origin,
}

impl<T> Setting<T> {
    pub(crate) const fn default(value: T) -> Setting<T> {
        Setting {
            value,
            origin: Origin::Default,
        }
    }

    /// Takes the environment's value, if the variable was set.
    pub(crate) fn env(&mut self, value: Option<T>) {
        if let Some(value) = value {
            *self = Setting {
                value,
                origin: Origin::Env,
            };
        }
    }

    pub(crate) fn set(&mut self, value: T) {
        *self = Setting {
            value,
            origin: Origin::Builder,
        };
    }

    /// What an error calls this setting: the environment variable it came from, or the
    /// builder method that set it.
    pub(crate) fn label(&self, env: &'static str, method: &'static str) -> Cow<'static, str> {
        label(self.origin, env, method)
    }
}

/// What an error calls a setting of `origin`.
pub(crate) fn label(origin: Origin, env: &'static str, method: &'static str) -> Cow<'static, str> {
    match origin {
        Origin::Env => Cow::Borrowed(env),
        Origin::Default => Cow::Owned(format!("default {method}")),
        Origin::Builder => Cow::Owned(format!("ConfigBuilder::{method}")),
    }
}

/// How an error shows a value: quoted as it would appear in the environment, or as set in
/// code.
pub(crate) fn shown(
    origin: Origin,
    env_form: impl fmt::Display,
    code_form: impl fmt::Debug,
) -> String {
    match origin {
        Origin::Env => format!("\"{env_form}\""),
        _ => format!("{code_form:?}"),
    }
}
