//! Query parameters, decoded as Go's `url.ParseQuery` does (`+` is a space, `%XX` a byte).

/// The decoded `name=value` pairs of a query, in order.
#[derive(Debug, Clone, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(query: &str) -> Params {
        Params(
            query
                .split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                    (decode(name), decode(value))
                })
                .collect(),
        )
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// `true`/`1` (any case) → true, `false`/`0` → false, anything else (or absent) → None.
    pub fn flag(&self, name: &str) -> Option<bool> {
        match self.get(name)?.to_ascii_lowercase().as_str() {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        }
    }
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = || {
            let h = bytes.get(i + 1..i + 3)?;
            u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()
        };
        match b {
            b'+' => out.push(b' '),
            b'%' => match hex() {
                Some(decoded) => {
                    out.push(decoded);
                    i += 2;
                }
                None => out.push(b),
            },
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_like_go() {
        let p = Params::parse("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&watch=0&empty=&bad=%zz");
        assert_eq!(p.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(p.flag("watch"), Some(true));
        assert_eq!(p.get("empty"), Some(""));
        assert_eq!(p.get("bad"), Some("%zz"));
        assert_eq!(p.get("missing"), None);
    }
}
