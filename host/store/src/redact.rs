//! Passwords out of store locations: [`redact_url`] is what every message,
//! log line and `Debug` shows of a store URL. A leaf: it knows nothing of
//! stores.

/// `(scheme, rest)` of `scheme://rest`, if `url` starts with a scheme.
pub(crate) fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let valid = first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some((scheme, rest))
}

/// `url` with every password replaced by `***`: the one in the user info
/// (`postgres://user:secret@host/db`), `password=` parameters of the query
/// string (`?password=secret`), and `password=` in a key-value connection
/// string (`host=h password=secret`).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = split_scheme(url) else {
        return redact_params(url, ' ');
    };
    // The user info ends at the last `@` before the path, query or fragment
    // — looked for up to the query, so an unescaped `/` or `@` inside a
    // password still ends up redacted.
    let head_end = rest.find(['?', '#']).unwrap_or(rest.len());
    let (head, tail) = rest.split_at(head_end);
    let head = match head.rfind('@') {
        Some(at) => {
            let (userinfo, host) = head.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:***{host}"),
                None => head.to_owned(),
            }
        }
        None => head.to_owned(),
    };
    format!("{scheme}://{head}{}", redact_params(tail, '&'))
}

/// `text` with the value of every `password=` parameter replaced by `***`;
/// parameters are separated by `sep` (and a value may be single-quoted in a
/// key-value string).
fn redact_params(text: &str, sep: char) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(k) = find_ignore_case(rest, "password") {
        let before = &rest[..k];
        let at_start = before.is_empty()
            || before.ends_with([sep, '?', '&', ' ', '\t', '\n'])
            || before.ends_with(char::is_whitespace);
        let after = &rest[k + "password".len()..];
        let trimmed = after.trim_start();
        let Some(value) = trimmed.strip_prefix('=').filter(|_| at_start) else {
            out.push_str(&rest[..k + "password".len()]);
            rest = after;
            continue;
        };
        out.push_str(before);
        out.push_str("password=***");
        let value = value.trim_start();
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            // A quoted value ends at the next unescaped quote.
            let mut escaped = false;
            let mut end = value.len();
            for (i, c) in quoted.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '\'' if !escaped => {
                        end = i + 2;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            end
        } else {
            value
                .find(|c: char| c == sep || c == '#' || c.is_whitespace())
                .unwrap_or(value.len())
        };
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

fn find_ignore_case(hay: &str, needle: &str) -> Option<usize> {
    hay.to_ascii_lowercase().find(needle)
}
