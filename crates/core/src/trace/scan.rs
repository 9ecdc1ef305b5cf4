//! A trace's text cut into values, streamed, for serde_json to parse each from a slice.
//!
//! serde_json reads an `io::Read` a byte at a time and copies every string into its scratch
//! buffer (its documentation: `from_reader` is much slower than `from_slice`), which made that
//! reader most of an import's time. Here the text is read in large blocks; a value's extent is
//! found by a walk over its bytes (its own brackets and the quotes, strings skipped whole,
//! escapes honoured), and serde_json parses the value from its slice, borrowing strings without
//! escapes. What is validated is still serde_json's: the scanner only finds where a value ends
//! (text that is not JSON inside it is serde_json's error), and the punctuation between values.
//! Memory: one block, or the largest single value when that is larger.

use std::io::{self, Read};

/// Bytes read at a time.
const BLOCK: usize = 1 << 20;

/// Where the scan of one value stands (kept across reads of more text).
#[derive(Clone, Copy)]
enum Walk {
    /// An object or array: its bracket pair, the depth, inside a string, after a backslash.
    Nest {
        open: u8,
        close: u8,
        depth: u32,
        in_str: bool,
        esc: bool,
    },
    /// A string: after its opening quote; after a backslash.
    Str { opened: bool, esc: bool },
    /// A number, `true`, `false`, `null`: up to the next delimiter.
    Scalar,
}

impl Walk {
    fn new(first: u8) -> Walk {
        match first {
            b'{' => Walk::Nest {
                open: b'{',
                close: b'}',
                depth: 0,
                in_str: false,
                esc: false,
            },
            b'[' => Walk::Nest {
                open: b'[',
                close: b']',
                depth: 0,
                in_str: false,
                esc: false,
            },
            b'"' => Walk::Str {
                opened: false,
                esc: false,
            },
            _ => Walk::Scalar,
        }
    }

    /// Walks `s` (the text after what was walked before): the length up to the value's end
    /// (inclusive of its closing bracket or quote), or None when `s` ends first.
    fn walk(&mut self, s: &[u8]) -> Option<usize> {
        match self {
            Walk::Nest {
                open,
                close,
                depth,
                in_str,
                esc,
            } => {
                // the state in locals while walking, stored when `s` ends first
                let (open, close, mut d, mut quoted, mut escaped) =
                    (*open, *close, *depth, *in_str, *esc);
                let mut i = 0;
                let end = 'walk: loop {
                    if quoted {
                        match string_end(s, i, &mut escaped) {
                            Some(j) => i = j,
                            None => break 'walk None,
                        }
                        quoted = false;
                    }
                    // a byte at a time: the brackets and quotes of an event lie a few bytes
                    // apart, where a byte loop is twice as fast as a `memchr` per hop
                    loop {
                        let Some(&b) = s.get(i) else {
                            break 'walk None;
                        };
                        i += 1;
                        if b == b'"' {
                            quoted = true;
                            break;
                        } else if b == open {
                            d += 1;
                        } else if b == close {
                            d -= 1;
                            if d == 0 {
                                break 'walk Some(i);
                            }
                        }
                    }
                };
                (*depth, *in_str, *esc) = (d, quoted, escaped);
                end
            }
            Walk::Str { opened, esc } => {
                let mut i = 0;
                if !*opened {
                    if s.is_empty() {
                        return None;
                    }
                    *opened = true;
                    i = 1;
                }
                string_end(s, i, esc)
            }
            Walk::Scalar => s
                .iter()
                .position(|b| matches!(b, b',' | b']' | b'}' | b' ' | b'\n' | b'\r' | b'\t')),
        }
    }
}

/// Inside a string from `s[i..]` (after a backslash when `esc`): the length of `s` up to and
/// including the closing quote, or None when `s` ends first (`esc` then says whether it ended
/// right after a backslash).
fn string_end(s: &[u8], mut i: usize, esc: &mut bool) -> Option<usize> {
    loop {
        let &b = s.get(i)?;
        i += 1;
        if *esc {
            *esc = false;
        } else if b == b'\\' {
            *esc = true;
        } else if b == b'"' {
            return Some(i);
        }
    }
}

/// Text read in blocks, consumed value by value.
pub(super) struct Scanner<R> {
    reader: R,
    buf: Vec<u8>,
    /// The next byte not consumed.
    pos: usize,
    /// The end of the text read so far.
    end: usize,
    /// The offset in the text of `buf[0]`.
    base: u64,
    eof: bool,
}

impl<R: Read> Scanner<R> {
    pub fn new(reader: R) -> Self {
        Scanner {
            reader,
            buf: vec![0; BLOCK],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
        }
    }

    /// The offset in the text of the next byte not consumed.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Reads more text after what is held (the part not consumed moved to the front, the
    /// buffer grown when that part fills most of it); false at the end of the text.
    fn more(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.buf.len() - self.end < BLOCK / 2 {
            let grow = self.buf.len().max(BLOCK);
            self.buf.resize(self.buf.len() + grow, 0);
        }
        loop {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The next byte that is not whitespace, not consumed; None at the end of the text.
    pub fn peek(&mut self) -> io::Result<Option<u8>> {
        loop {
            while self.pos < self.end {
                let b = self.buf[self.pos];
                if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            if !self.more()? {
                return Ok(None);
            }
        }
    }

    /// Consumes the byte [`Scanner::peek`] returned.
    pub fn bump(&mut self) {
        self.pos += 1;
    }

    /// The next value's text (it starts at the next byte: call [`Scanner::peek`] first),
    /// consumed; None when the text ends inside it (a scalar may end with the text).
    pub fn value(&mut self) -> io::Result<Option<&[u8]>> {
        let mut walk = Walk::new(self.buf[self.pos]);
        // walked so far, from `pos` (which `more` may move)
        let mut walked = 0;
        loop {
            if let Some(n) = walk.walk(&self.buf[self.pos + walked..self.end]) {
                let start = self.pos;
                self.pos += walked + n;
                return Ok(Some(&self.buf[start..self.pos]));
            }
            walked = self.end - self.pos;
            if !self.more()? {
                if matches!(walk, Walk::Scalar) {
                    let start = self.pos;
                    self.pos = self.end;
                    return Ok(Some(&self.buf[start..self.end]));
                }
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads through a reader that gives `step` bytes at a time, so that every value is cut
    /// across reads at every place.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(self.0.len()).min(out.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn values(text: &str, step: usize) -> (Vec<String>, bool) {
        let mut sc = Scanner::new(Trickle(text.as_bytes(), step));
        let mut out = Vec::new();
        loop {
            match sc.peek().unwrap() {
                None => return (out, true),
                Some(b',') => sc.bump(),
                Some(_) => match sc.value().unwrap() {
                    Some(v) => out.push(String::from_utf8(v.to_vec()).unwrap()),
                    None => return (out, false),
                },
            }
        }
    }

    #[test]
    fn values_end_where_their_brackets_close_outside_strings() {
        // braces and quotes inside strings, escaped quotes and backslashes, nested arrays
        let vals = [
            r#"{"name":"a}b{","args":{"x":[1,{"y":"\"}"}]}}"#,
            r#"{"k":"\\","l":"\\\"{"}"#,
            r#"[[1,2],[3,"]"]]"#,
            r#""a \" , ] string""#,
            "12.5e3",
            "true",
        ];
        let text = format!(" {} ,\n{}", vals.join(" , "), "null");
        for step in [1, 2, 3, 7, 1 << 20] {
            let (got, whole) = values(&text, step);
            assert!(whole);
            let mut want: Vec<&str> = vals.to_vec();
            want.push("null");
            assert_eq!(got, want, "read {step} bytes at a time");
        }
    }

    #[test]
    fn a_value_cut_by_the_end_of_the_text_is_none() {
        for step in [1, 5, 1 << 20] {
            let (got, whole) = values(r#"{"a":1} , {"b":"}"#, step);
            assert_eq!(got, [r#"{"a":1}"#]);
            assert!(!whole);
            // cut right after a backslash inside a string
            let (got, whole) = values(r#"{"a":"x\"#, step);
            assert!(got.is_empty() && !whole);
        }
    }

    #[test]
    fn a_value_larger_than_a_block_is_held_whole_and_offsets_count_the_text() {
        let big = format!(r#"{{"s":"{}"}}"#, "x".repeat(3 * BLOCK));
        let text = format!("[{big}, 1]");
        let mut sc = Scanner::new(Trickle(text.as_bytes(), 4096));
        assert_eq!(sc.peek().unwrap(), Some(b'['));
        sc.bump();
        sc.peek().unwrap();
        assert_eq!(sc.offset(), 1);
        assert_eq!(sc.value().unwrap().unwrap(), big.as_bytes());
        assert_eq!(sc.offset(), 1 + big.len() as u64);
        assert_eq!(sc.peek().unwrap(), Some(b','));
        sc.bump();
        sc.peek().unwrap();
        assert_eq!(sc.value().unwrap().unwrap(), b"1");
        assert_eq!(sc.peek().unwrap(), Some(b']'));
        assert_eq!(sc.offset(), text.len() as u64 - 1);
    }
}
