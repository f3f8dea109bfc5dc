//! Client-to-server masking (RFC 6455 §5.3), undone for reading in the reader's own buffers,
//! never in the bytes the tunnel forwards.

/// XORs `bytes` with `key`, where `bytes` begins at payload offset `offset` (so a payload split
/// across reads unmasks as if whole). Eight bytes at a time, then the rest one by one.
pub(super) fn unmask(bytes: &mut [u8], key: [u8; 4], offset: u64) {
    let phase = (offset % 4) as usize;
    let k = [
        key[phase],
        key[(phase + 1) % 4],
        key[(phase + 2) % 4],
        key[(phase + 3) % 4],
    ];
    let word = u64::from_ne_bytes([k[0], k[1], k[2], k[3], k[0], k[1], k[2], k[3]]);
    let mut words = bytes.chunks_exact_mut(8);
    for chunk in &mut words {
        let mut w = [0; 8];
        w.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
    }
    // The words took a multiple of 8 bytes, so the key's phase is where it began.
    for (i, b) in words.into_remainder().iter_mut().enumerate() {
        *b ^= k[i % 4];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytewise(bytes: &[u8], key: [u8; 4], offset: u64) -> Vec<u8> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ key[((offset as usize) + i) % 4])
            .collect()
    }

    #[test]
    fn the_rfc_example_unmasks_to_hello() {
        // RFC 6455 §5.7: a single-frame masked text message.
        let mut payload = [0x7f, 0x9f, 0x4d, 0x51, 0x58];
        unmask(&mut payload, [0x37, 0xfa, 0x21, 0x3d], 0);
        assert_eq!(&payload, b"Hello");
    }

    #[test]
    fn unmasking_from_any_offset_matches_the_byte_by_byte_rule() {
        let key = [0xde, 0xad, 0xbe, 0xef];
        let data: Vec<u8> = (0..=255u8).collect();
        for offset in 0..8 {
            for len in [0, 1, 3, 7, 8, 9, 31, 200] {
                let mut got = data[..len].to_vec();
                unmask(&mut got, key, offset);
                assert_eq!(got, bytewise(&data[..len], key, offset), "{offset} {len}");
            }
        }
    }

    #[test]
    fn a_payload_unmasked_in_pieces_equals_one_unmasked_whole() {
        let key = [1, 2, 3, 250];
        let data: Vec<u8> = (0..100u8).collect();
        let mut whole = data.clone();
        unmask(&mut whole, key, 0);
        let mut pieces = data.clone();
        let (a, rest) = pieces.split_at_mut(5);
        let (b, c) = rest.split_at_mut(13);
        unmask(a, key, 0);
        unmask(b, key, 5);
        unmask(c, key, 18);
        assert_eq!(pieces, whole);
    }
}
