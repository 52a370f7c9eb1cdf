//! When a case may run relative to the others.

use serde::Serialize;

/// When a case may run relative to the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Schedule {
    /// Alongside other cases (it touches only its own database or file).
    Concurrent,
    /// Alone: it restarts the cluster or kills processes that others would notice.
    Exclusive,
    /// After every other case of the run (it inspects the clean databases or files of
    /// its family: the family's reconciliation).
    Last,
}
