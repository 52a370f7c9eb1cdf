//! The naive designs the L negative controls run on purpose, beside the real ones they
//! refute, so a control's design can be read next to the design it fails:
//!
//! - [`debit`]: read the balance, decide in the application, write (L4, L5, L6; refuted
//!   by [`crate::transfer()`]'s conditional update).
//! - [`reconcile`]: L11's checks from separate READ COMMITTED statements (L20; refuted by
//!   [`crate::reconcile()`]'s one REPEATABLE READ snapshot).
//!
//! Nothing here is used by the product.

pub mod debit;
pub mod reconcile;
