//! Property tests of the quantity parser (issue 41, item 6): a claim's `storage` request is text
//! anyone can write, so `parse_quantity` must never panic, must answer malformed text with
//! upstream's `ErrFormatWrong` text, and must read back every size `bytes_to_quantity` prints.

use proptest::prelude::*;

use super::*;

/// Upstream's `resource.ErrFormatWrong`, the whole message a bad quantity gets.
const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Whether `s` has the shape of a quantity (sign, digits with at most one point, a known suffix or
/// a decimal exponent), written independently of the parser.
fn well_formed(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let number_len = s
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = s.split_at(number_len);
    let points = number.matches('.').count();
    if points > 1 || number.len() == points {
        return false;
    }
    const SUFFIXES: [&str; 16] = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
    ];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    let Some(exp) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Text near the grammar: signs, digits, points, suffix letters and exponents, so most cases get
/// past the first character, plus huge exponents that stress the arithmetic.
fn arb_quantityish() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => "[+-]?[0-9.]{0,45}(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)",
        2 => "[+-]?[0-9.]{0,12}[eE][+-]?[0-9]{0,22}",
        1 => "[+-]?[0-9]{0,3}(\\.[0-9]{0,3})?[eE]-9223372036854775[0-9]{3}",
        1 => "[+-eEinumkKMGTP0-9. ]{0,16}",
        1 => "\\PC{0,24}",
        1 => any::<String>(),
    ]
}

proptest! {
    // No regression files: a failure prints its minimal input, which becomes a unit test.
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_text_parses_or_gets_upstreams_error(s in arb_quantityish()) {
        match parse_quantity(&s) {
            Ok(bytes) => {
                prop_assert!(well_formed(&s), "{s:?} parsed to {bytes} but is not a quantity");
                prop_assert!(bytes >= 0);
            }
            Err(QuantityError::Syntax) => {
                prop_assert!(!well_formed(&s), "{s:?} is a quantity but was rejected");
                prop_assert_eq!(QuantityError::Syntax.to_string(), FORMAT_WRONG);
            }
            Err(QuantityError::Negative) => {
                prop_assert!(s.starts_with('-') && well_formed(&s), "{s:?}");
            }
            Err(QuantityError::TooLarge) => prop_assert!(well_formed(&s), "{s:?}"),
        }
    }

    #[test]
    fn every_printed_size_parses_back_to_its_bytes(bytes in prop_oneof![
        0i64..=i64::MAX,
        (0i64..1 << 20, 0u32..7).prop_map(|(m, e)| m.checked_shl(10 * e).filter(|v| v >> (10 * e) == m).unwrap_or(m)),
        (0i64..1000).prop_map(|m| m * 1000),
    ]) {
        let text = bytes_to_quantity(bytes);
        prop_assert_eq!(parse_quantity(&text), Ok(bytes), "{} printed as {}", bytes, text);
    }

    #[test]
    fn a_suffixed_whole_number_is_its_exact_multiple(
        m in 0u32..=u32::MAX,
        (suffix, factor) in prop::sample::select(vec![
            ("", 1i128), ("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40),
            ("Pi", 1 << 50), ("Ei", 1 << 60), ("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000),
            ("T", 1_000_000_000_000), ("P", 1_000_000_000_000_000), ("E", 1_000_000_000_000_000_000),
        ]),
    ) {
        let exact = i128::from(m) * factor;
        let want = i64::try_from(exact).map_err(|_| QuantityError::TooLarge);
        prop_assert_eq!(parse_quantity(&format!("{m}{suffix}")), want);
    }

    #[test]
    fn a_fraction_rounds_up_to_the_next_byte(whole in 0u32..100_000, frac in 0u32..1000) {
        // whole.frac (three digits) of a kibibyte: exactly (whole*1000 + frac) * 1024 / 1000 bytes.
        let exact = (u64::from(whole) * 1000 + u64::from(frac)) * 1024;
        let want = i64::try_from(exact.div_ceil(1000)).expect("fits");
        prop_assert_eq!(parse_quantity(&format!("{whole}.{frac:03}Ki")), Ok(want));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn padding_digits_cancelled_by_the_exponent_change_nothing(
        m in 0u64..1 << 40, zeros in 0usize..60, frac in "[0-9]{0,30}",
    ) {
        // m followed by `zeros` zeros and then any fraction, times 10^-zeros: m plus less than one.
        let text = format!("{m}{}.{frac}e-{zeros}", "0".repeat(zeros));
        let remainder = frac.bytes().any(|b| b != b'0');
        let want = i64::try_from(m).expect("fits") + i64::from(remainder);
        prop_assert_eq!(parse_quantity(&text), Ok(want), "{}", text);
    }
}
