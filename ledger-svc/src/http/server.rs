//! Accept loops on hyper 1.x (HTTP/1.1), one per listener, each watched by a
//! `GracefulShutdown` so that shutdown lets in-flight requests finish.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::listener::Listener;
use super::routes::handle;
use super::state::AppState;

/// A client must send its request head within this, milliseconds.
pub const HEADER_READ_TIMEOUT_MS: u64 = 5_000;
/// Read buffer of a connection, bytes; a request head larger than this is refused by
/// hyper (431).
pub const MAX_HEADER_BUFFER_BYTES: usize = 16 * 1024;
/// Pause after a failed `accept` (e.g. out of file descriptors), milliseconds.
const ACCEPT_RETRY_MS: u64 = 50;

/// Serves `listener` until `stop` turns true, then stops accepting and returns the
/// connections still open, for the caller to drain within its grace period.
pub async fn serve(
    listener: TcpListener,
    which: Listener,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS))
        .max_buf_size(MAX_HEADER_BUFFER_BYTES);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let state = state.clone();
                    let service =
                        service_fn(move |request| handle(state.clone(), which, request));
                    let connection = graceful.watch(
                        builder.serve_connection(TokioIo::new(stream), service),
                    );
                    // An error here is a client that went away, a malformed request head,
                    // or a fault that closed the connection on purpose: nothing to do.
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                }
                Err(error) => {
                    eprintln!("ledger-svc: {which:?} accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                }
            },
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
            }
        }
    }
    drop(listener);
    graceful
}
