//! Choices a run makes for one system under test — the ledger's transfer mode, say —
//! carried to every case without the kit knowing them. Each choice is a Rust type defined
//! by its system (`points_ledger::TransferMode`), stored once per run by the harness
//! ([`crate::EnvOptions::choices`]), pinned by a case that must keep one value whatever
//! the run's ([`crate::Case::pin`]), and read back as that type ([`crate::Ctx::choice`]).
//! Each choice in force is recorded per case in the run record under its name.

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// One stored choice: its name in the run record, its value as shown there, the value.
#[derive(Clone)]
struct Entry {
    name: &'static str,
    shown: String,
    value: Arc<dyn Any + Send + Sync>,
}

/// A set of choices, at most one value per type.
#[derive(Clone, Default)]
pub struct Choices {
    entries: BTreeMap<TypeId, Entry>,
}

impl Choices {
    /// Sets the choice of type `T` to `value`, named `name` in the run record
    /// (`transfer_mode`), replacing an earlier value of that type.
    pub fn set<T>(&mut self, name: &'static str, value: T)
    where
        T: Any + Send + Sync + Copy + fmt::Display,
    {
        let entry = Entry {
            name,
            shown: value.to_string(),
            value: Arc::new(value),
        };
        self.entries.insert(TypeId::of::<T>(), entry);
    }

    /// [`Choices::set`] by value, for building: `Choices::default().with(…)`.
    pub fn with<T>(mut self, name: &'static str, value: T) -> Choices
    where
        T: Any + Send + Sync + Copy + fmt::Display,
    {
        self.set(name, value);
        self
    }

    /// The choice of type `T`, if one was set.
    pub fn get<T: Any + Copy>(&self) -> Option<T> {
        let entry = self.entries.get(&TypeId::of::<T>())?;
        entry.value.downcast_ref::<T>().copied()
    }

    /// These choices with those of `over` in place of any of the same type.
    pub fn overlaid(&self, over: &Choices) -> Choices {
        let mut entries = self.entries.clone();
        entries.extend(over.entries.iter().map(|(k, v)| (*k, v.clone())));
        Choices { entries }
    }

    /// Each choice as `(name, value as shown)`, for the run record.
    pub fn shown(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.entries.values().map(|e| (e.name, e.shown.as_str()))
    }

    /// Whether no choice is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl fmt::Debug for Choices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.shown()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Mode {
        A,
        B,
    }

    impl fmt::Display for Mode {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{self:?}")
        }
    }

    #[test]
    fn a_pinned_choice_wins_over_the_run_and_others_stay() {
        let run = Choices::default().with("mode", Mode::A).with("width", 3u32);
        let pinned = Choices::default().with("mode", Mode::B);
        let seen = run.overlaid(&pinned);
        assert_eq!(seen.get::<Mode>(), Some(Mode::B));
        assert_eq!(seen.get::<u32>(), Some(3));
        assert_eq!(Choices::default().get::<Mode>(), None);
        let shown: Vec<_> = seen.shown().collect();
        assert!(shown.contains(&("mode", "B")) && shown.contains(&("width", "3")));
    }
}
