//! Label selectors: Go's `labels.Parse` (its lexer, parser and `NewRequirement` validation),
//! reduced to accept or reject.

use super::{Invalid, is_go_int64};

/// Whether Go's `labels.Parse` accepts the selector.
pub(super) fn is_valid_label_selector(selector: &[u8]) -> bool {
    LabelParser::new(selector).selector().is_ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'s> {
    End,
    OpenPar,
    ClosedPar,
    Comma,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    /// Keys, values and the keywords `in`/`notin`, which are only keywords where an operator
    /// is expected.
    Ident(&'s [u8]),
}

/// Go's label-selector `Lexer`, byte for byte.
struct Lexer<'s> {
    s: &'s [u8],
    pos: usize,
    ended: bool,
}

impl<'s> Lexer<'s> {
    fn next_token(&mut self) -> Token<'s> {
        if self.ended {
            return Token::End;
        }
        while self.s.get(self.pos).is_some_and(|&b| is_label_whitespace(b)) {
            self.pos += 1;
        }
        let first = match self.s.get(self.pos) {
            // Go's read() returns 0 both at the end and for a NUL byte, so a NUL where a token
            // would start ends the input.
            None | Some(0) => {
                self.ended = true;
                return Token::End;
            }
            Some(&b) => b,
        };
        let token = match single_char_token(first) {
            Some(single) => self.special(first, single),
            None => self.ident(),
        };
        // For the same reason a NUL right after a token is swallowed, not put back.
        if self.s.get(self.pos) == Some(&0) {
            self.pos += 1;
        }
        token
    }

    fn special(&mut self, first: u8, single: Token<'s>) -> Token<'s> {
        self.pos += 1;
        let double = match (first, self.s.get(self.pos)) {
            (b'!', Some(b'=')) => Some(Token::NotEquals),
            (b'=', Some(b'=')) => Some(Token::DoubleEquals),
            _ => None,
        };
        if double.is_some() {
            self.pos += 1;
        }
        double.unwrap_or(single)
    }

    fn ident(&mut self) -> Token<'s> {
        let start = self.pos;
        while self
            .s
            .get(self.pos)
            .is_some_and(|&b| b != 0 && !is_label_whitespace(b) && single_char_token(b).is_none())
        {
            self.pos += 1;
        }
        Token::Ident(self.s.get(start..self.pos).unwrap_or_default())
    }
}

fn is_label_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn single_char_token(b: u8) -> Option<Token<'static>> {
    match b {
        b'(' => Some(Token::OpenPar),
        b')' => Some(Token::ClosedPar),
        b',' => Some(Token::Comma),
        b'!' => Some(Token::Bang),
        b'=' => Some(Token::Equals),
        b'>' => Some(Token::GreaterThan),
        b'<' => Some(Token::LessThan),
        _ => None,
    }
}

/// Go's label-selector `Parser` with `NewRequirement`'s validation, reduced to accept/reject.
struct LabelParser<'s> {
    lexer: Lexer<'s>,
    peeked: Option<Token<'s>>,
}

impl<'s> LabelParser<'s> {
    fn new(selector: &'s [u8]) -> Self {
        LabelParser { lexer: Lexer { s: selector, pos: 0, ended: false }, peeked: None }
    }

    fn peek(&mut self) -> Token<'s> {
        let token = self.peeked.unwrap_or_else(|| self.lexer.next_token());
        self.peeked = Some(token);
        token
    }

    fn next(&mut self) -> Token<'s> {
        self.peeked.take().unwrap_or_else(|| self.lexer.next_token())
    }

    fn selector(&mut self) -> Result<(), Invalid> {
        match self.peek() {
            Token::End => return Ok(()),
            Token::Ident(_) | Token::Bang => {}
            _ => return Err(Invalid),
        }
        loop {
            self.requirement()?;
            match self.next() {
                Token::End => return Ok(()),
                Token::Comma if matches!(self.peek(), Token::Ident(_) | Token::Bang) => {}
                _ => return Err(Invalid),
            }
        }
    }

    fn requirement(&mut self) -> Result<(), Invalid> {
        let mut token = self.next();
        let negated = token == Token::Bang;
        if negated {
            token = self.next();
        }
        let Token::Ident(key) = token else {
            return Err(Invalid);
        };
        if !is_qualified_name(key) {
            return Err(Invalid);
        }
        // `!key` never takes an operator: whatever follows must be ',' or the end.
        if negated || matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(());
        }
        match self.next() {
            Token::Ident(op) if op == b"in" || op == b"notin" => self.value_set(),
            Token::Equals | Token::DoubleEquals | Token::NotEquals => self.exact_value().map(drop),
            Token::GreaterThan | Token::LessThan => {
                let value = self.exact_value()?;
                if is_go_int64(value) { Ok(()) } else { Err(Invalid) }
            }
            _ => Err(Invalid),
        }
    }

    fn exact_value(&mut self) -> Result<&'s [u8], Invalid> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(b"");
        }
        match self.next() {
            Token::Ident(value) if is_label_value(value) => Ok(value),
            _ => Err(Invalid),
        }
    }

    fn value_set(&mut self) -> Result<(), Invalid> {
        if self.next() != Token::OpenPar {
            return Err(Invalid);
        }
        match self.peek() {
            Token::ClosedPar => {
                self.next();
                Ok(())
            }
            Token::Ident(_) | Token::Comma => {
                self.value_list()?;
                if self.next() == Token::ClosedPar { Ok(()) } else { Err(Invalid) }
            }
            _ => Err(Invalid),
        }
    }

    /// Go's `parseIdentifiersList`: values separated by commas, any of them empty. Returns
    /// with the ')' still to be read.
    fn value_list(&mut self) -> Result<(), Invalid> {
        loop {
            match self.next() {
                Token::Ident(value) => {
                    if !is_label_value(value) {
                        return Err(Invalid);
                    }
                    match self.peek() {
                        Token::Comma => {}
                        Token::ClosedPar => return Ok(()),
                        _ => return Err(Invalid),
                    }
                }
                Token::Comma => match self.peek() {
                    Token::ClosedPar => return Ok(()),
                    Token::Comma => {
                        self.next();
                    }
                    _ => {}
                },
                _ => return Err(Invalid),
            }
        }
    }
}

/// `validation.IsQualifiedName`: `[dns-subdomain/]name`, name ≤ 63 of `[-A-Za-z0-9_.]` starting
/// and ending alphanumeric.
fn is_qualified_name(key: &[u8]) -> bool {
    let mut parts = key.split(|&b| b == b'/');
    let (first, second, third) = (parts.next(), parts.next(), parts.next());
    let name = match (first, second, third) {
        (Some(name), None, _) => name,
        (Some(prefix), Some(name), None) if is_dns1123_subdomain(prefix) => name,
        _ => return false,
    };
    !name.is_empty() && name.len() <= 63 && is_qualified_name_part(name)
}

/// `validation.IsValidLabelValue`: empty, or a qualified-name part of at most 63 bytes.
fn is_label_value(value: &[u8]) -> bool {
    value.len() <= 63 && (value.is_empty() || is_qualified_name_part(value))
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(v: &[u8]) -> bool {
    match (v.first(), v.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && v.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `validation.IsDNS1123Subdomain`: ≤ 253 bytes of dot-separated `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns1123_subdomain(v: &[u8]) -> bool {
    let is_label = |l: &[u8]| match (l.first(), l.last()) {
        (Some(first), Some(last)) => {
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            alnum(first) && alnum(last) && l.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    };
    v.len() <= 253 && v.split(|&b| b == b'.').all(is_label)
}
