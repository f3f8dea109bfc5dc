//! The `Sec-WebSocket-Extensions` header of the upstream's `101` (RFC 6455 §9.1), read for what
//! it means to a reader: no extension, `permessage-deflate` with its parameters (RFC 7692 §7.1),
//! or something the reader cannot follow.

use super::Direction;

/// What the handshake's response negotiated, as far as reading frames goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extensions {
    /// No extension: frames carry plain payloads.
    None,
    /// `permessage-deflate` alone, with these parameters.
    PerMessageDeflate(DeflateParams),
    /// Some other extension, alone or beside `permessage-deflate`: what it does to frames is
    /// unknown, so the tunnel forwards the connection without reading it.
    Unsupported,
}

/// The parameters of `permessage-deflate` as the server accepted them (RFC 7692 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeflateParams {
    /// The server starts every message with an empty window.
    pub server_no_context_takeover: bool,
    /// The client starts every message with an empty window.
    pub client_no_context_takeover: bool,
    /// The server compresses with a window of at most 2^bits bytes (8 to 15; 15 when absent).
    pub server_max_window_bits: u8,
    /// The client compresses with a window of at most 2^bits bytes (8 to 15; 15 when absent).
    pub client_max_window_bits: u8,
}

impl Default for DeflateParams {
    /// Every parameter absent: both sides keep their context, with 32 KiB windows.
    fn default() -> Self {
        DeflateParams {
            server_no_context_takeover: false,
            client_no_context_takeover: false,
            server_max_window_bits: 15,
            client_max_window_bits: 15,
        }
    }
}

// === impl DeflateParams ===

impl DeflateParams {
    /// Whether messages going `direction` may refer to the ones before them.
    pub fn context_takeover(&self, direction: Direction) -> bool {
        match direction {
            Direction::ClientToServer => !self.client_no_context_takeover,
            Direction::ServerToClient => !self.server_no_context_takeover,
        }
    }

    /// The window bits of the side that sends `direction`'s messages.
    pub fn window_bits(&self, direction: Direction) -> u8 {
        match direction {
            Direction::ClientToServer => self.client_max_window_bits,
            Direction::ServerToClient => self.server_max_window_bits,
        }
    }
}

/// A `Sec-WebSocket-Extensions` response header that makes no sense; the connection is then
/// tunnelled without being read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtensionError {
    /// Not a list of `name; param=value` elements.
    #[error("not an extension list: field {field}, byte {at}")]
    Malformed {
        /// Which header field (0 for the first).
        field: usize,
        /// The byte of that field where the list stopped making sense.
        at: usize,
    },
    /// `permessage-deflate` accepted twice (a response names at most one, RFC 7692 §5).
    #[error("permessage-deflate negotiated twice")]
    DeflateTwice,
    /// A parameter RFC 7692 does not define.
    #[error("permessage-deflate has no parameter {0:?}")]
    UnknownParameter(String),
    /// A parameter given twice.
    #[error("permessage-deflate parameter {0} given twice")]
    DuplicateParameter(&'static str),
    /// A `*_no_context_takeover` with a value.
    #[error("permessage-deflate parameter {0} takes no value")]
    UnexpectedValue(&'static str),
    /// A `*_max_window_bits` without its value (only an offer may leave it out).
    #[error("permessage-deflate parameter {0} needs a value in a response")]
    MissingValue(&'static str),
    /// A `*_max_window_bits` whose value is not 8 to 15 in decimal without leading zeros.
    #[error("permessage-deflate {param}={value:?} is not a window size from 8 to 15")]
    WindowBits {
        /// The parameter.
        param: &'static str,
        /// Its value as written (unquoted).
        value: String,
    },
}

// === impl Extensions ===

impl Extensions {
    /// Reads the values of every `Sec-WebSocket-Extensions` field of the response, in order.
    pub fn from_response<'a>(
        fields: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Extensions, ExtensionError> {
        let mut deflate = None;
        let mut other = false;
        for (field, value) in fields.into_iter().enumerate() {
            let mut cursor = Cursor {
                bytes: value,
                at: 0,
            };
            while let Some((name, params)) = cursor
                .element()
                .map_err(|at| ExtensionError::Malformed { field, at })?
            {
                if name.eq_ignore_ascii_case(b"permessage-deflate") {
                    if deflate.is_some() {
                        return Err(ExtensionError::DeflateTwice);
                    }
                    deflate = Some(deflate_params(&params)?);
                } else {
                    other = true;
                }
            }
        }
        Ok(match (deflate, other) {
            (_, true) => Extensions::Unsupported,
            (Some(params), false) => Extensions::PerMessageDeflate(params),
            (None, false) => Extensions::None,
        })
    }
}

/// One parameter: its name and its value, unquoted, if it has one.
type Param<'a> = (&'a [u8], Option<Vec<u8>>);

/// One element of the list: the extension's name and its parameters.
type Element<'a> = (&'a [u8], Vec<Param<'a>>);

/// The parameters of `permessage-deflate` in a response, checked as RFC 7692 §7.1 says.
fn deflate_params(params: &[Param<'_>]) -> Result<DeflateParams, ExtensionError> {
    const NAMES: [&str; 4] = [
        "server_no_context_takeover",
        "client_no_context_takeover",
        "server_max_window_bits",
        "client_max_window_bits",
    ];
    let mut seen = [false; 4];
    let mut out = DeflateParams::default();
    for (name, value) in params {
        let Some(which) = NAMES
            .iter()
            .position(|n| name.eq_ignore_ascii_case(n.as_bytes()))
        else {
            return Err(ExtensionError::UnknownParameter(
                String::from_utf8_lossy(name).into_owned(),
            ));
        };
        let param = NAMES[which];
        if std::mem::replace(&mut seen[which], true) {
            return Err(ExtensionError::DuplicateParameter(param));
        }
        match (which, value) {
            (0 | 1, Some(_)) => return Err(ExtensionError::UnexpectedValue(param)),
            (0, None) => out.server_no_context_takeover = true,
            (1, None) => out.client_no_context_takeover = true,
            (_, None) => return Err(ExtensionError::MissingValue(param)),
            (_, Some(value)) => {
                let bits = window_bits(value).ok_or_else(|| ExtensionError::WindowBits {
                    param,
                    value: String::from_utf8_lossy(value).into_owned(),
                })?;
                if which == 2 {
                    out.server_max_window_bits = bits;
                } else {
                    out.client_max_window_bits = bits;
                }
            }
        }
    }
    Ok(out)
}

/// 8 to 15 in decimal, without leading zeros (RFC 7692 §7.1.2.1).
fn window_bits(value: &[u8]) -> Option<u8> {
    let text = std::str::from_utf8(value).ok()?;
    let bits: u8 = text.parse().ok()?;
    ((8..=15).contains(&bits) && text == bits.to_string()).then_some(bits)
}

/// A walk over one field's value: `element *( "," element )`, each element
/// `token *( ";" token [ "=" ( token / quoted-string ) ] )`, with optional whitespace around the
/// punctuation and empty elements allowed (RFC 9110 §5.6.1).
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

// === impl Cursor ===

impl<'a> Cursor<'a> {
    /// The next element's name and parameters, `None` at the end; `Err(at)` where the text stops
    /// being a list.
    fn element(&mut self) -> Result<Option<Element<'a>>, usize> {
        loop {
            self.skip_ows();
            match self.peek() {
                None => return Ok(None),
                Some(b',') => self.at += 1,
                Some(_) => break,
            }
        }
        let name = self.token().ok_or(self.at)?;
        let mut params = Vec::new();
        loop {
            self.skip_ows();
            match self.peek() {
                None => break,
                Some(b',') => {
                    self.at += 1;
                    break;
                }
                Some(b';') => {
                    self.at += 1;
                    self.skip_ows();
                    let param = self.token().ok_or(self.at)?;
                    self.skip_ows();
                    let value = if self.peek() == Some(b'=') {
                        self.at += 1;
                        self.skip_ows();
                        Some(self.value().ok_or(self.at)?)
                    } else {
                        None
                    };
                    params.push((param, value));
                }
                Some(_) => return Err(self.at),
            }
        }
        Ok(Some((name, params)))
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    /// One or more token characters (RFC 9110 §5.6.2).
    fn token(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        while self.peek().is_some_and(is_tchar) {
            self.at += 1;
        }
        (self.at > start).then(|| &self.bytes[start..self.at])
    }

    /// A token or a quoted string, unquoted.
    fn value(&mut self) -> Option<Vec<u8>> {
        if self.peek() != Some(b'"') {
            return self.token().map(<[u8]>::to_vec);
        }
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let b = self.peek()?;
            self.at += 1;
            match b {
                b'"' => return Some(out),
                b'\\' => {
                    out.push(self.peek()?);
                    self.at += 1;
                }
                b'\t' | b' '..=b'~' | 0x80..=0xff => out.push(b),
                _ => return None,
            }
        }
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(fields: &[&str]) -> Result<Extensions, ExtensionError> {
        Extensions::from_response(fields.iter().map(|f| f.as_bytes()))
    }

    fn deflate(fields: &[&str]) -> DeflateParams {
        match read(fields) {
            Ok(Extensions::PerMessageDeflate(p)) => p,
            other => panic!("{fields:?}: {other:?}"),
        }
    }

    #[test]
    fn no_field_or_an_empty_one_negotiates_nothing() {
        assert_eq!(read(&[]), Ok(Extensions::None));
        assert_eq!(read(&["", " , "]), Ok(Extensions::None));
    }

    #[test]
    fn bare_permessage_deflate_keeps_context_with_full_windows() {
        let p = deflate(&["permessage-deflate"]);
        assert_eq!(p, DeflateParams::default());
        assert!(p.context_takeover(Direction::ClientToServer));
        assert_eq!(p.window_bits(Direction::ServerToClient), 15);
    }

    #[test]
    fn every_parameter_is_read_for_its_direction() {
        let p = deflate(&[
            "permessage-deflate; server_no_context_takeover ;client_no_context_takeover; \
             server_max_window_bits=10; client_max_window_bits=\"9\"",
        ]);
        assert!(!p.context_takeover(Direction::ServerToClient));
        assert!(!p.context_takeover(Direction::ClientToServer));
        assert_eq!(p.window_bits(Direction::ServerToClient), 10);
        assert_eq!(p.window_bits(Direction::ClientToServer), 9);
        let p = deflate(&["Permessage-Deflate; Server_No_Context_Takeover"]);
        assert!(!p.context_takeover(Direction::ServerToClient));
        assert!(p.context_takeover(Direction::ClientToServer));
    }

    #[test]
    fn another_extension_means_the_connection_is_not_read() {
        assert_eq!(
            read(&["x-webkit-deflate-frame"]),
            Ok(Extensions::Unsupported)
        );
        assert_eq!(
            read(&["permessage-deflate", "foo; bar=\"a,b\""]),
            Ok(Extensions::Unsupported)
        );
    }

    #[test]
    fn nonsense_is_a_typed_error() {
        assert_eq!(
            read(&["permessage-deflate;"]),
            Err(ExtensionError::Malformed { field: 0, at: 19 })
        );
        assert_eq!(
            read(&["a", "permessage-deflate; x=\"open"]),
            Err(ExtensionError::Malformed { field: 1, at: 27 })
        );
        assert_eq!(
            read(&["permessage-deflate server_no_context_takeover"]),
            Err(ExtensionError::Malformed { field: 0, at: 19 })
        );
        assert_eq!(
            read(&["permessage-deflate, permessage-deflate"]),
            Err(ExtensionError::DeflateTwice)
        );
        assert_eq!(
            read(&["permessage-deflate; mystery"]),
            Err(ExtensionError::UnknownParameter("mystery".into()))
        );
        assert_eq!(
            read(&["permessage-deflate; client_no_context_takeover; client_no_context_takeover"]),
            Err(ExtensionError::DuplicateParameter(
                "client_no_context_takeover"
            ))
        );
        assert_eq!(
            read(&["permessage-deflate; server_no_context_takeover=1"]),
            Err(ExtensionError::UnexpectedValue(
                "server_no_context_takeover"
            ))
        );
        assert_eq!(
            read(&["permessage-deflate; client_max_window_bits"]),
            Err(ExtensionError::MissingValue("client_max_window_bits"))
        );
    }

    #[test]
    fn window_bits_are_8_to_15_without_leading_zeros() {
        for good in ["8", "9", "10", "15"] {
            assert!(window_bits(good.as_bytes()).is_some(), "{good}");
        }
        for bad in ["7", "16", "010", "+9", "", "nine", "9 "] {
            assert_eq!(window_bits(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(
            read(&["permessage-deflate; server_max_window_bits=16"]),
            Err(ExtensionError::WindowBits {
                param: "server_max_window_bits",
                value: "16".into()
            })
        );
    }
}
