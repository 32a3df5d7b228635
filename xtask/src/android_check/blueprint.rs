//! A small Blueprint (Android.bp) parser of our own, for check 1c: enough
//! of the grammar Soong's blueprint parser accepts (github.com/google/
//! blueprint, parser/parser.go) to reject what it would reject in the
//! files `cargo xtask dist` writes: module definitions `type { name: value,
//! ... }` (or `type(...)`-less maps only), variable assignments `x = value`
//! / `x += value`, values that are strings (with Go escapes), booleans,
//! integers, lists `[v, ...]`, maps `{k: v, ...}`, variable references and
//! `+` concatenation, trailing commas, `//` and `/* */` comments.
//!
//! It is not Soong: module types and property names are not checked
//! against Soong's schema (`dist`'s own test pins those), and `select()`
//! is not supported.

use anyhow::{bail, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Bool(bool),
    Int(i64),
    List(Vec<Value>),
    Map(Vec<(String, Value)>),
    Var(String),
    /// `a + b`
    Concat(Box<Value>, Box<Value>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Module {
    pub kind: String,
    pub props: Vec<(String, Value)>,
    pub line: usize,
}

impl Module {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.props.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

struct P<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> P<'a> {
    fn line(&self) -> usize {
        self.s[..self.i].iter().filter(|&&c| c == b'\n').count() + 1
    }

    fn err<T>(&self, what: &str) -> Result<T> {
        bail!("Android.bp:{}: {what}", self.line())
    }

    /// Skips whitespace and comments.
    fn ws(&mut self) -> Result<()> {
        loop {
            while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
            if self.s[self.i..].starts_with(b"//") {
                while self.i < self.s.len() && self.s[self.i] != b'\n' {
                    self.i += 1;
                }
            } else if self.s[self.i..].starts_with(b"/*") {
                match self.s[self.i + 2..].windows(2).position(|w| w == b"*/") {
                    Some(p) => self.i += p + 4,
                    None => return self.err("unterminated /* comment"),
                }
            } else {
                return Ok(());
            }
        }
    }

    fn peek(&mut self) -> Result<Option<u8>> {
        self.ws()?;
        Ok(self.s.get(self.i).copied())
    }

    fn eat(&mut self, c: u8) -> Result<bool> {
        if self.peek()? == Some(c) {
            self.i += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn expect(&mut self, c: u8) -> Result<()> {
        if !self.eat(c)? {
            return self.err(&format!("expected `{}`", c as char));
        }
        Ok(())
    }

    fn ident(&mut self) -> Result<String> {
        self.ws()?;
        let st = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
        {
            self.i += 1;
        }
        if st == self.i || self.s[st].is_ascii_digit() {
            return self.err("expected an identifier");
        }
        Ok(String::from_utf8_lossy(&self.s[st..self.i]).into_owned())
    }

    fn string(&mut self) -> Result<String> {
        // Go string literal: "..." with escapes, or `raw`.
        let q = self.s[self.i];
        self.i += 1;
        let mut out = Vec::new();
        while self.i < self.s.len() {
            let c = self.s[self.i];
            self.i += 1;
            if c == q {
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            if c == b'\n' && q == b'"' {
                return self.err("newline in string");
            }
            if c == b'\\' && q == b'"' {
                let e = *self.s.get(self.i).unwrap_or(&0);
                self.i += 1;
                out.push(match e {
                    b'n' => b'\n',
                    b't' => b'\t',
                    b'\\' => b'\\',
                    b'"' => b'"',
                    _ => return self.err(&format!("unknown escape \\{}", e as char)),
                });
            } else {
                out.push(c);
            }
        }
        self.err("unterminated string")
    }

    fn operand(&mut self) -> Result<Value> {
        match self.peek()? {
            Some(b'"') | Some(b'`') => Ok(Value::Str(self.string()?)),
            Some(b'[') => {
                self.i += 1;
                let mut v = Vec::new();
                while !self.eat(b']')? {
                    v.push(self.value()?);
                    if !self.eat(b',')? {
                        self.expect(b']')?;
                        break;
                    }
                }
                Ok(Value::List(v))
            }
            Some(b'{') => {
                self.i += 1;
                Ok(Value::Map(self.props(b'}')?))
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let st = self.i;
                self.i += 1;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                match std::str::from_utf8(&self.s[st..self.i]).unwrap().parse() {
                    Ok(n) => Ok(Value::Int(n)),
                    Err(_) => self.err("bad integer"),
                }
            }
            Some(_) => {
                let id = self.ident()?;
                Ok(match id.as_str() {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    _ => Value::Var(id),
                })
            }
            None => self.err("expected a value"),
        }
    }

    fn value(&mut self) -> Result<Value> {
        let mut v = self.operand()?;
        while self.eat(b'+')? {
            v = Value::Concat(Box::new(v), Box::new(self.operand()?));
        }
        Ok(v)
    }

    /// `name: value, ...` up to `close` (consumed); trailing comma allowed.
    fn props(&mut self, close: u8) -> Result<Vec<(String, Value)>> {
        let mut v: Vec<(String, Value)> = Vec::new();
        while !self.eat(close)? {
            let k = self.ident()?;
            if v.iter().any(|(x, _)| *x == k) {
                return self.err(&format!("property `{k}` defined twice"));
            }
            self.expect(b':')?;
            v.push((k, self.value()?));
            if !self.eat(b',')? {
                self.expect(close)?;
                break;
            }
        }
        Ok(v)
    }
}

/// Parses a whole file into its modules (assignments are checked, not kept).
pub fn parse(text: &str) -> Result<Vec<Module>> {
    let mut p = P {
        s: text.as_bytes(),
        i: 0,
    };
    let mut modules = Vec::new();
    while p.peek()?.is_some() {
        let line = p.line();
        let id = p.ident()?;
        match p.peek()? {
            Some(b'{') => {
                p.i += 1;
                let props = p.props(b'}')?;
                modules.push(Module {
                    kind: id,
                    props,
                    line,
                });
            }
            Some(b'=') => {
                p.i += 1;
                p.value()?;
            }
            Some(b'+') => {
                p.i += 1;
                p.expect(b'=')?;
                p.value()?;
            }
            _ => return p.err(&format!("`{id}` is neither a module nor an assignment")),
        }
    }
    Ok(modules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modules_lists_maps_and_comments() {
        let m = parse(
            "// c\nfoo = [\"a\"] + [\"b\"]\npackage {\n  x: [\"y\",],\n}\n/* b */\n\
             cc_prebuilt_binary {\n name: \"v\", arch: { arm64: { srcs: [\"bin/v\"] } },\n \
             strip: { none: true }, n: -3, l: foo,\n}\n",
        )
        .unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].kind, "cc_prebuilt_binary");
        assert_eq!(m[1].get("name"), Some(&Value::Str("v".into())));
        assert_eq!(m[1].get("n"), Some(&Value::Int(-3)));
        assert_eq!(m[1].line, 7);
    }

    #[test]
    fn rejects_what_blueprint_rejects() {
        for bad in [
            "m { name: \"a\" ",
            "m { name \"a\" }",
            "m { name: \"a\" name: \"b\" }",
            "m { name: \"a\", name: \"b\" }",
            "m { srcs: [\"a\" \"b\"] }",
            "m { name: \"a }",
            "m ( name: \"a\" )",
            "/* open",
            "m { s: \"\\q\" }",
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
