//! Which of the two listeners a request came in on.

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The public listener.
    Public,
    /// The admin listener.
    Admin,
}
