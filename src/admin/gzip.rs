//! `/metrics` compressed when the scraper asks (`Accept-Encoding: gzip`, as Prometheus sends
//! by default): a scrape of 10,000 series is tens of megabytes of text and compresses about
//! twentyfold. Any other request, or a `gzip;q=0`, gets the body as it is.

use std::io::Write;

use bytes::Bytes;

/// Whether an `Accept-Encoding` value accepts gzip (`gzip` or `*`, with a q-value above 0).
pub fn accepts_gzip(accept_encoding: Option<&str>) -> bool {
    let Some(value) = accept_encoding else {
        return false;
    };
    let mut gzip = None;
    let mut any = None;
    for item in value.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .find_map(|p| p.trim().strip_prefix("q=").map(str::to_string))
            .and_then(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(q > 0.0),
            "*" => any = Some(q > 0.0),
            _ => {}
        }
    }
    gzip.or(any).unwrap_or(false)
}

/// The body gzipped at a fast level (a scrape is made once and read once), or `None` when
/// compressing fails, in which case the body goes as it is.
pub fn compress(body: &[u8]) -> Option<Bytes> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 8),
        flate2::Compression::fast(),
    );
    encoder.write_all(body).ok()?;
    encoder.finish().ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn gzip_is_taken_only_when_accepted() {
        assert!(accepts_gzip(Some("gzip")));
        assert!(accepts_gzip(Some("gzip, deflate, br")));
        assert!(accepts_gzip(Some("identity;q=0.5, GZIP;q=0.8")));
        assert!(accepts_gzip(Some("*")));
        assert!(!accepts_gzip(None));
        assert!(!accepts_gzip(Some("identity")));
        assert!(!accepts_gzip(Some("gzip;q=0")));
        assert!(
            !accepts_gzip(Some("*, gzip;q=0")),
            "an explicit gzip;q=0 wins over *"
        );
        assert!(!accepts_gzip(Some("br, deflate")));
    }

    #[test]
    fn what_is_compressed_reads_back() {
        let body = "metronome_build_info{version=\"0.1.0\"} 1\n".repeat(1000);
        let gz = compress(body.as_bytes()).unwrap();
        assert!(gz.len() * 10 < body.len(), "{} of {}", gz.len(), body.len());
        let mut back = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, body);
    }
}
