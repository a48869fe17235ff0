use super::*;

#[test]
fn claim_sizes_parse_to_bytes_rounding_up() {
    let cases = [
        ("1Gi", 1 << 30),
        ("10Gi", 10 << 30),
        ("1.5Gi", 3 << 29),
        ("500M", 500_000_000),
        ("1G", 1_000_000_000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2k", 2000),
        ("100", 100),
        ("+5Ki", 5120),
        ("0", 0),
        ("0.0", 0),
        (".5Ki", 512),
        ("1.", 1),
        ("100m", 1),
        ("1500m", 2),
        ("1n", 1),
        ("1e-20", 1),
        ("7Ei", 7 << 60),
    ];
    for (input, want) in cases {
        assert_eq!(parse_quantity(input), Ok(want), "{input}");
    }
}

#[test]
fn malformed_sizes_are_rejected() {
    for bad in [
        "", "abc", "1Gb", "1..5", "Gi", "1 Gi", "1e", "1e+", "--1", "1Zi",
    ] {
        assert_eq!(parse_quantity(bad), Err(QuantityError::Syntax), "{bad:?}");
    }
    assert_eq!(parse_quantity("-1Gi"), Err(QuantityError::Negative));
    assert_eq!(parse_quantity("-0"), Ok(0));
    assert_eq!(parse_quantity("8Ei"), Err(QuantityError::TooLarge));
    assert_eq!(parse_quantity("1e30"), Err(QuantityError::TooLarge));
    assert_eq!(parse_quantity("1e400"), Err(QuantityError::TooLarge));
}

/// Found by `any_text_parses_or_gets_upstreams_error`: the exponent minus the fraction's
/// digits overflowed i64 (a panic in debug builds).
#[test]
fn an_exponent_near_the_i64_limit_is_a_tiny_size_not_a_panic() {
    assert_eq!(parse_quantity(".1e-9223372036854775807"), Ok(1));
    assert_eq!(parse_quantity("1.5e-9223372036854775808"), Ok(1));
    assert_eq!(parse_quantity("0.0e-9223372036854775808"), Ok(0));
}

/// Found while writing the properties: more than 38 significant digits were "too large" even
/// when the exponent brings the size back down, where upstream reads the value.
#[test]
fn long_mantissas_scale_down_by_their_exponent() {
    let five_and_40_zeros = format!("5{}", "0".repeat(40));
    assert_eq!(parse_quantity(&format!("{five_and_40_zeros}e-40")), Ok(5));
    assert_eq!(parse_quantity(&format!("{five_and_40_zeros}1e-41")), Ok(6));
    assert_eq!(parse_quantity(&format!("{five_and_40_zeros}e-39")), Ok(50));
    assert_eq!(
        parse_quantity(&five_and_40_zeros),
        Err(QuantityError::TooLarge)
    );
}

/// Upstream `TestBytesToQuantity`-style expectations.
#[test]
fn bytes_print_as_binary_si_quantities() {
    let cases = [
        (5 << 30, "5Gi"),
        ((11 << 30) / 2, "5632Mi"),
        ((11 << 20) / 2, "5632Ki"),
        (1 << 20, "1Mi"),
        (1024, "1Ki"),
        (1500, "1500"),
        (2000, "2000"),
        (1000, "1k"),
        (999, "999"),
        (1, "1"),
        (0, "0"),
        (7 << 60, "7Ei"),
    ];
    for (bytes, want) in cases {
        assert_eq!(bytes_to_quantity(bytes), want, "{bytes}");
    }
}
