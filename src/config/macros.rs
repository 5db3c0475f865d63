//! `settings!`: from the one table of settings in `table.rs`, the [`Config`] struct and its
//! accessors, the [`ConfigBuilder`] and its setters, reading the environment, checking each
//! value, `Debug`, the public `ENV_*` / `DEFAULT_*` constants and the rows of the settings
//! table in `docs/tuning.md`.
//!
//! One row:
//!
//! ```text
//! /// What the setting does, one paragraph: the `effect` column of the docs table.
//! ///
//! /// More paragraphs for rustdoc only.
//! name: Type [AccessorType] {
//!     env: [ENV_CONST = "VARIABLE"],          // or [role CONST = "WORKER_..", "PS_.."]
//!     default: [DEFAULT_CONST = value],       // or [value], without a constant
//!     kind: <a kind from kind.rs>,
//!     setter: plain,                          // or `into`: the setter takes impl Into<Type>
//!     consts: { pub const ...; }              // optional: range constants of this setting
//! }
//! ```
//!
//! `[AccessorType]` is empty when the accessor returns `Type` itself (a copy).
//!
//! [`Config`]: super::Config
//! [`ConfigBuilder`]: super::ConfigBuilder

macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty [$($get:tt)*] {
            env: [$($env:tt)*],
            default: [$($def:tt)*],
            kind: $kind:expr,
            setter: $setter:ident
            $(, consts: { $($consts:item)* })? $(,)?
        }
    )*) => {
        $(
            env_const!($name [$($env)*]);
            default_const!($name $ty, [$($def)*]);
            $($($consts)*)?
        )*

        /// The validated configuration of one task. Build it with [`Config::builder`] or
        /// [`ConfigBuilder::from_env`]; every value has passed the checks of
        /// [`ConfigBuilder::build`], and cannot be changed afterwards.
        ///
        /// Each setting has an accessor of its name; `docs/tuning.md` lists them all.
        /// `Debug` does not show the cluster token, only its length.
        #[derive(Clone)]
        pub struct Config {
            /// The task's job name (`worker`, `ps`, `chief`, ...).
            pub(crate) job: String,
            /// The task's index within its job.
            pub(crate) task_index: u32,
            /// The receiver's parse-time limits, also announced to peers.
            pub(crate) limits: Limits,
            $(
                $(#[doc = $doc])*
                pub(crate) $name: $ty,
            )*
        }

        impl Config {
            /// The task's job name (`worker`, `ps`, `chief`, ...): 1 to 64 characters from
            /// `A-Z a-z 0-9 _ -`. Decides the [`Role`].
            pub fn job(&self) -> &str {
                &self.job
            }

            /// The task's index within its job.
            pub fn task_index(&self) -> u32 {
                self.task_index
            }

            /// The receiver's parse-time limits, also announced to peers
            /// (`STARWIRE_MAX_FRAME`, `STARWIRE_MAX_KEY`, ...).
            pub fn limits(&self) -> Limits {
                self.limits
            }

            $(
                $(#[doc = $doc])*
                ///
                #[doc = env_doc!([$($env)*])]
                pub fn $name(&self) -> out_ty!([$($get)*] $ty) {
                    Get::get(&self.$name)
                }
            )*
        }

        impl fmt::Debug for Config {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct("Config")
                    .field("job", &self.job)
                    .field("task_index", &self.task_index)
                    .field("limits", &self.limits)
                    $(.field(stringify!($name), &Shown(&$kind, &self.$name)))*
                    .finish()
            }
        }

        /// Builds a [`Config`]: defaults, optionally overridden by the environment
        /// ([`from_env`](ConfigBuilder::from_env)), overridden by the methods here. Every
        /// method overrides whatever the environment said; [`build`](ConfigBuilder::build)
        /// validates.
        ///
        /// `Debug` does not show the cluster token, only its length.
        #[derive(Clone)]
        pub struct ConfigBuilder {
            pub(crate) job: String,
            pub(crate) task_index: u32,
            pub(crate) limits: Limits,
            /// Where each of [`LIMIT_FIELDS`] came from.
            pub(crate) limit_origins: [Origin; LIMIT_FIELDS.len()],
            $(pub(crate) $name: Setting<$ty>,)*
        }

        impl fmt::Debug for ConfigBuilder {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct("ConfigBuilder")
                    .field("job", &self.job)
                    .field("task_index", &self.task_index)
                    .field("limits", &self.limits)
                    $(.field(stringify!($name), &Shown(&$kind, &self.$name.value)))*
                    .finish()
            }
        }

        impl ConfigBuilder {
            pub(crate) fn new(job: &str, task_index: u32) -> ConfigBuilder {
                ConfigBuilder {
                    job: job.to_owned(),
                    task_index,
                    limits: Limits::default(),
                    limit_origins: [Origin::Default; LIMIT_FIELDS.len()],
                    $($name: Setting::default(default_value!([$($def)*])),)*
                }
            }

            /// Reads every setting's variable (those of `role` for the role-dependent ones).
            pub(crate) fn read_settings(
                &mut self,
                role: Role,
                env: &Env<'_>,
            ) -> Result<(), ConfigError> {
                $(
                    self.$name.env(SettingType::<$ty>::read(
                        &$kind,
                        env,
                        env_name!([$($env)*]).of(role),
                    )?);
                )*
                Ok(())
            }

            /// Checks each setting on its own.
            pub(crate) fn check_settings(&self, role: Role) -> Result<(), ConfigError> {
                $(
                    SettingType::<$ty>::check(
                        &$kind,
                        &self.$name,
                        env_name!([$($env)*]).of(role),
                        stringify!($name),
                    )?;
                )*
                Ok(())
            }

            /// The config of the values as they are; `build` has checked them.
            pub(crate) fn into_config(self, limits: Limits) -> Config {
                Config {
                    job: self.job,
                    task_index: self.task_index,
                    limits,
                    $($name: self.$name.value,)*
                }
            }

            $(setter!($setter $name: $ty, [$($env)*]);)*
        }

        /// The rows of the settings table, in table order.
        pub(crate) fn rows() -> Vec<Row> {
            vec![$(
                Row {
                    env: env_name!([$($env)*]),
                    method: format!(".{}({})", stringify!($name), stringify!($ty)),
                    default: SettingType::<$ty>::value_doc(&$kind, &default_value!([$($def)*])),
                    range: SettingType::<$ty>::range_doc(&$kind),
                    doc: &[$($doc),*],
                },
            )*]
        }
    };
}

/// The public constant of a variable's name, unless the name depends on the role.
macro_rules! env_const {
    ($name:ident [$c:ident = $lit:literal]) => {
        #[doc = concat!("Environment variable of [`Config::", stringify!($name), "`].")]
        pub const $c: &str = $lit;
    };
    ($name:ident [role $c:ident = $worker:literal, $ps:literal]) => {
        /// Environment variables of one setting, by role.
        pub(crate) const $c: EnvName = EnvName::ByRole {
            worker: $worker,
            ps: $ps,
        };
    };
}

macro_rules! env_name {
    ([$c:ident = $lit:literal]) => {
        EnvName::One($c)
    };
    ([role $c:ident = $worker:literal, $ps:literal]) => {
        $c
    };
}

/// Rustdoc naming the variable(s) of a setting.
macro_rules! env_doc {
    ([$c:ident = $lit:literal]) => {
        concat!("Environment variable: `", $lit, "`.")
    };
    ([role $c:ident = $worker:literal, $ps:literal]) => {
        concat!(
            "Environment variable: `",
            $worker,
            "` for the jobs `worker` and `chief`, `",
            $ps,
            "` for the others."
        )
    };
}

/// The public constant of a default, when the row names one.
macro_rules! default_const {
    ($name:ident $ty:ty, [$c:ident = $e:expr]) => {
        #[doc = concat!("Default of [`Config::", stringify!($name), "`].")]
        pub const $c: $ty = $e;
    };
    ($name:ident $ty:ty, [$e:expr]) => {};
}

macro_rules! default_value {
    ([$c:ident = $e:expr]) => {
        $c
    };
    ([$e:expr]) => {
        $e
    };
}

macro_rules! out_ty {
    ([] $ty:ty) => { $ty };
    ([$($out:tt)+] $ty:ty) => { $($out)+ };
}

macro_rules! setter {
    (plain $name:ident: $ty:ty, [$($env:tt)*]) => {
        #[doc = concat!("Sets [`Config::", stringify!($name), "`], overriding the environment.")]
        ///
        #[doc = env_doc!([$($env)*])]
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name.set(value);
            self
        }
    };
    (into $name:ident: $ty:ty, [$($env:tt)*]) => {
        #[doc = concat!("Sets [`Config::", stringify!($name), "`], overriding the environment.")]
        ///
        #[doc = env_doc!([$($env)*])]
        #[must_use]
        pub fn $name(mut self, value: impl Into<$ty>) -> Self {
            self.$name.set(value.into());
            self
        }
    };
}
