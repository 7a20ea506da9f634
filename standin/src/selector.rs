//! Label and field selectors (`labelSelector=`, `fieldSelector=`), parsed and matched as
//! apimachinery's `labels.Parse` and `fields.ParseSelector` do.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Exists,
    NotExists,
    Equals,
    NotEquals,
    In,
    NotIn,
    Greater,
    Less,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// A parsed field selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Op(&'static str),
    Comma,
    Open,
    Close,
}

fn lex(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let next = chars.get(i + 1).copied();
        let (token, width) = match (c, next) {
            (c, _) if c.is_whitespace() => {
                i += 1;
                continue;
            }
            (',', _) => (Token::Comma, 1),
            ('(', _) => (Token::Open, 1),
            (')', _) => (Token::Close, 1),
            ('=', Some('=')) => (Token::Op("=="), 2),
            ('=', _) => (Token::Op("="), 1),
            ('!', Some('=')) => (Token::Op("!="), 2),
            ('!', _) => (Token::Op("!"), 1),
            ('>', _) => (Token::Op(">"), 1),
            ('<', _) => (Token::Op("<"), 1),
            _ => {
                let word: String = chars[i..]
                    .iter()
                    .take_while(|c| !c.is_whitespace() && !",()=!<>".contains(**c))
                    .collect();
                let width = word.chars().count();
                (Token::Word(word), width)
            }
        };
        tokens.push(token);
        i += width;
    }
    tokens
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let tokens = lex(text);
        let mut requirements = Vec::new();
        let mut rest = tokens.as_slice();
        while !rest.is_empty() {
            let (requirement, after) = requirement(rest)?;
            requirements.push(requirement);
            rest = match after {
                [] => after,
                [Token::Comma, tail @ ..] if !tail.is_empty() => tail,
                _ => return Err(format!("found '{}', expected: ','", describe(after))),
            };
        }
        Ok(LabelSelector(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.0.iter().all(|r| {
            let value = labels.get(&r.key).and_then(Value::as_str);
            match r.op {
                Op::Exists => value.is_some(),
                Op::NotExists => value.is_none(),
                Op::Equals | Op::In => value.is_some_and(|v| r.values.iter().any(|w| w == v)),
                Op::NotEquals | Op::NotIn => value.is_none_or(|v| r.values.iter().all(|w| w != v)),
                Op::Greater | Op::Less => {
                    let (Some(have), Some(want)) = (
                        value.and_then(|v| v.parse::<i64>().ok()),
                        r.values.first().and_then(|v| v.parse::<i64>().ok()),
                    ) else {
                        return false;
                    };
                    if r.op == Op::Greater { have > want } else { have < want }
                }
            }
        })
    }
}

fn describe(tokens: &[Token]) -> String {
    match tokens.first() {
        Some(Token::Word(w)) => w.clone(),
        Some(Token::Op(o)) => (*o).to_string(),
        Some(Token::Comma) => ",".into(),
        Some(Token::Open) => "(".into(),
        Some(Token::Close) => ")".into(),
        None => "end of string".into(),
    }
}

fn requirement(tokens: &[Token]) -> Result<(Requirement, &[Token]), String> {
    let simple = |key: &str, op, values: Vec<String>| Requirement { key: key.to_string(), op, values };
    match tokens {
        [Token::Op("!"), Token::Word(key), rest @ ..] => Ok((simple(key, Op::NotExists, vec![]), rest)),
        [Token::Word(key), Token::Op(op), rest @ ..] => {
            let op = match *op {
                "=" | "==" => Op::Equals,
                "!=" => Op::NotEquals,
                ">" => Op::Greater,
                "<" => Op::Less,
                _ => return Err(format!("found '{op}', expected: in, notin, =, ==, !=, gt, lt")),
            };
            match rest {
                [Token::Word(value), rest @ ..] => Ok((simple(key, op, vec![value.clone()]), rest)),
                // `key=` selects the empty value.
                _ => Ok((simple(key, op, vec![String::new()]), rest)),
            }
        }
        [Token::Word(key), Token::Word(op), Token::Open, rest @ ..] if op == "in" || op == "notin" => {
            let mut values = Vec::new();
            let mut rest = rest;
            loop {
                match rest {
                    [Token::Word(v), Token::Comma, tail @ ..] => {
                        values.push(v.clone());
                        rest = tail;
                    }
                    [Token::Word(v), Token::Close, tail @ ..] => {
                        values.push(v.clone());
                        rest = tail;
                        break;
                    }
                    [Token::Close, tail @ ..] => {
                        rest = tail;
                        break;
                    }
                    _ => return Err(format!("found '{}', expected: ',', ')' or identifier", describe(rest))),
                }
            }
            let op = if op == "in" { Op::In } else { Op::NotIn };
            Ok((simple(key, op, values), rest))
        }
        [Token::Word(key), rest @ ..] if matches!(rest.first(), None | Some(Token::Comma)) => {
            Ok((simple(key, Op::Exists, vec![]), rest))
        }
        _ => Err(format!("unable to parse requirement: found '{}'", describe(tokens))),
    }
}

impl FieldSelector {
    pub fn parse(text: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in split_unescaped(text, ',') {
            if term.is_empty() {
                continue;
            }
            let (field, equal, value) = if let Some((f, v)) = split_once_unescaped(&term, "!=") {
                (f, false, v)
            } else if let Some((f, v)) = split_once_unescaped(&term, "==") {
                (f, true, v)
            } else if let Some((f, v)) = split_once_unescaped(&term, "=") {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: '{text}'; can't understand '{term}'"));
            };
            terms.push((field.trim().to_string(), equal, unescape(&value)));
        }
        Ok(FieldSelector(terms))
    }

    /// Upstream supports `metadata.name`, `metadata.namespace` and a few fields per resource;
    /// any other dotted path is read from the object here, which is more lenient.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, want)| {
            let mut at = object;
            for part in field.split('.') {
                at = &at[part];
            }
            let have = match at {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (have == *want) == *equal
        })
    }
}

fn split_unescaped(text: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in text.chars() {
        match c {
            _ if escaped => {
                escaped = false;
                if let Some(p) = parts.last_mut() {
                    p.push('\\');
                    p.push(c);
                }
            }
            '\\' => escaped = true,
            c if c == sep => parts.push(String::new()),
            c => {
                if let Some(p) = parts.last_mut() {
                    p.push(c);
                }
            }
        }
    }
    parts
}

fn split_once_unescaped(term: &str, op: &str) -> Option<(String, String)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if term[i..].starts_with(op) {
            return Some((term[..i].to_string(), term[i + op.len()..].to_string()));
        }
    }
    None
}

fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut escaped = false;
    for c in value.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "namespace": "default", "labels": labels}, "type": "Opaque"})
    }

    #[test]
    fn label_selectors() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "7"}));
        let yes = [
            "",
            "app=web",
            "app==web",
            "app!=db",
            "missing!=x",
            "app",
            "!missing",
            "app in (web,db)",
            "app notin (db)",
            "missing notin (db)",
            "app=web,tier=front",
            "n>5",
            "n<8",
            " app = web , tier in ( front ) ",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        let no = [
            "app=db",
            "!app",
            "missing",
            "app in (db)",
            "app notin (web)",
            "app=web,tier=back",
            "n>7",
            "missing=x",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        for bad in ["app in web", "=x", "app=web,", "a b", "app in (web"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        for s in ["metadata.name=x", "metadata.name==x", "metadata.namespace!=kube-system", "type=Opaque", ""]
        {
            assert!(FieldSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        for s in ["metadata.name=y", "metadata.name!=x", "metadata.name=x,metadata.namespace=other"] {
            assert!(!FieldSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        assert_eq!(FieldSelector::parse(r"a=b\,c").unwrap().0[0].2, "b,c");
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
