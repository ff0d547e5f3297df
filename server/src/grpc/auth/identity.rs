//! Who a client certificate says it is: its identities, each with its kind, and the same
//! identities as an auth file's `subjects` and the logs write them.
/// The identities of a client certificate that an auth file's `subjects` may name, each with
/// its kind, so that one kind can never pose as another (a SAN URI whose text is `CN=admin` is
/// `uri:CN=admin`, not the common name `cn:admin`): each SAN URI (`uri:`), each SAN DNS name
/// (`dns:`), then the subject's common name (`cn:`).
pub fn cert_identities(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else { return Vec::new() };
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(u) = n {
                out.push(format!("uri:{u}"));
            }
        }
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                out.push(format!("dns:{d}"));
            }
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            out.push(format!("cn:{s}"));
        }
    }
    out
}

/// An auth file's subject as the key [`cert_identities`] gives: `CN=name` or `cn:name` is a
/// common name, `dns:name` a SAN DNS name, `uri:…` or a bare URI (a scheme, then `:`) a SAN URI.
/// `None` when it is none of them.
pub(super) fn subject_key(s: &str) -> Option<String> {
    let non_empty = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    if let Some(cn) = s.strip_prefix("CN=").or_else(|| s.strip_prefix("cn:")) {
        return non_empty(cn).map(|v| format!("cn:{v}"));
    }
    if let Some(d) = s.strip_prefix("dns:") {
        return non_empty(d).map(|v| format!("dns:{v}"));
    }
    if let Some(u) = s.strip_prefix("uri:") {
        return non_empty(u).map(|v| format!("uri:{v}"));
    }
    let (scheme, rest) = s.split_once(':')?;
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (valid && !rest.is_empty()).then(|| format!("uri:{s}"))
}

/// An identity as logs and audit lines show it: `CN=name`, the URI itself, `DNS:name`.
pub(super) fn shown_identity(key: &str) -> String {
    if let Some(cn) = key.strip_prefix("cn:") {
        format!("CN={cn}")
    } else if let Some(d) = key.strip_prefix("dns:") {
        format!("DNS:{d}")
    } else {
        key.strip_prefix("uri:").unwrap_or(key).to_owned()
    }
}
