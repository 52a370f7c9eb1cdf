//! What an engine keeps for each running case, by case id: one of the values the engine
//! is shared across cases with (a case's work folder, its pair of nodes).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::ctx::Ctx;

/// A value per running case, by case id.
#[derive(Debug)]
pub struct PerCase<T>(Mutex<HashMap<String, T>>);

impl<T> Default for PerCase<T> {
    fn default() -> PerCase<T> {
        PerCase(Mutex::new(HashMap::new()))
    }
}

impl<T> PerCase<T> {
    /// The value of the case in `ctx`, if it has one.
    pub fn get(&self, ctx: &Ctx) -> Option<T>
    where
        T: Clone,
    {
        self.0
            .lock()
            .expect("not poisoned")
            .get(ctx.case_id())
            .cloned()
    }

    /// Keeps `value` as the value of the case in `ctx` (replacing any earlier one).
    pub fn insert(&self, ctx: &Ctx, value: T) {
        let mut values = self.0.lock().expect("not poisoned");
        values.insert(ctx.case_id().to_string(), value);
    }

    /// Takes the value of the case in `ctx` out (it drops when the caller lets it go).
    pub fn remove(&self, ctx: &Ctx) -> Option<T> {
        self.0.lock().expect("not poisoned").remove(ctx.case_id())
    }
}
