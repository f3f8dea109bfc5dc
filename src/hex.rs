//! Lowercase hex text of the IDs a stream carries (its stream ID, its beacon key, trace and span
//! IDs), written digit by digit: `format!("{:032x}", id)` goes through `core::fmt`'s padding
//! (about 700 instructions an ID, callgrind), and a stream makes two before its first byte.

/// The sixteen digits, by value.
const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `value` as 32 lowercase hex digits, leading zeros kept (as `format!("{value:032x}")`).
pub fn u128_text(value: u128) -> String {
    bytes_text(&value.to_be_bytes())
}

/// Two lowercase hex digits for each byte of `bytes`, in order.
///
/// The digits are gathered as bytes and made a `String` once: pushing them as `char`s encodes
/// each as UTF-8 and checks the capacity per digit: 642 instructions for a stream's two IDs
/// against 372 (`bytes_text`'s exclusive cost per request, `CONCURRENCY=1 TOKENS=2 GAP=20ms
/// KEEP=DIR bash scripts/instructions-per-event.sh OLD_BIN NEW_BIN` and `callgrind_annotate`).
pub fn bytes_text(bytes: &[u8]) -> String {
    let digits: Vec<u8> = bytes
        .iter()
        .flat_map(|&byte| {
            [
                DIGITS[usize::from(byte >> 4)],
                DIGITS[usize::from(byte & 0x0f)],
            ]
        })
        .collect();
    String::from_utf8(digits).expect("hex digits are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn leading_zeros_are_kept() {
        assert_eq!(u128_text(0), "0".repeat(32));
        assert_eq!(u128_text(0xab), format!("{}ab", "0".repeat(30)));
        assert_eq!(u128_text(u128::MAX), "f".repeat(32));
        assert_eq!(bytes_text(&[]), "");
        assert_eq!(bytes_text(&[0x00, 0x0f, 0xf0, 0xff]), "000ff0ff");
    }

    proptest! {
        #[test]
        fn property_the_text_is_what_core_fmt_writes(value: u128, bytes: Vec<u8>) {
            prop_assert_eq!(u128_text(value), format!("{value:032x}"));
            let by_fmt: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            prop_assert_eq!(bytes_text(&bytes), by_fmt);
        }
    }
}
