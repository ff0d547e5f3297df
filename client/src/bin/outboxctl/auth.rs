//! `outboxctl auth`: credentials for outboxd's auth file, offline.

use anyhow::Result;
use serde_json::json;

use crate::Output;
use crate::failure::Failure;

/// 32 random bytes as 64 hex digits: as much entropy as the SHA-256 that stores it.
pub(crate) fn new_token(out: Output) -> Result<(), Failure> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| Failure { code: 1, message: format!("no randomness: {e}") })?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let hash = {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(token.as_bytes());
        format!("sha256:{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>())
    };
    match out {
        Output::Json => println!("{}", json!({ "token": token, "sha256": hash })),
        Output::Table => {
            println!("token:  {token}");
            println!("sha256: {hash}");
            eprintln!("Give the token to the client (--token, OUTBOXD_TOKEN or --token-file); put the sha256 line");
            eprintln!("in the principal's `tokens` in outboxd's auth file. The token is not shown again.");
        }
    }
    Ok(())
}
