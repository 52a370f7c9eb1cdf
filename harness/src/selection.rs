//! Which cases a run takes: every default case, whole families by prefix (`L`), or
//! single cases by id (`L3`, also the off-by-default `L0` and `CANARY`).

use case_kit::{Case, Family};

/// The cases of one run, each with its family, in the order given (families in registry
/// order, cases in id order, for a full run).
pub struct Selection<'a> {
    families: &'a [Family],
    chosen: Vec<(&'a Family, &'a Case)>,
    full: bool,
    /// Chosen but set aside by [`Selection::set_aside_server_restarts`].
    set_aside: Vec<(&'a Family, &'a Case)>,
    /// Chosen but set aside because this machine lacks what they need
    /// ([`Selection::set_aside_unavailable`], [`Selection::set_aside_family`]), with the
    /// reason.
    unavailable: Vec<(&'a Family, &'a Case, String)>,
}

impl<'a> Selection<'a> {
    /// Resolves the command line's words: none → every default case; a family prefix →
    /// its default cases; anything else → the case with that id (case-insensitive).
    ///
    /// Errors: a word that names no family and no case.
    pub fn parse(families: &'a [Family], words: &[String]) -> Result<Selection<'a>, String> {
        let mut chosen: Vec<(&Family, &Case)> = Vec::new();
        let mut add = |family: &'a Family, case: &'a Case| {
            if !chosen.iter().any(|(_, c)| c.id == case.id) {
                chosen.push((family, case));
            }
        };
        if words.is_empty() {
            for family in families {
                family.cases.iter().for_each(|case| add(family, case));
            }
        }
        for word in words {
            if let Some(family) = families
                .iter()
                .find(|family| family.prefix.eq_ignore_ascii_case(word))
            {
                family.cases.iter().for_each(|case| add(family, case));
                continue;
            }
            let found = families.iter().find_map(|family| {
                family
                    .cases
                    .iter()
                    .chain(&family.extras)
                    .find(|case| case.id.eq_ignore_ascii_case(word))
                    .map(|case| (family, case))
            });
            match found {
                Some((family, case)) => add(family, case),
                None => {
                    let prefixes: Vec<&str> = families.iter().map(|f| f.prefix).collect();
                    return Err(format!(
                        "unknown case or family {word:?}; families: {} (`--list` shows the cases)",
                        prefixes.join(" ")
                    ));
                }
            }
        }
        let defaults: usize = families.iter().map(|f| f.cases.len()).sum();
        let full = chosen.len() == defaults
            && chosen
                .iter()
                .all(|(family, case)| family.is_default(&case.id));
        Ok(Selection {
            families,
            chosen,
            full,
            set_aside: Vec::new(),
            unavailable: Vec::new(),
        })
    }

    /// Removes the chosen cases that crash or restart the server
    /// (`Case::restarts_server`), for a run on an existing server; they stay in
    /// [`Selection::set_aside`].
    pub fn set_aside_server_restarts(&mut self) {
        let (aside, kept) = self
            .chosen
            .drain(..)
            .partition(|(_, case)| case.restarts_server.is_some());
        self.chosen = kept;
        self.set_aside = aside;
    }

    /// Removes the chosen cases whose requirement is missing on this machine
    /// (`Case::requires`, e.g. root for a FUSE mount); they stay in
    /// [`Selection::unavailable`] with the reason.
    pub fn set_aside_unavailable(&mut self) {
        let mut kept = Vec::new();
        for (family, case) in self.chosen.drain(..) {
            match case.unavailable() {
                Some(reason) => self.unavailable.push((family, case, reason)),
                None => kept.push((family, case)),
            }
        }
        self.chosen = kept;
    }

    /// Why chosen cases cannot run at all, one line each (`Case::problem`: a case file
    /// that cannot be read, parsed or run on its engine, with its path and line), in
    /// selection order; empty when every chosen case can run.
    pub fn problems(&self) -> Vec<&'a str> {
        self.chosen
            .iter()
            .filter_map(|(_, case)| case.problem.as_deref())
            .collect()
    }

    /// The cases not run because this machine lacks what they need, with the reason.
    pub fn unavailable(&self) -> &[(&'a Family, &'a Case, String)] {
        &self.unavailable
    }

    /// Sets aside every chosen case of the family `prefix`, which cannot run here for
    /// `reason` (one line: its engine's binaries cannot be had, say).
    pub fn set_aside_family(&mut self, prefix: &str, reason: &str) {
        let (aside, kept): (Vec<_>, Vec<_>) = self
            .chosen
            .drain(..)
            .partition(|(family, _)| family.prefix == prefix);
        self.chosen = kept;
        self.unavailable.extend(
            aside
                .into_iter()
                .map(|(family, case)| (family, case, reason.to_owned())),
        );
    }

    /// Whether a chosen case belongs to the family `prefix`.
    pub fn has_family(&self, prefix: &str) -> bool {
        self.chosen
            .iter()
            .any(|(family, _)| family.prefix == prefix)
    }

    /// The cases chosen but not run (see [`Selection::set_aside_server_restarts`]).
    pub fn set_aside(&self) -> &[(&'a Family, &'a Case)] {
        &self.set_aside
    }

    /// The chosen cases with their families.
    pub fn cases(&self) -> impl Iterator<Item = (&'a Family, &'a Case)> + '_ {
        self.chosen.iter().copied()
    }

    /// The families that have a chosen case, in registry order.
    pub fn families(&self) -> Vec<&'a Family> {
        self.families
            .iter()
            .filter(|family| self.chosen.iter().any(|(f, _)| f.prefix == family.prefix))
            .collect()
    }

    /// Whether a chosen case needs the scratch PostgreSQL cluster.
    pub fn needs_postgres(&self) -> bool {
        self.chosen
            .iter()
            .any(|(family, _)| family.engine.needs_postgres())
    }

    /// Whether the run is exactly every default case.
    pub fn is_full_run(&self) -> bool {
        self.full
    }

    /// The family of a chosen case.
    pub fn family_of(&self, case_id: &str) -> Option<&'a Family> {
        self.chosen
            .iter()
            .find(|(_, case)| case.id == case_id)
            .map(|(family, _)| *family)
    }

    /// Every family's case ids, default and extra (run by name), for finding orphaned
    /// snapshot files.
    pub fn registered_ids(&self) -> Vec<(&'a str, Vec<&'a str>)> {
        self.families
            .iter()
            .map(|family| {
                let ids = family
                    .cases
                    .iter()
                    .chain(&family.extras)
                    .map(|case| case.id.as_str())
                    .collect();
                (family.prefix, ids)
            })
            .collect()
    }

    /// The command that replays this run's selection with `seed`.
    pub fn replay_command(&self, seed: u64, reports: &[case_kit::CaseReport]) -> String {
        if self.full {
            format!("./run.sh --seed {seed}")
        } else {
            let ids: Vec<&str> = reports.iter().map(|r| r.id.as_str()).collect();
            format!("./run.sh --seed {seed} {}", ids.join(" "))
        }
    }
}

/// Refuses a registry in which two cases (or two families) share an id: one of them
/// would silently never run (a template copied without changing its id, say).
///
/// Errors: the ids used twice, and where.
pub fn check_unique_ids(families: &[Family]) -> Result<(), String> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    let mut clashes = Vec::new();
    for family in families {
        if families
            .iter()
            .filter(|other| other.prefix.eq_ignore_ascii_case(family.prefix))
            .count()
            > 1
            && !clashes.contains(&format!("family prefix {}", family.prefix))
        {
            clashes.push(format!("family prefix {}", family.prefix));
        }
        for case in family.cases.iter().chain(&family.extras) {
            match seen
                .iter()
                .find(|(id, _)| id.eq_ignore_ascii_case(&case.id))
            {
                Some((_, title)) => clashes.push(format!(
                    "case id {} ({title:?} and {:?})",
                    case.id, case.title
                )),
                None => seen.push((&case.id, &case.title)),
            }
        }
    }
    if clashes.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "ids must be unique; used twice: {} (give the new case its own id)",
            clashes.join(", ")
        ))
    }
}

/// What a run of family `family` starts, as `--list` says it: its engine, and for the
/// families that bring their own system (`Engine::None`, or a PostgreSQL family whose
/// cases start clusters of their own) what that is, from each family's crate
/// documentation (`cases/*/src/lib.rs`). A family of `Engine::None` not named here is
/// said to bring its own system; `harness/tests/cli.rs` checks none is left unnamed.
pub fn starts(family: &Family) -> String {
    let own = match family.prefix {
        "I" => Some("a scratch MariaDB (InnoDB) for the run, no PostgreSQL"),
        "P" => Some(
            "per case a FUSE disk that forgets unsynced writes (forgetful-fs; root and \
             /dev/fuse), with a PostgreSQL cluster or an SQLite file on it",
        ),
        "R" => Some(
            "the scratch PostgreSQL (its binaries), and per case a primary and a standby \
             of their own, PgBouncer for the pooler cases; R6-R11 a Patroni cluster with \
             etcd behind HAProxy",
        ),
        _ => None,
    };
    match (own, family.engine) {
        (Some(own), _) => own.to_string(),
        (None, case_kit::Engine::Postgres(template)) => format!(
            "the scratch PostgreSQL; a database per case from template {}",
            template.template
        ),
        (None, case_kit::Engine::SqliteFile) => "an SQLite file per case, no server".to_string(),
        (None, case_kit::Engine::None) => "its own system, no shared server".to_string(),
    }
}

/// The key that sorts case ids in natural order: letters and numbers compared as
/// such, so `L2` comes before `L10` and `L-S2` before `L-S10` (`L13` never before `L1`).
pub fn natural_key(id: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut rest = id;
    while !rest.is_empty() {
        let letters = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let digits_end = rest[letters..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len(), |end| letters + end);
        let number = rest[letters..digits_end].parse().unwrap_or(0);
        key.push((rest[..letters].to_ascii_uppercase(), number));
        rest = &rest[digits_end..];
    }
    key
}

/// `--list`: each family (prefix, title, what it starts), then its cases in natural order
/// ([`natural_key`]: L1, L2 … L10, then L-S1 …); extras marked.
pub fn listing(families: &[Family]) -> String {
    let mut text = String::new();
    for family in families {
        text.push_str(&format!(
            "family {} :: {} (./run.sh {})\n  starts: {}\n",
            family.prefix,
            family.title,
            family.prefix,
            starts(family)
        ));
        let mut cases: Vec<&Case> = family.cases.iter().collect();
        cases.sort_by_key(|case| natural_key(&case.id));
        for case in cases {
            text.push_str(&format!("  {:<7} {}\n", case.id, case.title));
        }
        for case in &family.extras {
            text.push_str(&format!(
                "  {:<7} {} (off by default)\n",
                case.id, case.title
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use case_kit::{Case, Engine};
    use futures_util::FutureExt;

    fn case(id: &str) -> Case {
        Case::new(id, format!("case {id}"), |_ctx| async { Ok(()) }.boxed())
    }

    fn family(prefix: &'static str, ids: &[&str]) -> Family {
        Family {
            prefix,
            title: "test family",
            engine: Engine::None,
            cases: ids.iter().map(|id| case(id)).collect(),
            extras: Vec::new(),
            verbs: Vec::new(),
        }
    }

    #[test]
    fn a_reused_id_is_refused() {
        assert!(check_unique_ids(&[family("X", &["X1", "X2"]), family("Y", &["Y1"])]).is_ok());
        let error = check_unique_ids(&[family("X", &["X1", "X2", "x1"])]).unwrap_err();
        assert!(error.contains("case id x1"), "{error}");
        let error = check_unique_ids(&[family("X", &["X1"]), family("X", &["X2"])]).unwrap_err();
        assert!(error.contains("family prefix X"), "{error}");
    }

    #[test]
    fn ids_sort_in_natural_order() {
        let mut ids = ["L13", "L-S2", "L1", "L-S10", "L2", "L10", "CANARY"];
        ids.sort_by_key(|id| natural_key(id));
        assert_eq!(ids, ["CANARY", "L1", "L2", "L10", "L13", "L-S2", "L-S10"]);
    }

    #[test]
    fn the_registered_families_have_unique_ids() {
        check_unique_ids(&harness::families()).unwrap();
    }

    #[test]
    fn a_family_set_aside_is_listed_with_its_reason() {
        let families = vec![family("F", &["F1"]), family("I", &["I1", "I2"])];
        let mut selection = Selection::parse(&families, &[]).unwrap();
        assert!(selection.has_family("I"));
        selection.set_aside_family("I", "MariaDB unavailable: no root");
        assert!(!selection.has_family("I"));
        let kept: Vec<&str> = selection.cases().map(|(_, c)| c.id.as_str()).collect();
        assert_eq!(kept, ["F1"]);
        let aside: Vec<(&str, &str)> = selection
            .unavailable()
            .iter()
            .map(|(_, c, r)| (c.id.as_str(), r.as_str()))
            .collect();
        assert_eq!(
            aside,
            [
                ("I1", "MariaDB unavailable: no root"),
                ("I2", "MariaDB unavailable: no root")
            ]
        );
    }
}
