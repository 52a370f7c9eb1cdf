//! The callers of the authentication tests (`--auth-tokens`): fixed tokens, and a token
//! file holding only their SHA-256 hashes.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// The callers of these tests: (token, client id, admin). `app-a` has a second, admin
/// token (its back office: spot deposits and fills in its own tenant).
pub const CALLERS: [(&str, &str, bool); 4] = [
    ("tok-a-3b1f0e2c9d8a7f6e5d4c3b2a1908f7e6", "app-a", false),
    ("tok-b-8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f", "app-b", false),
    ("tok-ops-5e4d3c2b1a09f8e7d6c5b4a392817061", "ops", true),
    ("tok-a-admin-7a6b5c4d3e2f1a0b9c8d7e6f5a4b", "app-a", true),
];
/// `app-a`'s trading token (not admin).
pub const TOKEN_A: &str = CALLERS[0].0;
/// `app-b`'s token (not admin).
pub const TOKEN_B: &str = CALLERS[1].0;
/// The operator's admin token (`ops`).
pub const TOKEN_OPS: &str = CALLERS[2].0;
/// `app-a`'s admin token (its deposits and fills).
pub const TOKEN_A_ADMIN: &str = CALLERS[3].0;
/// A well-formed token that is in no file.
pub const UNKNOWN_TOKEN: &str = "tok-unknown-0f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// Lower-case hex of the SHA-256 of `text` (what the token file holds).
pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A token file for [`CALLERS`] in a fresh folder (kept alive by the returned guard).
pub fn token_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp folder");
    let path = dir.path().join("tokens");
    let mut text = String::from("# sha256-of-token client-id admin\n\n");
    for (token, client, admin) in CALLERS {
        text.push_str(&format!(
            "{} {client} {}\n",
            sha256_hex(token),
            if admin { "yes" } else { "no" }
        ));
    }
    std::fs::write(&path, text).expect("write the token file");
    (dir, path)
}
